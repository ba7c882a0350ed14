// Copies 2-D tiles of a tensor through TMA (cp.async.bulk.tensor) into a padded output:
// each block loads one box of `src` into shared memory, waits on an mbarrier, and writes it
// out with plain stores, so out-of-bounds elements show the tensor map's fill value.
struct alignas(64) CUtensorMap_st { unsigned long long opaque[16]; };
typedef CUtensorMap_st CUtensorMap;

template <typename T, int BR, int BC>
__global__ void tma_tile(const __grid_constant__ CUtensorMap src, T* out, int out_cols) {
    __shared__ alignas(128) T tile[BR * BC];
    __shared__ alignas(8) unsigned long long bar;
    const int x = blockIdx.x * BC, y = blockIdx.y * BR;
    const unsigned smem_tile = static_cast<unsigned>(__cvta_generic_to_shared(tile));
    const unsigned smem_bar = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_bar));
        asm volatile("fence.proxy.async.shared::cta;");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(smem_bar), "r"((unsigned)(BR * BC * sizeof(T))) : "memory");
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1, {%2, %3}], [%4];"
                     :: "r"(smem_tile), "l"(reinterpret_cast<unsigned long long>(&src)), "r"(x), "r"(y),
                        "r"(smem_bar) : "memory");
    }
    unsigned done = 0;
    while (!done) {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(smem_bar) : "memory");
    }
    for (int i = threadIdx.x; i < BR * BC; i += blockDim.x) {
        const int r = i / BC, c = i % BC;
        out[(long long)(y + r) * out_cols + (x + c)] = tile[i];
    }
}
