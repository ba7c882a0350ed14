"""What a ``Kernel`` does off a package's first launch (``kernel.py`` hands over here, and
this imports no ``kernel``): ``KernelAttributes`` (what the driver says of a loaded
function), tensor maps over device arrays, SASS, and the message of a launch the driver
refused (with the CUDA limit the grid or block exceeds)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _driver
from ._defs import record
from ._host import current_host
from .args import array_element
from .errors import NbjitArgumentError, NbjitLaunchError

if TYPE_CHECKING:
    from .tma import TensorMap, TensorMapPlan

__all__ = ["KernelAttributes"]


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


def tensor_map(array: Any, box: Any, **options: Any) -> TensorMap:
    """``nbjit.tensor_map``: the plan for ``array`` checked, then encoded by the driver."""
    from .tma import TensorMap
    plan = plan_for_array(array, box, **options)
    from ._driver_extra import encode_tensor_map_tiled
    return TensorMap(encode_tensor_map_tiled(plan), plan, array)


def plan_for_array(array: Any, box: Any, **options: Any) -> TensorMapPlan:
    """``tma.plan_from_interface`` for a device array (a Numba device array, or anything
    with ``__cuda_array_interface__``), its element type read as the packer reads it."""
    from .tma import plan_from_interface
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
    from .sass import cubin_for, disassemble
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
        most = _driver.function_attributes(launcher._s.func)["max_threads_per_block"]
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
