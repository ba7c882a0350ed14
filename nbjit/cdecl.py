"""C-level parameter types of kernels, read from the places that name them: Itanium-mangled
kernel names (demangled with ``itanium_demangler``, which returns a syntax tree), the
``extern "C"`` kernel declarations of CUDA C++ source, Triton IR signatures and signatures
users declare. Pure data: no CUDA needed.

Each reader gives ``[CParam, ...]`` per kernel or ``None`` where it cannot say; nothing is
guessed. ``signature.merge`` puts these facts together with the layouts of PTX and cubins.
"""
from __future__ import annotations

import bisect
import functools
import re

from ._defs import Pattern, record


# patterns used on every call, compiled once (on first use)
_EXTERN_C = Pattern(r'extern\s+"C"')
_TRAILING_NAME = Pattern(r"(?<!\w)([A-Za-z_]\w*)\s*$")  # (?<!\w): each word tried once
_VOID = Pattern(r"\bvoid\b")
_NOT_NEWLINE = Pattern(r"[^\n]")

__all__ = ["CParam", "DeviceDeclaration", "scalar_facts", "demangle", "demangled_text", "source_declarations",
           "device_declarations", "triton_ir_signatures", "parse_ctype", "element_of"]

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
# only short ones are read.
_LONG_NESTED_NAME = Pattern(r"L_Z[^E]{256}")


@functools.lru_cache(maxsize=4096)
def mangled_tree(name: str):
    """The demangler's syntax tree of an Itanium-mangled function name (a ``FuncNode``
    whose ``arg_tys`` are the parameter types), or None for a name the demangler cannot read
    or whose demangled text would pass ``MAX_DEMANGLED`` characters. Time and memory are
    linear in the name's length: the tree shares every substituted part."""
    if not name.startswith("_Z") or _LONG_NESTED_NAME.search(name):
        return None
    try:
        tree = _parse(name)
        if tree is None or _text_size(tree, {}) > MAX_DEMANGLED:
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


def _parse(name: str):
    """``itanium_demangler.parse`` with the library's own name and type readers, where its
    passes over the whole tree are linear: the library rewrites the tree as a tree (a
    shared part once per use, so 2**levels times) and looks for each new substitution by
    comparing it with every earlier one. (Names nested in names, ``L_Z...E``, are read by
    the library's own top level.) RTTI, thunks and guard variables are not kernels: None."""
    import itanium_demangler as dm
    cursor = _linear_cursor_class()(name, 2)
    if dm._SPECIAL_RE.match(name, 2):
        return None
    fname = dm._parse_name(cursor)
    if fname is None or cursor.at_end():
        return None if fname is None else _expand_packs(fname)
    ret_ty = None
    if fname.kind == "qual_name" and fname.value[-1].kind == "tpl_args" and \
            fname.value[-2].kind not in ("ctor", "dtor", "oper_cast"):
        ret_ty = dm._parse_type(cursor)
        if ret_ty is None:
            return None
    arg_tys = []
    while not cursor.at_end():
        arg_ty = dm._parse_type(cursor)
        if arg_ty is None:
            return None
        arg_tys.append(arg_ty)
    func = dm.FuncNode("func", fname, tuple(arg_tys), ret_ty)
    if fname.kind == "qual_name" and fname.value[-1].kind == "tpl_args":  # T_ -> the template's arguments
        tpl_args = fname.value[-1].value

        @_once_per_node
        def expand_params(node):
            if node.kind == "tpl_param" and node.value < len(tpl_args):
                return tpl_args[node.value]
            return node.map(expand_params)
        func = expand_params(func)

    return _expand_packs(func)


def _expand_packs(tree):
    """The library's ``_expand_arg_packs``: template argument packs spliced into the lists
    that hold them."""
    import itanium_demangler as dm

    @_once_per_node
    def expand(node):
        if node.kind == "tpl_args":
            flat = []
            for arg in node.value:
                flat += arg.value if arg.kind in ("tpl_arg_pack", "tpl_args") else [arg]
            return dm.Node("tpl_args", tuple(map(expand, flat)))
        if node.kind == "func":
            node = node.map(expand)
            flat = []
            for a in node.arg_tys:
                if a.kind == "expand_arg_pack" and a.value.kind == "rvalue" and \
                        a.value.value.kind in ("tpl_arg_pack", "tpl_args"):
                    flat += a.value.value.value
                else:
                    flat.append(a)
            return node._replace(arg_tys=tuple(flat))
        return node.map(expand)
    return expand(tree)


def _once_per_node(fn):
    """``fn`` computed once per node object: a tree whose parts are shared is walked in
    time linear in its distinct nodes, not in its size written out."""
    done: dict[int, tuple] = {}

    def once(node):
        hit = done.get(id(node))
        if hit is None:
            hit = done[id(node)] = (node, fn(node))  # (node kept alive: its id is not reused)
        return hit[1]
    return once


# Characters ``str()`` of a demangler node adds to its parts' (``"operator "``, ``"<>"``,
# ``"::*"``); kinds not listed print as ``repr()``.
_STR_EXTRA = {"name": 0, "builtin": 0, "qual_name": 0, "tpl_args": 2, "pointer": 1, "lvalue": 1, "rvalue": 2,
              "cv_qual": 0, "abi": 0, "literal": 2, "tpl_param": 3, "subst": 3, "ctor": 8, "dtor": 8, "oper": 9,
              "oper_cast": 9, "func": 5, "array": 4, "data": 4, "method": 4}


def _text_size(x, sizes: dict, as_repr: bool = False) -> int:
    """An upper bound of ``len(str(x))`` (``len(repr(x))`` with ``as_repr``) for a
    demangler node, each distinct node sized once."""
    if isinstance(x, str):
        return 4 * len(x) + 2 if as_repr else len(x)
    if isinstance(x, int):  # an array's length, a template parameter's number
        return x.bit_length() // 3 + 2
    if isinstance(x, frozenset):  # cv-qualifiers, ABI tags: " const", "[abi:v1]"
        return 13 + sum(4 * len(q) + 4 for q in x) if as_repr else sum(len(q) + 6 for q in x)
    if not isinstance(x, (tuple, list)):
        return 4  # None
    key = (id(x), as_repr)
    hit = sizes.get(key)
    if hit is None:
        if not hasattr(x, "_fields"):  # a sequence of nodes, joined by ", " or "::"
            n = 2 + sum(2 + _text_size(c, sizes, as_repr) for c in x)
        elif as_repr or x.kind not in _STR_EXTRA:
            n = 24 + len(x.kind) + sum(2 + _text_size(c, sizes, True) for c in x[1:])
        else:
            n = _STR_EXTRA[x.kind] + sum(_text_size(c, sizes) for c in x[1:])
        hit = sizes[key] = (x, n)
    return hit[1]


def _structure_key(x, keys: dict[int, tuple], ids: dict) -> object:
    """A value equal for two demangler nodes exactly where the nodes are equal (``==``),
    found once per distinct node."""
    if not isinstance(x, (tuple, list)):
        return ("leaf", x)
    hit = keys.get(id(x))
    if hit is None:
        k = (type(x) is list, tuple(_structure_key(c, keys, ids) for c in x))
        hit = keys[id(x)] = (x, ids.setdefault(k, len(ids)))
    return hit[1]


@functools.cache
def _linear_cursor_class():
    import itanium_demangler as dm

    class LinearCursor(dm._Cursor):
        """The library's cursor, finding an equal earlier substitution by a dictionary
        rather than by comparing the new one with each (deeply)."""

        def __init__(self, raw: str, pos: int = 0):
            super().__init__(raw, pos)
            self._keys: dict[int, tuple] = {}
            self._ids: dict = {}
            self._known: set = set()

        def add_subst(self, node):
            k = _structure_key(node, self._keys, self._ids)
            if k not in self._known:
                self._known.add(k)
                self._substs[len(self._substs)] = node
    return LinearCursor


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

# Comments; strings and character literals stay as they are (a '/*' in one opens no
# comment). An unterminated comment runs to the end, an unterminated string to the end of
# its line, and a character literal is short: each match ends where the scan for it ends,
# so no text is read twice.
_COMMENTS = Pattern(r"""//[^\n]*|/\*(?:.*?\*/|.*)|"(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n]){1,10}'""", re.S)
_EXTERN_BLOCK = Pattern(r'extern\s+"C"\s*\{')
_KERNEL = Pattern(r"__global__\b")
_ATTRS = Pattern(r"\b(?:__launch_bounds__|__cluster_dims__|__maxnreg__|__attribute__)\s*\((?:[^()]|\([^()]*\))*\)")
# Preprocessor lines as a declaration's head holds them: the head runs from the last ';', '{'
# or '}' to __global__, and its start counts as a line's.
_PREPROCESSOR = Pattern(r"(?:^|(?<=[;{}]))[ \t]*#[^\n;{}]*", re.M)
_QUALIFIERS = Pattern(r"\b(?:__restrict__|__restrict|restrict|__grid_constant__|volatile|struct|class|"
                       r"enum|register|__device__|__constant__|__shared__)\b")
_TEMPLATE = Pattern("template")
_HASH = Pattern("#")
_DELIMITER = Pattern(r"[;{}]")
_PAREN = Pattern(r"[()]")
_BRACE = Pattern(r"[{}]")
_MAX_PARAMS = 65536  # characters of a parameter list read at most


def source_declarations(source: str) -> dict[str, tuple[CParam, ...]]:
    """The parameter types of the ``extern "C" __global__`` kernels a CUDA C++ source
    declares, where they can be read without a preprocessor (plain declarations; macros,
    templates and function-pointer parameters leave that kernel out). Templates and other
    C++ kernels are typed from their mangled names instead. Time is linear in the source."""
    code = _ATTRS.sub(lambda m: " " * len(m.group()), _COMMENTS.sub(_blank_comment, source))
    heads = _PREPROCESSOR.sub(lambda m: " " * len(m.group()), code)  # what a head says, offsets kept
    delims = _starts(_DELIMITER, code)
    externs = list(_EXTERN_C.finditer(heads))
    templates, hashes = list(_TEMPLATE.finditer(heads)), list(_HASH.finditer(heads))
    opens = [i for i in _starts(_PAREN, code) if code[i] == "("]
    close_of = _matching(code, _PAREN, "(")
    spans = _extern_c_spans(code)
    kernels = list(_KERNEL.finditer(code))
    out: dict[str, tuple[CParam, ...]] = {}
    for k, m in enumerate(kernels):
        j = bisect.bisect_left(delims, m.start())
        head_start = delims[j - 1] + 1 if j else 0
        if not (_any_within(externs, head_start, m.start()) or _inside(spans, m.start())):
            continue
        if _any_within(templates, head_start, m.start()) or _any_within(hashes, head_start, m.start()):
            continue
        o = bisect.bisect_left(opens, m.end())
        if o == len(opens):
            continue
        open_ = opens[o]
        # a ';', '{', '}' or another __global__ before the '(': this one declares nothing here
        if (j < len(delims) and delims[j] < open_) or (k + 1 < len(kernels) and kernels[k + 1].start() < open_):
            continue
        decl = code[m.end():open_]
        name_m = _TRAILING_NAME.search(decl)
        if not name_m or "<" in decl or _VOID.search(decl) is None:
            continue
        close = close_of.get(open_)
        if close is None or close - open_ >= _MAX_PARAMS:
            continue
        if o + 1 < len(opens) and opens[o + 1] < close:
            continue  # a '(' inside: function pointers, macros (as _param_list says)
        params = _param_list(code[open_ + 1:close])
        if params is not None:
            out[name_m.group(1)] = params
    return out


@record
class DeviceDeclaration:
    """An ``extern "C" __device__`` function a source declares or defines: the name a link
    resolves, its return and parameter types (None where they cannot be read without a
    preprocessor), its line, its text (comments removed, on one line) and whether this is its
    definition (a body follows)."""

    name: str
    returns: CParam | None
    params: tuple[CParam, ...] | None
    line: int
    text: str
    defines: bool = False


_DEVICE = Pattern(r"__device__\b")
_FUNC_WORDS = Pattern(r"\b(?:static|inline|__inline__|__forceinline__|__noinline__|extern|__host__|constexpr)\b")
_STRING_C = Pattern(r'"C"')


def device_declarations(source: str) -> dict[str, DeviceDeclaration]:
    """The ``extern "C" __device__`` functions a CUDA C++ source declares or defines (written
    ``extern "C" __device__ float op(float, float);`` or inside an ``extern "C" { }`` block),
    by name; templates and declarations a macro writes are not read. Time is linear in the
    source."""
    code = _ATTRS.sub(lambda m: " " * len(m.group()), _COMMENTS.sub(_blank_comment, source))
    heads = _PREPROCESSOR.sub(lambda m: " " * len(m.group()), code)
    delims = _starts(_DELIMITER, code)
    externs, templates = list(_EXTERN_C.finditer(heads)), list(_TEMPLATE.finditer(heads))
    opens = [i for i in _starts(_PAREN, code) if code[i] == "("]
    close_of = _matching(code, _PAREN, "(")
    spans = _extern_c_spans(code)
    lines = _starts(re.compile("\n"), source)
    out: dict[str, DeviceDeclaration] = {}
    for m in _DEVICE.finditer(heads):
        j = bisect.bisect_left(delims, m.start())
        head_start = delims[j - 1] + 1 if j else 0
        if not (_any_within(externs, head_start, m.start()) or _inside(spans, m.start())):
            continue
        o = bisect.bisect_left(opens, m.end())
        if o == len(opens) or _any_within(templates, head_start, m.start()) or \
                (j < len(delims) and delims[j] < opens[o]):
            continue  # a template, or no '(' before the next ';', '{', '}': a variable
        open_, close = opens[o], close_of.get(opens[o])
        decl = heads[m.end():open_]
        name_m = _TRAILING_NAME.search(decl)
        if name_m is None or close is None or close - open_ >= _MAX_PARAMS or "<" in decl:
            continue
        after = code[close + 1:close + 64].lstrip()[:1]
        if after not in (";", "{"):
            continue  # not a declaration or a definition (a call, a macro)
        inner = o + 1 < len(opens) and opens[o + 1] < close  # a '(' inside: function pointers, macros
        params = None if inner else _param_list(code[open_ + 1:close])
        ret_text = _FUNC_WORDS.sub(" ", _STRING_C.sub(" ", decl[:name_m.start()]))
        returns = parse_ctype(ret_text) if ret_text.strip() else None
        e = bisect.bisect_left(externs, head_start, key=re.Match.start)  # the head's extern "C", if it has one
        start = externs[e].start() if e < len(externs) and externs[e].start() < m.start() else m.start()
        name = name_m.group(1)
        d = DeviceDeclaration(name, returns, params, bisect.bisect_left(lines, start) + 1,
                              " ".join(code[start:close + 1].split()), after == "{")
        if name not in out or (d.defines and not out[name].defines):  # the definition, else the first
            out[name] = d
    return out


def _blank_comment(m: re.Match) -> str:
    """Comments become blanks of the same length (offsets kept); strings stay."""
    s = m.group()
    return s if s[0] in "\"'" else _NOT_NEWLINE.sub(" ", s)


def _starts(pattern: "re.Pattern | Pattern", text: str) -> list[int]:
    return [m.start() for m in pattern.finditer(text)]


def _any_within(matches: list[re.Match], lo: int, hi: int) -> bool:
    """Whether one of ``matches`` (in order, not overlapping) lies within ``text[lo:hi]``."""
    i = bisect.bisect_left(matches, lo, key=re.Match.start)
    return i < len(matches) and matches[i].end() <= hi


def _matching(text: str, pattern: "re.Pattern | Pattern", opener: str) -> dict[int, int]:
    """``{position of an opening bracket: position of its closing one}`` for the brackets
    ``pattern`` finds (one kind), in one pass; an unclosed one is left out."""
    out, stack = {}, []
    for m in pattern.finditer(text):
        if text[m.start()] == opener:
            stack.append(m.start())
        elif stack:
            out[stack.pop()] = m.start()
    return out


def _extern_c_spans(source: str) -> list[tuple[int, int]]:
    """The ``extern "C" { ... }`` blocks (an unclosed one runs to the end), merged where
    they nest, in order."""
    close_of = _matching(source, _BRACE, "{")
    spans: list[tuple[int, int]] = []
    for m in _EXTERN_BLOCK.finditer(source):
        a, b = m.end(), close_of.get(m.end() - 1, len(source) - 1) + 1
        if spans and a < spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], b))
        else:
            spans.append((a, b))
    return spans


def _inside(spans: list[tuple[int, int]], pos: int) -> bool:
    """Whether ``pos`` lies in one of ``spans`` (in order, not overlapping)."""
    i = bisect.bisect_right(spans, pos, key=lambda s: s[0]) - 1
    return i >= 0 and pos < spans[i][1]


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


_WORDS = Pattern(r"[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*|\*|&")


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

_TT_FUNC = Pattern(r"tt\.func\s+(?:public\s+|private\s+)?@([\w$.]+)\s*\(")
_TT_ARG = Pattern(r"%([\w.]+)\s*:\s*((?:!tt\.ptr<[^>]*>)|[\w.]+)")
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


_PARENS = Pattern(r"[()]")


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
