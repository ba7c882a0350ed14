"""The hosts: the one module that imports Numba (``tests/test_layering.py`` checks it), and
the bare host, which needs none.

nbjit runs beside a Numba that owns the CUDA context, the device arrays and streams users
pass, and the ``@cuda.jit`` dispatchers ``from_numba`` takes. What nbjit asks of it is the
small interface of ``Host``: the current context (made current where none is) and its
device, the device-array and pointer types whose address the launch path reads, device
memory seen as the host's array, an allocation, the CUDA error in the host's exceptions, a
dispatcher's PTX and the dtypes of its Numba types.

``Host`` implements that interface over numba-cuda's API, naming the modules it comes from;
``NumbaCuda`` is numba-cuda (``numba.cuda``). numba-cuda-mlir (``from numba_cuda_mlir import
cuda``) vendors the same driver, arrays, streams, signatures and types under
``numba_cuda_mlir.numba_cuda``: ``NumbaCudaMlir`` names those modules, and says what differs
(its compiler's options, and its kernels' array ABI: MLIR's memref descriptor).

``Bare`` serves without any Numba: the driver's contexts through cuda.bindings and nbjit's
own ``DeviceArray`` (``memory.py``); it loads, launches, pickles and captures bundles,
images and compiled CUDA C++, with arrays and streams from PyTorch, CuPy, JAX or anything
with ``__cuda_array_interface__``, DLPack or ``__cuda_stream__``.

Which host serves is decided once, on first use (``current_host``): the one named by
``nbjit.use_host(name)`` or the ``NBJIT_HOST`` environment variable; else the one whose
package the user imported (both imported: numba-cuda, with a warning that says how to choose
the other); else the first installed, numba-cuda before numba-cuda-mlir; else the bare host. Objects of every
host are understood whichever serves (arrays, pointers and streams launch, their errors are
read, ``from_numba`` takes either's dispatcher): what the choice decides is whose context
nbjit loads into and whose arrays it makes (``DeviceGlobal.as_array``, Triton's scratch).

Nothing here imports Numba before a method needs it: ``import nbjit.loading.module`` stays free of
it, and a host that is not chosen is never imported.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import importlib.util
import os
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Collection, Mapping, Sequence

from nbjit.arch import Arch
from nbjit.errors import NbjitHostError, NbjitLoadError, install_hint, warn
from nbjit.gpu import driver as _driver

__all__ = ["Host", "NumbaCuda", "NumbaCudaMlir", "HOSTS", "ENV", "current_host", "use_host", "choose", "host_of",
           "pointer_getter", "error_code"]

ENV = "NBJIT_HOST"  # names the host to serve, overriding what was imported


SET_CONDITIONAL = "cudaGraphSetConditional"  # (the driver's: a graph condition set by a kernel)


def _array_address(a, _cvp=ctypes.c_void_p) -> int:
    """A Numba device array's address (on every launch: ``as_int`` inlined)."""
    p = a.gpu_data.device_pointer
    return (p.value or 0) if type(p) is _cvp else int(p)


def _pointer_address(p, _cvp=ctypes.c_void_p) -> int:
    """A Numba ``MemoryPointer``'s (or ``OwnedPointer``'s) address."""
    d = p.device_pointer
    return (d.value or 0) if type(d) is _cvp else int(d)


class Host:
    """What nbjit needs of the Numba beside it, implemented over numba-cuda's API.

    A subclass names where its package keeps each part (``modules``, imported on first
    use): ``"cuda"`` (``current_context``, ``gpus``, ``from_cuda_array_interface``,
    ``device_array``, ``compile_ptx``), ``"devicearray"`` (``DeviceNDArrayBase``),
    ``"driver"`` (``MemoryPointer``, ``OwnedPointer``, ``CudaAPIError``), ``"sigutils"``
    (``normalize_signature``), ``"types"`` (Numba's types) and ``"numpy_support"``
    (``as_dtype``). ``package`` is the module whose import makes it the user's choice.
    """

    name: str = ""
    package: str = ""
    modules: Mapping[str, str] = {}
    top: str = ""  # its top-level import package: installed where it is found (importing nothing)
    extra: str = ""  # nbjit-core's extra that installs it (not the `nbjit` metapackage's: that brings numba-cuda)
    abi: str = "numba"  # how its kernels take arrays and complex numbers (numba_abi: "numba" or "mlir")

    def __init__(self) -> None:
        self._modules: dict[str, ModuleType] = {}

    def __repr__(self) -> str:
        return f"<nbjit host {self.name}>"

    def module(self, part: str) -> ModuleType:
        """The module that holds ``part`` (imported on first use); an NbjitLoadError saying what
        to install where the host's package is not installed."""
        m = self._modules.get(part)
        if m is None:
            try:
                m = self._modules[part] = importlib.import_module(self.modules[part])
            except ModuleNotFoundError as e:
                if e.name is None or e.name.split(".")[0] != self.modules[part].split(".")[0]:
                    raise  # one of the package's own dependencies: its own message says which
                raise not_installed(self, HOSTS, ENV) from None
        return m

    def installed(self) -> bool:
        """Whether the host's package is installed (found on the path, not imported)."""
        try:
            return importlib.util.find_spec(self.top) is not None
        except (ImportError, ValueError):
            return False

    def owns(self, obj: Any) -> bool:
        """Whether ``obj`` (a dispatcher, an array) is an object of this host's package."""
        return type(obj).__module__.split(".")[0] == self.top

    def imported(self, part: str) -> ModuleType | None:
        """The module that holds ``part`` where it is imported already, else None (importing
        nothing: an object of one of its types means it is)."""
        return sys.modules.get(self.modules[part])

    # ------------------------------------------------------------ contexts and devices
    def current_context(self) -> Any:
        """The host's current context (created and made current on first use); an
        NbjitLoadError where there is no CUDA GPU or driver."""
        _driver.check_not_forked()
        ctx = self._primary_current()
        if ctx is None:
            ctx = self._own_current_context()
        _driver.mark_cuda_used()
        return ctx

    def _primary_current(self) -> Any:
        """What the host's own ``current_context()`` returns where the context current on
        this thread is a primary context the host has already made (the usual case once it
        ran): its object for it, found with two driver calls instead of the host's look-up
        (a fresh process's first call to Numba's took 45-60 us on the H200, this 10-20);
        None in every other case (no context, or one the host has not made: then the host's
        own call decides, or says what is wrong)."""
        try:
            handle = _driver.current_context_key()
            if not handle:
                return None
            dev = _driver.current_device()
            if dev is None:
                return None
            ctx = self.module("cuda").gpus[dev].primary_context  # (the device ordinal, as Numba reads it)
            if ctx is None or self.context_key(ctx) != handle:
                return None
            ctx.prepare_for_use()  # (what Numba's call does too: nothing once it has run)
            return ctx
        except Exception:  # no driver library, no device list: the host's own call reports it
            return None

    def _own_current_context(self) -> Any:
        """The host's ``cuda.current_context()``, its errors told in one line as an NbjitLoadError."""
        cuda = self.module("cuda")
        try:
            return cuda.current_context()
        except Exception as e:  # numba's CudaSupportError and driver errors: dozens of lines of text
            raise context_error(e) from None

    def make_current(self, device: int) -> None:
        """Make the host's context of ``device`` current in this thread, as Numba's own
        first call in a thread does (its primary context, pushed)."""
        _driver.check_not_forked()
        self.module("cuda").current_context(device)
        _driver.mark_cuda_used()

    def context_key(self, ctx: Any) -> int:
        """A context object's driver handle, as an int."""
        return _driver.as_int(ctx.handle)

    def context_cc(self, ctx: Any) -> tuple[int, int]:
        """The compute capability of a context's device, e.g. (9, 0)."""
        return tuple(ctx.device.compute_capability)  # type: ignore[return-value]

    def context_ordinal(self, ctx: Any) -> int:
        """The ordinal of a context's device."""
        return int(ctx.device.id)

    def current_cc(self) -> tuple[int, int]:
        """The compute capability of the current context's device (the host's context made
        current where none is): two driver calls once a context is current."""
        dev = _driver.current_device()
        if dev is not None:
            return _driver.device_info(dev).cc
        return self.context_cc(self.current_context())

    def device_arch(self) -> Arch:
        """The current device's architecture, e.g. sm_90."""
        return Arch.parse(self.current_cc())

    # ------------------------------------------------------------ arrays and pointers
    def pointer_getter(self, t: type) -> Callable[[Any], int] | None:
        """How to read the device address of an object of type ``t`` where ``t`` is one of
        the host's device-array or pointer types, else None (decided once per type by the
        packer; nothing imported: see ``imported``)."""
        arrays, driver = self.imported("devicearray"), self.imported("driver")
        if arrays is not None and issubclass(t, arrays.DeviceNDArrayBase):
            return _array_address
        if driver is not None and issubclass(t, (driver.MemoryPointer, driver.OwnedPointer)):
            return _pointer_address
        return None

    def array_view(self, ptr: int, shape: tuple[int, ...], dtype: Any, owner: Any) -> Any:
        """The host's device array over ``shape`` elements of numpy ``dtype`` at device
        address ``ptr``, C-ordered, keeping ``owner`` alive (reads and writes go there)."""
        desc = {"shape": tuple(shape), "typestr": dtype.str, "data": (ptr, False), "strides": None, "version": 2}
        return self.module("cuda").from_cuda_array_interface(desc, owner=owner, sync=False)

    def allocate(self, nbytes: int) -> Any:
        """A new device array of ``nbytes`` bytes (uint8) in the current context, freed with it."""
        return self.module("cuda").device_array(nbytes, dtype="u1")

    # ------------------------------------------------------------ errors
    def error_code(self, exc: BaseException) -> int | None:
        """The CUresult one of the host's driver errors (``CudaAPIError``) carries, else None."""
        driver = self.imported("driver")
        if driver is not None and isinstance(exc, driver.CudaAPIError):
            return int(exc.code)
        return None

    # ------------------------------------------------------------ dispatchers and types
    def kernel_types(self, signature: Any) -> tuple[tuple, Any]:
        """(argument types, return type) of a signature as ``@cuda.jit`` takes it
        (``"void(float32[::1], float32)"``, a tuple of types, ...); the host's own error
        where it is not one."""
        args, ret = self.module("sigutils").normalize_signature(signature)
        return tuple(args), ret

    def returns_nothing(self, ret: Any) -> bool:
        """Whether a signature's return type is none (what a kernel returns)."""
        types = self.module("types")
        return ret is None or ret == types.none or ret == types.void

    def describe_type(self, t: Any) -> tuple | None:
        """A Numba type as nbjit passes it: ``("array", dtype, ndim, layout, readonly)``,
        ``("scalar", dtype)`` for integers, floats, booleans and complex numbers, None for
        any other type."""
        return describe_type(self, t)

    def ptx_options(self, targetoptions: Mapping[str, Any]) -> dict[str, Any]:
        """What of a ``@cuda.jit`` dispatcher's options ``compile_ptx`` takes again (as
        keywords for it): fastmath, lineinfo, launch bounds and optimisation."""
        return ptx_options(targetoptions)

    def compile_ptx(self, py_func: Callable, args: Sequence, cc: tuple[int, int], **options: Any) -> str:
        """The PTX of a kernel's Python function for argument types ``args`` and compute
        capability ``cc``, as the host's compiler makes it (``options``: ``ptx_options``'s).
        No GPU needed: the device functions the kernel calls, which the dispatcher compiles
        for "the current device" (once per process, whatever chip comes later), are compiled
        for ``cc``."""
        cuda = self.module("cuda")
        dispatcher, lock = self.module("dispatcher"), self.module("compiler_lock").global_compiler_lock
        with lock:
            asked = dispatcher.get_current_device
            dispatcher.get_current_device = _Device(cc).current
            try:
                ptx, _resty = cuda.compile_ptx(py_func, tuple(args), cc=cc, **options)
            finally:
                dispatcher.get_current_device = asked
        return ptx

    def pointee(self, t: Any) -> Any:
        """The type a ``CPointer`` type points to; None for any other type."""
        return t.dtype if isinstance(t, self.module("types").CPointer) else None

    def defer_cleanup(self) -> Any:
        """A context manager under which the host frees no device memory (Numba's deferred
        deallocations wait): a free during a stream capture would invalidate it."""
        return self.module("cuda").defer_cleanup()

    def set_condition(self) -> Any:
        """The device function @cuda.jit kernels call to set a graph condition,
        ``set_condition(handle, value)``: the driver's ``cudaGraphSetConditional`` (ptxas provides
        it, so nothing is linked), declared to this host with the C ABI."""
        return self.module("cuda").declare_device(SET_CONDITIONAL, "void(uint64, uint32)", abi="c")

    def compile_ltoir(self, func: Callable, args: Sequence, ret: Any, name: str,
                      cc: tuple[int, int]) -> tuple[bytes, Any]:
        """(LTO-IR, return type) of a Python device function (or ``@cuda.jit(device=True)``
        dispatcher, whose ``fastmath``, ``lineinfo``, ``debug`` and ``opt`` apply) compiled by
        the host with the C ABI as the function ``name``, for compute capability ``cc``;
        ``ret`` None: the host infers it. No GPU needed."""
        return compile_ltoir(self, func, args, ret, name, cc)


class NumbaCuda(Host):
    """numba-cuda: ``from numba import cuda``."""

    name = "numba-cuda"
    package = "numba.cuda"
    top = "numba_cuda"  # (numba-cuda >= 0.30 installs numba.cuda from there)
    extra = "numba"  # numba-cuda alone; "cu13" / "cu12" bring CUDA's compiler wheels besides
    modules = {"cuda": "numba.cuda", "devicearray": "numba.cuda.cudadrv.devicearray",
               "driver": "numba.cuda.cudadrv.driver", "sigutils": "numba.core.sigutils",
               "types": "numba.core.types", "numpy_support": "numba.np.numpy_support",
               "dispatcher": "numba.cuda.dispatcher", "compiler_lock": "numba.cuda.core.compiler_lock",
               "extending": "numba.cuda.extending"}

    def owns(self, obj: Any) -> bool:
        return type(obj).__module__.split(".")[0] in ("numba", "numba_cuda")

    def set_condition(self) -> Any:
        """numba-cuda's ``declare_device(..., abi="c")`` gives a function of no result a 64-bit
        one in PTX, which the driver's has not: an intrinsic declares it as it is."""
        types = self.module("types")
        return self.module("extending").intrinsic(functools.partial(_set_condition_typing, types))


def _set_condition_typing(types, typingctx, handle, value):
    """``set_condition(handle, value)`` typed for numba-cuda: an integer handle, an integer or
    boolean value; lowered to a call of ``void cudaGraphSetConditional(u64, u32)``."""
    if not isinstance(handle, types.Integer) or not isinstance(value, (types.Integer, types.Boolean)):
        return None

    def codegen(context, builder, sig, args):
        from llvmlite import ir  # (numba-cuda's own dependency, imported with it)
        h = context.cast(builder, args[0], sig.args[0], types.uint64)
        v = context.cast(builder, args[1], sig.args[1], types.uint32)
        fn = builder.module.globals.get(SET_CONDITIONAL) or ir.Function(
            builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(64), ir.IntType(32)]), SET_CONDITIONAL)
        builder.call(fn, [h, v])
        return context.get_dummy_value()

    return types.void(handle, value), codegen


class NumbaCudaMlir(Host):
    """numba-cuda-mlir: ``from numba_cuda_mlir import cuda``. Its driver, arrays, streams,
    signatures and types are numba-cuda's, vendored under ``numba_cuda_mlir.numba_cuda``; its
    compiler lowers through MLIR, and its kernels take an array as MLIR's memref descriptor
    (``numba_abi``), a complex number as one parameter."""

    name = "numba-cuda-mlir"
    package = "numba_cuda_mlir"
    top = "numba_cuda_mlir"
    extra = "mlir"
    abi = "mlir"
    modules = {"cuda": "numba_cuda_mlir.cuda", "devicearray": "numba_cuda_mlir.numba_cuda.cudadrv.devicearray",
               "driver": "numba_cuda_mlir.numba_cuda.cudadrv.driver",
               "sigutils": "numba_cuda_mlir.numba_cuda.core.sigutils", "types": "numba_cuda_mlir.numba_cuda.types",
               "numpy_support": "numba_cuda_mlir.numba_cuda.np.numpy_support",
               "dispatcher": "numba_cuda_mlir.numba_cuda.dispatcher", "tools": "numba_cuda_mlir.tools",
               "compiler_lock": "numba_cuda_mlir.numba_cuda.core.compiler_lock"}

    def array_view(self, ptr: int, shape: tuple[int, ...], dtype: Any, owner: Any) -> Any:
        # its from_cuda_array_interface reads owner.dtype (for records): a Module would look
        # for a kernel called "dtype" each time; a keeper holds the owner and has no dtype
        return super().array_view(ptr, shape, dtype, Keeper(owner))

    def ptx_options(self, targetoptions: Mapping[str, Any]) -> dict[str, Any]:
        """As numba-cuda's; its dispatchers keep ``opt_level`` (0 to 3), which ``compile_ptx``
        takes as ``opt`` (0: off; 1 to 3: on, as level 3)."""
        return mlir_ptx_options(targetoptions)

    def compile_ptx(self, py_func: Callable, args: Sequence, cc: tuple[int, int], **options: Any) -> str:
        """As numba-cuda's. Its compiler also asks the GPU's capability where it is given
        one (``tools.resolve_gpu_target``: to link for the newer of the two): without a GPU,
        that capability is taken to be ``cc`` while this compiles (``tools._cached_cc``, the
        answer it keeps once it has asked a device)."""
        tools = self.module("tools")
        with self.module("compiler_lock").global_compiler_lock:
            offline = tools._cached_cc is None and not _has_gpu(tools)
            if offline:
                tools._cached_cc = tuple(cc)
            try:
                return super().compile_ptx(py_func, args, cc, **options)
            finally:
                if offline:
                    tools._cached_cc = None


class BareContext:
    """A context as the bare host knows it: the driver's handle, its device's ordinal and
    compute capability (and, as a Numba context does, the modules nbjit loaded into it)."""

    __slots__ = ("handle", "device", "cc", "_nbjit_modules", "__weakref__")

    def __init__(self, handle: int, device: int, cc: tuple[int, int]) -> None:
        self.handle, self.device, self.cc = handle, device, cc

    def __repr__(self) -> str:
        return f"<nbjit context 0x{self.handle:x} on device {self.device}>"


class Bare(Host):
    """No Numba: the driver's contexts through ``cuda.bindings`` (the context current on the
    thread, else device 0's primary context, which PyTorch, CuPy and cuda.core share), and
    nbjit's own ``DeviceArray`` over device memory (``gpu/memory.py``). Arrays and streams
    come from whatever the user has (PyTorch, CuPy, JAX, DLPack, ``__cuda_array_interface__``,
    ``__cuda_stream__``, ints). Compiling a ``@cuda.jit`` kernel needs a Numba: that asks for
    one by name."""

    name = "bare"
    package = ""  # never "imported": chosen by name, or where no Numba is installed
    extra = "numba"

    def __init__(self) -> None:
        super().__init__()
        self._contexts: dict[tuple[int, int], BareContext] = {}  # by (handle, unique ID)

    def module(self, part: str) -> ModuleType:
        raise NbjitHostError(
            f"nbjit serves no Numba in this process (the bare host: {ENV}=bare, or no Numba installed), and "
            f"compiling or typing a @cuda.jit kernel needs one: install {install_hint('numba')} or "
            "numba-cuda-mlir, or ship the kernel in a bundle (nbjit.build_bundle), which loads without Numba")

    def installed(self) -> bool:
        return True

    def owns(self, obj: Any) -> bool:
        return False

    def imported(self, part: str) -> ModuleType | None:
        return None

    def defer_cleanup(self) -> Any:
        return contextlib.nullcontext()  # (nbjit's own arrays free when they go, as the user's libraries do)

    def current_context(self) -> BareContext:
        """The context current on this thread, else device 0's primary context made current."""
        _driver.check_not_forked()
        _driver.init()
        handle = _driver.current_context_key()
        if not handle:
            handle = _driver.primary_context(0)
            _driver.set_current(handle)
        key = (handle, _driver.context_id(handle))  # (a destroyed context's handle may come again)
        ctx = self._contexts.get(key)
        if ctx is None:
            dev = _driver.current_device()
            if dev is None:
                raise NbjitLoadError("the CUDA context current on this thread has no device (cuCtxGetDevice failed)")
            ctx = self._contexts.setdefault(key, BareContext(handle, dev, _driver.device_info(dev).cc))
        _driver.mark_cuda_used()
        return ctx

    def make_current(self, device: int) -> None:
        """Make ``device``'s primary context current in this thread."""
        _driver.check_not_forked()
        _driver.set_current(_driver.primary_context(device))
        _driver.mark_cuda_used()

    def context_key(self, ctx: Any) -> int:
        return ctx.handle

    def context_cc(self, ctx: Any) -> tuple[int, int]:
        return ctx.cc

    def context_ordinal(self, ctx: Any) -> int:
        return ctx.device

    def array_view(self, ptr: int, shape: tuple[int, ...], dtype: Any, owner: Any) -> Any:
        from nbjit.gpu.memory import DeviceArray  # (numpy's array type, for the bare host's users only)
        return DeviceArray(ptr, shape, dtype, owner)

    def allocate(self, nbytes: int) -> Any:
        from nbjit.gpu.memory import allocate  # (as array_view)
        self.current_context()
        return allocate(nbytes)


# The hosts nbjit serves, in order of preference where the user imported neither; the bare
# host (always there) serves where no Numba is installed.
HOSTS: tuple[Host, ...] = (NumbaCuda(), NumbaCudaMlir(), Bare())
_CHOSEN: list[Host] = []
_CHOOSING = threading.Lock()


def _named(name: str, hosts: Sequence[Host], where: str) -> Host:
    """The host called ``name``; an NbjitHostError naming ``where`` it was asked for and the names."""
    found = next((h for h in hosts if h.name == name), None)
    if found is None:
        raise not_a_host(name, hosts, where)
    return found


def choose(hosts: Sequence[Host], imported: Collection[str], wanted: str | None = None,
           installed: Callable[[Host], bool] | None = None) -> Host:
    """The host to serve: the one named ``wanted`` (``NBJIT_HOST``, ``use_host``); else the
    host of the Numba the user imported (the first of ``hosts`` whose ``package`` is among
    the ``imported`` module names: numba-cuda where both are); else the first of
    ``hosts`` that is ``installed`` (by default its own ``installed()``: the bare host always
    is, and comes last); else the last."""
    if wanted:
        return _named(wanted, hosts, f"{ENV}={wanted}")
    found = installed or (lambda h: h.installed())
    return next((h for h in hosts if h.package and h.package in imported), None) or \
        next((h for h in hosts if found(h)), hosts[-1])


def current_host() -> Host:
    """The host nbjit serves in this process, chosen on first use (see ``choose``); where
    both hosts' packages are imported and neither was named, an NbjitWarning says which
    serves and how to choose the other."""
    if not _CHOSEN:
        with _CHOOSING:
            if not _CHOSEN:
                wanted = os.environ.get(ENV, "").strip() or None
                h = choose(HOSTS, sys.modules, wanted)
                both = [x.name for x in HOSTS if x.package in sys.modules]
                if wanted is None and len(both) > 1:
                    warn(both_imported(h, both, HOSTS, ENV))
                _CHOSEN.append(h)
    return _CHOSEN[0]


def use_host(name: str) -> Host:
    """Serve the host called ``name`` in this process: ``"numba-cuda"`` (``from numba import
    cuda``), ``"numba-cuda-mlir"`` (``from numba_cuda_mlir import cuda``) or ``"bare"`` (no
    Numba: the driver's primary context, PyTorch's, CuPy's or any CAI/DLPack arrays); what the user
    imported, and ``NBJIT_HOST``, no longer decide. Call it before nbjit loads, compiles or
    launches anything (the choice is made once per process).

    Raises
    ------
    NbjitHostError: not a host's name, or another host serves already.
    """
    if not isinstance(name, str):
        raise not_a_name(name, HOSTS)
    h = _named(name, HOSTS, "nbjit.use_host")
    with _CHOOSING:
        if _CHOSEN and _CHOSEN[0] is not h:
            raise serving_already(name, _CHOSEN[0], ENV)
        if not _CHOSEN:
            _CHOSEN.append(h)
    return h


def host_of(obj: Any) -> Host:
    """The host whose package made ``obj`` (a ``@cuda.jit`` dispatcher), else the current host."""
    return next((h for h in HOSTS if h.owns(obj)), None) or current_host()


def pointer_getter(t: type) -> Callable[[Any], int] | None:
    """How to read the device address of an object of type ``t`` where it is a device
    array or pointer of any host, else None. Hosts not imported are not asked (a CuPy
    array never imports Numba)."""
    for h in HOSTS:
        f = h.pointer_getter(t)
        if f is not None:
            return f
    return None


def error_code(exc: BaseException) -> int | None:
    """The CUresult a host's driver error carries (Numba's ``CudaAPIError``), else None."""
    for h in HOSTS:
        code = h.error_code(exc)
        if code is not None:
            return code
    return None


def not_installed(host: Any, hosts: Sequence[Any], env: str) -> NbjitLoadError:
    """The error for ``host``'s package not installed (``hosts``: the others to choose from)."""
    return NbjitLoadError(
        f"nbjit loads and launches in the context of a Numba, and {host.name} (the one it serves "
        f"in this process) is not installed: install {install_hint(host.extra)}; or choose another "
        f"with {env} / nbjit.use_host() ({', '.join(repr(h.name) for h in hosts)})")


def context_error(e: Exception) -> NbjitLoadError:
    """The error for the host's ``cuda.current_context()`` raising ``e``, told in one line."""
    # its first line, or two where the first only introduces the second ("Error at driver init:")
    lines = [line.strip() for line in str(e).splitlines() if line.strip(": \t")]
    first = " ".join(lines[:2] if lines and lines[0].endswith(":") else lines[:1]) or type(e).__name__
    if "non-primary" in first:  # a context someone else created is current on this thread
        return NbjitLoadError(
            f"the CUDA context current on this thread is not a device's primary context ({first[:200]}), "
            "and Numba, whose context nbjit loads into, works only in those: pop that context "
            "(cuCtxPopCurrent) before using nbjit or Numba in this thread")
    return NbjitLoadError(
        f"no usable CUDA GPU or driver ({first[:200]}): loading and launching need one; nbjit can still "
        "inspect, strip and compile (give compile an explicit arch=, e.g. 'sm_90')")


def not_a_host(name: str, hosts: Sequence[Any], where: str) -> NbjitHostError:
    """The error for ``name``, asked for ``where``, naming none of ``hosts``."""
    return NbjitHostError(f"{where}: {name!r} is not a host nbjit serves; the names are "
                          f"{', '.join(repr(h.name) for h in hosts)}")


def not_a_name(name: Any, hosts: Sequence[Any]) -> NbjitHostError:
    """The error for ``nbjit.use_host(name)`` given something other than a name."""
    return NbjitHostError(f"nbjit.use_host takes a host's name ({', '.join(repr(x.name) for x in hosts)}), "
                          f"not {type(name).__name__}")


def serving_already(name: str, serving: Any, env: str) -> NbjitHostError:
    """The error for ``nbjit.use_host(name)`` where host ``serving`` was chosen already."""
    return NbjitHostError(
        f"nbjit.use_host({name!r}): nbjit serves {serving.name} in this process already (chosen at its "
        f"first use, which loads into that host's context); call use_host before nbjit loads, compiles or "
        f"launches anything, or set {env}={name} in the environment")


def both_imported(serving: Any, imported: Sequence[str], hosts: Sequence[Any], env: str) -> str:
    """The warning where the packages of the hosts called ``imported`` are imported, none
    was named, and ``serving`` was chosen."""
    other = next(x.name for x in hosts if x is not serving and x.name in imported)
    return (f"both {' and '.join(imported)} are imported: nbjit serves {serving.name} (it loads into its "
            f"context, and DeviceGlobal.as_array and Triton's scratch buffers are its arrays; either's "
            f"arrays and streams launch, and from_numba takes either's kernels). To serve {other}, "
            f"set {env}={other} or call nbjit.use_host({other!r}) before nbjit's first use")


def describe_type(host: Any, t: Any) -> tuple | None:
    """``Host.describe_type``: a Numba type of ``host``'s as nbjit passes it."""
    types, as_dtype = host.module("types"), host.module("numpy_support").as_dtype
    if isinstance(t, types.Array):
        return ("array", as_dtype(t.dtype), t.ndim, t.layout, not t.mutable)
    if isinstance(t, (types.Integer, types.Float, types.Boolean, types.Complex)):
        return ("scalar", as_dtype(t))
    return None


def ptx_options(targetoptions: Mapping[str, Any]) -> dict[str, Any]:
    """``Host.ptx_options``: what of a numba-cuda dispatcher's options ``compile_ptx`` takes again."""
    out: dict[str, Any] = {"fastmath": bool(targetoptions.get("fastmath", False)),
                           "lineinfo": bool(targetoptions.get("lineinfo", False))}
    if targetoptions.get("launch_bounds") is not None:
        out["launch_bounds"] = targetoptions["launch_bounds"]
    if targetoptions.get("opt") is not None:
        out["opt"] = bool(targetoptions["opt"])
    return out


def mlir_ptx_options(targetoptions: Mapping[str, Any]) -> dict[str, Any]:
    """``NumbaCudaMlir.ptx_options``: as numba-cuda's, with ``opt_level`` (0 to 3) for ``opt``
    (0: off; 1 to 3: on, as level 3)."""
    out = ptx_options({k: v for k, v in targetoptions.items() if k != "opt"})
    level = targetoptions.get("opt_level")
    if level is not None:
        out["opt"] = int(level) > 0
    return out


def compile_ltoir(host: Any, func: Callable, args: Sequence, ret: Any, name: str,
                  cc: tuple[int, int]) -> tuple[bytes, Any]:
    """``Host.compile_ltoir``: (LTO-IR, return type) of a Python device function compiled by
    ``host`` with the C ABI as the function ``name``."""
    py = getattr(func, "py_func", func)
    opts = dict(getattr(func, "targetoptions", None) or {})
    code, resty = host.module("cuda").compile(
        py, tuple(args) if ret is None else ret(*args), device=True, abi="c", abi_info={"abi_name": name},
        output="ltoir", cc=cc, fastmath=bool(opts.get("fastmath", False)),
        lineinfo=bool(opts.get("lineinfo", False)), debug=bool(opts.get("debug", False)), opt=opts.get("opt", True))
    return bytes(code), resty


class _Device:
    """What a Numba dispatcher reads of "the current device" while nbjit compiles for ``cc``."""

    def __init__(self, cc: tuple[int, int]) -> None:
        self.compute_capability = tuple(cc)

    def current(self) -> "_Device":
        """``get_current_device`` as the dispatcher calls it meanwhile."""
        return self


def _has_gpu(tools: ModuleType) -> bool:
    """Whether numba-cuda-mlir finds a GPU (its ``get_gpu_compute_capability`` answers)."""
    try:
        tools.get_gpu_compute_capability(tuple)
        return True
    except Exception:  # (CudaSupportError: no driver or no GPU)
        return False


class Keeper:
    """Keeps an object alive as a host array's owner, with nothing else to read."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj
