#!/usr/bin/env python3
"""A chain of dependent small kernels, each reading what the one before wrote, with and
without programmatic dependent launch (PDL), in one run: end-to-end GPU time of the chain
(CUDA events on one Numba stream), launched one by one and replayed from a CUDA graph.

Each kernel waits for the grid before it (``griddepcontrol.wait``) and lets the next one
start early (``griddepcontrol.launch_dependents``), so with PDL the next kernel's launch
and prologue overlap this one's tail. Needs an sm_90 (Hopper) or newer GPU.

    python benchmarks/pdl_chain.py [--chain 100] [--n 65536] [--repeat 30] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import nbjit  # noqa: E402

SRC = r'''
extern "C" __global__ void step(float* out, const float* in, int n) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] + 1.0f;
    asm volatile("griddepcontrol.launch_dependents;");
}
'''


def _text(name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chain", type=int, default=100, help="kernels in the chain")
    ap.add_argument("--n", type=int, default=65536, help="values each kernel touches")
    ap.add_argument("--repeat", type=int, default=30, help="chains timed per row (median)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    from numba import cuda

    step = nbjit.compile(SRC, name="pdl_chain.cu", output="ptx")["step"]
    assert step.pdl, "the kernel runs griddepcontrol.wait: PDL by default"
    grid, block = (a.n + 255) // 256, 256
    s = cuda.stream()
    bufs = [cuda.to_device(np.zeros(a.n, np.float32)), cuda.device_array(a.n, np.float32)]

    def chain(pdl: bool) -> None:
        for i in range(a.chain):
            step.launch(grid, block, bufs[(i + 1) % 2], bufs[i % 2], a.n, stream=s, pdl=pdl)

    def indexed(pdl: bool):
        """The same chain in the kernel[grid, block, stream] form, PDL by the kernel's default."""
        def run() -> None:
            step.pdl = pdl
            k = step[grid, block, s]
            for i in range(a.chain):
                k(bufs[(i + 1) % 2], bufs[i % 2], a.n)
        return run

    graphs = {}
    for pdl in (False, True):
        with nbjit.capture(s) as g:
            chain(pdl)
        graphs[pdl] = g

    def timed(run) -> float:
        start, end = cuda.event(), cuda.event()
        start.record(s)
        run()
        end.record(s)
        end.synchronize()
        return cuda.event_elapsed_time(start, end) * 1e3  # microseconds

    rows = {("launch()", False): lambda: chain(False), ("launch()", True): lambda: chain(True),
            ("k[g, b, s]", False): indexed(False), ("k[g, b, s]", True): indexed(True),
            ("graph", False): lambda: graphs[False].launch(), ("graph", True): lambda: graphs[True].launch()}
    times: dict = {k: [] for k in rows}
    for run in rows.values():  # warm-up
        run()
    for _ in range(a.repeat):  # rounds over every row in turn
        for k, run in rows.items():
            times[k].append(timed(run))
    # the chain computes bufs = start + chain length each time it runs: check one more run of each
    for k, run in rows.items():
        bufs[0].copy_to_device(np.zeros(a.n, np.float32))
        run()
        s.synchronize()
        got = bufs[a.chain % 2].copy_to_host()
        assert np.all(got == a.chain), (k, got[:4])
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{a.chain} dependent kernels of {a.n:,} values on {_text(cuda.get_current_device().name)}; "
          f"median of {a.repeat} chains, microseconds")
    print(f"{'':12}{'plain':>10}{'PDL':>10}{'PDL/plain':>11}")
    out = {}
    for how in ("launch()", "k[g, b, s]", "graph"):
        p, q = med[(how, False)], med[(how, True)]
        print(f"{how:12}{p:10.1f}{q:10.1f}{q / p:11.2f}")
        out[how] = {"plain_us": p, "pdl_us": q, "ratio": q / p}
    if a.json:
        Path(a.json).write_text(json.dumps({"chain": a.chain, "n": a.n, "repeat": a.repeat, **out}, indent=2) + "\n")


if __name__ == "__main__":
    main()
