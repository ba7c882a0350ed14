// Programmatic dependent launch: a producer/consumer pair and a kernel that does not take
// part. Compiled by make_fixtures.py (nvcc -ptx / -cubin for sm_90).

// producer: y[i] = 2 x[i] + 1, after the grid before it (if any) has finished its writes;
// lets the next grid start once its own writes are issued (CUDA's device runtime calls)
extern "C" __global__ void pdl_producer(float* y, const float* x, int n) {
    cudaGridDependencySynchronize();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i] + 1.0f;
    cudaTriggerProgrammaticLaunchCompletion();
}

// the wait in a function of its own (not inlined): the kernel runs it all the same
__device__ __noinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// consumer: z[i] = y[i] + 3, reading what the producer wrote
extern "C" __global__ void pdl_consumer(float* z, const float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    wait_for_previous_grid();
    if (i < n) z[i] = y[i] + 3.0f;
}

// no griddepcontrol: launched plainly by default
extern "C" __global__ void pdl_none(float* z, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = 0.0f;
}
