"""@cuda.jit kernels that tests put in bundles (tests/test_numba_kernels.py builds them on a CPU;
tests/test_gpu_bare.py launches them without Numba). Written for numba-cuda; the tests make
numba-cuda-mlir's twin by importing ``cuda`` from numba_cuda_mlir instead (the first line)."""
from numba import cuda
import numpy as np

POINT = np.dtype([("x", np.float32), ("w", np.int32)], align=True)


@cuda.jit(device=True)
def twice(v):
    return v + v


@cuda.jit
def axpy(out, a, x, y):
    """out = a x + y, through a device function."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * twice(x[i]) * 0.5 + y[i]


@cuda.jit(fastmath=True, lineinfo=True)
def rowsum(m, out):
    """out[r] = sum of row r (one block per row, a shared and a local array)."""
    tmp = cuda.shared.array(128, np.float64)
    loc = cuda.local.array(2, np.float64)
    r, t = cuda.blockIdx.x, cuda.threadIdx.x
    loc[0] = 0.0
    for j in range(t, m.shape[1], cuda.blockDim.x):
        loc[0] += m[r, j]
    tmp[t] = loc[0]
    cuda.syncthreads()
    if t == 0:
        s = 0.0
        for k in range(cuda.blockDim.x):
            s += tmp[k]
        out[r] = s


@cuda.jit
def scale_int(a, k):
    """a *= k, for integer arrays."""
    i = cuda.grid(1)
    if i < a.size:
        a[i] *= k


@cuda.jit
def weigh(points, out):
    """out[i] = x * w of each record."""
    i = cuda.grid(1)
    if i < points.size:
        out[i] = points[i].x * points[i].w


@cuda.jit
def shout(a):
    """print from the device (vprintf: the driver's)."""
    if cuda.grid(1) == 0:
        print("first item", a[0])


@cuda.jit(debug=True, opt=False)
def checked(a):
    a[0] = 1


@cuda.jit
def grid_wide(a):
    cuda.cg.this_grid().sync()
    a[0] = 1


SIGNATURES = {
    "axpy": "void(float32[::1], float32, float32[::1], float32[::1])",
    "rowsum": "void(float64[:, :], float64[::1])",
    "scale_int": "void(int64[::1], int64)",
    "shout": "void(float32[::1])",
}
