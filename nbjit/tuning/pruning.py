"""Which variants are not worth timing, decided from what the compiler made (no GPU): a block
the kernel or the SM cannot take, registers or shared memory beyond the SM's, register
spills, an occupancy under the caller's floor."""
from __future__ import annotations

import math

from nbjit.errors import NbjitArgumentError
from nbjit.params.signature import KernelInfo
from nbjit.read.occupancy import occupancy

__all__ = ["why_not"]


def why_not(info: KernelInfo | None, arch: str, block: tuple[int, ...], shared: int, *,
            allow_spills: bool = False, min_occupancy: float = 0.0) -> str | None:
    """Why a variant launched with ``block`` threads and ``shared`` bytes of dynamic shared
    memory on ``arch`` is not timed, or None where it is. ``info``: its kernel as the cubin
    records it (None, or resources unknown as in PTX: only the block's size is checked)."""
    threads = math.prod(block)
    if threads > 1024:
        return f"a block of {threads} threads: more than the 1024 a block may have"
    d = info.directives if info is not None else None
    if d is not None and d.maxntid and threads > math.prod(d.maxntid):
        return f"a block of {threads} threads: more than the kernel's .maxntid {tuple(d.maxntid)} allows"
    if d is not None and d.reqntid and threads != math.prod(d.reqntid):
        return f"a block of {threads} threads: the kernel's .reqntid asks {tuple(d.reqntid)}"
    if info is None or info.registers is None or info.shared is None:
        return None
    if info.spills and not allow_spills:
        return f"spills registers ({info.spills} spill instructions, {info.registers} registers): allow_spills=True " \
               "times it anyway"
    try:
        occ = occupancy(info, arch, tuple(block), shared, max_dynamic_shared=shared if shared > 48 * 1024 else None)
    except NbjitArgumentError:  # an architecture nbjit has no table for: the driver decides
        return None
    if occ.blocks_per_sm == 0:
        short = ", ".join(k for k, v in occ.limits.items() if v == 0)
        return f"cannot run: its {short} ({info.registers} registers a thread, {info.shared + shared} bytes of " \
               f"shared memory a block) exceed what an SM of {arch} has for a block of {threads} threads"
    if occ.occupancy < min_occupancy:
        return f"occupancy {occ.occupancy:.3f} (limited by {', '.join(occ.limited_by)}) is under the floor " \
               f"min_occupancy={min_occupancy}"
    return None
