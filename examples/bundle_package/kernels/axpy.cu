// The demo package's kernels: compiled into src/nbjit_demo_kernels/kernels.nbjit by
// build_bundle.py (cubins for sm_80, sm_90, sm_100, sm_120 and PTX for compute_80).

// y = a * x + y
extern "C" __global__ void axpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

// x = s * x, for any element type (instantiated by name expressions: scale<float>, scale<double>)
template <typename T>
__global__ void scale(T* x, T s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}
