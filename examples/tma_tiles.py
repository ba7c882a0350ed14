#!/usr/bin/env python3
"""TMA on Hopper: a matrix copied tile by tile through a tensor map (``cp.async.bulk.tensor``)
into an output padded to whole tiles; the tensor map fills what lies outside the matrix with
zeros. The kernel is CUDA C++ compiled with nbjit.compile; the result is checked against numpy.

    python examples/tma_tiles.py [ROWS COLS]     (COLS a multiple of 4: rows of 16-byte multiples)
"""
from __future__ import annotations

import sys

import numpy as np

import nbjit

SRC = r'''
struct alignas(64) CUtensorMap_st { unsigned long long opaque[16]; };  // as cuda.h declares it
typedef CUtensorMap_st CUtensorMap;

constexpr int BR = 32, BC = 32;  // the tile: 32 rows of 32 floats

extern "C" __global__ void copy_tiles(const __grid_constant__ CUtensorMap src, float* out, int out_cols) {
    __shared__ alignas(128) float tile[BR * BC];
    __shared__ alignas(8) unsigned long long bar;
    const int x = blockIdx.x * BC, y = blockIdx.y * BR;
    const unsigned smem_tile = static_cast<unsigned>(__cvta_generic_to_shared(tile));
    const unsigned smem_bar = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_bar));
        asm volatile("fence.proxy.async.shared::cta;");
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // one thread asks the TMA unit for the whole tile
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(smem_bar), "r"((unsigned)sizeof(tile)) : "memory");
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1, {%2, %3}], [%4];"
                     :: "r"(smem_tile), "l"(reinterpret_cast<unsigned long long>(&src)), "r"(x), "r"(y),
                        "r"(smem_bar) : "memory");
    }
    unsigned done = 0;
    while (!done)  // every thread waits for the tile's bytes to arrive
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(smem_bar) : "memory");
    for (int i = threadIdx.x; i < BR * BC; i += blockDim.x)
        out[(long long)(y + i / BC) * out_cols + (x + i % BC)] = tile[i];
}
'''
TILE = (32, 32)


def main() -> int:
    rows, cols = (int(v) for v in sys.argv[1:3]) if len(sys.argv) >= 3 else (1000, 1000)
    from numba import cuda
    if not cuda.is_available():
        print("tma_tiles: needs a CUDA GPU", file=sys.stderr)
        return 1
    dev = cuda.get_current_device()
    if dev.compute_capability < (9, 0):
        major, minor = dev.compute_capability
        print(f"tma_tiles: TMA needs an sm_90 (Hopper) or newer GPU; this one is sm_{major}{minor}", file=sys.stderr)
        return 1
    copy_tiles = nbjit.compile(SRC, name="tma_tiles.cu")["copy_tiles"]
    print("kernel:", copy_tiles)

    a = np.random.default_rng(0).random((rows, cols), dtype=np.float32)
    src = cuda.to_device(a)
    try:
        tm = nbjit.tensor_map(src, TILE, oob_fill="zero")  # the driver's rules are checked first
    except nbjit.NbjitArgumentError as e:
        print(f"tma_tiles: {e}", file=sys.stderr)
        return 2
    grid = (-(-cols // TILE[1]), -(-rows // TILE[0]))  # x: tile columns, y: tile rows
    out = cuda.to_device(np.full((grid[1] * TILE[0], grid[0] * TILE[1]), -1, np.float32))
    copy_tiles[grid, 128](tm, out, grid[0] * TILE[1])
    got = out.copy_to_host()

    assert np.array_equal(got[:rows, :cols], a), "the copied matrix differs"
    assert not got[rows:, :].any() and not got[:rows, cols:].any(), "the padding is not zero"
    print(f"copied a {rows} x {cols} float32 matrix in {grid[0] * grid[1]} tiles of {TILE[0]} x {TILE[1]}; "
          f"padded to {got.shape[0]} x {got.shape[1]} with zeros; equal to numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
