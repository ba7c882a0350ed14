#!/usr/bin/env python3
"""TMA on Hopper: a matrix copied tile by tile through a tensor map (``cp.async.bulk.tensor``)
into an output padded to whole tiles; the tensor map fills what lies outside the matrix with
zeros. The kernel is CUDA C++ (tests/data/src/tma.cu) compiled with nbjit.compile; the result is
checked against numpy.

    python examples/tma_tiles.py [ROWS COLS]     (COLS a multiple of 4: rows of 16-byte multiples)
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import nbjit

# the kernel: tests/data/src/tma.cu, a template over element type and tile (one block per tile:
# thread 0 asks the TMA unit for the tile with cp.async.bulk.tensor and an mbarrier, every
# thread waits for it, then stores it to the output)
SRC = Path(__file__).resolve().parent.parent / "tests/data/src/tma.cu"
KERNEL = "tma_tile<float, 32, 32>"
TILE = (32, 32)


def main() -> int:
    rows, cols = (int(v) for v in sys.argv[1:3]) if len(sys.argv) >= 3 else (1000, 1000)
    from numba import cuda
    if not cuda.is_available():
        print("tma_tiles.py needs a CUDA GPU and driver (examples/inspect_kernels.py runs without one)",
              file=sys.stderr)
        return 1
    dev = cuda.get_current_device()
    if dev.compute_capability < (9, 0):
        major, minor = dev.compute_capability
        print(f"tma_tiles: TMA needs an sm_90 (Hopper) or newer GPU; this one is sm_{major}{minor}", file=sys.stderr)
        return 1
    copy_tiles = nbjit.compile(SRC.read_text(), name=SRC.name, name_expressions=[KERNEL])[KERNEL]
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
