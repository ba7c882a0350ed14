#!/usr/bin/env python3
"""What a pickled nbjit kernel weighs, and what Dask ships when a task graph carries one
(no GPU needed: kernels made with ``lazy=True`` pickle as a loaded kernel does).

For each kernel: its image bytes, one pickled kernel (pickle and cloudpickle), 1,000
kernels of the module in one pickle; then a Dask array graph of 64 chunks that takes the
kernel as an argument of ``map_blocks``: the graph pickled whole (what the client sends the
scheduler) and each task pickled alone (what the scheduler sends a worker), with the
kernel passed directly and as one ``dask.delayed`` value that the tasks depend on.

    python benchmarks/pickle_size.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import pickle
import sys
import tempfile
from pathlib import Path

import cloudpickle

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nbjit  # noqa: E402

SAXPY = r'''extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}'''
DATA = ROOT / "tests" / "data"


def kernels() -> dict:
    out = {"NVRTC saxpy (cubin, sm_90)": nbjit.compile(SAXPY, arch="sm_90", lazy=True)["saxpy"]}
    m = nbjit.load(DATA / "nvcc/kernels_sm90.ptx", lazy=True)
    out["nvcc PTX, 11 kernels"] = m["k_basic"]
    m = nbjit.load(DATA / "triton/matmul_kernel/matmul_kernel.cubin", lazy=True)
    out["Triton matmul (cubin)"] = m[m.kernels[0]]
    return out


def dask_sizes(kernel, chunks: int = 64) -> dict:
    import dask
    import dask.array as da
    import numpy as np

    def apply(block, kernel):
        return block

    x = da.zeros(chunks * 1000, chunks=1000, dtype=np.float32)
    out = {}
    for how, arg in (("kernel in each task", kernel), ("one dask.delayed(kernel)", dask.delayed(kernel))):
        y = x.map_blocks(apply, kernel=arg, dtype=np.float32)
        graph = dict(y.__dask_graph__())
        mine = [k for k in graph if isinstance(k, tuple) and k[0] == y.name]
        per_task = [len(cloudpickle.dumps(graph[k])) for k in mine]
        out[how] = {"graph_bytes": len(cloudpickle.dumps(graph)), "tasks": len(mine),
                    "per_task_bytes_total": sum(per_task), "per_task_bytes_max": max(per_task)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    try:
        import dask  # noqa: F401
        have_dask = True
    except ImportError:
        have_dask = False
    results = {}
    for label, k in kernels().items():
        mod = k.module
        same = [mod[n] for n in mod.kernels]
        r = {"image_bytes": len(mod.image.data), "pickle_bytes": len(pickle.dumps(k)),
             "cloudpickle_bytes": len(cloudpickle.dumps(k)),
             "1000_kernels_one_pickle_bytes": len(pickle.dumps([same[i % len(same)] for i in range(1000)]))}
        if have_dask:
            r["dask_64_chunks"] = dask_sizes(k)
        results[label] = r
        print(f"{label}: image {r['image_bytes']:,} B, pickled {r['pickle_bytes']:,} B "
              f"(cloudpickle {r['cloudpickle_bytes']:,} B), 1,000 kernels in one pickle "
              f"{r['1000_kernels_one_pickle_bytes']:,} B")
        for how, d in r.get("dask_64_chunks", {}).items():
            print(f"    dask, 64 chunks, {how}: graph {d['graph_bytes']:,} B; tasks one by one "
                  f"{d['per_task_bytes_total']:,} B in all ({d['per_task_bytes_max']:,} B the largest)")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        import os
        os.environ.setdefault("NBJIT_CACHE_DIR", d)
        try:
            main()
        except BrokenPipeError:  # output piped to `head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
