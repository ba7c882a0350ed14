"""C declarations read from text: the ``extern "C" __global__`` kernels of CUDA C++ source
(``source_declarations``), its ``extern "C" __device__`` functions (``device_declarations``,
what a link resolves), one C parameter declaration (``parse_ctype``), the signatures of
Triton IR (``triton_ir_signatures``) and signatures a user declares (``parse_signature``,
``declare``: ``"float*, const float*, float, int"``). Pure data, no CUDA needed; each gives
``cdecl.CParam``s or ``None`` where it cannot say, nothing guessed."""
from __future__ import annotations

import bisect
import re
from typing import Any

from nbjit.errors import NbjitArgumentError
from nbjit.params.cdecl import _VECTORS, CParam, canonical, scalar_facts
from nbjit.params.signature import KernelInfo, KernelSignature, SignatureConflict, merge
from nbjit.records import Pattern, record

__all__ = ["source_declarations", "DeviceDeclaration", "device_declarations", "parse_ctype", "triton_ir_signatures",
           "parse_signature", "declare", "signature_text"]

# patterns used on every call, compiled once (on first use)
_EXTERN_C = Pattern(r'extern\s+"C"')
_TRAILING_NAME = Pattern(r"(?<!\w)([A-Za-z_]\w*)\s*$")  # (?<!\w): each word tried once
_VOID = Pattern(r"\bvoid\b")
_NOT_NEWLINE = Pattern(r"[^\n]")

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
    devices = list(_DEVICE.finditer(heads))
    for k, m in enumerate(devices):
        j = bisect.bisect_left(delims, m.start())
        head_start = delims[j - 1] + 1 if j else 0
        if not (_any_within(externs, head_start, m.start()) or _inside(spans, m.start())):
            continue
        o = bisect.bisect_left(opens, m.end())
        if o == len(opens) or _any_within(templates, head_start, m.start()) or \
                (j < len(delims) and delims[j] < opens[o]):
            continue  # a template, or no '(' before the next ';', '{', '}': a variable
        if k + 1 < len(devices) and devices[k + 1].start() < opens[o]:
            continue  # another __device__ before the '(': that one reads this declaration (each text once)
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


# ------------------------------------------------------------------ declared signatures

# short names -> C types
_DECLARED = {
    "ptr": "void*", "pointer": "void*",
    "i8": "signed char", "u8": "unsigned char", "i16": "short", "u16": "unsigned short",
    "i32": "int", "u32": "unsigned int", "i64": "long", "u64": "unsigned long",
    "int8": "signed char", "uint8": "unsigned char", "int16": "short", "uint16": "unsigned short",
    "int32": "int", "uint32": "unsigned int", "int64": "long", "uint64": "unsigned long",
    "f16": "__half", "bf16": "__nv_bfloat16", "f32": "float", "f64": "double",
    "float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double",
}


_VECTOR_TYPES = frozenset(_VECTORS)


def signature_text(signature: Any, kernel: str) -> str:
    """A declared signature given as a list or tuple of C types, as the text
    ``parse_signature`` reads; ``NbjitArgumentError`` for anything else that is not text."""
    if isinstance(signature, str):  # (a str subclass: numpy's)
        return str(signature)
    if isinstance(signature, (list, tuple)) and signature and \
            all(isinstance(t, str) and "," not in t for t in signature):
        return ", ".join(map(str, signature))
    what = "an empty list" if isinstance(signature, (list, tuple)) and not signature else repr(signature)[:80]
    raise NbjitArgumentError(f"signature for {kernel!r}: C types as text (\"float*, const float*, float, int\") or a "
                             f"list of them, one type each, not {what}")


def parse_signature(text: str, kernel: str = "<kernel>") -> list:
    """``"float*, const float*, float, int"`` or ``"ptr, ptr, f32, i32, bytes24"`` -> a
    ``cdecl.CParam`` per parameter.

    Each item is a C type (``float*``, ``const double*``, ``unsigned long long``,
    ``__half``, ``float2*``, a struct name), a short name (``ptr``, ``i8``..``i64``,
    ``u8``..``u64``, ``f16``, ``bf16``, ``f32``, ``f64`` and the ``int32``, ``float32``
    aliases; a short name with ``*`` is a typed pointer, ``f32*``), ``bytesN`` for an
    N-byte aggregate passed by value, or ``CUtensorMap`` for a TMA descriptor (it takes an
    ``nbjit.TensorMap``).
    """
    out = []
    for i, raw in enumerate(t.strip() for t in text.split(",")):
        tok = raw.lower()
        stars = len(tok) - len(tok.rstrip("*"))
        short = tok.rstrip("*").strip()
        if short.startswith("bytes") and short[5:].isdigit() and int(short[5:]) > 0 and not stars:
            out.append(CParam(f"bytes{int(short[5:])}"))
            continue
        if not stars and short.split()[-1:] == ["cutensormap"]:  # const __grid_constant__ CUtensorMap
            out.append(CParam("CUtensorMap"))
            continue
        if short in _DECLARED and (stars == 0 or short not in ("ptr", "pointer")):
            base = _DECLARED[short]
            out.append(CParam("void", True) if base == "void*" else CParam(base, stars > 0))
            continue
        c = parse_ctype(raw, named=True) if raw and not raw[0].isdigit() else None
        if c is None or not (c.pointer or scalar_facts(c.base) or c.base in _VECTOR_TYPES):
            raise NbjitArgumentError(f"signature for {kernel!r}: parameter {i} {raw!r} is not a type (use C types "
                                     "such as float*, const double*, int, or ptr, i8..i64, u8..u64, f16, bf16, "
                                     "f32, f64, bytesN, CUtensorMap)")
        out.append(c)
    return out


def declare(sig: KernelSignature, text: str, kernel: str) -> KernelSignature:
    """``sig`` with the types a user declared (checked against its sizes)."""
    try:
        declared = [("declared", parse_signature(text, kernel))]
        return merge(kernel, [("image", KernelInfo(kernel, sig))], declared).signature
    except SignatureConflict as e:
        raise NbjitArgumentError(f"signature {text!r}: {e}") from None
