// A CCCL-heavy source of another shape than cub_reduce_sort.cu: CUB's BlockLoad, BlockScan,
// BlockStore and WarpReduce with cuda::std (functional, limits, tuple), instantiated by name
// expressions scan_kernel<T, BLOCK, ITEMS>: benchmarks/compile_pch.py.
#include <cub/block/block_load.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/block/block_store.cuh>
#include <cub/warp/warp_reduce.cuh>
#include <cuda/std/functional>
#include <cuda/std/limits>
#include <cuda/std/tuple>

template <typename T, int BLOCK, int ITEMS>
__global__ void scan_kernel(const T* in, T* out, T* maxima, int n) {
  using Load = cub::BlockLoad<T, BLOCK, ITEMS, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  using Scan = cub::BlockScan<T, BLOCK>;
  using Store = cub::BlockStore<T, BLOCK, ITEMS, cub::BLOCK_STORE_WARP_TRANSPOSE>;
  using Warp = cub::WarpReduce<T>;
  __shared__ union {
    typename Load::TempStorage load;
    typename Scan::TempStorage scan;
    typename Store::TempStorage store;
    typename Warp::TempStorage warp[BLOCK / 32];
  } tmp;
  T items[ITEMS];
  const int base = blockIdx.x * BLOCK * ITEMS;
  Load(tmp.load).Load(in + base, items, n - base, cuda::std::numeric_limits<T>::lowest());
  __syncthreads();
  T total;
  Scan(tmp.scan).InclusiveScan(items, items, cuda::std::plus<T>{}, total);
  __syncthreads();
  Store(tmp.store).Store(out + base, items, n - base);
  __syncthreads();
  auto best = cuda::std::make_tuple(items[0], threadIdx.x);
  T m = Warp(tmp.warp[threadIdx.x / 32]).Reduce(cuda::std::get<0>(best), cuda::maximum<T>{});
  if (threadIdx.x % 32 == 0) maxima[blockIdx.x * (BLOCK / 32) + threadIdx.x / 32] = m + total * T(0);
}
