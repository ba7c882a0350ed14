"""Kernel parameter lists made and typed in bulk, for the readers and the compiler (``signature``
holds the shapes and ``merge``; a loaded kernel needs nothing of this): parameters placed in
the buffer (``layout``, ``param_shape``, ``place``), the records made without their
field-by-field ``__init__`` (``maker``), an image's entries typed from their mangled names and
declarations (``typed_entries``, ``build_table``), an entry found by name (``find_entry``)."""
from __future__ import annotations

import functools
from dataclasses import MISSING, fields
from typing import Any, Callable, Iterable, Mapping

from nbjit.cdecl import demangle
from nbjit.signature import KernelInfo, KernelSignature, Param, SignatureConflict, merge

__all__ = ["layout", "param_shape", "place", "find_entry", "build_table", "typed_entries", "maker"]


def layout(specs: list[tuple[str, str, int, int | None, bool, str | None, int | None, int | None]]) -> KernelSignature:
    """Place parameters in a buffer: each at the next offset aligned to its alignment.

    ``specs`` holds ``(name, type, element_size, count, pointer, space, align, pointee_align)``;
    ``align`` None means the element's natural size (FORMATS.md §1.3, checked against
    cubins' KPARAM_INFO).
    """
    return place([(name, param_shape(*spec)) for name, *spec in specs])


@functools.lru_cache(maxsize=1024)
def param_shape(typ: str, elem: int, count: int | None, pointer: bool, space: str | None, align: int | None,
                palign: int | None) -> tuple[int, int, dict]:
    """A kind of parameter (a ``layout`` spec but the name) as ``place`` takes it: its size,
    its alignment and its ``Param``'s fields (name and offset to be filled in). Cached: a
    module has few kinds of parameter, and ``place`` copies the fields."""
    size = elem * (count if count is not None else 1)
    a = align or elem
    return size, a, Param(None, typ, size, a, None, count, pointer, space, palign).__dict__


def place(params: Iterable[tuple[str, tuple[int, int, dict]]]) -> KernelSignature:
    """``layout`` of ``(name, param_shape(...))`` pairs, one dict copy a parameter (the
    dataclass's ``__init__`` sets each of its 14 fields through ``object.__setattr__``, 5-10x
    slower; it checks nothing)."""
    out = []
    off = 0
    new, set_ = object.__new__, object.__setattr__
    for name, (size, a, fields_) in params:
        off = (off + a - 1) // a * a
        d = fields_.copy()
        d["name"] = name
        d["offset"] = off
        p = new(Param)
        set_(p, "__dict__", d)
        out.append(p)
        off += size
    return KernelSignature(tuple(out), off)


def find_entry(entries: Iterable[KernelInfo], name: str) -> KernelInfo:
    """The entry called ``name`` (KeyError if none): for PtxInfo and CubinInfo."""
    for e in entries:
        if e.name == name:
            return e
    raise KeyError(name)


def build_table(names: Iterable[str], layouts_of: Callable[[str], list], ctypes_of: Callable[[str], list]
                ) -> dict[str, KernelInfo]:
    """``{kernel name: KernelInfo}`` for ``names``, merging ``layouts_of(name)`` and
    ``ctypes_of(name)`` (see ``merge``)."""
    return {n: merge(n, layouts_of(n), ctypes_of(n)) for n in names}


def typed_entries(entries: Iterable[KernelInfo], label: str, declarations: Mapping[str, Any] | None = None
                  ) -> tuple[KernelInfo, ...]:
    """``entries`` of one image (``label`` "ptx" or "cubin") with the C types their mangled
    names and ``declarations`` (``{name: (label, params)}``) give; an entry whose sources
    contradict each other is left as the image says."""
    out = []
    for e in entries:
        try:
            out.append(merge(e.name, [(label, e)], [(declarations or {}).get(e.name),
                                                    ("mangled name", demangle(e.name))]))
        except SignatureConflict:
            out.append(e)
    return tuple(out)


def maker(cls) -> Callable[..., Any]:
    """A keyword-only constructor for one of these frozen dataclasses that fills the new
    object's fields at once (in their order), defaults for those not given; the fields
    without a default must be given. The generated ``__init__`` sets each field through
    ``object.__setattr__``, 5-10x slower, and the PTX reader makes one ``KernelInfo`` per
    kernel (``__init__`` checks nothing; ``replace`` below skips it too)."""
    if any(f.default_factory is not MISSING for f in fields(cls)):
        raise TypeError(f"{cls.__name__} has a field with a default factory: maker() gives defaults as they are")
    template = {f.name: f.default for f in fields(cls)}  # (MISSING where the caller must give one)
    new, set_ = object.__new__, object.__setattr__

    def make(**values):
        d = template.copy()
        d.update(values)
        obj = new(cls)
        set_(obj, "__dict__", d)
        return obj

    make.__doc__ = f"A {cls.__name__} from keyword arguments (see _signature_build.maker)."
    return make
