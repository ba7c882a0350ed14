"""How many blocks of a kernel fit on one SM of a given architecture, from the kernel's
registers, shared memory and barriers and the block size: CUDA's occupancy rules
(``cuda_occupancy.h``), re-implemented as plain data. No GPU needed.

The rules, per SM: warps are allocated whole; registers are allocated per warp in units of
256, each of the SM's four sub-partitions holding a quarter of the register file; shared
memory is allocated per block in units of 128 bytes, with the 1 KiB the driver reserves per
block (sm_80 and later) counted in; and an architecture caps blocks, threads and barriers.
The shared memory carve-out is the driver's default (all of it for shared memory where a
block needs it), as ``cuOccupancyMaxActiveBlocksPerMultiprocessor`` assumes.
"""
from __future__ import annotations

from nbjit.arch import Arch
from nbjit.errors import NbjitArgumentError
from nbjit.params.signature import KernelInfo
from nbjit.records import record

__all__ = ["Occupancy", "SMLimits", "sm_limits", "occupancy"]

KIB = 1024


@record
class SMLimits:
    """What one SM of a compute capability offers (the numbers cudaGetDeviceProperties gives)."""

    cc: int  # 90
    threads: int  # resident threads per SM
    blocks: int  # resident blocks per SM
    shared: int  # shared memory per SM, bytes
    shared_per_block_optin: int  # the most one block may have (cudaFuncAttributeMaxDynamicSharedMemorySize)
    barriers_per_block_slot: int  # named barriers per resident block slot (counted from sm_90 on)
    registers: int = 65536  # per SM, and per block
    warp: int = 32
    threads_per_block: int = 1024
    shared_per_block: int = 48 * KIB  # without opting in
    reserved_shared: int = 1 * KIB  # the driver's, per block
    register_unit: int = 256  # registers per warp are allocated in these
    shared_unit: int = 128  # bytes
    sub_partitions: int = 4
    max_registers_per_thread: int = 255


# compute capability -> limits (the CUDA Programming Guide's table of technical specifications)
_TABLE = {s.cc: s for s in (
    SMLimits(80, 2048, 32, 164 * KIB, 163 * KIB, 2),
    SMLimits(86, 1536, 16, 100 * KIB, 99 * KIB, 1),
    SMLimits(87, 1536, 16, 164 * KIB, 163 * KIB, 1),
    SMLimits(89, 1536, 24, 100 * KIB, 99 * KIB, 1),
    SMLimits(90, 2048, 32, 228 * KIB, 227 * KIB, 2),
    SMLimits(100, 2048, 32, 228 * KIB, 227 * KIB, 2),
    SMLimits(103, 2048, 32, 228 * KIB, 227 * KIB, 1),
    SMLimits(120, 1536, 24, 100 * KIB, 99 * KIB, 1),
    SMLimits(121, 1536, 24, 100 * KIB, 99 * KIB, 1),
)}


def sm_limits(arch: Arch | str | int) -> SMLimits:
    """The SM limits of ``arch`` (an ``Arch``, ``"sm_90"``, ``"sm_90a"``, ``"compute_90"`` or ``90``).

    Raises
    ------
    NbjitArgumentError: an architecture not in nbjit's table (the message lists those that are).
    """
    try:
        cc = arch if isinstance(arch, int) else Arch.parse(arch.strip() if isinstance(arch, str) else arch).number
    except ValueError as e:
        raise NbjitArgumentError(f"occupancy: {e}") from None
    limits = _TABLE.get(cc)
    if limits is None:
        known = ", ".join(f"sm_{k}" for k in _TABLE)
        raise NbjitArgumentError(f"occupancy: no SM limits for {arch} in nbjit's table (it has {known})")
    return limits


@record
class Occupancy:
    """Resident blocks per SM for one kernel, block size and dynamic shared memory."""

    kernel: str
    arch: str
    block: int  # threads per block
    dynamic_shared: int
    blocks_per_sm: int
    warps_per_sm: int
    max_warps_per_sm: int
    limits: dict  # what each resource allows: {"warps", "registers", "shared", "blocks", "barriers"}
    limited_by: tuple[str, ...]  # the resources that set blocks_per_sm
    registers_per_block: int  # as allocated
    shared_per_block: int  # as allocated, with the reserved 1 KiB

    @property
    def occupancy(self) -> float:
        """Resident warps over the most an SM holds (0.0 to 1.0)."""
        return self.warps_per_sm / self.max_warps_per_sm

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "arch": self.arch, "block": self.block, "dynamic_shared": self.dynamic_shared,
                "blocks_per_sm": self.blocks_per_sm, "warps_per_sm": self.warps_per_sm,
                "max_warps_per_sm": self.max_warps_per_sm, "occupancy": round(self.occupancy, 4),
                "limits": dict(self.limits), "limited_by": list(self.limited_by),
                "registers_per_block": self.registers_per_block, "shared_per_block": self.shared_per_block}


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(kernel: KernelInfo, arch: str | int, block: int | tuple, dynamic_shared: int = 0, *,
              max_dynamic_shared: int | None = None) -> Occupancy:
    """Resident blocks per SM of ``kernel`` (a cubin's ``KernelInfo``: registers, static shared
    memory and barriers known) on ``arch``, launched with ``block`` threads (an int or a
    1-3 tuple) and ``dynamic_shared`` bytes of dynamic shared memory.

    ``max_dynamic_shared``: the kernel's ``cudaFuncAttributeMaxDynamicSharedMemorySize``
    where it was raised (opting in beyond 48 KiB per block); default: not raised.

    Raises
    ------
    NbjitArgumentError: a block or shared size that is not a positive int, an architecture
    not in the table, or a kernel whose registers or shared memory are not known (PTX).
    """
    name = kernel.name
    threads = _threads(block, name)
    if isinstance(dynamic_shared, bool) or not isinstance(dynamic_shared, int) or dynamic_shared < 0:
        raise NbjitArgumentError(f"occupancy of {name}: dynamic shared memory must be bytes >= 0, "
                                 f"not {dynamic_shared!r}")
    if kernel.registers is None or kernel.shared is None:
        raise NbjitArgumentError(f"occupancy of {name}: its registers and shared memory are not known (PTX: "
                                 "compile it to a cubin for the architecture first)")
    sm = sm_limits(arch)
    warps = -(-threads // sm.warp)
    max_warps = sm.threads // sm.warp
    lim: dict[str, int] = {}
    lim["warps"] = max_warps // warps if threads <= sm.threads_per_block else 0
    lim["blocks"] = sm.blocks

    # registers: per warp in allocation units; each sub-partition holds whole warps
    regs = kernel.registers
    per_warp = _round_up(regs * sm.warp, sm.register_unit)
    per_block = per_warp * warps
    if per_block > sm.registers or per_warp * _round_up(warps, sm.sub_partitions) > sm.registers \
            or regs > sm.max_registers_per_thread:
        lim["registers"] = 0
    elif per_warp:
        lim["registers"] = (sm.registers // sm.sub_partitions // per_warp) * sm.sub_partitions // warps
    else:
        lim["registers"] = sm.blocks

    # shared memory: static + dynamic + the driver's reserve, in allocation units
    static = kernel.shared + sm.reserved_shared
    smem = _round_up(static + dynamic_shared, sm.shared_unit)
    opted = max_dynamic_shared is not None and static + max_dynamic_shared > sm.shared_per_block + sm.reserved_shared
    per_block_cap = (sm.shared_per_block_optin if opted else sm.shared_per_block) + sm.reserved_shared
    if (max_dynamic_shared is not None and dynamic_shared > max_dynamic_shared) or smem > per_block_cap:
        lim["shared"] = 0
    else:
        lim["shared"] = sm.shared // smem  # smem >= the 1 KiB reserve: never 0

    if kernel.barriers and sm.cc >= 90:  # (the rules count barriers from sm_90 on)
        lim["barriers"] = sm.blocks * sm.barriers_per_block_slot // kernel.barriers
    blocks = min(lim.values())
    return Occupancy(name, f"sm_{sm.cc}", threads, dynamic_shared, blocks, blocks * warps, max_warps, lim,
                     tuple(k for k, v in lim.items() if v == blocks), per_block, smem)


def _threads(block, name: str) -> int:
    dims = block if isinstance(block, tuple) else (block,)
    if not 1 <= len(dims) <= 3 or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise NbjitArgumentError(f"occupancy of {name}: block must be a positive int or a tuple of 1-3 of them, "
                                 f"not {block!r}")
    n = 1
    for d in dims:
        n *= d
    return n
