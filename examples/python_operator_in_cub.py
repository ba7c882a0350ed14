"""A CUB block reduction whose operator is a Python function: Numba compiles the function to
LTO-IR, NVRTC compiles the CUB template to LTO-IR, nvJitLink links the two (inlining the
operator into CUB's code), and nbjit caches every step.

    python examples/python_operator_in_cub.py

Needs a GPU and CUB's headers (CCCL: pip install nvidia-cuda-cccl; nbjit-core's cu13 extra brings
them). The first run compiles (CUB takes NVRTC seconds); a call again, or a later process,
reads nbjit's cache; a new operator compiles only itself and links again.
"""
import time

import numpy as np
from numba import cuda

import nbjit

if not cuda.is_available():
    raise SystemExit("python_operator_in_cub.py needs a CUDA GPU and driver (examples/inspect_kernels.py runs "
                     "without one)")

SOURCE = r'''
#include <cub/block/block_reduce.cuh>

extern "C" __device__ float combine(float a, float b);   // defined by the Python function linked in

struct Combine {
    __device__ float operator()(const float& a, const float& b) const { return combine(a, b); }
};

template <typename Op, int BLOCK>
__global__ void reduce(const float* in, float* partial, int n, float init) {
    using BlockReduce = cub::BlockReduce<float, BLOCK>;
    __shared__ typename BlockReduce::TempStorage tmp;
    Op op;
    float acc = init;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) acc = op(acc, in[i]);
    float r = BlockReduce(tmp).Reduce(acc, op);
    if (threadIdx.x == 0) partial[blockIdx.x] = r;
}
'''
EXPR = "reduce<Combine, 256>"


def absmax(a, b):
    return max(abs(a), abs(b))


def add(a, b):
    return a + b


def build(op):
    """The reduction with ``op`` linked in as combine(); seconds taken."""
    t0 = time.perf_counter()
    try:
        module = nbjit.compile(SOURCE, name="cub_reduce.cu", name_expressions=[EXPR],
                               link=[(op, "float32(float32, float32)", "combine")])
    except nbjit.CompileFailure as e:
        if "cannot open source file" in e.log and "cub/" in e.log:
            raise SystemExit("python_operator_in_cub.py needs CUB's headers (CCCL), which this CUDA install does "
                             "not have: pip install nvidia-cuda-cccl (nbjit-core's cu13 extra brings it)") from None
        raise
    return module[EXPR], time.perf_counter() - t0


cuda.current_context()  # create the CUDA context first: it is not part of compiling
n, blocks = 10_000_000, 264
x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
d_x, partial = cuda.to_device(x), cuda.device_array(blocks, np.float32)

kernel, first = build(absmax)
_, again = build(absmax)
print(f"absmax: compiled in {1e3 * first:.0f} ms (Numba, NVRTC with CUB, nvJitLink; or nbjit's cache on a later "
      f"run), again in {1e3 * again:.2f} ms (cached)")
kernel[blocks, 256](d_x, partial, n, np.float32(0))
assert partial.copy_to_host().max() == np.abs(x).max()
print(f"absmax: checked the reduction of {n} floats against numpy ({np.abs(x).max():.4f})")

kernel, new = build(add)
print(f"add: a new operator in {1e3 * new:.0f} ms (Numba and nvJitLink: the CUB source's compile is reused)")
kernel[blocks, 256](d_x, partial, n, np.float32(0))
total = partial.copy_to_host().astype(np.float64).sum()
assert np.isclose(total, x.astype(np.float64).sum(), rtol=1e-3, atol=1e-2), (total, x.sum())
print(f"add: checked the sum of {n} floats against numpy ({total:.2f})")
