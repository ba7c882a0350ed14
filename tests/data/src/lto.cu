// A kernel and an extern "C" device function (tests/data/make_fixtures.py): a fatbin holding
// an sm_90 cubin beside an lto_90 entry (loads: the cubin), and relocatable LTO-IR alone (a
// link input that defines triple()), and a host object with relocatable device code (nvcc -dc).
extern "C" __device__ float triple(float x) { return 3.0f * x; }

extern "C" __global__ void k_triple(float* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = triple(in[i]);
}
