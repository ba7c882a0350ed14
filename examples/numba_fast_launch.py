"""A @cuda.jit kernel launched 10,000 times by Numba and by nbjit: the same results, and the
host time each launcher takes (needs a GPU).

    python examples/numba_fast_launch.py
    NBJIT_HOST=numba-cuda-mlir python examples/numba_fast_launch.py   # numba-cuda-mlir's @cuda.jit
"""
import os
import time

import numpy as np

if os.environ.get("NBJIT_HOST") == "numba-cuda-mlir":
    from numba_cuda_mlir import cuda
    from numba_cuda_mlir.numba_cuda import types
else:
    from numba import cuda, types

import nbjit

if not cuda.is_available():
    raise SystemExit("numba_fast_launch.py needs a CUDA GPU and driver (examples/inspect_kernels.py runs without one)")


@cuda.jit
def step(y, x, a):
    i = cuda.grid(1)
    if i < y.shape[0]:
        y[i] = a * x[i] + y[i]


def run(launch, y, x, times: int) -> float:
    cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(times):
        launch(y, x, np.float32(0.5))
    cuda.synchronize()
    return (time.perf_counter() - t0) / times * 1e6


def main() -> None:
    n, times = 4096, 10_000
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    by_numba, by_nbjit = cuda.to_device(np.zeros(n, np.float32)), cuda.to_device(np.zeros(n, np.float32))
    grid, block = (n + 255) // 256, 256

    numba_launch = step[grid, block]
    fast = nbjit.from_numba(step, (types.float32[::1], types.float32[::1], types.float32))
    nbjit_launch = fast[grid, block]
    numba_launch(by_numba, x, np.float32(0.5))  # compile and warm both up
    nbjit_launch(by_nbjit, x, np.float32(0.5))

    t_numba = run(numba_launch, by_numba, x, times)
    t_nbjit = run(nbjit_launch, by_nbjit, x, times)
    a, b = by_numba.copy_to_host(), by_nbjit.copy_to_host()
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a, 0.5 * (times + 1) * np.arange(n), rtol=1e-3)  # float32 sums
    print(f"{times} launches of {fast.name[:40]}...: results equal")
    print(f"Numba dispatch  {t_numba:7.2f} us per launch (host + GPU, end to end)")
    print(f"nbjit           {t_nbjit:7.2f} us per launch ({t_numba / t_nbjit:.1f}x faster)")


if __name__ == "__main__":
    main()
