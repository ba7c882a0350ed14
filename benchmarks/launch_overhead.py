#!/usr/bin/env python3
"""Host microseconds per asynchronous launch of one tiny kernel
``(float* y, const float* x, float a, int n)``, side by side in one process:

* floor: ``cuda.bindings.driver.cuLaunchKernel`` with a pre-packed parameter array
* nbjit with Numba device arrays: ``k[grid, block](y, x, a, n)``
* nbjit with plain integer pointers (what cuda.core needs)
* nbjit bound once (``k.bind(...)``) and relaunched
* Numba ``@cuda.jit`` dispatch of the same computation
* cuda.core ``launch``
* CuPy ``RawKernel`` (where installed)

Each row: the best of ``--repeat`` rounds of ``--batch`` launches (synchronising between
rounds, never inside one, so the queue never fills). Prints a table with each row's
ratio to the floor and writes JSON (``--json``).

    python benchmarks/launch_overhead.py [--batch 500] [--repeat 30] [--json out.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import platform
import time
from pathlib import Path

import numpy as np

N = 1 << 10
GRID, BLOCK = (N + 255) // 256, 256
SRC = r'''
extern "C" __global__ void axpy(float* y, const float* __restrict__ x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''
DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def timeit(fn, sync, batch: int, repeat: int) -> float:
    for _ in range(batch):  # warm up
        fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        t1 = time.perf_counter()
        sync()
        best = min(best, (t1 - t0) / batch)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description="launch overhead, us per launch")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json")
    a = ap.parse_args()

    from cuda.bindings import driver as cu
    from numba import cuda

    import nbjit

    x = cuda.to_device(np.arange(N, dtype=np.float32))
    y = cuda.to_device(np.zeros(N, dtype=np.float32))
    xp, yp = int(x.gpu_data.device_pointer), int(y.gpu_data.device_pointer)
    sync = cuda.synchronize

    mod = nbjit.load(DATA / "nvcc/kernels_sm90.ptx")
    k = mod["k_basic"]
    rows: dict[str, float] = {}

    # the floor: cuLaunchKernel with a parameter array packed once
    vals = [ctypes.c_uint64(yp), ctypes.c_uint64(xp), ctypes.c_float(2.0), ctypes.c_int32(N)]
    arr = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in vals])
    arr_addr = ctypes.addressof(arr)
    func = k.handle
    hstream = cu.CUstream(0)
    launch = cu.cuLaunchKernel

    def floor():
        launch(func, GRID, 1, 1, BLOCK, 1, 1, 0, hstream, arr_addr, 0)

    rows["floor: cuLaunchKernel, pre-packed"] = timeit(floor, sync, a.batch, a.repeat)

    from nbjit import _driver
    fast, handle = _driver.launcher()
    if handle is int:  # nbjit's C launch primitive is built: its own floor
        fh, sh = int(func), int(hstream)
        rows["nbjit C primitive, pre-packed"] = timeit(lambda: fast(fh, GRID, 1, 1, BLOCK, 1, 1, 0, sh, arr_addr),
                                                      sync, a.batch, a.repeat)
    else:
        print("nbjit's C launch extension is not built: nbjit rows use cuda.bindings")

    cfg = k[GRID, BLOCK]
    rows["nbjit, Numba arrays"] = timeit(lambda: cfg(y, x, 2.0, N), sync, a.batch, a.repeat)
    rows["nbjit, Numba arrays, k[g, b](...)"] = timeit(lambda: k[GRID, BLOCK](y, x, 2.0, N), sync, a.batch, a.repeat)
    rows["nbjit, int pointers"] = timeit(lambda: cfg(yp, xp, 2.0, N), sync, a.batch, a.repeat)
    bound = k.bind(GRID, BLOCK, y, x, 2.0, N)
    rows["nbjit, bound once"] = timeit(bound, sync, a.batch, a.repeat)

    @cuda.jit
    def axpy_numba(yy, xx, aa, n):
        i = cuda.grid(1)
        if i < n:
            yy[i] = aa * xx[i] + yy[i]

    nk = axpy_numba[GRID, BLOCK]
    rows["Numba @cuda.jit dispatch"] = timeit(lambda: nk(y, x, np.float32(2.0), np.int32(N)), sync, a.batch,
                                              a.repeat)

    try:
        from cuda.core import Device, LaunchConfig, ObjectCode, launch as core_launch
        dev = Device()
        dev.set_current()
        obj = ObjectCode.from_ptx((DATA / "nvcc/kernels_sm90.ptx").read_bytes())
        ck = obj.get_kernel("k_basic")
        cs = dev.create_stream()
        conf = LaunchConfig(grid=GRID, block=BLOCK)
        a32, n32 = np.float32(2.0), np.int32(N)
        rows["cuda.core launch, int pointers"] = timeit(lambda: core_launch(cs, conf, ck, yp, xp, a32, n32),
                                                        cs.sync, a.batch, a.repeat)
    except Exception as e:  # report, do not hide, a missing or changed cuda.core
        print(f"cuda.core: skipped ({type(e).__name__}: {e})")

    try:
        import cupy as cp
        rk = cp.RawKernel(SRC, "axpy")
        cx, cy = cp.arange(N, dtype=cp.float32), cp.zeros(N, dtype=cp.float32)
        a32, n32 = np.float32(2.0), np.int32(N)
        rows["CuPy RawKernel"] = timeit(lambda: rk((GRID,), (BLOCK,), (cy, cx, a32, n32)),
                                        cp.cuda.Device().synchronize, a.batch, a.repeat)
    except ImportError:
        print("CuPy: not installed, skipped")

    base = rows["floor: cuLaunchKernel, pre-packed"]
    print(f"{'':40}{'us/launch':>10}{'x floor':>9}")
    for name, us in rows.items():
        print(f"{name:40}{us:10.2f}{us / base:9.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "rows": {k2: {"us": v, "ratio": v / base} for k2, v in rows.items()},
            "batch": a.batch, "repeat": a.repeat, "python": platform.python_version(),
            "gpu": cuda.get_current_device().name.decode() if isinstance(cuda.get_current_device().name, bytes)
            else str(cuda.get_current_device().name)}, indent=2))


if __name__ == "__main__":
    main()
