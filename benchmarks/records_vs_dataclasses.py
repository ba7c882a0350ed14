#!/usr/bin/env python3
"""What ``nbjit.records`` saves against ``dataclasses.dataclass`` on a bundle's first kernel:
fresh processes taking turns, each timing the making of every record class on the route
(``@record`` as it is, or the same classes made by ``dataclasses.dataclass``), and nbjit's
whole share (``import nbjit`` to the first launch's end, after numpy and ``numba.cuda``).

    python benchmarks/records_vs_dataclasses.py [--runs 12] [--no-gpu]

``--no-gpu``: the route without a launch (``load_bundle(lazy=True)`` and the kernel's
parameters), which makes the same classes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "examples/bundle_package/src/nbjit_demo_kernels/kernels.nbjit"

CHILD = r'''
import dataclasses, json, os, sys, time
from nbjit import records
spent, count, made_by = [0.0], [0], records.record


def record(cls=None, /, *, frozen=True, eq=True):
    def wrap(c):
        t = time.perf_counter()
        out = dataclasses.dataclass(frozen=frozen, eq=eq)(c) if os.environ["MAKER"] == "dataclasses" \
            else made_by(c, frozen=frozen, eq=eq)
        spent[0] += time.perf_counter() - t
        count[0] += 1
        return out
    return wrap if cls is None else wrap(cls)


records.record = record
import numpy as np
from numba import cuda
gpu = sys.argv[2] == "gpu"
if gpu:
    cuda.current_context()
t0 = time.perf_counter()
import nbjit
k = nbjit.load_bundle(sys.argv[1], name="axpy", lazy=not gpu)["axpy"]
k.params
if gpu:
    x, y = cuda.to_device(np.ones(1024, np.float32)), cuda.to_device(np.zeros(1024, np.float32))
    k[4, 256](np.float32(2), x, y, 1024)
    cuda.synchronize()
t1 = time.perf_counter()
print(json.dumps({"making_ms": spent[0] * 1e3, "classes": count[0], "nbjit_ms": (t1 - t0) * 1e3}))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description="records against dataclasses on a bundle's first kernel")
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--no-gpu", action="store_true", help="the route without a launch (no GPU needed)")
    a = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out: dict[str, list] = {"records": [], "dataclasses": []}
    for _ in range(a.runs):
        for maker in out:
            r = subprocess.run([sys.executable, "-c", CHILD, str(BUNDLE), "cpu" if a.no_gpu else "gpu"],
                               capture_output=True, text=True, env={**env, "MAKER": maker}, timeout=300)
            if r.returncode != 0:
                raise SystemExit(r.stderr[-3000:])
            out[maker].append(json.loads(r.stdout.strip().splitlines()[-1]))
    for maker, runs in out.items():
        print(f"{maker:12} classes {runs[0]['classes']:3}  making them "
              f"{statistics.median(r['making_ms'] for r in runs):6.2f} ms  nbjit's share "
              f"{statistics.median(r['nbjit_ms'] for r in runs):6.1f} ms  (medians of {a.runs} processes)")


if __name__ == "__main__":
    main()
