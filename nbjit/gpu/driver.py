"""The CUDA driver (through cuda.bindings, the bindings numba-cuda itself uses, and the C
launcher beside this module), with ``graphs.py`` beside it for graphs: contexts, modules and
functions, launches (plain and with attributes), devices' and functions' attributes,
occupancy, tensor maps, the contexts of pointers. It imports no
stage of nbjit; Numba's context objects are the host's (``host.py``); everything else in
nbjit is data.

Version differences are absorbed here, once: which optional entry points the bindings
have (cuFuncGetParamInfo, cuLaunchKernelEx) is probed on first use. Process state (whether
CUDA was used, whether this is a forked child, several GPUs) is read through functions."""
from __future__ import annotations

import ctypes
import functools
import os
import struct
import threading
from typing import Any

from nbjit.errors import NbjitArgumentError, NbjitError, NbjitLaunchError, NbjitLoadError
from nbjit.gpu import extension
from nbjit.records import record

__all__: list[str] = []

_LOG_BYTES = 1 << 16


@functools.cache
def _cu():
    from cuda.bindings import driver
    return driver


# Errors after which "any further CUDA work will return the same error" (the driver's
# documentation): a kernel faulted, and the process must start again to use CUDA.
STICKY_ERRORS = frozenset({700, 702, 710, 714, 715, 716, 717, 718, 719})
STICKY_HINT = ("a kernel launched earlier in this process faulted, and after that every CUDA call fails the same "
               "way: start the process again (compute-sanitizer, or CUDA_LAUNCH_BLOCKING=1, finds the kernel)")


def error_text(err) -> str:
    """``"CUDA_ERROR_INVALID_VALUE (1): invalid argument"``; for an error that leaves the
    process unable to use CUDA, what happened and what to do."""
    code = int(err)
    try:
        cu = _cu()
        e = cu.CUresult(code)
        _, name = cu.cuGetErrorName(e)
        _, text = cu.cuGetErrorString(e)
        out = f"{name.decode()} ({code}): {text.decode()}"
    except Exception:  # an unknown code must not hide the failure being reported
        out = f"CUDA error {code}"
    return f"{out} ({STICKY_HINT})" if code in STICKY_ERRORS else out


def check(res, what: str, exc: type[NbjitError] = NbjitError):
    """Unpack a cuda.bindings result tuple; raise ``exc`` naming the call on failure."""
    err = res[0]
    if err != 0:
        raise exc(f"{what} failed: {error_text(err)}")
    if len(res) == 1:
        return None
    return res[1] if len(res) == 2 else res[1:]


# ------------------------------------------------------------------ handles


def as_int(handle) -> int:
    """An address or handle as an int: numba-cuda gives cuda.bindings objects (CUdeviceptr,
    CUcontext: int() works) or, with its ctypes bindings (CUDA 12), ctypes.c_void_p."""
    if isinstance(handle, ctypes._SimpleCData):
        return handle.value or 0
    return int(handle)


def stream_handle(stream: Any):
    """A CUstream for a Numba stream, an int handle, an object with ``__cuda_stream__`` or
    ``cuda_stream`` (PyTorch), or None/0 (the default stream)."""
    if stream is None or (isinstance(stream, int) and stream == 0):
        return stream_object(0)
    h = getattr(stream, "handle", None)
    if h is not None and type(h).__name__ == "CUstream":
        return h
    if isinstance(h, ctypes.c_void_p):  # numba-cuda's ctypes bindings (CUDA 12)
        return stream_object(h.value or 0)
    if isinstance(stream, int):
        return stream_object(stream)
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        v = proto() if callable(proto) else proto
        return stream_object(int(v[1]))
    cs = getattr(stream, "cuda_stream", None)
    if isinstance(cs, int):
        return stream_object(cs)
    raise NbjitLaunchError(f"{type(stream).__name__} is not a stream (pass a Numba stream, an int handle, an object "
                           "with __cuda_stream__, or None)")


# ------------------------------------------------------------------ process state, contexts, devices


# Set in a child forked after this process used CUDA: the child cannot use it (CUDA's rule).
_STATE = {"used": False, "forked": False}


def _after_fork_in_child() -> None:
    if _STATE["used"]:
        _STATE["forked"] = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

FORK_MESSAGE = ("CUDA cannot be used in a child process forked after the parent used CUDA: start workers with "
                "multiprocessing's 'spawn' or 'forkserver' method (multiprocessing.get_context('spawn'), "
                "ProcessPoolExecutor(mp_context=...)), and load modules in the worker")


def forked() -> bool:
    """Whether this process is a child forked after its parent used CUDA."""
    return _STATE["forked"]


def check_not_forked() -> None:
    """NbjitError where this process is a child forked after its parent used CUDA."""
    if forked():
        raise NbjitError(FORK_MESSAGE)


def mark_cuda_used() -> None:
    """Note that this process has used CUDA (a child forked from now on cannot)."""
    _STATE["used"] = True


def current_device() -> int | None:
    """The ordinal of the device of the context current on this thread; None where no
    context is current (CUDA not initialised, no driver library included)."""
    try:
        res = _cu().cuCtxGetDevice()
    except Exception:  # no driver library (cuda.pathfinder's error): no context either
        return None
    return int(res[1]) if res[0] == 0 else None


def current_context_key() -> int:
    """The handle of the context current on this thread (0 if none, CUDA not initialised
    included): cheap, no Numba call (once a context exists, one C call)."""
    if _STATE["forked"]:
        raise NbjitError(FORK_MESSAGE)
    fast = _CTX_GETTER[0]
    if fast:
        key = fast()
        if key is not None:
            return key
    try:
        cu = _cu()
        res = cu.cuCtxGetCurrent()
    except Exception:  # no driver library (cuda.pathfinder's error): no context either
        return 0
    if res[0] == cu.CUresult.CUDA_ERROR_NOT_INITIALIZED:
        return 0
    key = int(check(res, "cuCtxGetCurrent"))
    if key and fast is None:
        # nbjit's C call is set up the second time a context is there to ask for: setting it up
        # (cuGetProcAddress through the bindings, cold) cost a fresh process's first compile
        # ~40 us on the H200, which a process that asks once never earns back
        if _CTX_ASKED[0]:
            _CTX_GETTER[0] = _c_context_getter()
        _CTX_ASKED[0] = True
    return key


def set_entry_point(ext, name: str) -> bool:
    """Hand nbjit's C extension ``ext`` the driver's function ``name`` (cuGetProcAddress, for
    this driver's version); False where the driver has none."""
    cu = _cu()
    res = cu.cuGetProcAddress(name.encode(), driver_version(), cu.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT)
    if res[0] != 0 or not int(res[1]):
        return False
    ext.set_entry_point(name, int(res[1]))
    return True


def _c_context_getter():
    """nbjit's C call of the driver's cuCtxGetCurrent (a tenth of the binding's cost), or
    False where the extension is not used (then never asked again)."""
    _launch = extension.extension()
    if _launch is None:
        return False
    try:
        return _launch.current_context if set_entry_point(_launch, "cuCtxGetCurrent") else False
    except Exception:  # a driver without the entry point: the bindings' call serves
        return False


_CTX_GETTER: list = [None]  # None: not set up yet; False: none; else the C function
_CTX_ASKED = [False]  # whether the bindings have found a context current once already


def context_key_source() -> str:
    """Who answers ``current_context_key``: ``"c"`` (nbjit's extension calling
    cuCtxGetCurrent), ``"python"`` (cuda.bindings), ``"unset"`` (cuda.bindings until a context
    has been found current twice)."""
    fast = _CTX_GETTER[0]
    return "unset" if fast is None else "c" if fast else "python"


@functools.lru_cache(maxsize=None)
def device_count() -> int:
    return int(check(_cu().cuDeviceGetCount(), "cuDeviceGetCount"))


@functools.lru_cache(maxsize=None)
def multi_gpu() -> bool:
    """Whether several GPUs are visible (decided once: with one, launches check no devices)."""
    return device_count() > 1


@functools.lru_cache(maxsize=None)
def driver_version() -> int:
    """The installed driver's CUDA version, e.g. 13000 for 13.0."""
    return int(check(_cu().cuDriverGetVersion(), "cuDriverGetVersion"))


# ------------------------------------------------------------------ contexts and memory without a Numba


@functools.lru_cache(maxsize=None)
def init() -> None:
    """cuInit, once per process (a Numba host does it itself); an NbjitLoadError saying what
    is missing where there is no driver or no GPU."""
    try:
        cu = _cu()
        res = cu.cuInit(0)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "cuda":
            raise
        raise NbjitLoadError("nbjit calls the CUDA driver through cuda-bindings, which is not installed: pip install "
                             "cuda-bindings (or a Numba: nbjit-core's numba extra brings both)") from None
    except Exception as e:  # no driver library: cuda.pathfinder's error
        raise NbjitLoadError(f"no usable CUDA driver ({str(e).splitlines()[0][:200] or type(e).__name__}): loading "
                             "and launching need one; nbjit can still inspect, strip and compile") from None
    check(res, "cuInit", NbjitLoadError)


@functools.lru_cache(maxsize=None)
def primary_context(ordinal: int) -> int:
    """The handle of device ``ordinal``'s primary context, retained for the life of the
    process (the context Numba, CuPy, PyTorch and the runtime API share)."""
    init()
    cu = _cu()
    dev = check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})", NbjitLoadError)
    return int(check(cu.cuDevicePrimaryCtxRetain(dev), f"cuDevicePrimaryCtxRetain(device {ordinal})",
                     NbjitLoadError))


def context_id(handle: int) -> int:
    """A context's unique ID (cuCtxGetId: never reused in the process, where a destroyed
    context's handle may be); the handle itself where the driver has no such call."""
    cu = _cu()
    try:
        res = cu.cuCtxGetId(cu.CUcontext(handle))
    except AttributeError:  # (bindings older than CUDA 12.0)
        return handle
    return int(check(res, "cuCtxGetId", NbjitLoadError))


def set_current(handle: int) -> None:
    """Make context ``handle`` current on this thread."""
    cu = _cu()
    check(cu.cuCtxSetCurrent(cu.CUcontext(handle)), "cuCtxSetCurrent", NbjitLoadError)


def mem_alloc(nbytes: int) -> int:
    """``nbytes`` of device memory in the current context (at least one byte asked)."""
    return int(check(_cu().cuMemAlloc(max(int(nbytes), 1)), f"cuMemAlloc({nbytes} bytes)", NbjitLoadError))


def mem_free(ptr: int) -> None:
    """Free memory ``mem_alloc`` gave (now, or once no capture records: ``free``; errors
    ignored: it runs from finalizers, maybe at exit)."""
    free(_mem_free, ptr)


def _mem_free(ptr: int) -> None:
    try:
        _cu().cuMemFree(ptr)
    except Exception:  # (the driver may be unloading)
        pass


# ------------------------------------------------------------------ frees while a stream is captured
# A free (cuMemFree, cuModuleUnload, cuGraphDestroy) while a stream is captured in this thread
# invalidates that capture; nbjit's objects are freed by finalizers, which run whenever Python
# collects them. So while an nbjit capture records, frees wait for its end.
_FREES: dict = {"recording": 0, "waiting": [], "lock": threading.Lock()}


def recording(began: bool) -> None:
    """An nbjit capture began (True) or ended (False) recording; when none records any more,
    the frees that waited are done."""
    with _FREES["lock"]:
        _FREES["recording"] += 1 if began else -1
        due = _FREES["waiting"] if _FREES["recording"] == 0 else []
        if due:
            _FREES["waiting"] = []
    for fn, args in due:
        fn(*args)


def free(fn, *args) -> None:
    """``fn(*args)`` (a free of device memory, a module, a graph) now, or once no capture records."""
    with _FREES["lock"]:
        if _FREES["recording"]:
            _FREES["waiting"].append((fn, args))
            return
    fn(*args)


def copy_to_host(dst: bytearray | memoryview, src: int) -> None:
    """Copy ``len(dst)`` bytes from device address ``src`` into the writable buffer ``dst``
    (synchronous with the default stream)."""
    n = len(dst)
    if n:
        buf = (ctypes.c_char * n).from_buffer(dst)
        check(_cu().cuMemcpyDtoH(ctypes.addressof(buf), src, n), "cuMemcpyDtoH")


def copy_from_host(dst: int, src: bytes | bytearray | memoryview) -> None:
    """Copy the bytes of ``src`` to device address ``dst`` (synchronous)."""
    data = bytes(src)
    if data:
        check(_cu().cuMemcpyHtoD(dst, data, len(data)), "cuMemcpyHtoD")


# ------------------------------------------------------------------ modules


@record(frozen=False)
class Loaded:
    handle: object  # CUmodule
    info_log: str


def load_module(data: bytes, what: str, kind: str = "ptx") -> Loaded:
    """Load an image of ``kind`` ("ptx", NUL-terminated; "cubin"; "fatbin") into the current
    context, keeping the JIT's info and error logs. Raises ``NbjitLoadError`` with the error
    log."""
    cu = _cu()
    if kind == "cubin":  # nothing to JIT, so no logs to keep; without log buffers the first load
        res = cu.cuModuleLoadData(data)  # in a context took 0.06-0.1 ms on the H200, with them 0.2-1.0
        if res[0] == 0:
            return Loaded(res[1], "")
        # refused: load again with the logs, for the driver's own words in the error
    # the driver writes its logs into these: mutable buffers, never bytes objects
    info = bytearray(_LOG_BYTES)
    errlog = bytearray(_LOG_BYTES)
    J = cu.CUjit_option
    opts = [J.CU_JIT_INFO_LOG_BUFFER, J.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            J.CU_JIT_ERROR_LOG_BUFFER, J.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, J.CU_JIT_LOG_VERBOSE]
    vals = [info, _LOG_BYTES, errlog, _LOG_BYTES, 1]
    res = cu.cuModuleLoadDataEx(data, len(opts), opts, vals)
    if res[0] != 0:
        log = _text(errlog)
        raise NbjitLoadError(f"{what}: the driver could not load it: {error_text(res[0])}"
                             + (f"\n{log}" if log else ""), )
    return Loaded(res[1], _text(info))


def _text(buf: bytes | bytearray) -> str:
    return buf.split(b"\0", 1)[0].decode(errors="replace").strip()


def unload_module(handle) -> None:
    """Unload a module (now, or once no capture records: ``free``)."""
    if forked():  # the handle belongs to the parent's context
        return
    free(_unload, handle)


def _unload(handle) -> None:
    try:
        _cu().cuModuleUnload(handle)
    except Exception:  # the driver may be gone at interpreter exit: nothing to report
        pass


_NOT_FOUND = 500  # CUDA_ERROR_NOT_FOUND


def get_function(module_handle, name: str):
    """The kernel ``name`` of a loaded module, or None where it has none."""
    check_not_forked()
    res = _cu().cuModuleGetFunction(module_handle, name.encode())
    if res[0] != 0:
        return _not_found(res[0], f"kernel {name!r}")
    return res[1]


def get_global(module_handle, name: str) -> tuple[int, int] | None:
    """(address, size) of the device variable ``name`` of a loaded module, or None."""
    res = _cu().cuModuleGetGlobal(module_handle, name.encode())
    if res[0] != 0:
        return _not_found(res[0], f"global {name!r}")
    return int(res[1]), int(res[2])


def _not_found(err, what: str) -> None:
    """None where the driver did not find ``what``; NbjitLoadError for any other failure
    (a context an earlier kernel broke, say), which "not found" would misname."""
    if int(err) != _NOT_FOUND:
        raise NbjitLoadError(f"looking up {what} failed: {error_text(err)}")
    return None


def param_info(func) -> list[tuple[int, int]] | None:
    """(offset, size) of every parameter from cuFuncGetParamInfo (CUDA >= 12.4), or None
    where the driver or bindings lack it."""
    cu = _cu()
    if not hasattr(cu, "cuFuncGetParamInfo") or driver_version() < 12040:
        return None
    out = []
    while len(out) < 4096:
        res = cu.cuFuncGetParamInfo(func, len(out))
        if res[0] != 0:
            if not out and res[0] != cu.CUresult.CUDA_ERROR_INVALID_VALUE:
                return None  # not supported for this function
            break
        out.append((int(res[1]), int(res[2])))
    return out


# ------------------------------------------------------------------ launching


@record
class Backend:
    """The launch primitive of the hot path: ``launch(func, gx, gy, gz, bx, by, bz, shared,
    stream, params) -> CUresult`` (an int, 0 on success), taking ``func`` and ``stream``
    converted by ``handle``. ``name`` is ``"c"`` (nbjit's extension calling the driver's
    cuLaunchKernel) or ``"python"`` (cuda.bindings' cuLaunchKernel)."""

    name: str
    launch: Any
    handle: Any
    extended: bool = False  # launch also takes launch attributes (cuLaunchKernelEx in C)


@functools.lru_cache(maxsize=None)
def backend() -> Backend:
    """The launch backend, decided once: nbjit's C extension where it is used (see
    ``extension``), else cuda.bindings."""
    cu = _cu()
    _launch = extension.extension()
    try:
        if _launch is None:
            raise ImportError("nbjit's C extension is not built, or NBJIT_PURE_PYTHON is set")
        if not set_entry_point(_launch, "cuLaunchKernel"):
            raise RuntimeError("cuGetProcAddress(cuLaunchKernel) failed")
        return Backend("c", _launch.launch, int, set_entry_point(_launch, "cuLaunchKernelEx"))
    except Exception:  # no C extension (or an unexpected driver): the portable path
        bound = cu.cuLaunchKernel

        def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params):
            return bound(f, gx, gy, gz, bx, by, bz, shared, stream, params, 0)[0]

        return Backend("python", launch, _same)


def _same(x):
    return x


def stream_object(handle: int):
    """A CUstream for an integer handle (what cuLaunchKernel takes fastest)."""
    return _cu().CUstream(handle)


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


_ENTRY_NEEDS = ("cuCtxGetCurrent", "cuCtxSetCurrent", "cuGetErrorName", "cuGetErrorString", "cuStreamSynchronize")


def entry_points() -> dict[str, int]:
    """The addresses of nbjit's C entry point (``launch``, ``pack``, ``synchronize``: see
    launch/entry.py), with the driver functions they call handed to the C extension; raises
    ``NbjitLaunchError`` where the extension is not used."""
    ext = extension.extension()
    if ext is None:
        raise NbjitLaunchError("launching from compiled code (@njit, ctypes, C) needs nbjit's C extension, and this "
                               "process runs without it (NBJIT_PURE_PYTHON is set, or nbjit was installed without a "
                               "C compiler)")
    backend()  # (cuLaunchKernel and cuLaunchKernelEx)
    for name in _ENTRY_NEEDS:
        set_entry_point(ext, name)
    return ext.entry_points()


def synchronize(stream: int) -> None:
    """cuStreamSynchronize of the stream with handle ``stream``."""
    check(_cu().cuStreamSynchronize(stream_object(stream)), f"synchronizing stream {stream:#x}", NbjitLaunchError)
