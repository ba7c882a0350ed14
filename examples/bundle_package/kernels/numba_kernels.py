"""The demo package's @cuda.jit kernel: compiled by Numba into src/nbjit_demo_kernels/kernels.nbjit
(image "scale_rows") by build_bundle.py, so that the package's users launch it without Numba."""
from numba import cuda


@cuda.jit
def scale_rows(m, factors):
    """m[i, j] *= factors[i]: any 2-D float32 array (C- or F-ordered, or a strided view)."""
    i, j = cuda.grid(2)
    if i < m.shape[0] and j < m.shape[1]:
        m[i, j] *= factors[i]


SIGNATURE = "void(float32[:, :], float32[::1])"
