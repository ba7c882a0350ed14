"""Quick start: run a kernel that nvcc compiled to PTX on Numba device arrays.

    python examples/quickstart.py

The PTX is tests/data/nvcc/kernels_sm90.ptx, made by `nvcc -ptx -arch=sm_90` from
tests/data/src/kernels.cu; its kernel is
    extern "C" __global__ void k_basic(float* y, const float* x, float a, int n)  // y = a*x + y
"""
from pathlib import Path

import numpy as np
from numba import cuda

import nbjit

if not cuda.is_available():
    raise SystemExit("quickstart.py needs a CUDA GPU and driver (examples/inspect_kernels.py runs without one)")

PTX = Path(__file__).resolve().parent.parent / "tests/data/nvcc/kernels_sm90.ptx"

module = nbjit.load(PTX)
print(f"loaded {module.name}: kernels {', '.join(module.kernels[:4])}, ...")
axpy = module["k_basic"]
print("signature:", axpy.signature, "| registers:", axpy.attributes.registers)

n = 1_000_000
x = np.random.default_rng(1).random(n, dtype=np.float32)
y = np.ones(n, dtype=np.float32)
d_x, d_y = cuda.to_device(x), cuda.to_device(y)

threads = 256
blocks = (n + threads - 1) // threads
axpy[blocks, threads](d_y, d_x, np.float32(2.0), n)   # Numba's launch syntax

result = d_y.copy_to_host()
expected = 2.0 * x + y
assert np.allclose(result, expected), "mismatch"
print(f"checked y = 2*x + y on {n} elements against numpy: max error {np.abs(result - expected).max():.2e}")
