// A CUB-heavy source (BlockReduce + BlockRadixSort), instantiated by name expressions
// reduce_sort<T, BLOCK, ITEMS>: benchmarks/compile_pch.py and the GPU test of PCH compiles.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_radix_sort.cuh>

template <typename T, int BLOCK, int ITEMS>
__global__ void reduce_sort(const T* in, T* out, T* sums) {
  using Reduce = cub::BlockReduce<T, BLOCK>;
  using Sort = cub::BlockRadixSort<T, BLOCK, ITEMS>;
  __shared__ union { typename Reduce::TempStorage r; typename Sort::TempStorage s; } tmp;
  T items[ITEMS];
  for (int i = 0; i < ITEMS; ++i) items[i] = in[(blockIdx.x * BLOCK + threadIdx.x) * ITEMS + i];
  T s = Reduce(tmp.r).Sum(items[0]);
  __syncthreads();
  Sort(tmp.s).Sort(items);
  for (int i = 0; i < ITEMS; ++i) out[(blockIdx.x * BLOCK + threadIdx.x) * ITEMS + i] = items[i];
  if (threadIdx.x == 0) sums[blockIdx.x] = s;
}
