"""Kernel parameter lists: one shape for PTX, cubin and user-declared signatures."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Param", "KernelSignature", "Directives", "KernelInfo", "SCALAR_TYPES", "layout", "find_entry"]

# PTX parameter types -> size in bytes. `.pred` cannot be a kernel parameter for ptxas
# (FORMATS.md §1.3) but is a PTX type, so it is listed for completeness.
SCALAR_TYPES: dict[str, int] = {
    "u8": 1, "s8": 1, "b8": 1, "pred": 1,
    "u16": 2, "s16": 2, "b16": 2, "f16": 2, "bf16": 2,
    "u32": 4, "s32": 4, "b32": 4, "f32": 4, "f16x2": 4, "bf16x2": 4,
    "u64": 8, "s64": 8, "b64": 8, "f64": 8,
    "b128": 16,
}


@dataclass(frozen=True)
class Param:
    """One kernel parameter and its place in the parameter buffer.

    ``type`` is a PTX type name without the dot (``"u64"``, ``"f32"``, ``"b8"``) or
    ``"unknown"`` where only the size is known (cubins). ``count`` is the array length of
    an array parameter (``.b8 p[24]``: a struct passed by value), else ``None``.
    ``pointer`` is true where the parameter is declared a pointer (``.ptr``, or a user
    signature's ``ptr``); ``space`` is the ``.ptr`` state space, if any.
    """

    name: str
    type: str
    size: int
    align: int
    offset: int
    count: int | None = None
    pointer: bool = False
    space: str | None = None
    pointee_align: int | None = None

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
        return d


@dataclass(frozen=True)
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
        return "(" + ", ".join(_describe(p) for p in self.params) + ")"


def _describe(p: Param) -> str:
    if p.pointer:
        return f"ptr {p.name}"
    if p.count is not None:
        return f"{p.type}[{p.count}] {p.name}"
    if p.type == "unknown":
        return f"<{p.size} bytes> {p.name}"
    return f"{p.type} {p.name}"


def layout(specs: list[tuple[str, str, int, int | None, bool, str | None, int | None, int | None]]) -> KernelSignature:
    """Place parameters in a buffer: each at the next offset aligned to its alignment.

    ``specs`` holds ``(name, type, element_size, count, pointer, space, align, pointee_align)``;
    ``align`` None means the element's natural size (FORMATS.md §1.3, checked against
    cubins' KPARAM_INFO).
    """
    params = []
    off = 0
    for name, typ, elem, count, pointer, space, align, palign in specs:
        size = elem * (count if count is not None else 1)
        a = align or elem
        off = (off + a - 1) // a * a
        params.append(Param(name, typ, size, a, off, count, pointer, space, palign))
        off += size
    return KernelSignature(tuple(params), off)


@dataclass(frozen=True)
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

    @property
    def cluster(self) -> tuple[int, int, int] | None:
        """The required cluster shape, padded to three dimensions, if any."""
        if not self.reqnctapercluster:
            return None
        return tuple((list(self.reqnctapercluster) + [1, 1])[:3])  # type: ignore[return-value]


@dataclass(frozen=True)
class KernelInfo:
    """A kernel entry: its name, parameters and launch directives.

    The same shape comes from PTX, cubins and user-declared signatures; the resource
    fields (registers, shared, const, local) are known only for compiled code and are
    None for PTX.
    """

    name: str
    signature: KernelSignature
    directives: Directives = Directives()
    linkage: str | None = None
    registers: int | None = None
    shared: int | None = None
    const: int | None = None
    local: int | None = None

    @property
    def params(self) -> tuple[Param, ...]:
        return self.signature.params

    @property
    def param_size(self) -> int:
        return self.signature.size

    def to_json(self) -> dict:
        d = {
            "name": self.name,
            "linkage": self.linkage,
            "params": [p.to_json() for p in self.signature.params],
            "param_size": self.signature.size,
            "directives": self.directives.to_json(),
        }
        for k in ("registers", "shared", "const", "local"):
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        return d


def find_entry(entries, name: str) -> KernelInfo:
    """The entry called ``name`` (KeyError if none): for PtxInfo and CubinInfo."""
    for e in entries:
        if e.name == name:
            return e
    raise KeyError(name)
