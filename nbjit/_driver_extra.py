"""The driver's calls off the way to a launch (``_driver`` has those, and this stands on it):
a device's attributes (``device_info``), a function's, occupancy, tensor maps, stream capture
and graphs; and those of the launches a bundle's first kernel does not make: with attributes
(the C launcher's attribute bytes, cuLaunchKernelEx through cuda.bindings) and with several
GPUs (the contexts of pointers).
With ``_driver`` the only code that calls the driver (``tests/test_layering.py``)."""
from __future__ import annotations

import functools
import struct

from nbjit._defs import record
from nbjit._driver import _cu, check, error_text
from nbjit.errors import NbjitArgumentError, NbjitLaunchError

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


# ------------------------------------------------------------------ functions, pointers, launches


def function_attributes(func) -> dict:
    cu = _cu()
    A = cu.CUfunction_attribute
    names = {
        "registers": A.CU_FUNC_ATTRIBUTE_NUM_REGS,
        "shared": A.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
        "const": A.CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
        "local": A.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
        "max_threads_per_block": A.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        "ptx_version": A.CU_FUNC_ATTRIBUTE_PTX_VERSION,
        "binary_version": A.CU_FUNC_ATTRIBUTE_BINARY_VERSION,
        "max_dynamic_shared": A.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
    }
    return {k: int(check(cu.cuFuncGetAttribute(a, func), "cuFuncGetAttribute")) for k, a in names.items()}


def set_max_dynamic_shared(func, nbytes: int) -> None:
    cu = _cu()
    check(cu.cuFuncSetAttribute(func, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                nbytes), "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", NbjitLaunchError)


def pointer_context(ptr: int) -> int | None:
    """The handle of the context a device address was allocated in (None if unknown).
    (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL read 0 for memory of device 1 through
    cuda.bindings 13.3 on a 2-GPU H200 machine; the context is reliable.)"""
    cu = _cu()
    res = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_CONTEXT, ptr)
    return int(res[1]) if res[0] == 0 else None


def context_device(ctx_handle: int) -> int | None:
    """The device ordinal of a context."""
    cu = _cu()
    ctx = cu.CUcontext(ctx_handle)
    if cu.cuCtxPushCurrent(ctx)[0] != 0:
        return None
    try:
        res = cu.cuCtxGetDevice()
        return int(res[1]) if res[0] == 0 else None
    finally:
        cu.cuCtxPopCurrent()


_ATTR = struct.Struct("<I4x64s")  # CUlaunchAttribute: the id, padding, a 64-byte value


def launch_attributes(*, cooperative: bool, cluster, pdl: bool) -> bytes:
    """A launch's attributes as the driver's ``CUlaunchAttribute`` array (72 bytes each),
    for nbjit's C launcher: cooperative, a cluster shape, programmatic stream serialization."""
    ids = _cu().CUlaunchAttributeID
    out = []
    if cooperative:
        out.append(_ATTR.pack(int(ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE), struct.pack("<i", 1)))
    if cluster is not None:
        out.append(_ATTR.pack(int(ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION), struct.pack("<3I", *cluster)))
    if pdl:
        out.append(_ATTR.pack(int(ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION), struct.pack("<i", 1)))
    return b"".join(out)


def launch_ex(func, grid, block, shared: int, stream, params: int, *, cooperative: bool, cluster,
              pdl: bool = False) -> int:
    """cuLaunchKernelEx with cooperative / cluster / programmatic stream serialization
    attributes; returns the CUresult."""
    cu = _cu()
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
    cfg.sharedMemBytes = shared
    cfg.hStream = stream
    attrs = []
    if cooperative:
        a = cu.CUlaunchAttribute()
        a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        a.value.cooperative = 1
        attrs.append(a)
    if cluster is not None:
        a = cu.CUlaunchAttribute()
        a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = cluster
        attrs.append(a)
    if pdl:
        a = cu.CUlaunchAttribute()
        a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        a.value.programmaticStreamSerializationAllowed = 1
        attrs.append(a)
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    return cu.cuLaunchKernelEx(cfg, func, params, 0)[0]


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
