"""What a ``Kernel`` does off a package's first launch (``kernel.py`` hands over here, and
this imports no ``kernel``): ``KernelAttributes`` (what the driver says of a loaded
function), ``kernel.pdl`` set, occupancy, tensor maps over device arrays (``tensor_map``),
SASS, the kernel's context made current in a thread with none, and a launch the driver
refused: whether it goes again, else its message (with the CUDA limit the grid or block
exceeds)."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from nbjit import _driver, _driver_extra
from nbjit._defs import record
from nbjit._host import current_host
from nbjit.args import array_element
from nbjit.errors import NbjitArgumentError, NbjitLaunchError

if TYPE_CHECKING:
    from nbjit.tma import TensorMap, TensorMapPlan

__all__ = ["KernelAttributes", "tensor_map"]


@record
class KernelAttributes:
    """What the driver says about a loaded kernel."""

    registers: int
    shared: int  # static shared memory, bytes
    const: int
    local: int
    max_threads_per_block: int
    ptx_version: int  # e.g. 90 for PTX ISA 9.0 (the virtual arch for cubins)
    binary_version: int  # e.g. 90 for SASS sm_90
    max_dynamic_shared: int
    # from the cubin's own records (None where the code came as PTX, which the driver compiled):
    frame: int | None = None  # the kernel's stack frame, bytes (spills and local arrays live there)
    spills: int | None = None  # instructions that spill or refill registers
    # as ptxas reported them compiling it (nbjit.compile with -Xptxas=-v; None where not known):
    spill_stores: int | None = None  # bytes stored by spills
    spill_loads: int | None = None  # bytes loaded by refills


KernelAttributes.__module__ = "nbjit.kernel"  # (where users find it; pickles name it so)


def kernel_attributes(kernel) -> KernelAttributes:
    """``Kernel.attributes``."""
    s = kernel._loaded()
    attrs = s.attrs
    if attrs is None:  # (the driver's, read once per loaded function: modules of the same bytes share it)
        attrs = s.attrs = KernelAttributes(**_driver_extra.function_attributes(s.func), frame=s.info.frame,
                                           spills=s.info.spills)
    mod = kernel.module  # what ptxas said while compiling it, where nbjit compiled this module's image
    told = mod.image.resources.get(s.name) if mod is not None else None
    if told:
        return replace(attrs, spill_stores=told.get("spill_stores"), spill_loads=told.get("spill_loads"))
    return attrs


def set_pdl(s, value: bool, chosen: bool) -> None:
    """``kernel.pdl = value`` (``chosen``: the user's word) or a producer's default
    (``Kernel.default_pdl``), for the kernel's state ``s``."""
    if chosen and not isinstance(value, bool):
        raise NbjitLaunchError(f"kernel {s.label!r}: pdl must be True or False, got {value!r}")
    with s.lock:
        if chosen:
            s.pdl_chosen = True
        elif s.pdl_chosen or s.pdl == value:
            return
        s.pdl = value
        s.launchers.clear()  # launchers configured before (Triton's included) follow the new default


def adopt_context(s) -> bool:
    """In a thread with no current CUDA context, make the context of the kernel's state ``s``
    current; True where that is now the current one."""
    if _driver.current_context_key() != 0:
        return False
    current_host().make_current(s.device)
    return _driver.current_context_key() == s.ctx_key


_INVALID_CONTEXT = 201  # CUDA_ERROR_INVALID_CONTEXT: what a launch in a thread with no context gets


def may_relaunch(s, err) -> bool:
    """Whether a launch of the kernel's state ``s`` that failed for want of a context in this
    thread (one that made no CUDA call before) can go again: the kernel's context made
    current, as Numba's first call in a thread makes one current."""
    return int(err) == _INVALID_CONTEXT and adopt_context(s)


def blocks_per_sm(s, threads: int, dynamic_shared: int) -> int:
    """``Kernel.max_active_blocks_per_sm`` for blocks of ``threads``."""
    adopt_context(s)  # (the occupancy queries need a current context)
    return _driver_extra.max_active_blocks(s.func, threads, dynamic_shared)


def block_size(s, dynamic_shared: int) -> tuple[int, int]:
    """``Kernel.suggested_block_size``."""
    adopt_context(s)
    return _driver_extra.potential_block_size(s.func, dynamic_shared)


def tensor_map(array: Any, box: Any, *, element_strides: Any = None, interleave: str | None = None,
               swizzle: str | None = None, l2_promotion: str | None = None,
               oob_fill: str | None = None) -> TensorMap:
    """A tiled TMA tensor map over a device array (a Numba device array, or anything with
    ``__cuda_array_interface__``: CuPy, PyTorch), for a kernel's ``const __grid_constant__
    CUtensorMap`` parameter.

    Parameters
    ----------
    box: the tile, one size per axis in the array's order (e.g. ``(64, 32)``: 64 rows of 32).
    element_strides: the step along each axis inside the box (1 to 8; default 1).
    interleave: ``None``/``"none"``, ``"16B"`` or ``"32B"``.
    swizzle: ``None``/``"none"``, ``"32B"``, ``"64B"`` or ``"128B"`` (shared-memory bank swizzling).
    l2_promotion: ``None``/``"none"``, ``"64B"``, ``"128B"`` or ``"256B"``.
    oob_fill: ``None``/``"zero"`` (elements outside the array read as 0) or ``"nan"`` (floats).

    Raises
    ------
    NbjitArgumentError: the array or tile breaks a rule of the driver's (alignment, strides,
    box sizes, swizzle span, ...): the message says which, and for which axis.
    """
    from nbjit.tma import TensorMap
    plan = plan_for_array(array, box, element_strides=element_strides, interleave=interleave, swizzle=swizzle,
                          l2_promotion=l2_promotion, oob_fill=oob_fill)
    return TensorMap(_driver_extra.encode_tensor_map_tiled(plan), plan, array)


tensor_map.__module__ = "nbjit.kernel"  # (where users find it; pickles name it so)


def plan_for_array(array: Any, box: Any, **options: Any) -> TensorMapPlan:
    """``tma.plan_from_interface`` for a device array (a Numba device array, or anything
    with ``__cuda_array_interface__``), its element type read as the packer reads it."""
    from nbjit.tma import plan_from_interface
    try:
        cai = array.__cuda_array_interface__
    except AttributeError:
        cai = None
    except Exception as e:  # the exporter refused (torch: a dtype the interface has no typestr for)
        raise NbjitArgumentError(f"tensor map: {type(array).__name__}.__cuda_array_interface__ raised "
                                 f"{type(e).__name__}: {str(e)[:200]}") from None
    if cai is None:
        raise NbjitArgumentError(f"tensor map: {type(array).__name__} is not a device array (expected a Numba "
                                 "device array or an object with __cuda_array_interface__)")
    if (array_element(array) or ("",))[0] == "bf":  # typestr '<V2': the array's own dtype says bfloat16
        return plan_from_interface(cai, box, dtype="u2", data_type="BFLOAT16", **options)
    return plan_from_interface(cai, box, **options)


def sass(kernel, arch) -> str:
    """``Kernel.sass``: the kernel's SASS through nvdisasm."""
    from nbjit.sass import cubin_for, disassemble
    img = kernel.module.image
    if img.kind != "cubin" and arch is None:
        arch = current_host().device_arch()
    return disassemble(cubin_for(img, arch), kernel=kernel.name, name=img.name)


def launch_error(launcher, err) -> NbjitLaunchError:
    """``_Launcher.error``: a launch of ``launcher`` failed with ``err``."""
    why = _driver.FORK_MESSAGE if _driver.forked() else _driver.error_text(err) + _shape_problem(launcher, err)
    e = NbjitLaunchError(
        f"launch of kernel {launcher._s.label!r} failed (grid {launcher.grid}, block {launcher.block}, "
        f"{launcher.shared} bytes dynamic shared memory): {why}")
    e.code = int(err)  # the CUresult, as numba's CudaAPIError has it (a capture reads it)
    return e


def _shape_problem(launcher, err) -> str:
    """For an invalid-value refusal, which CUDA limit the grid or block exceeds, if one
    does (the kernel's own limit asked of the driver only now, on the way to an error)."""
    if int(err) != 1:  # CUDA_ERROR_INVALID_VALUE
        return ""
    (gx, gy, gz), (bx, by, bz) = launcher.grid, launcher.block
    threads = bx * by * bz
    try:
        most = _driver_extra.function_attributes(launcher._s.func)["max_threads_per_block"]
    except Exception:  # no answer: the other limits may still tell
        most = 1024
    if threads > most:
        return f": a block of {threads} threads, and this kernel runs at most {most} per block"
    for axis, v, limit in (("x", bx, 1024), ("y", by, 1024), ("z", bz, 64)):
        if v > limit:
            return f": block {axis} is {v}, and CUDA allows at most {limit}"
    for axis, v, limit in (("x", gx, 2 ** 31 - 1), ("y", gy, 65535), ("z", gz, 65535)):
        if v > limit:
            return f": grid {axis} is {v}, and CUDA allows at most {limit}"
    return ""
