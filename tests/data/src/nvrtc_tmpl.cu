// NVRTC fixture: templates instantiated through name expressions, a header from memory.
#include "scale.cuh"

namespace ns {
template <typename T, int N>
__global__ void op(T* out, const T* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = scale<T>(in[i], N);
}
}

template <typename T>
__global__ void fill(T* out, T value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}

extern "C" __global__ void plain(int* p) { p[threadIdx.x] = threadIdx.x; }
