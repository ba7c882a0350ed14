// Kernels with known resource use, for spill, stack and occupancy tests (make_fixtures.py nvrtc).
// spills: __launch_bounds__(1024, 2) caps it at 32 registers on sm_80/sm_90; its 48 live values
// do not fit, so ptxas spills them to the stack.
extern "C" __global__ void __launch_bounds__(1024, 2) spills(float* out, const float* in, int n) {
  float acc[48];
#pragma unroll
  for (int i = 0; i < 48; ++i) acc[i] = in[threadIdx.x + i * n];
#pragma unroll
  for (int j = 0; j < 3; ++j)
#pragma unroll
    for (int i = 0; i < 48; ++i) acc[i] = acc[i] * acc[(i + j + 7) % 48] + 1.0f;
  float s = 0;
#pragma unroll
  for (int i = 0; i < 48; ++i) s += acc[i] * in[i];
  out[threadIdx.x] = s;
}

// local_array: a dynamically indexed array lives on the stack (a frame, no spills)
extern "C" __global__ void local_array(int* out, const int* idx, int n) {
  int a[32];
  for (int i = 0; i < 32; ++i) a[i] = idx[i];
  for (int i = 0; i < n; ++i) a[idx[i] & 31] += i;
  out[threadIdx.x] = a[threadIdx.x & 31];
}

// tiled: static shared memory and a light register load
extern "C" __global__ void tiled(float* out, const float* in) {
  __shared__ float tile[2048];
  tile[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = tile[(threadIdx.x + 1) % blockDim.x];
}

// plain: nothing special
extern "C" __global__ void plain(float* out) { out[threadIdx.x] = 1.0f; }
