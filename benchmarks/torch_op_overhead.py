#!/usr/bin/env python3
"""Host cost of an nbjit kernel called as a PyTorch operator (``nbjit.torch.op``) in eager
mode, against torch's own custom operator doing the same work, in one run: µs per call, a
loop of calls then one synchronize, best of ``--repeat`` interleaved rounds. Rows:

* torch's ``x * a`` (no custom op: the floor of one torch kernel)
* a ``torch.library.custom_op`` whose implementation is ``x * a`` (an output made, one launch)
* the nbjit op ``scale`` (an output made by its rule, the kernel launched by nbjit)
* the in-place pair: a custom op ``y.add_(x, alpha=a)`` against the nbjit op ``axpy``
* the nbjit kernel launched directly, ``k[grid, block, stream](out, x, a, n)`` (no op)

The goal (issue #52): the nbjit op costs at most torch's custom op + 1 µs.

    python benchmarks/torch_op_overhead.py [--calls 2000] [--repeat 20] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

import nbjit

SRC = r"""
extern "C" __global__ void scale(float *out, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i];
}
extern "C" __global__ void axpy(float *y, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
"""
N = 4096


@torch.library.custom_op("nbjit_bench::torch_scale", mutates_args=())
def torch_scale(x: torch.Tensor, a: float) -> torch.Tensor:
    return x * a


@torch_scale.register_fake
def _(x, a):
    return torch.empty_like(x)


@torch.library.custom_op("nbjit_bench::torch_axpy", mutates_args=("y",))
def torch_axpy(y: torch.Tensor, x: torch.Tensor, a: float) -> None:
    y.add_(x, alpha=a)


def rows() -> dict:
    """name -> a function making one call."""
    m = nbjit.compile(SRC)
    scale = nbjit.torch.op(m["scale"], name="nbjit_bench::scale", outputs={"out": "x"}, fill={"n": lambda x: x.numel()},
                           grid=lambda n: (n + 255) // 256, block=256)
    axpy = nbjit.torch.op(m["axpy"], name="nbjit_bench::axpy", inplace=("y",), fill={"n": lambda x: x.numel()},
                          grid=lambda n: (n + 255) // 256, block=256)
    x, y, out = (torch.rand(N, device="cuda") for _ in range(3))
    k = m["scale"]
    stream = torch.cuda.current_stream().cuda_stream
    grid = (N + 255) // 256
    return {
        "torch x * a (no custom op)": lambda: x * 2.0,
        "torch custom op: x * a": lambda: torch_scale(x, 2.0),
        "nbjit op: scale (output made by its rule)": lambda: scale(x, 2.0),
        "torch custom op, in place: y.add_(x, alpha=a)": lambda: torch_axpy(y, x, 1e-9),
        "nbjit op, in place: axpy": lambda: axpy(y, x, 1e-9),
        "nbjit kernel, no op: k[grid, block, stream](out, x, a, n)": lambda: k[grid, 256, stream](out, x, 2.0, N),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description="host µs per call of an nbjit op and torch's own custom op")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    table = rows()
    for fn in table.values():  # warm up: first calls compile, teach the C path, fill caches
        for _ in range(50):
            fn()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in table}
    for _ in range(a.repeat):
        for name, fn in table.items():
            t0 = time.perf_counter()
            for _ in range(a.calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            samples[name].append((t1 - t0) / a.calls * 1e6)
    best = {name: min(v) for name, v in samples.items()}
    width = max(map(len, best)) + 2
    for name, us in best.items():
        print(f"{name:{width}}{us:8.2f} us")
    out_of, in_place = ("nbjit op: scale (output made by its rule)", "torch custom op: x * a"), \
        ("nbjit op, in place: axpy", "torch custom op, in place: y.add_(x, alpha=a)")
    extra = {f"{n} minus {t}": best[n] - best[t] for n, t in (out_of, in_place)}
    for what, us in extra.items():
        print(f"{what}: {us:+.2f} us (goal: at most +1)")
    if a.json:
        Path(a.json).write_text(json.dumps({"us": best, "over_torch_custom_op_us": extra, "calls": a.calls,
                                            "repeat": a.repeat, "gpu": torch.cuda.get_device_name(),
                                            "torch": torch.__version__, "python": platform.python_version()},
                                           indent=2))


if __name__ == "__main__":
    main()
