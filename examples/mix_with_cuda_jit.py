"""Mix an nbjit kernel (nvcc PTX) with Numba @cuda.jit kernels on the same arrays and stream.

    python examples/mix_with_cuda_jit.py
    NBJIT_HOST=numba-cuda-mlir python examples/mix_with_cuda_jit.py   # numba-cuda-mlir's @cuda.jit

Pipeline on one stream: @cuda.jit fills x and y, the nvcc kernel computes y = 3*x + y,
@cuda.jit squares y; every element is checked against numpy. The same code runs with
numba-cuda (``from numba import cuda``) or numba-cuda-mlir (``from numba_cuda_mlir import
cuda``): nbjit serves the one imported.
"""
import os
from pathlib import Path

import numpy as np

if os.environ.get("NBJIT_HOST") == "numba-cuda-mlir":
    from numba_cuda_mlir import cuda
else:
    from numba import cuda

import nbjit

if not cuda.is_available():
    raise SystemExit("mix_with_cuda_jit.py needs a CUDA GPU and driver (examples/inspect_kernels.py runs without one)")

PTX = Path(__file__).resolve().parent.parent / "tests/data/nvcc/kernels_sm90.ptx"
axpy = nbjit.load(PTX)["k_basic"]


@cuda.jit
def iota(a, scale):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = i * scale


@cuda.jit
def square(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = a[i] * a[i]


n = 1 << 20
stream = cuda.stream()
x = cuda.device_array(n, np.float32, stream=stream)
y = cuda.device_array(n, np.float32, stream=stream)
blocks, threads = (n + 255) // 256, 256

iota[blocks, threads, stream](x, 1.0)
iota[blocks, threads, stream](y, 0.5)
axpy[blocks, threads, stream](y, x, 3.0, n)       # nbjit kernel, same stream, same arrays
square[blocks, threads, stream](y)
result = y.copy_to_host(stream=stream)
stream.synchronize()

i = np.arange(n, dtype=np.float32)
expected = (3 * i + 0.5 * i) ** 2
assert np.array_equal(result, expected), "mismatch"
print(f"checked {n} elements of a @cuda.jit -> nbjit -> @cuda.jit pipeline on one stream against numpy "
      f"({cuda.__name__.split('.')[0].replace('_', '-')}'s @cuda.jit)")
