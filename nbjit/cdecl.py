"""C-level parameter types of kernels, read from the places that name them: Itanium-mangled
kernel names (demangled with ``itanium_demangler``, which returns a syntax tree), the
``extern "C"`` kernel declarations of CUDA C++ source, Triton IR signatures and signatures
users declare. Pure data: no CUDA needed.

Each reader gives ``[CParam, ...]`` per kernel or ``None`` where it cannot say; nothing is
guessed. ``signature.merge`` puts these facts together with the layouts of PTX and cubins.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

# patterns used on every call, compiled once at import
_EXTERN_C = re.compile(r'extern\s+"C"')
_TRAILING_NAME = re.compile(r"([A-Za-z_]\w*)\s*$")
_VOID = re.compile(r"\bvoid\b")
_NOT_NEWLINE = re.compile(r"[^\n]")

__all__ = ["CParam", "scalar_facts", "demangle", "demangled_text", "source_declarations", "triton_ir_signatures",
           "parse_ctype", "element_of"]

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
_COMPLEX = re.compile(r"(?:(?:\w+::)*)complex<(float|double|__half|half)>")


@dataclass(frozen=True)
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


@functools.lru_cache(maxsize=4096)
def demangle(name: str) -> tuple[CParam, ...] | None:
    """The parameter types encoded in an Itanium-mangled kernel name (``_Z4fillIdEvPT_S0_m``
    -> ``double*, double, unsigned long``), or None for a plain (``extern "C"``) name or one
    the demangler cannot read."""
    if not name.startswith("_Z"):
        return None
    try:
        from itanium_demangler import parse
        tree = parse(name)
    except Exception:  # not a name the demangler understands: its types stay unknown
        return None
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
    """The demangled form of a mangled name (``fill<float>(float*, float, int)``), or None."""
    if not name.startswith("_Z"):
        return None
    try:
        from itanium_demangler import parse
        tree = parse(name)
        return None if tree is None else str(tree)
    except Exception:  # unreadable: say nothing
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


# ------------------------------------------------------------------ CUDA C++ source

_COMMENTS = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', re.S)
_EXTERN_BLOCK = re.compile(r'extern\s+"C"\s*\{')
_KERNEL = re.compile(r"__global__\b")
_ATTRS = re.compile(r"\b(?:__launch_bounds__|__cluster_dims__|__maxnreg__|__attribute__)\s*\((?:[^()]|\([^()]*\))*\)")
_PREPROCESSOR = re.compile(r"^[ \t]*#[^\n]*", re.M)
_QUALIFIERS = re.compile(r"\b(?:__restrict__|__restrict|restrict|__grid_constant__|volatile|struct|class|"
                         r"enum|register|__device__|__constant__|__shared__)\b")


def source_declarations(source: str) -> dict[str, tuple[CParam, ...]]:
    """The parameter types of the ``extern "C" __global__`` kernels a CUDA C++ source
    declares, where they can be read without a preprocessor (plain declarations; macros,
    templates and function-pointer parameters leave that kernel out). Templates and other
    C++ kernels are typed from their mangled names instead."""
    code = _ATTRS.sub(lambda m: " " * len(m.group()), _COMMENTS.sub(_blank_comment, source))
    spans = _extern_c_spans(code)
    out: dict[str, tuple[CParam, ...]] = {}
    for m in _KERNEL.finditer(code):
        head_start = max(code.rfind(";", 0, m.start()), code.rfind("}", 0, m.start()),
                         code.rfind("{", 0, m.start())) + 1
        head = _PREPROCESSOR.sub("", code[head_start:m.start()])
        if not (_EXTERN_C.search(head) or _inside(spans, m.start())):
            continue
        if "template" in head or "#" in head:
            continue
        open_ = code.find("(", m.end())
        if open_ == -1:
            continue
        decl = code[m.end():open_]
        name_m = _TRAILING_NAME.search(decl)
        if not name_m or "<" in decl or _VOID.search(decl) is None:
            continue
        close = _matching_paren(code, open_)
        if close is None:
            continue
        params = _param_list(code[open_ + 1:close])
        if params is not None:
            out[name_m.group(1)] = params
    return out


def _blank_comment(m: re.Match) -> str:
    """Comments become blanks of the same length (offsets kept); strings stay."""
    s = m.group()
    return s if s.startswith('"') else _NOT_NEWLINE.sub(" ", s)


def _extern_c_spans(source: str) -> list[tuple[int, int]]:
    spans = []
    for m in _EXTERN_BLOCK.finditer(source):
        depth, i = 1, m.end()
        while i < len(source) and depth:
            c = source[i]
            depth += (c == "{") - (c == "}")
            i += 1
        spans.append((m.end(), i))
    return spans


def _inside(spans, pos: int) -> bool:
    return any(a <= pos < b for a, b in spans)


def _matching_paren(code: str, open_: int) -> int | None:
    depth = 0
    for i in range(open_, min(len(code), open_ + 65536)):
        c = code[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
    return None


def _param_list(text: str) -> tuple[CParam, ...] | None:
    text = text.strip()
    if not text or text == "void":
        return ()
    if any(c in text for c in "()<>[]{}#"):
        return None  # function pointers, templates, arrays, macros: not readable here
    out = []
    for chunk in text.split(","):
        p = parse_ctype(chunk, named=True)
        if p is None:
            return None
        out.append(p)
    return tuple(out)


_WORDS = re.compile(r"[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*|\*|&")


def parse_ctype(text: str, *, named: bool = False) -> CParam | None:
    """A C parameter declaration (``"const float* __restrict__ x"``, ``"unsigned n"``,
    ``"float*"``) as a CParam; None where it is not a plain type (references, pointers to
    pointers are ``void*``). ``named``: the last word may be the parameter's name."""
    t = _QUALIFIERS.sub(" ", text.split("=")[0])
    toks = _WORDS.findall(t)
    if not toks or "&" in toks:
        return None
    stars = toks.count("*")
    before_star = toks[: toks.index("*")] if stars else toks
    name = None
    words = [w for w in toks if w != "*"]
    if named and stars and toks[-1] != "*":
        name = toks[-1]
        words = words[:-1]
    elif named and not stars and len(words) >= 2 and not _is_type_words(words):
        name = words[-1]
        words = words[:-1]
    const = "const" in before_star
    words = [w for w in words if w != "const"]
    if not words:
        return None
    base = canonical(" ".join(words))
    if stars > 1:
        return CParam("void*", True, False, name)
    return CParam(base, stars == 1, const and stars == 1, name)


_TYPE_WORDS = {"unsigned", "signed", "int", "long", "short", "char"}


def _is_type_words(words: list[str]) -> bool:
    """Whether every word belongs to a multi-word builtin (``unsigned long long``)."""
    return all(w in _TYPE_WORDS for w in words)


# ------------------------------------------------------------------ Triton IR

_TT_FUNC = re.compile(r"tt\.func\s+(?:public\s+|private\s+)?@([\w$.]+)\s*\(")
_TT_ARG = re.compile(r"%([\w.]+)\s*:\s*((?:!tt\.ptr<[^>]*>)|[\w.]+)")
_TT_SCALARS = {"f32": "float", "f64": "double", "f16": "__half", "bf16": "__nv_bfloat16", "i1": "bool",
               "i8": "signed char", "i16": "short", "i32": "int", "i64": "long", "ui8": "unsigned char",
               "ui16": "unsigned short", "ui32": "unsigned int", "ui64": "unsigned long"}


def triton_ir_signatures(ttir: str) -> dict[str, tuple[CParam, ...]]:
    """Parameter types of the public functions of Triton IR (``.ttir``): ``!tt.ptr<f32>``
    is ``float*``, ``i32`` is ``int``; element types without a C counterpart (fp8) become
    one-byte opaque structs (``f8E4M3FN``)."""
    out = {}
    m = _TT_FUNC.search(ttir)
    while m is not None:
        # A parameter list ends before the next function begins: each character is scanned
        # for parentheses once, however many lists are left open (linear in the text).
        nxt = _TT_FUNC.search(ttir, m.end())
        close = _list_end(ttir, m.end(), len(ttir) if nxt is None else nxt.start())
        if close is None:
            m = nxt
            continue
        params = []
        for a in _split_top(ttir[m.end():close]):
            t = _TT_ARG.match(a.strip())
            if not t:
                break
            name, ty = t.group(1), t.group(2)
            name = None if name.isdigit() or name.startswith("arg") and name[3:].isdigit() else name
            if ty.startswith("!tt.ptr<"):
                elem = ty[len("!tt.ptr<"):-1].split(",")[0].strip()
                params.append(CParam(_TT_SCALARS.get(elem, elem), True, False, name))
            else:
                params.append(CParam(_TT_SCALARS.get(ty, ty), False, False, name))
        else:
            out[m.group(1)] = tuple(params)
        m = nxt
    return out


_PARENS = re.compile(r"[()]")


def _list_end(text: str, start: int, end: int) -> int | None:
    """Where the parameter list opened just before ``start`` closes, if before ``end``."""
    depth = 1
    for p in _PARENS.finditer(text, start, end):
        depth += 1 if p.group() == "(" else -1
        if depth == 0:
            return p.start()
    return None


def _split_top(text: str) -> list[str]:
    """Split at commas outside <>, (), {} and strings (argument attributes hold commas)."""
    out, depth, cur, quote = [], 0, [], False
    for c in text:
        if c == '"':
            quote = not quote
        elif not quote:
            if c in "<({[":
                depth += 1
            elif c in ">)}]":
                depth -= 1
            elif c == "," and depth == 0:
                out.append("".join(cur))
                cur = []
                continue
        cur.append(c)
    if "".join(cur).strip():
        out.append("".join(cur))
    return out
