#!/usr/bin/env python3
"""One nbjit kernel, compiled once on the client, launched by Dask workers on the Numba host's
device arrays and streams: numba-cuda's, or numba-cuda-mlir's (``NBJIT_HOST=numba-cuda-mlir``,
or where numba-cuda-mlir is the only one installed; numba-cuda is then never imported, on the
client or the workers).

No Dask-CUDA and no CuPy: a ``distributed.LocalCluster`` of worker processes (spawned, not
forked: a child forked after its parent used CUDA cannot use it), each on the current GPU. Each
task copies its chunk to the GPU on a stream of its own (the host's ``cuda.stream()``), launches
the kernel there on the host's device arrays, and copies the result back; chunks travel between
processes as numpy arrays, the kernel as its compiled bytes (once per worker), loaded on its
first launch in each worker into the context of the host that worker serves (it inherits
``NBJIT_HOST``). The result is checked against numpy; the script prints what each worker ran
with. (``examples/dask_multi_gpu.py`` spreads CuPy chunks over every GPU with Dask-CUDA.)

    pip install -e ".[cu13]" "dask[array,distributed]"   # in nbjit's checkout
    python examples/dask_numba_arrays.py                               # numba-cuda
    NBJIT_HOST=numba-cuda-mlir python examples/dask_numba_arrays.py    # numba-cuda-mlir's arrays and streams
    python examples/dask_numba_arrays.py --workers 2 --threads 2 --n 20_000_000
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

if os.environ.get("NBJIT_HOST") == "numba-cuda-mlir":
    from numba_cuda_mlir import cuda
else:
    try:
        from numba import cuda
    except ImportError:  # numba-cuda-mlir alone: nbjit serves it (the first host installed)
        from numba_cuda_mlir import cuda

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


def poly_chunk(x: np.ndarray, kernel) -> np.ndarray:
    """One chunk through the kernel on this worker's GPU: the host's device arrays, on a
    stream of the task's own."""
    s = cuda.stream()
    dx = cuda.to_device(np.ascontiguousarray(x), stream=s)
    dy = cuda.device_array(x.shape, np.float32, stream=s)
    n = x.size
    kernel[max(1, min((n + 255) // 256, 4096)), 256, s](dy, dx, *COEFFS, np.int64(n))
    y = dy.copy_to_host(stream=s)
    s.synchronize()
    return y


def worker_report(kernel) -> dict:
    """What a worker ran with: its arrays' type, the context the kernel was loaded into (the
    kernel unpickled here again is the module the tasks loaded: one per process for the same
    bytes), and whether numba-cuda (``numba``) was ever imported there."""
    ctx = kernel.module.context if kernel.module.loaded else None
    a = cuda.device_array(1, np.float32)
    return {"pid": os.getpid(), "array": f"{type(a).__module__}.{type(a).__name__}",
            "context": None if ctx is None else f"{type(ctx).__module__}.{type(ctx).__name__}",
            "numba_imported": "numba" in sys.modules}


def run(client, n: int, chunk: int, kernel=None, seed: int = 0) -> dict:
    """Apply the kernel to ``n`` float32 values in chunks of ``chunk`` on the client's
    workers; check the result against numpy. Returns the chunks, timings and what each
    worker ran with."""
    import dask
    import dask.array as da

    kernel = kernel if kernel is not None else nbjit.compile(SRC)["poly"]
    x = da.random.default_rng(seed).random(n, chunks=chunk, dtype=np.float32)
    # one dask.delayed value: each worker receives the kernel once (passed plainly, it would
    # travel inside every task); it loads on the worker's GPU at its first launch there
    shipped = dask.delayed(kernel, pure=True)
    y = x.map_blocks(poly_chunk, kernel=shipped, dtype=np.float32)
    t0 = time.perf_counter()
    want, got = dask.compute(x, y)
    seconds = time.perf_counter() - t0
    a, b, c = COEFFS
    np.testing.assert_allclose(got, (a * want + b) * want + c, rtol=1e-6)
    return {"chunks": y.npartitions, "seconds": seconds, "workers": client.run(worker_report, kernel)}


def cluster(workers: int, threads: int):
    """A LocalCluster of spawned worker processes (they inherit this environment: NBJIT_HOST)."""
    import dask
    from distributed import LocalCluster
    dask.config.set({"distributed.worker.multiprocessing-method": "spawn"})
    return LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True, dashboard_address=None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=50_000_000, help="values (float32)")
    ap.add_argument("--chunk", type=int, default=5_000_000, help="values per chunk")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (all on the current GPU)")
    ap.add_argument("--threads", type=int, default=2, help="threads per worker (each task has its own stream)")
    a = ap.parse_args()
    if not cuda.is_available():
        raise SystemExit("dask_numba_arrays.py needs a CUDA GPU and driver (examples/inspect_kernels.py runs "
                         "without one)")
    try:
        from distributed import Client
    except ImportError as e:
        raise SystemExit(f"{e}: this example needs Dask: pip install 'dask[array,distributed]'") from None
    try:
        kernel = nbjit.compile(SRC)["poly"]  # NVRTC runs here, once (and is cached on disk)
    except nbjit.NbjitError as e:
        raise SystemExit(str(e)) from None
    with cluster(a.workers, a.threads) as c, Client(c) as client:
        print(f"{len(client.scheduler_info()['workers'])} workers of {a.threads} threads; kernel {kernel}; "
              f"client's arrays from {cuda.__name__}")
        run(client, a.chunk * 2, a.chunk, kernel)  # warm-up: each worker loads the kernel
        r = run(client, a.n, a.chunk, kernel)
    for addr, w in sorted(r["workers"].items()):
        print(f"worker {addr} (pid {w['pid']}): arrays {w['array']}, kernel loaded into {w['context']}, "
              f"numba-cuda imported: {'yes' if w['numba_imported'] else 'no'}")
    print(f"{r['chunks']} chunks of {a.chunk:,} values, {a.n:,} in all: {r['seconds'] * 1e3:.1f} ms (with the "
          f"copies to and from the GPU); result equal to numpy's")
    print(f"client: numba-cuda imported: {'yes' if 'numba' in sys.modules else 'no'}")


if __name__ == "__main__":
    main()
