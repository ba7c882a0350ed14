#!/usr/bin/env python3
"""100 tiny kernels — half @cuda.jit, half nbjit — launched one by one versus captured once
(``nbjit.capture``) and replayed, beside ``torch.cuda.graph`` replaying the same nbjit
kernels where PyTorch is installed; all in one process.

Reports, per row: host µs per kernel (the time to issue an iteration, divided by 100) and
end-to-end µs per kernel (issue plus completion, best of ``--repeat`` rounds of ``--iters``
iterations).

    python benchmarks/graph_replay.py [--iters 50] [--repeat 10] [--json out.json]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import numpy as np

N = 256
KERNELS = 100
SRC = r'''extern "C" __global__ void inc(float* a, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += v;
}'''


def measure(issue, sync, iters: int, repeat: int) -> tuple[float, float]:
    """(host µs per kernel, end-to-end µs per kernel), best of ``repeat`` rounds."""
    issue()
    sync()
    host = e2e = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(iters):
            issue()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        host = min(host, (t1 - t0) / iters / KERNELS * 1e6)
        e2e = min(e2e, (t2 - t0) / iters / KERNELS * 1e6)
    return host, e2e


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()

    torch = None
    if importlib.util.find_spec("torch"):
        import torch
    from numba import cuda

    import nbjit

    @cuda.jit
    def inc_numba(arr, v):
        i = cuda.grid(1)
        if i < arr.shape[0]:
            arr[i] += v

    inc = nbjit.compile(SRC, name="graph_bench.cu")["inc"]
    s = cuda.stream()
    x = cuda.to_device(np.zeros(N, np.float32))
    nk, jk = inc_numba[1, N, s], inc[1, N, s]
    v = np.float32(1.0)

    def one_by_one():
        for _ in range(KERNELS // 2):
            nk(x, v)
            jk(x, v, N)

    rows = {"one by one (@cuda.jit + nbjit)": measure(one_by_one, s.synchronize, a.iters, a.repeat)}
    with nbjit.capture(s) as g:
        one_by_one()
    rows["nbjit.capture replay (@cuda.jit + nbjit)"] = measure(g.launch, s.synchronize, a.iters, a.repeat)

    def nbjit_only():
        for _ in range(KERNELS):
            jk(x, v, N)

    rows["one by one (nbjit only)"] = measure(nbjit_only, s.synchronize, a.iters, a.repeat)
    with nbjit.capture(s) as g2:
        nbjit_only()
    rows["nbjit.capture replay (nbjit only)"] = measure(g2.launch, s.synchronize, a.iters, a.repeat)
    if torch is not None:
        tx = torch.zeros(N, device="cuda")
        ts = torch.cuda.Stream()
        tk = inc[1, N, ts]
        with torch.cuda.stream(ts):
            for _ in range(3):
                tk(tx, v, N)  # warm up on the side stream, as torch.cuda.graph asks
        ts.synchronize()
        tg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tg, stream=ts):
            cap = inc[1, N, torch.cuda.current_stream()]
            for _ in range(KERNELS):
                cap(tx, v, N)
        rows["torch.cuda.graph replay (nbjit only)"] = measure(tg.replay, torch.cuda.synchronize, a.iters, a.repeat)
    else:
        print("torch: not installed, its row skipped")

    print(f"{'':44}{'host us/kernel':>15}{'end-to-end us/kernel':>22}")
    for name, (host, e2e) in rows.items():
        print(f"{name:44}{host:15.3f}{e2e:22.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps({k: {"host_us": h, "e2e_us": e} for k, (h, e) in rows.items()}, indent=2))


if __name__ == "__main__":
    main()
