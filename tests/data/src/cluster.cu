// sm_90 kernels with cluster and register directives (tests/data/make_fixtures.py).
extern "C" __global__ void __cluster_dims__(2, 1, 1) k_cluster(float* out) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = (float)blockIdx.x;
}

extern "C" __global__ void __launch_bounds__(128, 1, 4) k_rank(float* out) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}

extern "C" __global__ void __maxnreg__(32) k_maxnreg(float* out, float v) {
    out[threadIdx.x] = v;
}
