// A block-level reduction template whose operator comes from a link (nbjit.compile(...,
// link=[...])): Op is a functor whose operator() calls an extern "C" __device__ function that
// another input defines (a Python function compiled by Numba, LTO-IR, C++). No CUB needed.
// Used by tests/test_link.py, tests/test_gpu_link.py and benchmarks/link_lto.py.

template <typename T, typename Op, int BLOCK>
__global__ void block_reduce(const T* in, T* out, int n, T init) {
    __shared__ T part[BLOCK];
    Op op;
    T acc = init;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) acc = op(acc, in[i]);
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] = op(part[threadIdx.x], part[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}

// out[i] = f(x[i], k[i]): a two-argument operator of two types, element by element
template <typename T, typename K, typename F>
__global__ void transform2(T* out, const T* x, const K* k, int n) {
    F f;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f(x[i], k[i]);
}
