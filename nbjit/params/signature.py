"""Kernel parameter lists: one shape for PTX, cubin and user-declared signatures; ``merge``
(what each source knows of a kernel, put together); parameters laid out in the buffer, an
image's entries typed in bulk, and the readers' fast record makers."""
from __future__ import annotations

import functools
import re
from dataclasses import MISSING, fields
from typing import Any, Callable, Iterable, Mapping, Sequence

from nbjit.params.cdecl import demangle, element_of, scalar_facts
from nbjit.records import record

__all__ = ["Param", "KernelSignature", "Directives", "KernelInfo", "RESOURCES", "SCALAR_TYPES", "merge",
           "SignatureConflict"]

# PTX parameter types -> size in bytes. `.pred` cannot be a kernel parameter for ptxas
# (FORMATS.md §1.3) but is a PTX type, so it is listed for completeness.
SCALAR_TYPES: dict[str, int] = {
    "u8": 1, "s8": 1, "b8": 1, "pred": 1,
    "u16": 2, "s16": 2, "b16": 2, "f16": 2, "bf16": 2,
    "u32": 4, "s32": 4, "b32": 4, "f32": 4, "f16x2": 4, "bf16x2": 4,
    "u64": 8, "s64": 8, "b64": 8, "f64": 8,
    "b128": 16,
}


@record
class Param:
    """One kernel parameter and its place in the parameter buffer.

    ``type`` is a PTX type name without the dot (``"u64"``, ``"f32"``, ``"b8"``) or
    ``"unknown"`` where only the size is known (cubins). ``count`` is the array length of
    an array parameter (``.b8 p[24]``: a struct passed by value), else ``None``.
    ``pointer`` is true where the parameter is declared a pointer (``.ptr``, a cubin's
    parameter attributes, a C type ``T*``, or a user signature's ``ptr``); ``space`` is the
    ``.ptr`` state space, if any.

    Where a C type is known (a demangled name, the CUDA source, Triton IR, a declaration):
    ``ctype`` is its text (``"const float*"``), ``pointee`` the element type of a pointer
    (``"float"``, ``"void"``, a struct name) and ``const`` whether that is const.
    ``origin`` says where each fact came from: ``(("layout", "ptx"), ("type", "mangled
    name"), ...)``.
    """

    name: str
    type: str
    size: int
    align: int | None  # None: not recorded (cubins keep offsets, not alignments)
    offset: int
    count: int | None = None
    pointer: bool = False
    space: str | None = None
    pointee_align: int | None = None
    ctype: str | None = None
    pointee: str | None = None
    const: bool = False
    origin: tuple[tuple[str, str], ...] = ()
    abi: Any = None  # how a foreign ABI passes it (a numba_abi.NumbaArray for a Numba array)

    @property
    def element(self) -> tuple[str, int | None]:
        """What an array passed here must hold, as ``cdecl.element_of`` says: ``("void",
        None)`` for non-pointers, ``void*`` and pointers whose element type is unknown."""
        if not self.pointer or self.pointee is None:
            return ("void", None)
        return element_of(self.pointee)

    @property
    def kind(self) -> str:
        """``"pointer"``, ``"struct"`` (array/aggregate), ``"scalar"`` or ``"unknown"``."""
        if self.pointer:
            return "pointer"
        if self.count is not None:
            return "struct"
        if self.type == "unknown":
            return "unknown"
        return "scalar"

    def to_json(self) -> dict:
        d = {"name": self.name, "type": self.type, "size": self.size, "align": self.align,
             "offset": self.offset}
        if self.count is not None:
            d["count"] = self.count
        if self.pointer:
            d["pointer"] = True
            d["space"] = self.space
        if self.ctype is not None:
            d["ctype"] = self.ctype
        if self.pointee is not None:
            d["pointee"] = self.pointee
            d["const"] = self.const
        if self.origin:
            d["origin"] = dict(self.origin)
        return d

    @classmethod
    def from_json(cls, d: Any) -> "Param":
        """The parameter ``to_json`` gave ``d`` for (``abi`` and ``pointee_align`` are not in
        it); ``ValueError`` names the field that is not what ``to_json`` writes."""
        if type(d) is not dict:
            raise ValueError(f"a parameter is {type(d).__name__}, not an object")
        name = _field(d, "name", str)
        origin = d.get("origin", {})
        if type(origin) is not dict or not all(type(v) is str for v in origin.values()):
            raise ValueError(f"parameter {name!r}: origin is not {{fact: source}}")
        p = cls(name, _field(d, "type", str), _field(d, "size", int), _field(d, "align", int, None),
                _field(d, "offset", int), _field(d, "count", int, None), _field(d, "pointer", bool, False),
                _field(d, "space", str, None), None, _field(d, "ctype", str, None), _field(d, "pointee", str, None),
                _field(d, "const", bool, False), tuple(origin.items()))
        if p.size < 0 or p.offset < 0:
            raise ValueError(f"parameter {name!r}: size {p.size} at offset {p.offset}")
        return p


@record
class KernelSignature:
    """The ordered parameters of a kernel and the size of its parameter buffer."""

    params: tuple[Param, ...]
    size: int

    def __len__(self) -> int:
        return len(self.params)

    def __iter__(self):
        return iter(self.params)

    def __getitem__(self, i: int) -> Param:
        return self.params[i]

    def __str__(self) -> str:
        return "(" + ", ".join(_describe(p, shown_param_name(p.name, i)) for i, p in enumerate(self.params)) + ")"


def shown_param_name(name: str, i: int) -> str:
    """A parameter's name as shown: a compiler's placeholder (PTX's ``<kernel>_param_<i>``)
    as ``param_<i>``, as a cubin names it; a source's name as it is."""
    return f"param_{i}" if name.endswith(f"_param_{i}") else name


def _describe(p: Param, name: str) -> str:
    if p.ctype is not None:
        return f"{p.ctype} {name}"
    if p.pointer:
        return f"ptr {name}"
    if p.count is not None:
        return f"{p.type}[{p.count}] {name}"
    if p.type == "unknown":
        return f"<{p.size} bytes> {name}"
    return f"{p.type} {name}"


@record
class Directives:
    """Per-kernel performance directives (PTX) or their cubin attribute equivalents."""

    maxntid: tuple[int, ...] | None = None
    reqntid: tuple[int, ...] | None = None
    minnctapersm: int | None = None
    maxnctapersm: int | None = None
    maxnreg: int | None = None
    noreturn: bool = False
    explicitcluster: bool = False
    reqnctapercluster: tuple[int, ...] | None = None
    maxclusterrank: int | None = None
    blocksareclusters: bool = False

    def to_json(self) -> dict:
        """Only the directives that are present, tuples as lists."""
        out = {}
        for k, v in self.__dict__.items():
            if v is None or v is False:
                continue
            out[k] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_json(cls, d: Any) -> "Directives":
        """The directives ``to_json`` gave ``d`` for; ``ValueError`` for anything else."""
        if type(d) is not dict:
            raise ValueError(f"directives are {type(d).__name__}, not an object")
        kw = {}
        for k, v in d.items():
            kind = _DIRECTIVE_KINDS.get(k)
            if kind is None:
                raise ValueError(f"{k!r} is not a directive")
            if kind is tuple:
                if type(v) is not list or not all(type(x) is int for x in v):
                    raise ValueError(f"directive {k}: {v!r} is not a list of integers")
                v = tuple(v)
            elif type(v) is not kind:
                raise ValueError(f"directive {k}: {v!r} is not {kind.__name__}")
            kw[k] = v
        return cls(**kw)

    @property
    def cluster(self) -> tuple[int, int, int] | None:
        """The required cluster shape, padded to three dimensions, if any."""
        if not self.reqnctapercluster:
            return None
        return tuple((list(self.reqnctapercluster) + [1, 1])[:3])  # type: ignore[return-value]


_DIRECTIVE_KINDS = {"maxntid": tuple, "reqntid": tuple, "minnctapersm": int, "maxnctapersm": int, "maxnreg": int,
                    "noreturn": bool, "explicitcluster": bool, "reqnctapercluster": tuple, "maxclusterrank": int,
                    "blocksareclusters": bool}

# a kernel's resources as compiled code records them (None in PTX): what each cubin has its own of
RESOURCES = ("registers", "shared", "const", "local", "stack", "frame", "spills", "barriers")


@record
class KernelInfo:
    """A kernel entry: its name, parameters and launch directives.

    The same shape comes from PTX, cubins and user-declared signatures; the resource
    fields (``RESOURCES``: registers, shared, const, local, stack, frame, spills, barriers) are known
    only for compiled code and are None for PTX.
    """

    name: str
    signature: KernelSignature
    directives: Directives = Directives()
    linkage: str | None = None
    registers: int | None = None
    shared: int | None = None
    const: int | None = None
    local: int | None = None  # local memory outside the stack (.nv.local.<kernel>; cuobjdump's LOCAL), bytes
    stack: int | None = None  # the stack it needs with the functions it calls (cuobjdump's STACK)
    # where the kernel's own parameters start, where arguments and parameters are not one to
    # one (a Numba array argument is 5 + 2·ndim parameters); None: the params' offsets
    launch_offsets: tuple[int, ...] | None = None
    # the griddepcontrol instructions (PTX) the kernel or a function it calls runs: "wait"
    # (it waits for the grid it depends on) and/or "launch_dependents"; () where none or unknown
    griddepcontrol: tuple[str, ...] = ()
    frame: int | None = None  # the kernel's own stack frame, bytes (ptxas's "stack frame"; spills live there)
    # instructions that spill a register to the stack or refill it (the cubin's SpillRefill
    # annotations; ptxas -v counts the same code in bytes); None where the cubin does not say
    spills: int | None = None
    barriers: int | None = None  # named barriers it uses (__syncthreads uses one)

    @property
    def waits_for_grid(self) -> bool:
        """Whether the kernel runs ``griddepcontrol.wait`` (so may be launched with
        programmatic dependent launch: it waits itself for the grid before it)."""
        return "wait" in self.griddepcontrol

    @property
    def params(self) -> tuple[Param, ...]:
        """The parameters in order."""
        return self.signature.params

    @property
    def param_size(self) -> int:
        """Bytes of the parameter buffer."""
        return self.signature.size

    def to_json(self) -> dict:
        d = {
            "name": self.name,
            "linkage": self.linkage,
            "params": [p.to_json() for p in self.signature.params],
            "param_size": self.signature.size,
            "directives": self.directives.to_json(),
        }
        for k in RESOURCES:
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        if self.griddepcontrol:
            d["griddepcontrol"] = list(self.griddepcontrol)
        return d

    @classmethod
    def from_json(cls, d: Any) -> "KernelInfo":
        """The kernel ``to_json`` gave ``d`` for (a kernel bundle's manifest lists its
        kernels so); ``ValueError`` names the kernel and the field that is not what
        ``to_json`` writes, or parameters that overrun the parameter buffer."""
        if type(d) is not dict:
            raise ValueError(f"a kernel is {type(d).__name__}, not an object")
        name = _field(d, "name", str)
        try:
            ps = d.get("params")
            if type(ps) is not list:
                raise ValueError("params is not a list")
            params = tuple(Param.from_json(p) for p in ps)
            size = _field(d, "param_size", int)
            if any(p.offset + p.size > size for p in params):
                raise ValueError(f"parameters overrun the {size}-byte parameter buffer")
            gdc = d.get("griddepcontrol", [])
            if type(gdc) is not list or not all(type(x) is str for x in gdc):
                raise ValueError("griddepcontrol is not a list of text")
            resources = {k: _field(d, k, int, None) for k in RESOURCES}
            return cls(name, KernelSignature(params, size), Directives.from_json(d.get("directives", {})),
                       _field(d, "linkage", str, None), griddepcontrol=tuple(gdc), **resources)
        except ValueError as e:
            raise ValueError(f"kernel {name!r}: {e}") from None


_REQUIRED = object()


def _field(d: dict, key: str, kind: type, default: Any = _REQUIRED) -> Any:
    """``d[key]``, of type ``kind`` exactly (or the ``default`` where it is absent or, for
    a None default, null); ``ValueError`` otherwise."""
    v = d.get(key, _REQUIRED)
    if v is _REQUIRED or (v is None and default is None):
        if default is _REQUIRED:
            raise ValueError(f"no {key}")
        return default
    if type(v) is not kind:
        raise ValueError(f"{key} is {type(v).__name__}, not {kind.__name__}")
    return v


# ------------------------------------------------------------------ merging what each source knows


class SignatureConflict(ValueError):
    """Two sources disagree about a kernel's parameters (the caller picks the nbjit error)."""

    def __init__(self, message: str, source: str):
        super().__init__(message)
        self.source = source


def same_layout(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]], params: Iterable[Param]) -> bool:
    """Whether two sources' ``(offset, size)`` lists describe one parameter list: the same
    sizes in order, and the same offsets unless a parameter may be aligned beyond 16 bytes
    (``params``: both sources' parameters). A ``__grid_constant__ CUtensorMap`` is aligned
    to 64: the compiler places it by its address in the constant bank, whose parameter area
    starts 16-aligned, so the cubin pads before it (offset 48, say) where PTX says 0. Each
    parameter is handed to the driver through its own pointer, so the padding is the
    driver's business."""
    if [s for _, s in a] != [s for _, s in b]:
        return False
    if any(p.size > 16 and (p.align is None or p.align > 16) for p in params):
        return True
    return [o for o, _ in a] == [o for o, _ in b]


def merge(name: str, layouts: Iterable[tuple[str, KernelInfo | None]],
          ctypes: Iterable[tuple[str, Sequence[Any] | None] | None] = ()) -> KernelInfo:
    """One ``KernelInfo`` for kernel ``name`` from every source that knows something of it.

    ``layouts``: ``[(label, KernelInfo), ...]`` from PTX and cubins (label ``"ptx"``,
    ``"cubin"``, ``"driver"``): offsets and sizes must agree; the first gives names and PTX
    types. ``ctypes``: ``[(label, [CParam, ...] or None), ...]`` from the mangled name, the
    CUDA source, Triton IR or a user declaration; a list whose length is not the kernel's
    parameter count says nothing of this ABI (Numba expands arrays into fields) and is left
    out, except a ``"declared"`` one, which must fit. Facts are never guessed; a
    contradiction raises ``SignatureConflict`` naming kernel, parameter and sources.
    """
    layouts = [(lbl, k) for lbl, k in layouts if k is not None]
    if not layouts:
        raise SignatureConflict(f"kernel {name!r}: no source gives its parameter layout", "layout")
    label0, base = layouts[0]
    # (a layout merged before, a kernel bundle's manifest's, keeps where its facts came from)
    params = [p if p.origin else _with_origin(p, (("layout", label0),) + ((("type", label0),) if p.type != "unknown"
                                                                            else ()))
              for p in base.params]
    info = base
    for lbl, other in layouts[1:]:
        ours = [(p.offset, p.size) for p in base.params]
        theirs = [(p.offset, p.size) for p in other.params]
        if not same_layout(ours, theirs, base.params + other.params):
            raise SignatureConflict(
                f"kernel {name!r}: {label0} lays out its parameters as (offset, size) {ours}, {lbl} as {theirs}", lbl)
        params = [_layout_facts(p, q, lbl) for p, q in zip(params, other.params)]
        info = _resources(info, other)
    for item in ctypes:
        if item is None or item[1] is None:
            continue
        lbl, cps = item
        if len(cps) != len(params):
            if lbl == "declared":
                raise SignatureConflict(f"kernel {name!r}: the declaration has {len(cps)} parameters, the kernel "
                                        f"{len(params)}: {name}{KernelSignature(tuple(params), base.param_size)}", lbl)
            continue
        params = [_typed(name, i, p, c, lbl) for i, (p, c) in enumerate(zip(params, cps))]
    gdc = next((k.griddepcontrol for _, k in layouts if k.griddepcontrol), ())
    return KernelInfo(name, KernelSignature(tuple(params), base.param_size), info.directives, info.linkage,
                      griddepcontrol=gdc, **{k: getattr(info, k) for k in RESOURCES})


def replace(obj, **changes):
    """A copy of one of these frozen dataclasses with ``changes`` (as ``dataclasses.replace``,
    without running ``__init__`` again: they check nothing there, and merging makes many)."""
    if not changes.keys() <= obj.__dict__.keys():
        raise TypeError(f"{type(obj).__name__} has no field {sorted(changes.keys() - obj.__dict__.keys())}")
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new


def _with_origin(p: Param, facts) -> Param:
    return replace(p, origin=tuple(dict((*p.origin, *facts)).items()))


def _layout_facts(p: Param, q: Param, label: str) -> Param:
    """``p`` with what layout source ``q`` adds: pointer-ness and pointee alignment (cubins),
    the type and the parameter's alignment (PTX beside a cubin)."""
    if q.pointer and not p.pointer:
        p = replace(p, pointer=True, space=p.space or q.space, pointee_align=p.pointee_align or q.pointee_align)
        p = _with_origin(p, (("pointer", label),))
    if p.type == "unknown" and q.type != "unknown":
        p = _with_origin(replace(p, type=q.type, count=q.count), (("type", label),))
    if p.align is None and q.align is not None:  # PTX declares it; a cubin does not say
        p = _with_origin(replace(p, align=q.align), (("align", label),))
    return p


def _resources(a: KernelInfo, b: KernelInfo) -> KernelInfo:
    kw = {k: getattr(a, k) if getattr(a, k) is not None else getattr(b, k) for k in RESOURCES}
    directives = a.directives if a.directives != Directives() else b.directives
    return replace(a, directives=directives, **kw)


def _typed(kernel: str, i: int, p: Param, c, label: str) -> Param:
    """``p`` with the facts of C type ``c`` from ``label``, or SignatureConflict."""
    def conflict(why: str) -> SignatureConflict:
        return SignatureConflict(f"kernel {kernel!r}, parameter {i} ({p.name}): the {label} type is {c.text}, "
                                 f"{why}", label)

    name = c.name or p.name
    known = dict(p.origin)
    if not c.pointer and "CUtensorMap" in c.base and p.size != 128:
        raise conflict(f"a tensor map (128 bytes), but the parameter takes {p.size} bytes")
    if c.pointer:
        if p.size != 8:
            raise conflict(f"a pointer (8 bytes), but the parameter takes {p.size} bytes")
        if p.ctype is not None:  # an earlier C source typed it: they must agree
            if not p.pointer or (p.pointee not in (None, "void") and c.base != "void"
                                 and element_of(p.pointee) != element_of(c.base)):
                raise conflict(f"but the {known.get('ctype', 'other')} type is {p.ctype}")
            return p
        typ = p.type if p.type not in ("unknown", "b64") else "u64"
        return _with_origin(replace(p, name=name, type=typ, count=None, pointer=True, ctype=c.text,
                                    pointee=c.base, const=c.const),
                            (("pointer", label), ("pointee", label), ("ctype", label)))
    facts = scalar_facts(c.base)
    if p.ctype is not None:
        if p.pointer or (facts and scalar_facts(p.ctype) and scalar_facts(p.ctype)[0] != facts[0]):
            raise conflict(f"but the {known.get('ctype', 'other')} type is {p.ctype}")
        return p
    if facts is None:  # a struct, enum or vector by value: the layout's bytes stay
        m = re.fullmatch(r"bytes(\d+)", c.base)
        if m and int(m.group(1)) != p.size:
            raise conflict(f"{m.group(1)} bytes, but the parameter takes {p.size}")
        if p.pointer and label != "declared":
            raise conflict("but the image marks it a pointer")
        return _with_origin(replace(p, name=name, ctype=c.text, pointer=False if label == "declared" else p.pointer),
                            (("ctype", label),))
    ptx, size, _ = facts
    if size != p.size:
        raise conflict(f"{size} bytes, but the parameter takes {p.size}")
    if p.pointer and label != "declared":
        raise conflict("but the image marks it a pointer")
    if p.type not in ("unknown", ptx) and p.count is None and not _same_bits(p.type, ptx):
        raise conflict(f"but the {dict(p.origin).get('type', 'image')} type is .{p.type}")
    return _with_origin(replace(p, name=name, type=ptx, count=None, pointer=False, space=None, ctype=c.text),
                        (("type", label), ("ctype", label)))


def _same_bits(a: str, b: str) -> bool:
    """PTX types that C types may refine: nvcc writes ``int`` as ``.u32``, ``long`` as
    ``.u64``, ``bool`` as ``.u8``, untyped ``.b32``."""
    ints = "usb"
    return a[0] in ints and b[0] in ints and a[1:] == b[1:]


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

    make.__doc__ = f"A {cls.__name__} from keyword arguments (see maker)."
    return make
