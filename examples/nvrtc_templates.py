"""Compile a templated CUDA C++ kernel at run time for two types and run both on Numba arrays.

    python examples/nvrtc_templates.py

The first run compiles with NVRTC; later runs (even in new processes) load the cubin from
nbjit's disk cache (`nbjit cache info` shows where).
"""
import time

import numpy as np
from numba import cuda

import nbjit

if not cuda.is_available():
    raise SystemExit("nvrtc_templates.py needs a CUDA GPU and driver (examples/inspect_kernels.py runs without one)")

SOURCE = r'''
#include "ops.cuh"

template <typename T>
__global__ void axpby(T* out, const T* x, const T* y, T a, T b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = lerp_like(x[i], y[i], a, b);
}
'''
HEADERS = {"ops.cuh": "template <typename T> __device__ T lerp_like(T x, T y, T a, T b) { return a * x + b * y; }\n"}

cuda.current_context()  # create the CUDA context first: it is not part of compiling
t0 = time.perf_counter()
module = nbjit.compile(SOURCE, name="axpby.cu", headers=HEADERS,
                       name_expressions=["axpby<float>", "axpby<double>"], options=["-std=c++17"])
print(f"compiled (or loaded from the cache) in {1e3 * (time.perf_counter() - t0):.1f} ms: "
      f"{module.image.lowered_names}")

n = 100_000
threads, blocks = 256, (n + 255) // 256
for dtype, expr in ((np.float32, "axpby<float>"), (np.float64, "axpby<double>")):
    x = np.random.default_rng(0).random(n).astype(dtype)
    y = np.random.default_rng(1).random(n).astype(dtype)
    out = cuda.device_array(n, dtype)
    module[expr][blocks, threads](out, cuda.to_device(x), cuda.to_device(y), dtype(2.0), dtype(-0.5), n)
    expected = dtype(2.0) * x + dtype(-0.5) * y
    assert np.allclose(out.copy_to_host(), expected, rtol=1e-6), expr
    print(f"{expr}: checked {n} elements against numpy")
