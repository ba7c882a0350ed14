"""What a ``Module`` does off a package's first kernel (``module.py`` hands over here, and
this imports no ``module``): its pickled form and unpickling, the same bytes loaded again,
kernels typed afresh, a kernel found by its demangled name, the error naming a missing
kernel, PTX newer than the driver assembled through the cache, a kernel the driver alone
describes, a device variable as the host's array (``DeviceGlobal``, made with the first
global asked for), the module in another context, its ``repr``."""
from __future__ import annotations

import collections
import threading
import zlib
from typing import Any, Callable, Iterable

from nbjit import _driver
from nbjit._defs import Pattern, record
from nbjit._host import current_host
from nbjit.arch import Arch
from nbjit.cdecl import demangler_missing, shown_name
from nbjit.errors import KernelNotFoundError, NbjitCompileError, NbjitLoadError
from nbjit.image import Image, _sha256
from nbjit.loader import Plan
from nbjit.signature import KernelInfo, KernelSignature, Param

__all__ = ["DeviceGlobal"]

_WIRE_VERSION = 1
# the modules most recently unpickled in this process: tasks of one graph (each unpickled on
# its own) share one module, and a worker keeps it loaded between tasks
_RESTORED: "collections.OrderedDict[tuple, Any]" = collections.OrderedDict()
_RESTORED_KEEP = 16
_RESTORING = threading.Lock()


def wire(mod) -> tuple:
    """``Module._wire``: the pickled form, plain data, the bytes compressed once per module."""
    blob = mod._wire_blob
    live = mod._live
    data, kind = live.shipped if live is not None else (mod.image.data, mod.image.kind)
    if blob is None:
        if kind == "ptx":
            data = data.rstrip(b"\0")
        blob = mod._wire_blob = (_sha256(data), len(data), zlib.compress(data, 6))
    img = mod.image
    arch = None if img.arch is None else str(img.arch)  # (plain data: the text)
    f = mod._facts
    with f.lock:
        facts = {"lowered_names": dict(f.names), "declarations": dict(f.decls), "numba": dict(f.numba)}
    return (_WIRE_VERSION, img.name, kind, arch, *blob, {**facts, "keep_debug": mod.keep_debug})


def restore(wire: tuple, pending: Callable) -> Any:
    """``module._restore_module``: a pickled module (``wire``), made by ``pending(image,
    keep_debug, numba)`` to wait for first use; the same object for the same bytes while it
    is among the last ``_RESTORED_KEEP`` unpickled."""
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
        mod = pending(img, facts["keep_debug"], facts["numba"])
        with _RESTORING:
            mod = _RESTORED.setdefault(key, mod)
            while len(_RESTORED) > _RESTORED_KEEP:
                _RESTORED.popitem(last=False)
    mod._learn(facts["lowered_names"], facts["declarations"], facts["numba"])  # a later pickle may know more
    return mod


def loaded_again(mod, img: Image, keep_debug: bool) -> Any:
    """``module._load_into`` of ``img`` where ``mod`` is loaded there from the same bytes
    (another image object): ``mod``, with ``img``'s facts added; where ``img`` tells more
    (``tells_more``), a module of ``img`` sharing ``mod``'s loaded copy."""
    if tells_more(img, mod.image):
        twin = type(mod)(img, keep_debug)
        twin._attach(mod)  # (one handle, one state per kernel; its names and declarations join)
        return twin
    mod._learn(img.lowered_names, img.declarations)
    return mod


def tells_more(new: Image, old: Image) -> bool:
    """Whether ``new``, an image of the same bytes as ``old``, carries what its compiler
    reported that ``old`` lacks: ptxas's report (``-Xptxas=-v``: ``Image.resources``) or a
    log. (A cubin NVRTC made with ``-Xptxas=-v`` is byte for byte the one ``nvrtc``/``nvcc``
    made with it elsewhere: a file loaded earlier must not hide the compile's report.)"""
    return bool(new.resources and new.resources != old.resources) or bool(new.log and not old.log)


def forget(live, names: Iterable[str]) -> None:
    """Kernels of a module's live part (``module._Live``) to type afresh on next use (new
    facts about them)."""
    with live.lock:
        for k in names:
            live.states.pop(k, None)
            live.typed.pop(k, None)


def on_current_device(mod, load: Callable) -> Any:
    """``Module.on_current_device``: ``mod``'s image loaded in the current context by
    ``load`` (``module.load``), with ``mod``'s facts; ``mod`` where that is its own."""
    if _driver.current_context_key() == mod._loaded().ctx_key:
        return mod
    twin = load(mod.image, keep_debug=mod.keep_debug)
    f = mod._facts
    twin._learn(f.names, f.decls, f.numba)
    return twin


def module_repr(mod) -> str:
    """``Module.__repr__``."""
    live = mod._live
    if live is None:
        return f"<nbjit.Module {mod.name} ({mod.image.kind}): loads on first use>"
    route = f", {live.route}" if live.route else ""
    return f"<nbjit.Module {mod.name} ({live.kind}{route}) on device {live.device}: {len(live.kernels)} kernels>"


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


def assemble(p: Plan, cache=None) -> Plan:
    """``module.carry_out`` of a plan with a host step: its PTX, newer than the driver,
    assembled to a cubin by nvJitLink through the cache."""
    a = p.assemble
    from nbjit.compiler import assemble_cached  # (here: loading a cubin or a kernel bundle imports no compiler)
    from nbjit.cubin import inspect_cubin
    try:
        cubin = assemble_cached(a.ptx, a.arch, name=a.name, cache=cache)
    except NbjitCompileError as e:
        raise NbjitLoadError(
            f"{a.name}: PTX {a.ptx_version[0]}.{a.ptx_version[1]} is newer than this driver takes (CUDA "
            f"{a.driver_cuda[0]}.{a.driver_cuda[1]}: PTX up to {a.driver_ptx[0]}.{a.driver_ptx[1]}), and nvJitLink "
            f"{a.nvjitlink[0]}.{a.nvjitlink[1]} could not assemble it:\n{e}") from None
    return Plan(cubin, "cubin", inspect_cubin(cubin, source=a.name), p.route, p.note, p.entry, p.ptx, p.details)


def from_driver(name: str, params: list[tuple[int, int]] | None) -> KernelInfo:
    """Kernel ``name`` as the driver's parameter list alone describes it (sizes, offsets)."""
    if params is None:
        raise NbjitLoadError(f"kernel {name!r}: its parameter list is unknown (no readable image and no "
                             "cuFuncGetParamInfo in this driver)")
    ps = [Param(f"param_{i}", "unknown", size, 1, off) for i, (off, size) in enumerate(params) if off >= 0]
    end = max((p.offset + p.size for p in ps), default=0)
    return KernelInfo(name, KernelSignature(tuple(ps), end))


def get_global(mod, name: str) -> "DeviceGlobal":
    """``Module.get_global``: the variable ``name`` of ``mod`` (loaded first)."""
    live = mod._loaded()
    g = _driver.get_global(live.handle, mod._facts.names.get(name, name))
    if g is None:
        src = live.ptx or live.info
        names = [v.name for v in getattr(src, "globals", ()) if getattr(v, "size", None)]
        raise KernelNotFoundError(f"no global {name!r} in {mod.name}; it has: {', '.join(names) or '(none)'}")
    return DeviceGlobal(name, g[0], g[1], mod)


@record
class DeviceGlobal:
    """A module-scope ``__device__`` / ``__constant__`` variable: its device address and size."""

    name: str
    ptr: int
    size: int
    module: "Module"  # noqa: F821 (nbjit.module's: this imports no module)

    def as_array(self, dtype: Any, shape: int | tuple[int, ...] | None = None) -> Any:
        """A device array of the Numba host nbjit serves (numba-cuda's ``DeviceNDArray``, or
        numba-cuda-mlir's) over the variable's memory (reads and writes go to it)."""
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


DeviceGlobal.__module__ = "nbjit.module"  # (where users find it; pickles name it so)
