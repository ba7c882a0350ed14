"""Module: an image loaded into one Numba context; kernels by name; device globals."""
from __future__ import annotations

import difflib
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from . import _driver
from .args import parse_signature
from .cdecl import demangle
from .numba_abi import is_numba_name
from .errors import KernelNotFoundError, NbjitArgumentError, NbjitLoadError, NbjitWarning
from .cubin import CubinInfo
from .image import Image, ImageLike, as_image
from .kernel import Kernel, _State
from .loader import Plan, plan
from .signature import KernelInfo, KernelSignature, Param, SignatureConflict, merge

__all__ = ["Module", "DeviceGlobal", "load", "compile", "from_numba"]


@dataclass(frozen=True)
class DeviceGlobal:
    """A module-scope ``__device__`` / ``__constant__`` variable: its device address and size."""

    name: str
    ptr: int
    size: int
    module: "Module"

    def as_array(self, dtype: Any, shape: int | tuple[int, ...] | None = None) -> Any:
        """A Numba device array over the variable's memory (reads and writes go to it)."""
        import numpy as np
        from numba import cuda

        dt = np.dtype(dtype)
        if shape is None:
            if self.size % dt.itemsize:
                raise ValueError(f"global {self.name!r} has {self.size} bytes, not a whole number of {dt}")
            shape = (self.size // dt.itemsize,)
        elif isinstance(shape, int):
            shape = (shape,)
        need = int(np.prod(shape)) * dt.itemsize
        if need > self.size:
            raise ValueError(f"global {self.name!r} has {self.size} bytes; shape {tuple(shape)} of {dt} needs {need}")
        desc = {"shape": tuple(shape), "typestr": dt.str, "data": (self.ptr, False), "strides": None,
                "version": 2}
        return cuda.from_cuda_array_interface(desc, owner=self.module, sync=False)


def _registry(ctx) -> "weakref.WeakValueDictionary":
    reg = getattr(ctx, "_nbjit_modules", None)
    if reg is None:
        reg = weakref.WeakValueDictionary()
        ctx._nbjit_modules = reg
    return reg


_LOAD_LOCK = threading.Lock()


def load(image: ImageLike, *, name: str | None = None, keep_debug: bool = False) -> "Module":
    """Load PTX, a cubin or a fatbin into the current Numba context. Loading the same bytes
    twice in one context returns the same ``Module``.

    Parameters
    ----------
    image: a path, ``bytes``, PTX text or ``nbjit.Image`` (the kind is sniffed by content).
    name: a name for messages (default: the file name).
    keep_debug: keep PTX debug information (for debugger sessions; the driver then
        compiles unoptimised). By default it is stripped.

    Raises
    ------
    ImageFormatError: not PTX, a cubin or a fatbin. NbjitLoadError: the driver refused it
    (the message holds its JIT log).
    """
    img = as_image(image, name)
    if name is not None and img.name != name:
        img = Image(img.data, img.kind, name, img.arch, img.lowered_names, img.log, img.declarations)
    ctx = _driver.current_context()
    reg = _registry(ctx)
    key = (img.sha256, keep_debug)
    with _LOAD_LOCK:
        mod = reg.get(key)
        if mod is None:
            mod = Module._load(img, ctx, keep_debug)
            reg[key] = mod
        else:
            mod._learn(img)
    return mod


class Module:
    """An image loaded into one context. ``module["name"]`` / ``module.name`` give kernels,
    ``module.kernels`` lists their names; ``get_global`` finds device variables."""

    def __init__(self, image: Image, ctx, prepared: Plan, loaded: _driver.Loaded):
        self.image = image
        self.context = ctx
        self.device = ctx.device.id
        self._ctx_key = _driver.context_key(ctx)
        self._handle = loaded.handle
        self.jit_log = loaded.info_log
        self.route = prepared.route
        self.note = prepared.note
        self.prepared_kind = prepared.kind
        self._info = prepared.info
        self._ptx = prepared.ptx
        self._names = dict(image.lowered_names)
        self._decls = dict(image.declarations)
        self._numba: dict[str, tuple] = {}  # kernel -> Numba argument types given by from_numba
        self._states: dict[str, _State] = {}
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _driver.unload_module, loaded.handle)
        self._finalizer.atexit = False  # at interpreter exit the driver may already be gone

    @classmethod
    def _load(cls, img: Image, ctx, keep_debug: bool) -> "Module":
        from .compiler import nvjitlink_version
        prepared = carry_out(plan(img, _driver.context_cc(ctx), _driver.driver_version(), keep_debug=keep_debug,
                                  nvjitlink=nvjitlink_version))
        what = f"{img.name} ({_describe(prepared)})"
        loaded = _driver.load_module(prepared.data, what)
        mod = cls(img, ctx, prepared, loaded)
        if prepared.note:
            warnings.warn(prepared.note, NbjitWarning, stacklevel=3)
        return mod

    def _learn(self, img: Image) -> None:
        """The same bytes again, maybe with more facts (name expressions, C declarations)."""
        with self._lock:
            for k, v in img.lowered_names.items():
                self._names.setdefault(k, v)
            new = {k: v for k, v in img.declarations.items() if k not in self._decls}
            if new:
                self._decls.update(new)
                for k in new:
                    self._states.pop(k, None)  # typed afresh on next use

    # ------------------------------------------------------------ kernels
    @property
    def name(self) -> str:
        """The image's name (its file, or what ``load(name=...)`` said)."""
        return self.image.name

    @property
    def kernels(self) -> tuple[str, ...]:
        """Names of the kernels in the module (mangled, as the driver knows them)."""
        src = self._ptx or self._info
        if src is not None:
            return tuple(e.name for e in src.entries)
        return ()

    def _layouts(self, name: str) -> list[tuple[str, KernelInfo]]:
        """The parameter layouts the inspected images give for kernel ``name``: the PTX first
        (it has types), then the cubin actually loaded (resources, pointer attributes)."""
        srcs = [s for s in (self._ptx, self._info) if s is not None]
        if len(srcs) == 2 and srcs[0] is srcs[1]:
            srcs.pop()
        out = []
        for src in srcs:
            e = next((e for e in src.entries if e.name == name), None)
            if e is not None:
                out.append(("cubin" if isinstance(src, CubinInfo) else "ptx", e))
        return out

    def _resolve(self, name: str) -> str:
        if name in self._names:
            return self._names[name]
        return name

    def get_kernel(self, name: str, signature: str | None = None) -> Kernel:
        """The kernel ``name`` (a mangled name, or an NVRTC name expression such as
        ``"fill<float>"``). Its parameter types come from every source nbjit has (PTX types,
        the mangled name, the CUDA source given to ``nbjit.compile``, Triton IR);
        ``signature`` declares them where none says (an ``extern "C"`` kernel in a cubin):
        C types such as ``"float*, const float*, float, int"`` or short names
        ``"ptr, ptr, f32, i32"``. A declaration must fit the image's sizes and agree with what
        the image says; arrays passed for a typed pointer must hold its element type."""
        return self._kernel(name, signature)

    def _kernel(self, name: str, signature: str | None = None, extra_layouts=()) -> Kernel:
        """The one way a Kernel is made: shared per name unless it carries extra facts."""
        _driver.check_not_forked()
        real = self._resolve(name)
        if signature is not None or extra_layouts:
            return Kernel(self, self._make_state(real, name, signature, extra_layouts))
        with self._lock:
            st = self._states.get(real)
            if st is None:
                st = self._make_state(real, name, None)
                self._states[real] = st
        return Kernel(self, st)

    def _make_state(self, real: str, asked: str, signature: str | None, extra_layouts=()) -> _State:
        """Kernel ``real``'s function and its one signature, merged from every source: the
        inspected images, the driver's parameter list, C declarations (the source given to
        ``nbjit.compile``, Triton IR), the mangled name and the user's ``signature``."""
        func = _driver.get_function(self._handle, real)
        layouts = self._layouts(real) + list(extra_layouts)
        if func is None or (not layouts and self.kernels):
            raise self._missing(asked)
        driver_params = _driver.param_info(func)
        if not layouts:
            layouts = [("driver", _from_driver(real, driver_params))]
            driver_params = None
        if is_numba_name(real) or real in self._numba:
            return self._numba_state(real, func, layouts)
        types = []
        if signature is not None:
            types.append(("declared", parse_signature(signature, real)))
        if real in self._decls:
            types.append(self._decls[real])
        types.append(("mangled name", demangle(real)))
        try:
            info = merge(real, layouts, types)
        except SignatureConflict as e:
            if e.source == "declared":
                raise NbjitArgumentError(f"signature {signature!r}: {e}") from None
            raise NbjitLoadError(f"{self.name}: {e}") from None
        if driver_params is not None:
            _verify(info, driver_params, self.name)
        return _State(real, func, info, self._ctx_key, self.device)

    def _numba_state(self, real: str, func, layouts) -> _State:
        """A @cuda.jit kernel: one argument per Python argument, as Numba passes them."""
        from . import numba_abi
        try:
            image = merge(real, layouts)
        except SignatureConflict as e:
            raise NbjitLoadError(f"{self.name}: {e}") from None
        args = self._numba.get(real)
        source = "numba types" if args is not None else "numba mangled name"
        info = numba_abi.signature(real, image, args if args is not None else numba_abi.from_mangled(real), source)
        driver_params = _driver.param_info(func)
        if driver_params is not None:
            _verify(image, driver_params, self.name)
        return _State(real, func, info, self._ctx_key, self.device)

    def _missing(self, name: str) -> KernelNotFoundError:
        names = list(self.kernels) + [k for k in self._names if k not in self.kernels]
        close = difflib.get_close_matches(name, names, n=len(names), cutoff=0.0)
        return KernelNotFoundError(f"no kernel {name!r} in {self.name}; it has: {', '.join(close) or '(none)'}")

    def __getitem__(self, name: str) -> Kernel:
        return self.get_kernel(name)

    def __getattr__(self, name: str) -> Kernel:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self.get_kernel(name)
        except KernelNotFoundError as e:
            raise AttributeError(str(e)) from None

    def __contains__(self, name: str) -> bool:
        return self._resolve(name) in self.kernels

    def __dir__(self):
        return list(super().__dir__()) + [k for k in self.kernels if k.isidentifier()]

    # ------------------------------------------------------------ globals
    def get_global(self, name: str) -> DeviceGlobal:
        """A ``__device__`` / ``__constant__`` variable: address and size, and ``as_array``."""
        g = _driver.get_global(self._handle, self._resolve(name))
        if g is None:
            names = self._global_names()
            raise KernelNotFoundError(f"no global {name!r} in {self.name}; it has: {', '.join(names) or '(none)'}")
        return DeviceGlobal(name, g[0], g[1], self)

    def _global_names(self) -> list[str]:
        src = self._ptx or self._info
        return [g.name for g in getattr(src, "globals", ()) if getattr(g, "size", None)]

    # ------------------------------------------------------------ other devices, lifetime
    def on_current_device(self) -> "Module":
        """This image loaded in the current context (the same module if that is its own)."""
        if _driver.current_context_key() == self._ctx_key:
            return self
        return load(self.image)

    def close(self) -> None:
        """Unload now (kernels of this module must not be launched afterwards)."""
        self._finalizer()

    def __repr__(self) -> str:
        route = f", {self.route}" if self.route else ""
        return f"<nbjit.Module {self.name} ({self.prepared_kind}{route}) on device {self.device}: " \
               f"{len(self.kernels)} kernels>"


def carry_out(p: Plan, cache=None) -> Plan:
    """The plan with its host step done: PTX newer than the driver assembled to a cubin by
    nvJitLink, through the cache (``cache``, default ``nbjit.default_cache()``)."""
    a = p.assemble
    if a is None:
        return p
    from .compiler import assemble_cached
    from .cubin import inspect_cubin
    from .errors import NbjitCompileError

    try:
        cubin = assemble_cached(a.ptx, a.arch, name=a.name, cache=cache)
    except NbjitCompileError as e:
        raise NbjitLoadError(
            f"{a.name}: PTX {a.ptx_version[0]}.{a.ptx_version[1]} is newer than this driver takes (CUDA "
            f"{a.driver_cuda[0]}.{a.driver_cuda[1]}: PTX up to {a.driver_ptx[0]}.{a.driver_ptx[1]}), and nvJitLink "
            f"{a.nvjitlink[0]}.{a.nvjitlink[1]} could not assemble it:\n{e}") from None
    return Plan(cubin, "cubin", inspect_cubin(cubin, source=a.name), p.route, p.note, p.entry, p.ptx, p.details)


def _describe(p: Plan) -> str:
    d = p.details
    if p.ptx is not None:
        v = p.ptx.version
        return f"PTX {v[0]}.{v[1]} for {p.ptx.arch}" + (f", via {p.route}" if p.route != "driver" else "")
    if p.kind == "cubin" and p.info is not None:
        return f"cubin for {p.info.arch}"
    return p.kind + (f" ({d})" if d else "")


def _from_driver(name: str, params: list[tuple[int, int]] | None) -> KernelInfo:
    if params is None:
        raise NbjitLoadError(f"kernel {name!r}: its parameter list is unknown (no readable image and no "
                             "cuFuncGetParamInfo in this driver)")
    ps = [Param(f"param_{i}", "unknown", size, 1, off) for i, (off, size) in enumerate(params) if off >= 0]
    end = max((p.offset + p.size for p in ps), default=0)
    return KernelInfo(name, KernelSignature(tuple(ps), end))


def _verify(entry: KernelInfo, driver_params: list[tuple[int, int]], source: str) -> None:
    ours = [(p.offset, p.size) for p in entry.params]
    if driver_params != ours:
        raise NbjitLoadError(
            f"{source}: kernel {entry.name!r}: the driver lays out its parameters as (offset, size) "
            f"{driver_params}, the inspected image as {ours}: refusing to launch with a wrong layout")


def compile(source: str, *, name: str | None = None, name_expressions: Iterable[str] = (),
            headers: Mapping[str, str] | None = None, include_paths: Iterable[str] = (),
            options: Iterable[str] = (), arch: str | None = None, output: str = "auto", keep_debug: bool = False,
            cache: Any = None) -> "Module":
    """Compile CUDA C++ with NVRTC (through the disk cache) and load it into the current
    Numba context. Arguments as for ``nbjit.compile_image``; ``module["fill<float>"]``
    then finds a kernel by the name expression written."""
    from .compiler import compile_image

    img = compile_image(source, name=name, name_expressions=name_expressions, headers=headers,
                        include_paths=include_paths, options=options, arch=arch, output=output, cache=cache)
    return load(img, keep_debug=keep_debug)


def from_numba(dispatcher: Any, signature: Any) -> Kernel:
    """A ``@cuda.jit`` kernel as an nbjit ``Kernel``: compiled by Numba for ``signature``
    (``"void(float32[::1], float32)"``, a tuple of Numba types, ...) and this device, loaded
    into the current Numba context, launched by nbjit's launcher with the arguments the
    Numba kernel takes (device arrays, numpy and Python scalars) at a fraction of Numba's
    dispatch cost. Arrays are checked against the signature (dtype, ndim, layout).

    Raises
    ------
    NbjitLoadError: not a kernel dispatcher, a device function, ``debug=True`` (Numba's
    exception reporting), a cooperative kernel, or argument types nbjit cannot pass.
    """
    from numba import cuda
    from numba.core import sigutils, types

    from . import numba_abi
    from .cache import default_cache

    py = getattr(dispatcher, "py_func", None)
    opts = dict(getattr(dispatcher, "targetoptions", None) or {})
    if py is None:
        raise NbjitLoadError(f"{type(dispatcher).__name__} is not a @cuda.jit kernel")
    what = f"@cuda.jit kernel {py.__name__!r}"
    if opts.get("device"):
        raise NbjitLoadError(f"{what} is a device function: only kernels can be launched")
    if opts.get("debug"):
        raise NbjitLoadError(f"{what} is compiled with debug=True, which reports exceptions through Numba's own "
                             "launcher: nbjit does not run it; compile it without debug=True")
    try:
        args, ret = sigutils.normalize_signature(signature)
    except Exception as e:  # numba's TypeError / parse errors
        raise NbjitLoadError(f"{what}: {signature!r} is not a signature ({e})") from None
    if ret not in (None, types.none, types.void):
        raise NbjitLoadError(f"{what}: a kernel returns nothing; the signature says {ret}")
    nargs = numba_abi.from_numba_types(args)
    cc = _driver.context_cc(_driver.current_context())
    cache = default_cache()
    call = ("numba", py, tuple(args), cc, tuple(sorted((k, str(v)) for k, v in opts.items())))
    ptx = cache.recall(call)
    if ptx is None:
        ptx, resty = cuda.compile_ptx(py, args, cc=cc, fastmath=bool(opts.get("fastmath", False)),
                                      lineinfo=bool(opts.get("lineinfo", False)))
        cache.remember(call, ptx)
    if "cudaCG" in ptx:
        raise NbjitLoadError(f"{what} uses cooperative groups, which need Numba's linker (cudadevrt): launch it "
                             "with Numba")
    mod = load(Image(ptx.encode(), "ptx", f"{py.__name__}.ptx"))
    names = [k for k in mod.kernels if numba_abi.is_numba_name(k)] or list(mod.kernels)
    if len(names) != 1:
        raise NbjitLoadError(f"{what}: expected one kernel in Numba's PTX, found {names}")
    with mod._lock:
        if mod._numba.get(names[0]) != nargs:
            mod._numba[names[0]] = nargs
            mod._states.pop(names[0], None)
    return mod._kernel(names[0])
