#!/usr/bin/env python3
"""Time to get a launchable kernel for a small CUDA C++ source, each measured in fresh
processes (imports and context creation excluded, everything after included):

  (a) cold: an empty cache, so NVRTC compiles;
  (b) warm: a fresh process over the cache (a) filled;
  (c) in-process repeat of the same call (median of 200 calls);

for nbjit.compile and, where CuPy is installed (needs a GPU), cupy.RawModule the same way.
Prints a table (median of --runs processes) and writes JSON (--json).

    python benchmarks/compile_cache.py [--runs 5] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = r'''
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''

NBJIT = r'''
import json, sys, time
import nbjit
from numba import cuda
cuda.current_context()
src = sys.argv[1]
t0 = time.perf_counter(); k = nbjit.compile(src)["saxpy"]; t1 = time.perf_counter()
ts = []
for _ in range(200):
    t = time.perf_counter(); nbjit.compile(src)["saxpy"]; ts.append(time.perf_counter() - t)
print(json.dumps({"first": t1 - t0, "repeat": sorted(ts)[len(ts) // 2]}))
'''

CUPY = r'''
import json, sys, time
import cupy as cp
cp.cuda.Device(0).use(); cp.zeros(1)
src = sys.argv[1]
t0 = time.perf_counter(); k = cp.RawModule(code=src).get_function("saxpy"); t1 = time.perf_counter()
ts = []
for _ in range(200):
    t = time.perf_counter(); cp.RawModule(code=src).get_function("saxpy"); ts.append(time.perf_counter() - t)
print(json.dumps({"first": t1 - t0, "repeat": sorted(ts)[len(ts) // 2]}))
'''


def run(code: str, env: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", code, SRC], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure(code: str, env_key: str, runs: int) -> dict:
    cold, warm, repeat = [], [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as d:
            env = {**os.environ, env_key: d, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
            a = run(code, env)
            b = run(code, env)
            cold.append(a["first"])
            warm.append(b["first"])
            repeat.append(b["repeat"])
    return {"cold": statistics.median(cold), "warm": statistics.median(warm),
            "repeat": statistics.median(repeat)}


def main() -> None:
    ap = argparse.ArgumentParser(description="compile-cache timings")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = {"nbjit.compile": measure(NBJIT, "NBJIT_CACHE_DIR", a.runs)}
    try:
        import cupy  # noqa: F401  (only to know whether CuPy's rows can run)
        rows["cupy.RawModule"] = measure(CUPY, "CUPY_CACHE_DIR", a.runs)
    except ImportError:
        print("CuPy not installed: its rows are skipped")
    print(f"{'':18}{'(a) cold ms':>13}{'(b) warm ms':>13}{'(c) repeat ms':>15}{'a/b':>8}")
    for k, v in rows.items():
        print(f"{k:18}{v['cold'] * 1e3:13.2f}{v['warm'] * 1e3:13.2f}{v['repeat'] * 1e3:15.3f}"
              f"{v['cold'] / v['warm']:8.0f}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
