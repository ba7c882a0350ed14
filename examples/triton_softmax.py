"""Run Triton's row softmax, compiled ahead of time (tests/data/triton/softmax_kernel, made by
Triton 3.9 for sm_90), on Numba device arrays, without importing Triton.

    python examples/triton_softmax.py
"""
from pathlib import Path

import numpy as np
from numba import cuda

import nbjit

if not cuda.is_available():
    raise SystemExit("triton_softmax.py needs a CUDA GPU and driver (examples/inspect_kernels.py runs without one)")

ENTRY = Path(__file__).resolve().parent.parent / "tests/data/triton/softmax_kernel"

softmax = nbjit.load_triton(ENTRY)  # reads softmax_kernel.json beside the .cubin / .ptx
print(softmax, "| launch rules:", softmax.rules)

rows, cols = 1024, 781  # the kernel was compiled with BLOCK=1024: up to 1024 columns
x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
d_x = cuda.to_device(x)
d_y = cuda.device_array_like(d_x)

# Triton's grid convention: one program per row; arguments are the runtime ones only
softmax[rows](d_y, d_x, d_x.strides[0] // 4, d_y.strides[0] // 4, cols)

e = np.exp(x - x.max(axis=1, keepdims=True))
expected = e / e.sum(axis=1, keepdims=True)
result = d_y.copy_to_host()
assert np.allclose(result, expected, rtol=1e-5, atol=1e-7), "mismatch"
print(f"checked a {rows}x{cols} softmax against numpy: max error {np.abs(result - expected).max():.2e}")
