"""The driver's calls off the way to a launch (``_driver`` has those, and this stands on it):
a device's attributes (``device_info``), occupancy, tensor maps, stream capture and graphs.
With ``_driver`` the only code that calls the driver (``tests/test_layering.py``)."""
from __future__ import annotations

import functools

from ._defs import record
from ._driver import _cu, check, error_text
from .errors import NbjitArgumentError, NbjitLaunchError

__all__: list[str] = []


@record
class DeviceInfo:
    ordinal: int
    cc: tuple[int, int]
    max_shared_optin: int  # bytes of shared memory per block a kernel can opt in to
    max_shared_default: int  # per block without opting in (48 KiB)
    sm_count: int
    cooperative: bool


@functools.lru_cache(maxsize=None)
def device_info(ordinal: int) -> DeviceInfo:
    cu = _cu()
    dev = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
    A = cu.CUdevice_attribute

    def attr(a):
        return int(check(cu.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute"))

    return DeviceInfo(
        ordinal,
        (attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
        attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
        attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        bool(attr(A.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)),
    )


def max_active_blocks(func, block: int, dynamic_shared: int) -> int:
    return int(check(_cu().cuOccupancyMaxActiveBlocksPerMultiprocessor(func, block, dynamic_shared),
                     "cuOccupancyMaxActiveBlocksPerMultiprocessor"))


def potential_block_size(func, dynamic_shared: int, limit: int = 0) -> tuple[int, int]:
    res = check(_cu().cuOccupancyMaxPotentialBlockSize(func, None, dynamic_shared, limit),
                "cuOccupancyMaxPotentialBlockSize")
    return int(res[0]), int(res[1])


# ------------------------------------------------------------------ tensor maps


def tensor_map_call(cu, plan) -> tuple:
    """``cuTensorMapEncodeTiled``'s arguments for a plan, in the binding's own types (its
    size lists take ``cuuint64_t`` / ``cuuint32_t``, never plain ints)."""
    def enum(kind, name):
        return getattr(getattr(cu, kind), f"CU_TENSOR_MAP_{name}")
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t
    return (enum("CUtensorMapDataType", f"DATA_TYPE_{plan.data_type}"), plan.rank, plan.address,
            [u64(x) for x in plan.dims], [u64(x) for x in plan.strides], [u32(x) for x in plan.box],
            [u32(x) for x in plan.element_strides],
            enum("CUtensorMapInterleave", f"INTERLEAVE_{plan.interleave}"),
            enum("CUtensorMapSwizzle", f"SWIZZLE_{plan.swizzle}"),
            enum("CUtensorMapL2promotion", f"L2_PROMOTION_{plan.l2_promotion}"),
            enum("CUtensorMapFloatOOBfill", f"FLOAT_OOB_FILL_{plan.oob_fill}"))


def encode_tensor_map_tiled(plan) -> bytes:
    """The 128 bytes of ``cuTensorMapEncodeTiled`` for a checked ``tma.TensorMapPlan``;
    ``NbjitArgumentError`` with the driver's word where it still refuses."""
    cu = _cu()
    res = cu.cuTensorMapEncodeTiled(*tensor_map_call(cu, plan))
    if res[0] != 0:
        raise NbjitArgumentError(f"tensor map: cuTensorMapEncodeTiled refused {plan.dtype}{list(plan.shape)} in boxes "
                                 f"of {list(plan.box_shape)}: {error_text(res[0])}")
    return b"".join(int(x).to_bytes(8, "little") for x in res[1].opaque)


# ------------------------------------------------------------------ graphs (stream capture)

CAPTURE_MODES = ("thread_local", "global", "relaxed")
# CUDA errors that mean "this is not allowed while a stream is captured"
CAPTURE_ERRORS = {900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", 901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
                  902: "CUDA_ERROR_STREAM_CAPTURE_MERGE", 903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
                  904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", 905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
                  906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", 908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"}


def begin_capture(stream, mode: str) -> None:
    cu = _cu()
    m = {"thread_local": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
         "global": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
         "relaxed": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED}[mode]
    check(cu.cuStreamBeginCapture(stream, m), "cuStreamBeginCapture", NbjitLaunchError)


def end_capture(stream) -> tuple[int, object]:
    """(CUresult, CUgraph or None): ends the capture whatever happened during it."""
    res = _cu().cuStreamEndCapture(stream)
    return int(res[0]), (res[1] if int(res[0]) == 0 else None)


def capture_status(stream) -> str:
    """``"none"``, ``"active"`` or ``"invalidated"``."""
    cu = _cu()
    st = check(cu.cuStreamIsCapturing(stream), "cuStreamIsCapturing")
    S = cu.CUstreamCaptureStatus
    return {S.CU_STREAM_CAPTURE_STATUS_NONE: "none", S.CU_STREAM_CAPTURE_STATUS_ACTIVE: "active"}.get(
        st, "invalidated")


def graph_nodes(graph) -> int:
    return int(check(_cu().cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[1])


def instantiate(graph):
    return check(_cu().cuGraphInstantiate(graph, 0), "cuGraphInstantiate", NbjitLaunchError)


def graph_launch(graph_exec, stream) -> int:
    return int(_cu().cuGraphLaunch(graph_exec, stream)[0])


def exec_update(graph_exec, graph) -> tuple[bool, str]:
    """Update an instantiated graph in place from ``graph``: (done, why not)."""
    cu = _cu()
    res = cu.cuGraphExecUpdate(graph_exec, graph)
    if int(res[0]) == 0:
        return True, ""
    info = res[1] if len(res) > 1 else None
    why = getattr(getattr(info, "result", None), "name", None) or error_text(res[0])
    return False, str(why)


def destroy_graph(graph) -> None:
    try:
        _cu().cuGraphDestroy(graph)
    except Exception:  # at interpreter exit the driver may be gone
        pass


def destroy_exec(graph_exec) -> None:
    try:
        _cu().cuGraphExecDestroy(graph_exec)
    except Exception:  # at interpreter exit the driver may be gone
        pass
