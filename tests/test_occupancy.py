"""nbjit.read.occupancy: CUDA's occupancy rules without a GPU, on real cubins' kernels (the GPU
test compares every sm_90 fixture kernel with cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
from __future__ import annotations

import dataclasses
import math

import pytest

from nbjit import NbjitArgumentError, NbjitError
from nbjit.read.cubin import inspect_cubin
from nbjit.read.occupancy import occupancy, sm_limits

from conftest import DATA  # noqa: E402

SPILL90 = inspect_cubin((DATA / "nvrtc/spill_sm90.cubin").read_bytes())
MATMUL = inspect_cubin((DATA / "triton/matmul_kernel/matmul_kernel.cubin").read_bytes()).entries[0]


def test_warps_limit_a_light_kernel():
    o = occupancy(SPILL90.entry("plain"), "sm_90", 256)
    assert (o.blocks_per_sm, o.warps_per_sm, o.max_warps_per_sm, o.limited_by) == (8, 64, 64, ("warps",))
    assert o.occupancy == 1.0


def test_registers_are_allocated_per_warp_and_sub_partition():
    # 255 registers -> 8192 per warp (units of 256); 16384 per sub-partition: 2 warps each, 8 an SM
    assert MATMUL.registers == 255
    o = occupancy(MATMUL, "sm_90a", 256)
    assert (o.blocks_per_sm, o.limits["registers"], o.registers_per_block) == (1, 1, 8 * 8192)
    assert o.limited_by == ("registers",)
    assert occupancy(MATMUL, "sm_90", 96).blocks_per_sm == 2  # 3 warps: 8 // 3
    # a block needing more registers than the SM has does not fit
    assert occupancy(MATMUL, "sm_90", 512).blocks_per_sm == 0


def test_shared_memory_counts_the_reserve_and_its_unit():
    tiled = SPILL90.entry("tiled")
    assert tiled.shared == 8192
    o = occupancy(tiled, "sm_90", 32, 1000)
    # 8192 + 1000 + 1024 reserved = 10216 -> 10240 (units of 128); 228 KiB // 10240 = 22
    assert (o.shared_per_block, o.limits["shared"], o.blocks_per_sm) == (10240, 22, 22)
    assert o.limited_by == ("shared",)
    # beyond 48 KiB a block needs the kernel's opt-in
    assert occupancy(tiled, "sm_90", 256, 60000).blocks_per_sm == 0
    assert occupancy(tiled, "sm_90", 256, 60000, max_dynamic_shared=60000).blocks_per_sm == 3
    assert occupancy(tiled, "sm_90", 256, 60001, max_dynamic_shared=60000).blocks_per_sm == 0
    # sm_86 has 100 KiB an SM and 16 block slots
    assert occupancy(tiled, "sm_86", 32, 1000).blocks_per_sm == 10


def test_block_limits_per_architecture():
    plain = SPILL90.entry("plain")
    assert occupancy(plain, "sm_90", 32).blocks_per_sm == 32
    assert occupancy(plain, "sm_89", 32).blocks_per_sm == 24
    assert occupancy(plain, "sm_86", 1024).blocks_per_sm == 1  # 1536 threads an SM
    assert occupancy(plain, "sm_90", 1025).blocks_per_sm == 0
    assert occupancy(plain, "sm_90", (16, 16)).block == 256


def test_barriers_count_from_sm90():
    plain = SPILL90.entry("plain")
    four = dataclasses.replace(plain, barriers=4)
    assert occupancy(four, "sm_90", 32).limits["barriers"] == 16  # 32 slots x 2 // 4
    assert occupancy(four, "sm_90", 32).blocks_per_sm == 16
    assert "barriers" not in occupancy(four, "sm_80", 32).limits


def test_json():
    j = occupancy(SPILL90.entry("spills"), "sm_90", 1024).to_json()
    assert j["blocks_per_sm"] == 2 and j["limited_by"] == ["warps", "registers"] and j["occupancy"] == 1.0


@pytest.mark.parametrize("args,match", [
    ((0,), "block must be"), (((1, 2, 3, 4),), "block must be"), ((True,), "block must be"),
    ((32, -1), "dynamic shared"), ((32, 1.5), "dynamic shared"),
])
def test_bad_arguments(args, match):
    with pytest.raises(NbjitArgumentError, match=match):
        occupancy(SPILL90.entry("plain"), "sm_90", *args)


def test_unknown_architecture_and_ptx_kernel():
    with pytest.raises(NbjitArgumentError, match="no SM limits for sm_75.*sm_80, sm_86"):
        sm_limits("sm_75")
    with pytest.raises(NbjitError, match="not an architecture|arch"):
        sm_limits("banana")
    ptx_like = dataclasses.replace(SPILL90.entry("plain"), registers=None)
    with pytest.raises(NbjitArgumentError, match="plain: its registers .* not known"):
        occupancy(ptx_like, "sm_90", 32)


# -------------------------------------------------------------------- GPU

SM90_CUBINS = ["nvcc/kernels_sm_90.cubin", "nvcc/cluster_sm90.cubin", "nvcc/pdl_sm_90.cubin",
               "nvcc/kernels_G_sm_90.cubin", "nvrtc/tmpl_sm90.cubin", "nvrtc/spill_sm90.cubin",
               *(p.relative_to(DATA).as_posix() for p in sorted(DATA.glob("triton/*/*.cubin")))]


@pytest.mark.gpu
@pytest.mark.parametrize("rel", SM90_CUBINS)
def test_same_as_the_driver(rel):
    """For every kernel of every sm_90 fixture: nbjit's count equals the driver's, for block
    sizes up to the kernel's limit and a few dynamic shared memory sizes."""
    import nbjit
    from nbjit.gpu.host import current_host

    if current_host().current_cc() != (9, 0):
        pytest.skip("the sm_90 fixtures' occupancy is compared on an sm_90 device")
    data = (DATA / rel).read_bytes()
    info = inspect_cubin(data)
    module = nbjit.load(data, name=rel)
    for e in info.entries:
        k = module[e.name]
        most = k.attributes.max_threads_per_block
        required = math.prod(e.directives.reqntid) if e.directives.reqntid else None
        for block in sorted({32, 64, 96, 128, 192, 256, 384, 512, 640, 1024, most}):
            if block > most or (required is not None and block != required):
                continue
            for dyn in (0, 1000, 20000):
                if dyn + e.shared > 48 * 1024:
                    continue
                assert occupancy(e, "sm_90", block, dyn).blocks_per_sm == k.max_active_blocks_per_sm(block, dyn), \
                    (rel, e.name, block, dyn)
