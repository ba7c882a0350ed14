"""Module: an image loaded into one Numba context; kernels by name; device globals; its
pickled form."""
from __future__ import annotations

import collections
import threading
import types
import weakref
import zlib
from typing import Any, Iterable, Iterator, Mapping, Sequence

from nbjit.arch import Arch
from nbjit.errors import KernelNotFoundError, NbjitArgumentError, NbjitLoadError, warn
from nbjit.gpu import driver as _driver
from nbjit.gpu.host import current_host
from nbjit.launch.kernel import Kernel, _State, remember_function
from nbjit.loading.plan import Plan, carry_out, plan
from nbjit.params.cdecl import demangle, demangler_missing, shown_name
from nbjit.params.signature import KernelInfo, KernelSignature, Param, SignatureConflict, merge, same_layout
from nbjit.read.image import Image, ImageLike, _sha256, as_image, inspect_image
from nbjit.records import Pattern, record

__all__ = ["Module", "DeviceGlobal", "load"]


def _registry(ctx) -> "weakref.WeakValueDictionary":
    reg = getattr(ctx, "_nbjit_modules", None)
    if reg is None:
        reg = weakref.WeakValueDictionary()
        ctx._nbjit_modules = reg
    return reg


_LOAD_LOCK = threading.Lock()
_NOTHING: Mapping = types.MappingProxyType({})


def load(image: ImageLike, *, name: str | None = None, keep_debug: bool = False, lazy: bool = False) -> "Module":
    """Load PTX, a cubin or a fatbin into the current Numba context. Loading the same bytes
    twice in one context returns the same ``Module``.

    Parameters
    ----------
    image: a path, ``bytes``, PTX text or ``nbjit.Image`` (the kind is sniffed by content).
    name: a name for messages (default: the file name).
    keep_debug: keep PTX debug information (for debugger sessions; the driver then
        compiles unoptimised). By default it is stripped.
    lazy: load on first use instead, into the context current then (no CUDA call now: a
        module made on a machine without a GPU, to pickle and send to workers that have one).

    Raises
    ------
    ImageFormatError: not PTX, a cubin or a fatbin. NbjitLoadError: the driver refused it
    (the message holds its JIT log).
    """
    keep_debug, lazy = flag(keep_debug, "keep_debug", NbjitLoadError), flag(lazy, "lazy", NbjitLoadError)
    img = as_image(image, name)
    if name is not None and img.name != name:
        img = Image(img.data, img.kind, name, img.arch, img.lowered_names, img.log, img.declarations)
    if lazy:
        return Module._pending(img, keep_debug)
    return load_into(img, current_host().current_context(), keep_debug)


def flag(value, what: str, error: type) -> bool:
    """A yes/no argument: True, False (or 1, 0); ``error`` naming ``what`` for anything else
    (a string such as "no" would be taken as yes)."""
    if value is True or value is False:
        return value
    if (type(value) is int and value in (0, 1)) or type(value).__name__ in ("bool", "bool_"):  # (numpy's bools)
        return bool(value)
    raise error(f"{what} must be True or False, not {value!r}")


def load_into(img: Image, ctx, keep_debug: bool) -> "Module":
    """``img`` loaded into Numba context ``ctx``, or the module already loaded there from
    the same bytes; where ``img`` tells what the compiler reported and that module's image
    does not (``tells_more``), a module of ``img`` sharing that module's loaded
    copy."""
    reg = _registry(ctx)
    key = (img.digest, keep_debug)
    with _LOAD_LOCK:
        mod = reg.get(key)
        if mod is None:
            mod = Module._load(img, ctx, keep_debug)
            reg[key] = mod
        elif mod.image is not img:
            return mod._loaded_again(img, keep_debug)
        else:
            mod._learn(img.lowered_names, img.declarations)
    return mod


class _Facts:
    """What a module's bytes do not say about its kernels: NVRTC name expressions
    (name -> mangled name), C declarations, Numba argument types. Only ever added to; one
    set per loaded copy, shared by the modules that use it."""

    __slots__ = ("names", "decls", "numba", "lock")

    def __init__(self, names: Mapping, decls: Mapping, numba: Mapping):
        self.names, self.decls, self.numba = dict(names), dict(decls), dict(numba)
        self.lock = threading.Lock()

    def learn(self, names: Mapping, decls: Mapping, numba: Mapping) -> set:
        """Add facts (a name expression or declaration known already stays; Numba types are
        replaced); the kernels whose typing they change."""
        with self.lock:
            for k, v in names.items():
                self.names.setdefault(k, v)
            changed = {k for k in decls if k not in self.decls}
            for k in changed:
                self.decls[k] = decls[k]
            for k, v in numba.items():
                if self.numba.get(k) != v:
                    self.numba[k] = v
                    changed.add(k)
        return changed


class _Live:
    """A module's bytes loaded into one context: the handle (unloaded when the last holder of
    this goes, or on ``close``), what the loading plan made of the image, and the kernels
    typed so far. What a ``Module`` makes on first use."""

    def __init__(self, image: Image, ctx, prepared: Plan, loaded: _driver.Loaded, facts: _Facts):
        host = current_host()
        self.context = ctx
        self.device = host.context_ordinal(ctx)
        self.ctx_key = host.context_key(ctx)
        self.handle = loaded.handle
        self.jit_log = loaded.info_log
        self.route = prepared.route
        self.note = prepared.note
        self.kind = prepared.kind
        self.info = prepared.info
        self.ptx = prepared.ptx
        src = self.ptx or self.info
        self.kernels = tuple(e.name for e in src.entries) if src is not None else ()
        # what travels in a pickle: the bytes loaded, or the whole fatbin (each device picks)
        self.shipped = (image.data, "fatbin") if image.kind == "fatbin" else (prepared.data, prepared.kind)
        # kernels typed already (a cache entry's facts), valid while the image's inspection is the one used
        self.typed = dict(image.typed) if image.info is not None and prepared.info is image.info else {}
        self.states: dict[str, _State] = {}
        self.facts = facts  # what the kernels are typed by, beside the image
        self.names = facts.names  # (for a look-up by name: one attribute fewer)
        self.lock = threading.Lock()
        self.finalizer = weakref.finalize(self, _driver.unload_module, loaded.handle)
        self.finalizer.atexit = False  # at interpreter exit the driver may already be gone

    def forget(self, names: Iterable[str]) -> None:
        """Kernels to type afresh on next use (new facts about them)."""
        with self.lock:
            for k in names:
                self.states.pop(k, None)
                self.typed.pop(k, None)

    def layouts(self, name: str) -> list[tuple[str, KernelInfo]]:
        """The parameter layouts the inspected images give for kernel ``name``: the PTX first
        (it has types), then the cubin actually loaded (resources, pointer attributes)."""
        srcs = [s for s in (self.ptx, self.info) if s is not None]
        if len(srcs) == 2 and srcs[0] is srcs[1]:
            srcs.pop()
        out = []
        for src in srcs:
            e = next((e for e in src.entries if e.name == name), None)
            if e is not None:  # (what is not the PTX is the cubin loaded: its inspection or a bundle's facts of it)
                out.append(("ptx" if src is self.ptx else "cubin", e))
        return out


class Module:
    """An image loaded into one context. ``module["name"]`` / ``module.name`` give kernels,
    ``module.kernels`` lists their names; ``get_global`` finds device variables.

    A module is its recipe (the image, its name expressions, declarations and Numba argument
    types, ``keep_debug``) and a live part made on first use: loaded into the context current
    then (``nbjit.load`` makes it at once; ``lazy=True`` and unpickling leave it for first
    use). Before that it lists and describes its kernels from the image, without a GPU.

    A module pickles as its recipe (the bytes that were loaded, after stripping or
    assembling, or the whole fatbin; its facts), never a handle: unpickled, it loads on first
    use into the context current then, sharing a module already loaded there from the same
    bytes."""

    def __init__(self, image: Image, keep_debug: bool = False, numba: Mapping | None = None):
        self.image = image
        self.keep_debug = keep_debug
        self._facts = _Facts(image.lowered_names, image.declarations, numba or {})
        self._live: _Live | None = None
        self._owner: Module | None = None  # the module loaded from the same bytes whose live part this shares
        self._wire_blob: tuple | None = None
        self._source: tuple[str, tuple[KernelInfo, ...]] | None = None
        self._offline: dict[tuple, KernelInfo] = {}

    @classmethod
    def _pending(cls, img: Image, keep_debug: bool, numba: Mapping | None = None) -> "Module":
        """A module that loads on first use, into the context current then (no CUDA call now)."""
        return cls(img, keep_debug, numba)

    @classmethod
    def _load(cls, img: Image, ctx, keep_debug: bool) -> "Module":
        prepared = carry_out(plan(img, current_host().context_cc(ctx), _driver.driver_version(), keep_debug=keep_debug,
                                  nvjitlink=_nvjitlink_version))
        what = f"{img.name} ({_describe(prepared)})"
        from nbjit.cache.sources import relocated  # (deferred: a bundle's first kernel imports no cache stage)
        # (line tables pointed at this user's copy of the sources they name)
        loaded = _driver.load_module(relocated(prepared.data, img.sources), what, prepared.kind)
        mod = cls(img, keep_debug)
        mod._live = _Live(img, ctx, prepared, loaded, mod._facts)
        if prepared.note:
            warn(prepared.note)
        return mod

    def _loaded(self) -> _Live:
        """The precondition of everything that needs the GPU: the live part, made on first
        use (this module's bytes loaded into the current context, or the copy loaded there
        already shared)."""
        live = self._live
        if live is None:
            with _ATTACH_LOCK:
                live = self._live
                if live is None:
                    live = self._attach(load(self.image, keep_debug=self.keep_debug))
        return live

    def _attach(self, target: "Module") -> _Live:
        """Share ``target``'s live part and facts (it was loaded from the same bytes; this
        module's facts join its own), and keep it alive while this module lives."""
        f = self._facts
        target._learn(f.names, f.decls, f.numba)
        live = target._live
        self._owner = target
        self._facts = live.facts
        self._live = live
        return live

    def _learn(self, names: Mapping = _NOTHING, decls: Mapping = _NOTHING, numba: Mapping = _NOTHING) -> None:
        """More facts about the same bytes (name expressions, C declarations, Numba argument
        types): the kernels they concern are typed afresh on next use."""
        changed = self._facts.learn(names, decls, numba)
        if changed:
            self._offline.clear()
            if self._live is not None:  # (those kernels typed afresh on next use)
                self._live.forget(changed)

    def __reduce__(self):
        return (_restore_module, (self._wire(),))

    def _wire(self) -> tuple:
        """The pickled form: plain data, the bytes compressed once per module."""
        blob = self._wire_blob
        live = self._live
        data, kind = live.shipped if live is not None else (self.image.data, self.image.kind)
        if blob is None:
            if kind == "ptx":
                data = data.rstrip(b"\0")
            blob = self._wire_blob = (_sha256(data), len(data), zlib.compress(data, 6))
        img = self.image
        arch = None if img.arch is None else str(img.arch)  # (plain data: the text)
        f = self._facts
        with f.lock:
            facts = {"lowered_names": dict(f.names), "declarations": dict(f.decls), "numba": dict(f.numba)}
        return (_WIRE_VERSION, img.name, kind, arch, *blob, {**facts, "keep_debug": self.keep_debug})

    def _loaded_again(self, img: Image, keep_debug: bool) -> "Module":
        """``load_into`` of ``img`` where this module is loaded there from the same bytes
        (another image object): this module, with ``img``'s facts added; where ``img`` tells
        more (``tells_more``), a module of ``img`` sharing this one's loaded copy."""
        if tells_more(img, self.image):
            twin = Module(img, keep_debug)
            twin._attach(self)  # (one handle, one state per kernel; its names and declarations join)
            return twin
        self._learn(img.lowered_names, img.declarations)
        return self

    # ------------------------------------------------------------ what the live part says
    @property
    def loaded(self) -> bool:
        """Whether the module is loaded (one loaded lazily, or unpickled, loads on first use)."""
        return self._live is not None

    @property
    def context(self):
        """The Numba context the module is loaded into."""
        return self._loaded().context

    @property
    def device(self) -> int:
        """The ordinal of the device the module is loaded on."""
        return self._loaded().device

    @property
    def jit_log(self) -> str:
        """The driver's JIT log of loading (PTX compiled by the driver)."""
        return self._loaded().jit_log

    @property
    def route(self) -> str | None:
        """How PTX was loaded: "driver", "nvjitlink" or "lowered" (None for a cubin or fatbin)."""
        return self._loaded().route

    @property
    def note(self) -> str | None:
        """What loading had to do that is worth knowing (the warning it gave), or None."""
        return self._loaded().note

    @property
    def prepared_kind(self) -> str:
        """What was handed to the driver: "ptx", "cubin" or "fatbin"."""
        return self._loaded().kind

    @property
    def _ctx_key(self) -> int:
        return self._loaded().ctx_key

    # ------------------------------------------------------------ kernels
    @property
    def name(self) -> str:
        """The image's name (its file, or what ``load(name=...)`` said)."""
        return self.image.name

    @property
    def kernels(self) -> tuple[str, ...]:
        """Names of the kernels in the module (mangled, as the driver knows them)."""
        live = self._live
        if live is not None:
            return live.kernels
        return tuple(e.name for e in self._image_kernels()[1])

    def _image_kernels(self) -> tuple[str, tuple[KernelInfo, ...]]:
        """("ptx" or "cubin", the kernels it describes): what the image says of its kernels,
        read without a GPU (a fatbin: its first readable entry). Read once."""
        src = self._source
        if src is None:
            src = self._source = _image_source(self.image)
        return src

    def _resolve(self, name: str) -> str:
        real = self._facts.names.get(name, name)
        if type(name) is not str or real in self.kernels:
            return real
        return self._by_demangled_name(name) or real

    def _by_demangled_name(self, name: str) -> str | None:
        """The kernel whose demangled name is ``name`` or begins with it (``by_demangled_name``)."""
        return by_demangled_name(self.kernels, name, self.name)

    def get_kernel(self, name: str, signature: str | Sequence[str] | None = None) -> Kernel:
        """The kernel ``name`` (a mangled name, or an NVRTC name expression such as
        ``"fill<float>"``). Its parameter types come from every source nbjit has (PTX types,
        the mangled name, the CUDA source given to ``nbjit.compile``, Triton IR);
        ``signature`` declares them where none says (an ``extern "C"`` kernel in a cubin):
        C types such as ``"float*, const float*, float, int"`` or short names
        ``"ptr, ptr, f32, i32"`` (or a list of them). A declaration must fit the image's sizes
        and agree with what the image says; arrays passed for a typed pointer must hold its
        element type."""
        if signature is not None and type(signature) is not str:  # (a list of types, a numpy str, or wrong)
            from nbjit.params.declarations import signature_text
            signature = signature_text(signature, name)
        return self._kernel(name, signature)

    def _kernel(self, name: str, signature: str | None = None, extra_layouts=()) -> Kernel:
        """The one way a Kernel is made: its live state shared per name unless it carries
        extra facts; of a module waiting for first use, a kernel that loads with it."""
        real = self._resolve(name)
        recipe = (real, signature, tuple(extra_layouts))
        if self._live is None:
            if self.kernels and real not in self.kernels:
                raise self._missing(name)
            if signature is not None:  # a declaration is checked against the image now, not at first use
                try:
                    self._offline_info(recipe)
                except NbjitLoadError:  # nothing to check it against before loading
                    pass
            return Kernel(self, recipe)
        return Kernel(self, recipe, self._state(recipe, name))

    def _state(self, recipe: tuple, asked: str | None = None) -> _State:
        """The live state of kernel ``recipe`` (name, signature, extra layouts), this module
        loaded first: shared per name unless the recipe carries facts of its own."""
        live = self._loaded()
        _driver.check_not_forked()
        real, signature, extra = recipe
        if signature is not None or extra:
            st = self._make_state(live, real, asked or real, signature, extra)
            st.recipe = recipe
            remember_function(self, recipe, st, replace=False)
            return st
        with live.lock:
            st = live.states.get(real)
            if st is None:
                st = live.states[real] = self._make_state(live, real, asked or real, None)
                remember_function(self, recipe, st)
        return st

    def _make_state(self, live: _Live, real: str, asked: str, signature: str | None, extra_layouts=()) -> _State:
        """Kernel ``real``'s function and its one signature, merged from every source: the
        inspected images, the driver's parameter list, C declarations (the source given to
        ``nbjit.compile``, Triton IR), the mangled name and the user's ``signature``."""
        func = _driver.get_function(live.handle, real)
        layouts = live.layouts(real) + list(extra_layouts)
        if func is None or (not layouts and live.kernels):
            raise self._missing(asked)
        driver_params = _driver.param_info(func)
        if not layouts:
            layouts = [("driver", from_driver(real, driver_params))]
            driver_params = None
        f = live.facts
        info, image, label = _kernel_info(self.name, real, layouts, signature, bool(extra_layouts), f.decls,
                                          live.typed, f.numba)
        if driver_params is not None:
            _verify(image, driver_params, self.name)
        return _State(real, func, info, live.ctx_key, live.device, label)

    def _offline_info(self, recipe: tuple) -> KernelInfo:
        """A kernel's merged description; while the module waits for first use, from the
        image's own facts, no GPU needed (the driver's parameter list is checked at loading)."""
        if self._live is not None:
            return self._state(recipe).info
        info = self._offline.get(recipe)
        if info is None:
            real, signature, extra = recipe
            kind, entries = self._image_kernels()
            layouts = [(kind, e) for e in entries if e.name == real] + list(extra)
            if not layouts:
                raise NbjitLoadError(f"{self.name}: kernel {real!r}: the image does not describe its parameters; the "
                                     "driver's list of them is read when the module loads (on a GPU)")
            typed = self.image.typed  # (a cache entry's facts, a kernel bundle's manifest)
            info = _kernel_info(self.name, real, layouts, signature, bool(extra), self._facts.decls, typed,
                                self._facts.numba)[0]
            self._offline[recipe] = info
        return info

    def _missing(self, name: str) -> KernelNotFoundError:
        return missing(name, self.kernels, self._facts.names, self.name)

    def __getitem__(self, name: str) -> Kernel:
        # a kernel already made, asked for by its own name: two dict look-ups
        live = self._live
        if live is not None and not _driver.forked():
            try:
                st = live.states.get(name)
            except TypeError:  # not a name
                st = None
            names = live.names
            if st is not None and not (names and names.get(name, name) != name):
                return Kernel(self, st.recipe, st)
        # not made yet, not loaded yet, a name expression for another kernel, a forked child
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

    def __iter__(self) -> Iterator[str]:
        """The kernels' names (``kernels``): ``for name in module``, ``list(module)``; a module
        waiting for first use stays unloaded (its image says them)."""
        return iter(self.kernels)

    def __dir__(self):
        return list(super().__dir__()) + [k for k in self.kernels if k.isidentifier()]

    # ------------------------------------------------------------ globals
    def get_global(self, name: str) -> DeviceGlobal:
        """A ``__device__`` / ``__constant__`` variable: address and size, and ``as_array``."""
        live = self._loaded()
        g = _driver.get_global(live.handle, self._facts.names.get(name, name))
        if g is None:
            src = live.ptx or live.info
            names = [v.name for v in getattr(src, "globals", ()) if getattr(v, "size", None)]
            raise KernelNotFoundError(f"no global {name!r} in {self.name}; it has: {', '.join(names) or '(none)'}")
        return DeviceGlobal(name, g[0], g[1], self)

    # ------------------------------------------------------------ other devices, lifetime
    def on_current_device(self) -> "Module":
        """This image loaded in the current context (the same module if that is its own),
        with this module's facts."""
        if _driver.current_context_key() == self._loaded().ctx_key:
            return self
        twin = load(self.image, keep_debug=self.keep_debug)
        f = self._facts
        twin._learn(f.names, f.decls, f.numba)
        return twin

    def close(self) -> None:
        """Unload now (kernels of this module must not be launched afterwards); a module
        waiting for first use has nothing to unload."""
        if self._live is not None:
            self._live.finalizer()

    def __repr__(self) -> str:
        live = self._live
        if live is None:
            return f"<nbjit.Module {self.name} ({self.image.kind}): loads on first use>"
        route = f", {live.route}" if live.route else ""
        return f"<nbjit.Module {self.name} ({live.kind}{route}) on device {live.device}: {len(live.kernels)} kernels>"


_ATTACH_LOCK = threading.Lock()


_WIRE_VERSION = 1
# the modules most recently unpickled in this process: tasks of one graph (each unpickled on
# its own) share one module, and a worker keeps it loaded between tasks
_RESTORED: "collections.OrderedDict[tuple, Any]" = collections.OrderedDict()
_RESTORED_KEEP = 16
_RESTORING = threading.Lock()


def _restore_module(wire: tuple) -> Module:
    """A pickled module (``Module._wire``), waiting for first use; the same object for the
    same bytes while it is among the last ``_RESTORED_KEEP`` unpickled."""
    if not isinstance(wire, tuple) or not wire or wire[0] != _WIRE_VERSION:
        got = wire[0] if isinstance(wire, tuple) and wire else wire
        raise NbjitLoadError(f"a pickled nbjit module of format {got!r}: this nbjit reads format {_WIRE_VERSION} "
                             "(pickle and unpickle with the same nbjit version)")
    _, name, kind, arch, sha, size, blob, facts = wire
    key = (sha, facts["keep_debug"])
    with _RESTORING:
        mod = _RESTORED.get(key)
        if mod is not None:
            _RESTORED.move_to_end(key)
    if mod is None:
        d = zlib.decompressobj()
        data = d.decompress(blob, size + 1)
        if len(data) != size or _sha256(data) != sha:
            raise NbjitLoadError(f"a pickled nbjit module ({name}): its bytes do not match their SHA-256 (the pickle "
                                 "is damaged)")
        img = Image(data, kind, name, None if arch is None else Arch.parse(arch), facts["lowered_names"], "",
                    facts["declarations"])
        mod = Module._pending(img, facts["keep_debug"], facts["numba"])
        with _RESTORING:
            mod = _RESTORED.setdefault(key, mod)
            while len(_RESTORED) > _RESTORED_KEEP:
                _RESTORED.popitem(last=False)
    mod._learn(facts["lowered_names"], facts["declarations"], facts["numba"])  # a later pickle may know more
    return mod


def _image_source(img: Image) -> tuple[str, tuple[KernelInfo, ...]]:
    """("ptx" or "cubin", the kernels it describes) of an image, read without a GPU (a fatbin:
    its first readable entry)."""
    if img.info is not None:  # a cache entry's facts
        return img.kind, img.info.entries
    if img.typed:  # a kernel bundle's merged signatures (its manifest's)
        return img.kind, tuple(img.typed.values())
    info = inspect_image(img)
    if img.kind == "fatbin":
        entry = next((e for e in info.entries if e.payload is not None and e.kind != "ltoir"), None)
        if entry is None:
            return "cubin", ()
        return _image_source(Image(entry.payload, entry.kind, img.name))
    return img.kind, info.entries


def is_numba_kernel(name: str) -> bool:
    """``numba_abi.is_numba_name`` or ``is_mlir_name`` (numba-cuda's or numba-cuda-mlir's
    kernel), importing that module only for a name mangled as a namespace member (every
    numba-cuda kernel's is) or naming Numba's array type."""
    if not name.startswith("_ZN") and not (name.startswith("_Z") and "5ArrayI" in name):
        return False
    from nbjit.params.numba_abi import is_mlir_name, is_numba_name
    return is_numba_name(name) or is_mlir_name(name)


def _kernel_info(module: str, real: str, layouts: list, signature: str | None, extra: bool, decls: Mapping,
                 typed: Mapping, numba: Mapping) -> tuple[KernelInfo, KernelInfo, str | None]:
    """(kernel ``real``'s merged description, the image's parameter layout that the driver's
    must match, the name messages give it) from ``layouts`` [(source, KernelInfo)], the C
    declarations ``decls``, kernels already ``typed``, Numba argument types ``numba`` and the
    user's ``signature``. ``module`` names the image in errors."""
    if real in numba or is_numba_kernel(real):  # a @cuda.jit kernel: one argument per Python argument
        from nbjit.params import numba_abi
        try:
            image = merge(real, layouts)
        except SignatureConflict as e:
            raise NbjitLoadError(f"{module}: {e}") from None
        args = numba.get(real)
        source = "numba types" if args is not None else "numba mangled name"
        info = numba_abi.signature(real, image, args if args is not None else numba_abi.from_mangled(real), source)
        return info, image, numba_abi.readable_name(real)
    info = typed.get(real) if signature is None and not extra else None
    if info is None:
        types = []
        if signature is not None:
            from nbjit.params.declarations import parse_signature  # (a declared signature: few kernels)
            types.append(("declared", parse_signature(signature, real)))
        if real in decls:
            types.append(decls[real])
        types.append(("mangled name", demangle(real)))
        try:
            info = merge(real, layouts, types)
        except SignatureConflict as e:
            if e.source == "declared":
                raise NbjitArgumentError(f"signature {signature!r}: {e}") from None
            raise NbjitLoadError(f"{module}: {e}") from None
    return info, info, None


def _nvjitlink_version() -> tuple[int, int] | None:
    """``nvjitlink_version``, importing nvJitLink's module only for PTX newer than the
    driver (what the loader asks it for)."""
    from nbjit.toolchain.nvjitlink import nvjitlink_version
    return nvjitlink_version()


def _describe(p: Plan) -> str:
    d = p.details
    if p.ptx is not None:
        v = p.ptx.version
        return f"PTX {v[0]}.{v[1]} for {p.ptx.arch}" + (f", via {p.route}" if p.route != "driver" else "")
    if p.kind == "cubin" and p.info is not None:
        return f"cubin for {p.info.arch}"
    return p.kind + (f" ({d})" if d else "")


def _verify(entry: KernelInfo, driver_params: list[tuple[int, int]], source: str) -> None:
    ours = [(p.offset, p.size) for p in entry.params]
    if not same_layout(driver_params, ours, entry.params):
        raise NbjitLoadError(
            f"{source}: kernel {entry.name!r}: the driver lays out its parameters as (offset, size) "
            f"{driver_params}, the inspected image as {ours}: refusing to launch with a wrong layout")


def tells_more(new: Image, old: Image) -> bool:
    """Whether ``new``, an image of the same bytes as ``old``, carries what its compiler
    reported that ``old`` lacks: ptxas's report (``-Xptxas=-v``: ``Image.resources``) or a
    log. (A cubin NVRTC made with ``-Xptxas=-v`` is byte for byte the one ``nvrtc``/``nvcc``
    made with it elsewhere: a file loaded earlier must not hide the compile's report.)"""
    return bool(new.resources and new.resources != old.resources) or bool(new.log and not old.log)


_NO_SPACE = Pattern(r"\s+")


def by_demangled_name(kernels: Iterable[str], name: str, module: str) -> str | None:
    """The kernel of ``kernels`` whose demangled name is ``name`` (``fill<float>(float*,
    int)``) or begins with it up to its template or parameter list (``fill<float>``, or
    ``fill`` where one kernel is so named), spaces aside; None where none is;
    ``KernelNotFoundError`` where several are (``module`` names the image)."""
    want = _NO_SPACE.sub("", name.strip().removeprefix("void "))
    if not want:
        return None
    found = []
    for k in kernels:
        text = shown_name(k)
        if text is None:
            continue
        t = _NO_SPACE.sub("", text.removeprefix("void "))  # (a template kernel's return type)
        if t == want:
            return k
        if t.startswith(want) and t[len(want)] in "<(":
            found.append((k, text))
    if len(found) > 1:
        raise KernelNotFoundError(f"{name!r} could be any of {len(found)} kernels in {module}: "
                                  + "; ".join(text for _, text in found) + " (give more of the name)")
    return found[0][0] if found else None


def missing(name: str, kernels: Iterable[str], names: Iterable[str], module: str) -> KernelNotFoundError:
    """The error for no kernel ``name`` in image ``module`` among ``kernels`` (and the name
    expressions ``names``): the likely name, and the kernels sorted, each demangled."""
    import difflib

    kernels = list(kernels)
    names = kernels + [k for k in names if k not in kernels]
    guess = difflib.get_close_matches(name, names, n=1) if isinstance(name, str) else []
    shown = [f"{k} ({shown_name(k)})" if shown_name(k) else k for k in sorted(names)]
    why = demangler_missing() if any(k.startswith("_Z") for k in names) else None
    return KernelNotFoundError(f"no kernel {name!r} in {module}"
                               + (f"; did you mean {guess[0]!r}? It has: " if guess else ". It has: ")
                               + (", ".join(shown) or "(none)")
                               + (f" (C++ names are not demangled: the {why})" if why else ""))


def from_driver(name: str, params: list[tuple[int, int]] | None) -> KernelInfo:
    """Kernel ``name`` as the driver's parameter list alone describes it (sizes, offsets)."""
    if params is None:
        raise NbjitLoadError(f"kernel {name!r}: its parameter list is unknown (no readable image and no "
                             "cuFuncGetParamInfo in this driver)")
    ps = [Param(f"param_{i}", "unknown", size, 1, off) for i, (off, size) in enumerate(params) if off >= 0]
    end = max((p.offset + p.size for p in ps), default=0)
    return KernelInfo(name, KernelSignature(tuple(ps), end))


@record
class DeviceGlobal:
    """A module-scope ``__device__`` / ``__constant__`` variable: its device address and size."""

    name: str
    ptr: int
    size: int
    module: Module

    def as_array(self, dtype: Any, shape: int | tuple[int, ...] | None = None) -> Any:
        """A device array of the host nbjit serves (numba-cuda's ``DeviceNDArray``,
        numba-cuda-mlir's, or the bare host's ``nbjit.gpu.memory.DeviceArray``) over the
        variable's memory (reads and writes go to it)."""
        import numpy as np

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
        return current_host().array_view(self.ptr, tuple(shape), dt, self.module)


