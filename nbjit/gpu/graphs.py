"""The driver's graph calls: stream capture (into a new graph, or into an existing graph
after given nodes), conditional handles and nodes, walking a graph's nodes (kernels,
memsets, copies, conditionals) and its edges, building a graph node by node, and updating
an instantiated graph in place (a kernel node's parameters, a node switched on or off).

Handles go in and out as the bindings' objects or ints; nodes are named by their ints where
callers keep them. What each feature needs of the driver is checked once, here
(``require``), so that the message names the feature and the version."""
from __future__ import annotations

import ctypes
import functools
from typing import Any

from nbjit.errors import NbjitGraphError, NbjitLaunchError
from nbjit.gpu import extension
from nbjit.gpu.driver import _cu, as_int, check, driver_version, error_text, free, param_info, set_entry_point
from nbjit.records import record

__all__: list[str] = []

CAPTURE_MODES = ("thread_local", "global", "relaxed")
# CUDA errors that mean "this is not allowed while a stream is captured"
CAPTURE_ERRORS = {900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", 901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
                  902: "CUDA_ERROR_STREAM_CAPTURE_MERGE", 903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
                  904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", 905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
                  906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", 908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"}

# What each graph feature needs of the driver (CUDA version as cuDriverGetVersion gives it)
NEEDS = {
    "while_loop": (12040, "CUDA 12.4"), "if_then": (12040, "CUDA 12.4"),
    "if_else": (12080, "CUDA 12.8"), "switch": (12080, "CUDA 12.8"),
}
CONDITIONAL_TYPES = {"if_then": 0, "if_else": 0, "while_loop": 1, "switch": 2}  # CUgraphConditionalNodeType


def require(feature: str) -> None:
    """``NbjitGraphError`` where the installed driver is older than ``feature`` needs."""
    need, name = NEEDS[feature]
    have = driver_version()
    if have < need:
        raise NbjitGraphError(f"{feature} needs a driver of {name} or newer; this one is CUDA {have // 1000}."
                              f"{have % 1000 // 10} (conditional nodes: while_loop and if_then need 12.4, "
                              "if_else and switch 12.8; update the NVIDIA driver)")


def _mode(mode: str):
    M = _cu().CUstreamCaptureMode
    return {"thread_local": M.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, "global": M.CU_STREAM_CAPTURE_MODE_GLOBAL,
            "relaxed": M.CU_STREAM_CAPTURE_MODE_RELAXED}[mode]


# ------------------------------------------------------------------ capture


def begin_capture(stream, mode: str, graph=None, after: tuple = ()) -> None:
    """Begin capturing ``stream``: into a new graph, or (``graph`` given) into that graph,
    the first captured work depending on the nodes ``after``."""
    cu = _cu()
    if graph is None:
        check(cu.cuStreamBeginCapture(stream, _mode(mode)), "cuStreamBeginCapture", NbjitLaunchError)
    else:
        check(cu.cuStreamBeginCaptureToGraph(stream, graph, list(after) or None, None, len(after), _mode(mode)),
              "cuStreamBeginCaptureToGraph", NbjitGraphError)


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


def capture_info(stream) -> tuple[str, Any, tuple]:
    """(status, the graph being captured into, the nodes the next captured work will depend on)."""
    cu = _cu()
    res = cu.cuStreamGetCaptureInfo(stream)
    if int(res[0]) != 0:
        return ("invalidated" if int(res[0]) in CAPTURE_ERRORS else "none"), None, ()
    status, _id, graph, deps = res[1], res[2], res[3], res[4]
    S = cu.CUstreamCaptureStatus
    if status != S.CU_STREAM_CAPTURE_STATUS_ACTIVE:
        return ("none" if status == S.CU_STREAM_CAPTURE_STATUS_NONE else "invalidated"), None, ()
    n = res[-1]
    return "active", graph, tuple(deps[:n]) if deps else ()


# ------------------------------------------------------------------ conditionals


def conditional_handle(graph, ctx: int, default: int, reset: bool) -> int:
    """A conditional handle of ``graph``: its value is ``default`` at each launch where
    ``reset`` (CU_GRAPH_COND_ASSIGN_DEFAULT), else kept from the last launch."""
    cu = _cu()
    h = check(cu.cuGraphConditionalHandleCreate(graph, ctx, int(default), 1 if reset else 0),
              "cuGraphConditionalHandleCreate", NbjitGraphError)
    return int(h)


def add_conditional(graph, after: tuple, handle: int, kind: str, size: int, ctx: int) -> tuple[Any, tuple]:
    """A conditional node of ``kind`` (if_then, if_else, while_loop, switch) with ``size``
    bodies, after the nodes ``after``: (node, its body graphs)."""
    require(kind)
    cu = _cu()
    p = cu.CUgraphNodeParams()
    p.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    p.conditional.handle = cu.CUgraphConditionalHandle(handle)
    p.conditional.type = cu.CUgraphConditionalNodeType(CONDITIONAL_TYPES[kind])
    p.conditional.size = size
    p.conditional.ctx = cu.CUcontext(ctx)
    node = check(add_node_call()(graph, list(after) or None, None, len(after), p), "cuGraphAddNode (conditional)",
                 NbjitGraphError)
    return node, tuple(p.conditional.phGraph_out[:size])


def add_node_call():
    """cuGraphAddNode with edge data: ``(graph, dependencies, edge data, count, params)``.
    cuda-bindings 13 has it as cuGraphAddNode; 12.x as cuGraphAddNode_v2 (its cuGraphAddNode
    takes no edge data)."""
    cu = _cu()
    return getattr(cu, "cuGraphAddNode_v2", None) or cu.cuGraphAddNode


# ------------------------------------------------------------------ walking a graph


def _listed(fn, *args) -> list:
    """The items of a ``cuGraphGet...(handle, count)`` call: asked for the count, then the items."""
    n = check(fn(*args, 0), fn.__name__)[-1]
    if not n:
        return []
    return list(check(fn(*args, n), fn.__name__)[0][:n])


def graph_nodes(graph) -> int:
    return int(check(_cu().cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[-1])


def nodes(graph) -> list:
    """The graph's nodes, in the order the driver keeps them (the order they were added)."""
    return _listed(_cu().cuGraphGetNodes, graph)


def dependencies(node) -> list:
    """The nodes ``node`` depends on."""
    return _listed(_cu().cuGraphNodeGetDependencies, node)


_KINDS = {"CU_GRAPH_NODE_TYPE_KERNEL": "kernel", "CU_GRAPH_NODE_TYPE_MEMSET": "memset",
          "CU_GRAPH_NODE_TYPE_MEMCPY": "memcpy", "CU_GRAPH_NODE_TYPE_CONDITIONAL": "conditional",
          "CU_GRAPH_NODE_TYPE_EMPTY": "empty", "CU_GRAPH_NODE_TYPE_GRAPH": "child graph"}


def node_kind(node) -> str:
    """"kernel", "memset", "memcpy", "conditional", "empty", or the driver's name for others."""
    t = check(_cu().cuGraphNodeGetType(node), "cuGraphNodeGetType")
    return _KINDS.get(t.name, t.name)


@record
class KernelNodeParams:
    """A kernel node's launch: its function, configuration and parameter pointers."""

    func: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    params: int  # the address of its void* array (the driver's copy)


def function_params(func: int) -> list[tuple[int, int]]:
    """(offset, size) of each parameter of the kernel ``func`` (cuFuncGetParamInfo: CUDA 12.4)."""
    return param_info(_cu().CUfunction(func)) or []


def kernel_node(node) -> KernelNodeParams:
    p = check(_cu().cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams", NbjitGraphError)
    return KernelNodeParams(as_int(p.func), (p.gridDimX, p.gridDimY, p.gridDimZ),
                            (p.blockDimX, p.blockDimY, p.blockDimZ), int(p.sharedMemBytes), int(p.kernelParams or 0))


def kernel_node_param(p: KernelNodeParams, index: int, size: int) -> bytes:
    """Parameter ``index`` (``size`` bytes) of a kernel node, from the driver's copy."""
    ptr = ctypes.c_void_p.from_address(p.params + ctypes.sizeof(ctypes.c_void_p) * index).value
    return ctypes.string_at(ptr, size)


def kernel_node_word(node, offset: int) -> int | None:
    """The 8-byte word at byte ``offset`` of a kernel node's parameters (read from the
    driver's copy), or None where no parameter holds it whole."""
    p = kernel_node(node)
    if not p.params:
        return None
    for i, (off, size) in enumerate(function_params(p.func)):
        if off <= offset and offset + 8 <= off + size:
            return int.from_bytes(kernel_node_param(p, i, size)[offset - off:offset - off + 8], "little")
    return None


def kernel_node_launch_attributes(node) -> list[str]:
    """What a kernel node's launch sets that its parameters and configuration do not hold: a
    cluster shape, a cooperative launch (the names of those set)."""
    cu = _cu()
    A = cu.CUlaunchAttributeID
    out = []
    res = cu.cuGraphKernelNodeGetAttribute(node, A.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
    if int(res[0]) == 0:
        d = res[1].clusterDim
        if (d.x or 1) * (d.y or 1) * (d.z or 1) > 1:
            out.append(f"a cluster of {d.x}x{d.y}x{d.z} blocks")
    res = cu.cuGraphKernelNodeGetAttribute(node, A.CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
    if int(res[0]) == 0 and res[1].cooperative:
        out.append("a cooperative launch")
    return out


def memset_node(node) -> dict:
    """A memset node: dst, value, element_size (1, 2 or 4 bytes), width (elements), height, pitch."""
    p = check(_cu().cuGraphMemsetNodeGetParams(node), "cuGraphMemsetNodeGetParams", NbjitGraphError)
    return {"dst": as_int(p.dst), "value": int(p.value), "element_size": int(p.elementSize),
            "width": int(p.width), "height": int(p.height), "pitch": int(p.pitch)}


def memcpy_node(node) -> dict:
    """A copy node, where it is a plain one between device addresses: src, dst, bytes; else
    ``NbjitGraphError`` naming what it copies."""
    cu = _cu()
    p = check(cu.cuGraphMemcpyNodeGetParams(node), "cuGraphMemcpyNodeGetParams", NbjitGraphError)
    M = cu.CUmemorytype
    device = (M.CU_MEMORYTYPE_DEVICE, M.CU_MEMORYTYPE_UNIFIED)
    if p.srcMemoryType not in device or p.dstMemoryType not in device:
        raise NbjitGraphError(f"a copy from {p.srcMemoryType.name} to {p.dstMemoryType.name} memory: only copies "
                              "between device addresses can be saved (host memory does not outlive the process)")
    if p.Height > 1 or p.Depth > 1 or p.srcXInBytes or p.dstXInBytes or p.srcY or p.dstY:
        raise NbjitGraphError("a 2-D or 3-D copy: only contiguous copies between device addresses can be saved")
    return {"src": as_int(p.srcDevice), "dst": as_int(p.dstDevice), "bytes": int(p.WidthInBytes)}


def function_name(func: int) -> str:
    """The kernel's name as its module has it (cuFuncGetName), or "?"."""
    try:
        res = _cu().cuFuncGetName(_cu().CUfunction(func))
        return res[1].decode() if int(res[0]) == 0 else "?"
    except Exception:  # an old driver or bindings without it: the name is only shown
        return "?"


# ------------------------------------------------------------------ building a graph


def new_graph():
    return check(_cu().cuGraphCreate(0), "cuGraphCreate", NbjitGraphError)


def _kernel_params(func: int, grid, block, shared: int, params: int):
    """CUDA_KERNEL_NODE_PARAMS: ``func`` launched so, its parameters' void* array at ``params``."""
    cu = _cu()
    p = cu.CUDA_KERNEL_NODE_PARAMS()
    p.func = cu.CUfunction(func)
    p.gridDimX, p.gridDimY, p.gridDimZ = grid
    p.blockDimX, p.blockDimY, p.blockDimZ = block
    p.sharedMemBytes = shared
    p.kernelParams = params
    return p


def add_kernel_node(graph, after: list, func: int, grid, block, shared: int, params: int):
    """A kernel node launching ``func`` with the parameters whose void* array is at ``params``."""
    p = _kernel_params(func, grid, block, shared, params)
    return check(_cu().cuGraphAddKernelNode(graph, after or None, len(after), p), "cuGraphAddKernelNode",
                 NbjitGraphError)


def _memset(m: dict):
    cu = _cu()
    p = cu.CUDA_MEMSET_NODE_PARAMS()
    p.dst = cu.CUdeviceptr(m["dst"])
    p.value, p.elementSize = m["value"], m["element_size"]
    p.width, p.height, p.pitch = m["width"], m["height"], m["pitch"]
    return p


def _memcpy(m: dict):
    cu = _cu()
    p = cu.CUDA_MEMCPY3D()
    p.srcMemoryType = p.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.srcDevice, p.dstDevice = cu.CUdeviceptr(m["src"]), cu.CUdeviceptr(m["dst"])
    p.WidthInBytes, p.Height, p.Depth = m["bytes"], 1, 1
    return p


def add_memset_node(graph, after: list, ctx: int, m: dict):
    """A memset node (``memset_node``'s fields)."""
    cu = _cu()
    return check(cu.cuGraphAddMemsetNode(graph, after or None, len(after), _memset(m), cu.CUcontext(ctx)),
                 "cuGraphAddMemsetNode", NbjitGraphError)


def add_memcpy_node(graph, after: list, ctx: int, m: dict):
    """A copy node between device addresses (``memcpy_node``'s fields)."""
    cu = _cu()
    return check(cu.cuGraphAddMemcpyNode(graph, after or None, len(after), _memcpy(m), cu.CUcontext(ctx)),
                 "cuGraphAddMemcpyNode", NbjitGraphError)


def add_empty_node(graph, after: list):
    return check(_cu().cuGraphAddEmptyNode(graph, after or None, len(after)), "cuGraphAddEmptyNode",
                 NbjitGraphError)


# ------------------------------------------------------------------ instantiated graphs


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


@functools.lru_cache(maxsize=None)
def node_calls():
    """Where nbjit's C extension is used: the extension, its node-update entry points set
    (cuGraphExecKernelNodeSetParams, cuGraphNodeSetEnabled); else None (cuda.bindings serves)."""
    ext = extension.extension()
    if ext is None or not all(set_entry_point(ext, name) for name in ("cuGraphExecKernelNodeSetParams",
                                                                       "cuGraphNodeSetEnabled")):
        return None
    return ext


def set_kernel_node(graph_exec: int, node: int, func: int, grid, block, shared: int, params: int) -> int:
    """Give an instantiated graph's kernel node a new configuration and parameters (the void*
    array at ``params``); the CUresult. Handles as ints."""
    ext = node_calls()
    if ext is not None:
        return ext.set_kernel_node(graph_exec, node, func, *grid, *block, shared, params)
    cu = _cu()
    p = _kernel_params(func, grid, block, shared, params)
    return int(cu.cuGraphExecKernelNodeSetParams(cu.CUgraphExec(graph_exec), cu.CUgraphNode(node), p)[0])


def set_memset_node(graph_exec, node, ctx: int, m: dict) -> int:
    """An instantiated graph's memset node given new fields; the CUresult."""
    cu = _cu()
    return int(cu.cuGraphExecMemsetNodeSetParams(graph_exec, node, _memset(m), cu.CUcontext(ctx))[0])


def set_memcpy_node(graph_exec, node, ctx: int, m: dict) -> int:
    """An instantiated graph's copy node given new addresses; the CUresult."""
    cu = _cu()
    return int(cu.cuGraphExecMemcpyNodeSetParams(graph_exec, node, _memcpy(m), cu.CUcontext(ctx))[0])


def set_enabled(graph_exec: int, node: int, on: bool) -> int:
    """Switch an instantiated graph's node on or off; the CUresult. Handles as ints."""
    ext = node_calls()
    if ext is not None:
        return ext.set_node_enabled(graph_exec, node, 1 if on else 0)
    cu = _cu()
    return int(cu.cuGraphNodeSetEnabled(cu.CUgraphExec(graph_exec), cu.CUgraphNode(node), 1 if on else 0)[0])


def release(graph, graph_exec) -> None:
    """Free a graph and its instantiation, either may be None (while an nbjit capture records,
    once it ends: ``driver.free``)."""
    free(_destroy, graph, graph_exec)


def _destroy(graph, graph_exec) -> None:
    if graph_exec is not None:
        destroy_exec(graph_exec)
    if graph is not None:
        destroy_graph(graph)


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
