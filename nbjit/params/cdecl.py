"""C-level parameter types of kernels: ``CParam``, the C scalar and vector types (sizes, PTX
types, element kinds for dtype checks), and the types Itanium-mangled kernel names encode
(demangled with ``itanium_demangler``, which returns a syntax tree: ``demangle.py``). Pure
data: no CUDA needed. The ``extern "C"`` declarations of CUDA C++ source, Triton IR
signatures, single C declarations and declared signatures are read by ``declarations.py``
(a loaded kernel parses no source).

Each reader gives ``[CParam, ...]`` per kernel or ``None`` where it cannot say; nothing is
guessed. ``signature.merge`` puts these facts together with the layouts of PTX and cubins."""
from __future__ import annotations

import functools

from nbjit.records import Pattern, record

__all__ = ["CParam", "scalar_facts", "demangle", "demangled_text", "element_of"]

# C scalar type -> (PTX type, size, element kind for array dtype checks)
# kinds: "f" float, "i" integer (either signedness), "b" bool, "bf" bfloat16, "c" complex.
_SCALARS: dict[str, tuple[str, int, str]] = {
    "float": ("f32", 4, "f"), "double": ("f64", 8, "f"),
    "__half": ("f16", 2, "f"), "half": ("f16", 2, "f"),
    "__nv_bfloat16": ("bf16", 2, "bf"), "nv_bfloat16": ("bf16", 2, "bf"), "__bf16": ("bf16", 2, "bf"),
    "bool": ("u8", 1, "b"),
    "char": ("s8", 1, "i"), "signed char": ("s8", 1, "i"), "unsigned char": ("u8", 1, "i"),
    "short": ("s16", 2, "i"), "unsigned short": ("u16", 2, "i"),
    "int": ("s32", 4, "i"), "unsigned int": ("u32", 4, "i"),
    "long": ("s64", 8, "i"), "unsigned long": ("u64", 8, "i"),
    "long long": ("s64", 8, "i"), "unsigned long long": ("u64", 8, "i"),
    "__int128": ("b128", 16, "i"), "unsigned __int128": ("b128", 16, "i"),
    "wchar_t": ("s32", 4, "i"), "char16_t": ("u16", 2, "i"), "char32_t": ("u32", 4, "i"),
}
# Spellings in source that name the types above (<stdint.h>, <cstddef>, CUDA's own).
_ALIASES = {
    "int8_t": "signed char", "uint8_t": "unsigned char", "int16_t": "short", "uint16_t": "unsigned short",
    "int32_t": "int", "uint32_t": "unsigned int", "int64_t": "long", "uint64_t": "unsigned long",
    "size_t": "unsigned long", "ptrdiff_t": "long", "intptr_t": "long", "uintptr_t": "unsigned long",
    "cudaGraphConditionalHandle": "unsigned long long", "CUgraphConditionalHandle": "unsigned long long",
    "unsigned": "unsigned int", "signed": "int", "signed int": "int", "long int": "long",
    "unsigned long int": "unsigned long", "long long int": "long long",
    "unsigned long long int": "unsigned long long", "short int": "short", "unsigned short int": "unsigned short",
    "signed short": "short", "signed long": "long", "signed long long": "long long", "uint": "unsigned int",
    "ushort": "unsigned short", "uchar": "unsigned char", "ulong": "unsigned long",
    "longlong": "long long", "ulonglong": "unsigned long long",
    "cuFloatComplex": "float2", "cuComplex": "float2", "cuDoubleComplex": "double2",
    "__nv_half": "__half", "__nv_half2": "__half2",
}
# CUDA vector types: base element and lane count (sizes as in vector_types.h).
_VECTOR_BASE = {"char": 1, "uchar": 1, "short": 2, "ushort": 2, "int": 4, "uint": 4, "long": 8, "ulong": 8,
                "longlong": 8, "ulonglong": 8, "float": 4, "double": 8}
_VECTORS: dict[str, int] = {f"{b}{n}": s * n for b, s in _VECTOR_BASE.items() for n in (1, 2, 3, 4)}
_VECTORS.update({"__half2": 4, "half2": 4, "__nv_bfloat162": 4, "nv_bfloat162": 4})
_COMPLEX = Pattern(r"(?:(?:\w+::)*)complex<(float|double|__half|half)>")


@record
class CParam:
    """One parameter's C type: ``base`` (``"float"``, ``"unsigned int"``, ``"Pair"``,
    ``"thrust::complex<float>"``), whether it is a pointer, and for pointers whether the
    pointee is ``const``."""

    base: str
    pointer: bool = False
    const: bool = False
    name: str | None = None

    @property
    def text(self) -> str:
        """The type as C writes it: ``"const float*"``, ``"int"``."""
        if self.pointer:
            return f"{'const ' if self.const else ''}{self.base}*"
        return self.base


def canonical(base: str) -> str:
    """One spelling per type: ``size_t`` -> ``unsigned long``, ``cuComplex`` -> ``float2``."""
    b = " ".join(base.split())
    return _ALIASES.get(b, b)


def scalar_facts(base: str) -> tuple[str, int, str] | None:
    """(PTX type, size, element kind) of a C scalar type, or None for other types."""
    return _SCALARS.get(canonical(base))


def element_of(base: str) -> tuple[str, int | None]:
    """What an array passed for a ``base*`` must hold: ``(kind, item size)``.

    ``kind`` is ``"f"``, ``"i"``, ``"b"``, ``"bf"``, ``"c"`` for scalar and complex
    pointees, ``"any"`` with the size for vector types and ``complex<T>`` (an item of that
    size), and ``("void", None)`` where any array will do (``void``, unknown structs)."""
    b = canonical(base)
    s = _SCALARS.get(b)
    if s is not None:
        return s[2], s[1]
    if b in _VECTORS:
        return "any", _VECTORS[b]
    m = _COMPLEX.fullmatch(b.replace(" ", ""))
    if m:
        return "c", 2 * {"float": 4, "double": 8, "__half": 2, "half": 2}[m.group(1)]
    return "void", None


# ------------------------------------------------------------------ mangled names


# The demangled text a mangled name may stand for, at most (an estimate from above). A
# substitution names an earlier type in a few bytes, so each level of nesting can double
# the text: a 173-byte name stands for megabytes. Past this a kernel's C types come from its
# PTX or cubin alone (demangle and demangled_text say None), as for an extern "C" kernel.
MAX_DEMANGLED = 1 << 16
# A name nested in a name (``L_Z...E``, a template argument naming a function or object) is
# read by the library's own top level, whose search for equal substitutions is quadratic:
# only short ones are read. Nor one with an ``N``: the inner name runs to the first ``E``, so a
# nested name (``N...E``) in it never ends and is never read, but would first build its lists
# (each substitution doubling them: exponential in the characters); an ``N`` in a word of it
# (``L_Z4NAMEv``) costs that kernel its types from the name alone (its PTX's are used).
_UNREAD_NESTED_NAME = Pattern(r"L_Z(?:[^E]{256}|[^EN]*N)")


@functools.lru_cache(maxsize=4096)
def mangled_tree(name: str):
    """The demangler's syntax tree of an Itanium-mangled function name (a ``FuncNode``
    whose ``arg_tys`` are the parameter types), or None for a name the demangler cannot read
    or whose demangled text would pass ``MAX_DEMANGLED`` characters, or whose reading would
    take more than ``_demangle.WORK_PER_CHAR`` parts of lists per character (no real name
    comes near). Time and memory are linear in the name's length: the tree shares every
    substituted part."""
    if not name.startswith("_Z") or _UNREAD_NESTED_NAME.search(name):
        return None
    try:  # (the first mangled name read: an extern "C" one needs none)
        from nbjit.params.demangle import parse, text_size
    except ImportError:  # not "types unknown": a kernel typed by its name would launch unchecked
        from nbjit.errors import NbjitError
        raise NbjitError(f"the parameter types of the C++ kernel {name[:80]!r} are read with the "
                         f"{demangler_missing()}") from None
    try:
        tree = parse(name)
        if tree is None or text_size(tree) > MAX_DEMANGLED:
            return None
    except Exception:  # (RecursionError included) not a name the demangler understands: its types stay unknown
        return None
    return tree


@functools.lru_cache(maxsize=4096)
def demangle(name: str) -> tuple[CParam, ...] | None:
    """The parameter types encoded in an Itanium-mangled kernel name (``_Z4fillIdEvPT_S0_m``
    -> ``double*, double, unsigned long``), or None for a plain (``extern "C"``) name, one
    the demangler cannot read or one whose demangled text would pass ``MAX_DEMANGLED``
    characters: that kernel's types are the PTX's or cubin's."""
    tree = mangled_tree(name)
    args = getattr(tree, "arg_tys", None)
    if tree is None or getattr(tree, "kind", None) != "func" or args is None:
        return None
    out = []
    for node in args:
        p = _from_node(node)
        if p is None:
            return None
        out.append(p)
    if len(out) == 1 and out[0].base == "void" and not out[0].pointer:
        return ()  # f(void)
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def demangled_text(name: str) -> str | None:
    """The demangled form of a mangled name (``fill<float>(float*, float, int)``), or None
    (not a mangled name, unreadable, or longer than ``MAX_DEMANGLED`` characters)."""
    tree = mangled_tree(name)
    return None if tree is None else str(tree)


def shown_name(name: str) -> str | None:
    """``demangled_text(name)``, or None where the demangler is missing: for messages and
    look-ups by name, which work without it (``demangler_missing`` says why)."""
    if name.startswith("_Z") and demangler_missing() is not None:
        return None
    return demangled_text(name)


def demangler_missing() -> str | None:
    """Where C++ names cannot be read here (the itanium-demangler package missing, or not a
    version whose readers nbjit uses), what to install; None where they can."""
    try:
        from nbjit.params import demangle  # noqa: F401 (whether it imports)
    except ImportError as e:
        return (f"itanium-demangler package, a dependency of nbjit that cannot be used here ({e}): pip install "
                "'itanium-demangler>=1.1,<1.2'")
    return None


def _from_node(node) -> CParam | None:
    pointer = const = False
    if node.kind == "pointer":
        pointer = True
        node = node.value
        if node.kind == "pointer":  # T**: a pointer to pointers, elements of 8 bytes
            return CParam("void*", True, False)
        if node.kind == "cv_qual":
            const = "const" in node.qual
            node = node.value
    elif node.kind == "cv_qual":  # a top-level const on a by-value parameter
        node = node.value
    if node.kind in ("builtin", "name", "qual_name"):
        return CParam(canonical(str(node)), pointer, const)
    if node.kind == "rvalue" or node.kind == "lvalue":  # references: not kernel parameters
        return None
    return CParam(canonical(str(node)), pointer, const)
