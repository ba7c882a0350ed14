#!/usr/bin/env python3
"""One nbjit kernel, compiled once on the client, applied to every chunk of a large array on
every GPU of this machine with Dask-CUDA (one worker process per GPU).

The kernel travels to the workers as data (its compiled bytes, once per worker): NVRTC runs
on the client only, each worker loads the kernel on first use on its own GPU. The chunks are CuPy arrays
on the workers' GPUs (``map_blocks``); the result is checked against numpy, and the script
prints which GPU each chunk ran on and the throughput.

    pip install -e ".[cu13,dask]" cupy-cuda13x       # in nbjit's checkout
    python examples/dask_multi_gpu.py                    # every visible GPU
    python examples/dask_multi_gpu.py --gpus 0 --n 50_000_000
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import nbjit

SRC = r'''
extern "C" __global__ void poly(float* y, const float* x, float a, float b, float c, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = x[i];
        y[i] = (a * v + b) * v + c;
    }
}
'''
COEFFS = (np.float32(0.5), np.float32(-2.0), np.float32(3.0))


def poly_block(x, kernel):
    """One chunk (a CuPy array on this worker's GPU) through the kernel, on CuPy's stream."""
    import cupy as cp
    y = cp.empty_like(x)
    n = x.size
    blocks = max(1, min((n + 255) // 256, 4096))
    kernel[blocks, 256, cp.cuda.get_current_stream()](y, x, *COEFFS, np.int64(n))
    return y


def worker_gpu() -> str:
    """The GPU a Dask-CUDA worker uses (the first of the CUDA_VISIBLE_DEVICES it was given)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]


def run(client, n: int, chunk: int, kernel=None, seed: int = 0, timeout: float | None = None) -> dict:
    """Apply the kernel to ``n`` float32 values in chunks of ``chunk`` on the client's
    workers; check the result against numpy. Returns the chunks per GPU and timings."""
    import cupy as cp
    import dask
    import dask.array as da
    from distributed import wait

    kernel = kernel if kernel is not None else nbjit.compile(SRC)["poly"]
    x = da.random.default_rng(seed).random(n, chunks=chunk, dtype=np.float32)
    xg = x.map_blocks(cp.asarray, meta=cp.empty(0, np.float32)).persist()  # chunks on the GPUs
    wait(xg, timeout=timeout)
    t0 = time.perf_counter()
    # one dask.delayed value: each worker receives the kernel once (passed plainly, it would
    # travel inside every task); it loads on the worker's GPU at its first launch there
    shipped = dask.delayed(kernel, pure=True)
    yg = xg.map_blocks(poly_block, kernel=shipped, dtype=np.float32, meta=cp.empty(0, np.float32)).persist()
    wait(yg, timeout=timeout)
    seconds = time.perf_counter() - t0
    gpus = client.run(worker_gpu)
    where = [gpus[next(iter(w))] for w in client.who_has(yg).values() if w]
    per_gpu = {g: where.count(g) for g in sorted(set(where))}
    got = yg.map_blocks(cp.asnumpy, meta=np.empty(0, np.float32)).compute()
    want = x.compute()
    a, b, c = COEFFS
    np.testing.assert_allclose(got, (a * want + b) * want + c, rtol=1e-6)
    return {"chunks": len(where), "per_gpu": per_gpu, "seconds": seconds,
            "gb_per_s": 2 * 4 * n / seconds / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000_000, help="values (float32)")
    ap.add_argument("--chunk", type=int, default=10_000_000, help="values per chunk")
    ap.add_argument("--gpus", default=None, help="GPUs to use, e.g. 0,1 (default: all visible)")
    a = ap.parse_args()
    try:
        import cupy  # noqa: F401
        from dask_cuda import LocalCUDACluster
        from distributed import Client
    except ImportError as e:
        need = "nbjit-core's dask extra and CuPy: pip install -e '.[cu13,dask]' cupy-cuda13x in nbjit's checkout"
        raise SystemExit(f"{e}: this example needs Dask-CUDA and CuPy ({need})") from None
    try:
        kernel = nbjit.compile(SRC)["poly"]  # NVRTC runs here, once (and is cached on disk)
    except nbjit.NbjitError as e:
        raise SystemExit(str(e)) from None
    with LocalCUDACluster(CUDA_VISIBLE_DEVICES=a.gpus) as cluster, Client(cluster) as client:
        print(f"{len(client.scheduler_info()['workers'])} workers; kernel {kernel}")
        run(client, a.chunk * 2, a.chunk, kernel)  # warm-up: each worker loads the kernel
        r = run(client, a.n, a.chunk, kernel)
    for gpu, count in r["per_gpu"].items():
        print(f"GPU {gpu}: {count} chunks")
    print(f"{r['chunks']} chunks of {a.chunk:,} values, {a.n:,} in all: {r['seconds'] * 1e3:.1f} ms, "
          f"{r['gb_per_s']:.1f} GB/s (read + write); result equal to numpy's")


if __name__ == "__main__":
    main()
