// Test kernels for nbjit's fixtures (compiled by tests/data/make_fixtures.py).
#include <cuda_fp16.h>
#include <cuda_bf16.h>

struct S24 { double d; int i; float f; long long l; };
struct Arr5 { int v[5]; };

__device__ float g_arr[16] = {1.0f, 2.0f, 3.0f};
__device__ unsigned int g_counter;
__constant__ float c_tab[8] = {0.5f, 1.5f};

__device__ __noinline__ float helper(float v) { return v * 2.0f + c_tab[0]; }

extern "C" __global__ void k_basic(float* y, const float* __restrict__ x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void k_struct(S24 s, double* out) {
    out[0] = s.d + s.i + s.f + (double)s.l;
}

extern "C" __global__ void k_arr(Arr5 a, int* out) {
    out[threadIdx.x % 5] = a.v[threadIdx.x % 5];
}

extern "C" __global__ void __launch_bounds__(256, 2) k_lb(float* out, const float* in) {
    __shared__ float tile[256];
    tile[threadIdx.x] = in[blockIdx.x * 256 + threadIdx.x];
    __syncthreads();
    out[blockIdx.x * 256 + threadIdx.x] = helper(tile[255 - threadIdx.x]);
}

extern "C" __global__ void k_dyn(float* out, int n) {
    extern __shared__ float dsm[];
    int t = threadIdx.x;
    if (t < n) dsm[t] = (float)t;
    __syncthreads();
    if (t < n) out[t] = dsm[n - 1 - t];
}

extern "C" __global__ void k_small(__half h, __nv_bfloat16 b, bool flag, char c, short s, float* out) {
    out[0] = __half2float(h) + __bfloat162float(b) + (flag ? 1.0f : 0.0f) + c + s;
}

extern "C" __global__ void k_widths(signed char i8, unsigned char u8, short i16, unsigned short u16,
                                    int i32, unsigned int u32, long long i64, unsigned long long u64,
                                    float f32, double f64, double* out) {
    out[0] = i8; out[1] = u8; out[2] = i16; out[3] = u16; out[4] = i32;
    out[5] = u32; out[6] = (double)i64; out[7] = (double)u64; out[8] = f32; out[9] = f64;
}

extern "C" __global__ void k_globals(float* out) {
    int i = threadIdx.x;
    if (i < 16) out[i] = g_arr[i] + c_tab[i % 8];
    if (i == 0) atomicAdd(&g_counter, 1u);
}

template <typename T>
__global__ void k_tmpl(T* out, T v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v * (T)i;
}
template __global__ void k_tmpl<float>(float*, float, int);
template __global__ void k_tmpl<int>(int*, int, int);

__global__ void k_mangled(int* p) { p[0] = 42; }
