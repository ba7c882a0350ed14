#!/usr/bin/env python3
"""NVRTC precompiled headers on a CCCL-heavy source (CUB BlockReduce + BlockRadixSort): the
time of a compile for a new instantiation (a template argument not compiled before, so a
cache miss), in a fresh process over an empty cache each run:

  cold      the process's first compile (NVRTC compiles the headers; with PCH on, it also
            writes the PCH);
  warm PCH  the next compiles, each a new instantiation, with the PCH the first one made;
  no PCH    the same compiles with pch=False.

Prints medians over --runs processes (each compiling --n instantiations) and writes JSON
(--json) with every figure.

    python benchmarks/compile_pch.py [--runs 3] [--n 4] [--json out.json]
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
SRC = (ROOT / "tests/data/src/cub_reduce_sort.cu").read_text()
INSTANCES = [f"reduce_sort<{t},{b},{i}>" for t, b, i in
             [("int", 128, 4), ("float", 128, 4), ("unsigned", 256, 2), ("double", 64, 3), ("short", 128, 8),
              ("long long", 128, 2), ("float", 256, 4), ("int", 64, 8)]]

CHILD = r'''
import json, sys, time
from nbjit.compiler import compile_image
from nbjit.cache import Cache
from nbjit import pch
src, cache_dir, use, n = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
exprs = json.loads(sys.argv[5])[:n]
cache = Cache(cache_dir)
times = []
for e in exprs:
    t = time.perf_counter()
    compile_image(src, name="heavy.cu", name_expressions=[e], arch="sm_90", cache=cache, pch=use)
    times.append(time.perf_counter() - t)
print(json.dumps({"times": times, "stats": pch.STORE.stats}))
'''


def run(use: bool, n: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        r = subprocess.run([sys.executable, "-c", CHILD, SRC, d, "1" if use else "0", str(n), json.dumps(INSTANCES)],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description="NVRTC precompiled headers on a CUB-heavy source")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=4, help="instantiations compiled per process (2..8)")
    ap.add_argument("--json")
    a = ap.parse_args()
    n = max(2, min(a.n, len(INSTANCES)))
    runs: dict[str, list] = {"pch": [], "no_pch": []}
    for _ in range(a.runs):  # the two take turns, so a change in the host's load meets both
        runs["pch"].append(run(True, n))
        runs["no_pch"].append(run(False, n))
    pch_cold = statistics.median(r["times"][0] for r in runs["pch"])
    pch_warm = statistics.median(t for r in runs["pch"] for t in r["times"][1:])
    plain_cold = statistics.median(r["times"][0] for r in runs["no_pch"])
    plain = statistics.median(t for r in runs["no_pch"] for t in r["times"][1:])
    print(f"medians of {a.runs} fresh processes, {n} instantiations each (s); PCH stats of the last: "
          f"{runs['pch'][-1]['stats']}")
    print(f"{'':22}{'first compile':>15}{'new instantiation':>20}")
    print(f"{'pch=True':22}{pch_cold:15.2f}{pch_warm:20.2f}")
    print(f"{'pch=False':22}{plain_cold:15.2f}{plain:20.2f}")
    print(f"recompile speed-up with a warm PCH: {plain / pch_warm:.1f}x; the first compile's cost of making it: "
          f"{pch_cold / plain_cold:.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": runs, "pch_first": pch_cold, "pch_warm": pch_warm,
                                            "no_pch_first": plain_cold, "no_pch": plain}, indent=2))


if __name__ == "__main__":
    main()
