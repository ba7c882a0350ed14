"""PTX text -> PtxInfo (header, entries, parameters, directives, globals, metadata, debug info),
and strip_debug. Pure data: no CUDA needed.

The scanner works on a *masked* copy of the text in which comments are blanked and string
contents hidden, byte for byte, so offsets and line numbers stay those of the original and
no comment or string can look like code (FORMATS.md §1.8). Everything else is a handful of
whole-text regular expressions; Python-level work is per declaration, not per line.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from .errors import PtxParseError
from .signature import SCALAR_TYPES, Directives, KernelInfo, KernelSignature, find_entry, layout

__all__ = [
    "PtxInfo",
    "FuncInfo",
    "GlobalVar",
    "DebugInfo",
    "inspect_ptx",
    "strip_debug",
    "set_version",
    "TRITON_META_DEFAULTS",
    "cuda_for_ptx",
    "max_ptx_for_cuda",
]

# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class FuncInfo:
    """A ``.func`` device function (definition or ``.extern`` declaration)."""

    name: str
    linkage: str | None
    defined: bool
    noreturn: bool = False

    def to_json(self) -> dict:
        return {"name": self.name, "linkage": self.linkage, "defined": self.defined,
                "noreturn": self.noreturn}


@dataclass(frozen=True)
class GlobalVar:
    """A module-scope variable. ``size`` is None for an unsized ``.extern .shared x[]``
    (dynamic shared memory)."""

    name: str
    space: str  # "global", "const", "shared"
    type: str
    size: int | None
    align: int
    linkage: str | None = None
    initialized: bool = False

    @property
    def dynamic_shared(self) -> bool:
        return self.space == "shared" and self.size is None

    def to_json(self) -> dict:
        return {"name": self.name, "space": self.space, "type": self.type, "size": self.size,
                "align": self.align, "linkage": self.linkage, "initialized": self.initialized}


@dataclass(frozen=True)
class DebugInfo:
    """What debug information a PTX text carries."""

    lineinfo: bool = False  # .loc lines present
    files: tuple[tuple[int, str], ...] = ()  # .file entries
    sections: tuple[str, ...] = ()  # DWARF .section names (".debug_info", ...)
    dwarf_legacy: bool = False  # @@DWARF lines
    target_debug: bool = False  # "debug" in .target

    @property
    def dwarf(self) -> bool:
        return bool(self.sections) or self.dwarf_legacy

    @property
    def kind(self) -> str:
        """``"dwarf"``, ``"lineinfo"`` or ``"none"``."""
        if self.dwarf or self.target_debug:
            return "dwarf"
        if self.lineinfo or self.files:
            return "lineinfo"
        return "none"

    def to_json(self) -> dict:
        return {"kind": self.kind, "lineinfo": self.lineinfo, "dwarf": self.dwarf,
                "target_debug": self.target_debug, "sections": list(self.sections),
                "dwarf_legacy": self.dwarf_legacy,
                "files": [{"index": i, "path": p} for i, p in self.files]}


# Triton's launch metadata and its defaults where a PTX says nothing.
TRITON_META_DEFAULTS: dict[str, int] = {
    "num_warps": 4,
    "num_ctas": 1,
    "shared": 0,
    "tmem_size": 0,
    "global_scratch_size": 0,
    "global_scratch_align": 1,
    "profile_scratch_size": 0,
    "profile_scratch_align": 1,
}
_LEGACY_META = {
    "TRITON_SHARED_MEM_BYTES": "shared",
    "TRITON_GLOBAL_SCRATCH_BYTES_PER_CTA": "global_scratch_size",
    "TRITON_GLOBAL_SCRATCH_ALIGN": "global_scratch_align",
}


@dataclass(frozen=True)
class PtxInfo:
    """Everything nbjit reads from a PTX module."""

    version: tuple[int, int]
    targets: tuple[str, ...]  # every .target item except "debug", arch first
    address_size: int | None
    entries: tuple[KernelInfo, ...]
    functions: tuple[FuncInfo, ...]
    globals: tuple[GlobalVar, ...]
    debug: DebugInfo
    metadata: dict = field(default_factory=dict)  # Triton-style; {} when the text has none
    metadata_keys: tuple[str, ...] = ()  # keys that came from comments, not fallbacks
    source: str | None = None

    @property
    def arch(self) -> str:
        return self.targets[0]

    @property
    def dynamic_shared(self) -> tuple[GlobalVar, ...]:
        return tuple(g for g in self.globals if g.dynamic_shared)

    def entry(self, name: str) -> KernelInfo:
        return find_entry(self.entries, name)

    def to_json(self) -> dict:
        return {
            "kind": "ptx",
            "version": list(self.version),
            "targets": list(self.targets),
            "arch": self.arch,
            "address_size": self.address_size,
            "entries": [e.to_json() for e in self.entries],
            "functions": [f.to_json() for f in self.functions],
            "globals": [g.to_json() for g in self.globals],
            "metadata": dict(self.metadata),
            "debug": self.debug.to_json(),
        }


# --------------------------------------------------------------------------- lexing

# A string, a line comment or a block comment, whichever starts first (so "//" inside a
# string and "/*" inside a line comment are what they are); a lone '"' or '/*' is an
# unterminated string or comment.
_LEX = re.compile(r'"[^"\n]*"|//[^\n]*|/\*.*?\*/|/\*|"', re.S)
_META = re.compile(r"//[ \t]*meta:[ \t]*(\w+)[ \t]*=[ \t]*(\S*)")
_LEGACY = re.compile(r"//[ \t]*(TRITON_\w+)[ \t]*:[ \t]*(\d+)")
_NON_NEWLINE = re.compile(r"[^\n]")
_NOT_ALLOWED = re.compile(r"[^\t\n\r\x20-\x7e]")
_ALLOWED = bytes(range(0x20, 0x7F)) + b"\t\n\r"
# A '//' comment or a string holding a brace. Possessive '*+' (Python >= 3.11) stops the
# engine from backtracking through every comment: twice as fast on compiler output.
_PLUS = "+" if sys.version_info >= (3, 11) else ""
_COMMENT_BRACE = re.compile(r"//[^\n{}]*" + _PLUS + r"[{}]")
_STRING_BRACE = re.compile(r'"[^"\n{}]*' + _PLUS + r"[{}]")
# str.find is slow for two-character needles whose first character is common; the
# regex engine's literal search is not.
_BLOCK_OPEN = re.compile(r"/\*")
_CLOSE_LINE = re.compile(r"\n\}")


class _Unterminated(Exception):
    def __init__(self, what: str, pos: int):
        self.what, self.pos = what, pos


def _blank(seg: str, meta: list | None = None) -> str:
    """``seg`` with comments turned to spaces (line breaks kept) and string contents to
    'x': same length and offsets, and nothing in a comment or string looks like code.
    Triton metadata comments are appended to ``meta``."""

    def repl(m: re.Match) -> str:
        s = m.group()
        if s == '"' or s == "/*":
            raise _Unterminated("string" if s == '"' else "/* comment", m.start())
        if s[0] == '"':
            return '"' + "x" * (len(s) - 2) + '"'
        if meta is not None and s[1] == "/":
            _note_meta(s, meta)
        return _NON_NEWLINE.sub(" ", s)

    return _LEX.sub(repl, seg)


def _note_meta(comment: str, meta: list) -> None:
    mm = _META.match(comment)
    if mm:
        meta.append((mm.group(1), mm.group(2), 0))
        return
    mm = _LEGACY.match(comment)
    if mm and mm.group(1) in _LEGACY_META:
        meta.append((_LEGACY_META[mm.group(1)], mm.group(2), 1))


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


# --------------------------------------------------------------------------- parsing

_VERSION = re.compile(r"\.version\s+(\d+)\.(\d+)\b")
_TARGET = re.compile(r"\.target\s+([^\n;]*)")
_ADDR = re.compile(r"\.address_size\s+(\d+)")
_DECL = re.compile(r"\.entry\b|\.func\b")
_LINKAGE = re.compile(r"((?:\.(?:visible|weak|extern|common)\s+)*)\Z")
_NAME = re.compile(r"\s*([A-Za-z_$%][\w$%]*)")
_PTOKEN = re.compile(r"\.\w+|\d+|[A-Za-z_$%][\w$%]*|\S")
_DIRECTIVE = re.compile(r"\.(\w+)((?:\s*\d+\s*,)*\s*\d+)?|\S+")
_VAR = re.compile(r"\.(global|const|shared)\b([^;]*);")
_VARTOK = re.compile(r"\.\w+|\d+|[A-Za-z_$%][\w$%]*|\[|\]|=")
_LOC = re.compile(r"\.loc\b")
_FILE = re.compile(r'\.file\s+(\d+)\s+"')
_PRAGMA = re.compile(r'\.pragma\s*"x*"\s*;')
_SECTION = re.compile(r"\.section\s+(\.[\w.$]+)")

_SPACES = ("global", "shared", "const", "local", "param")
_DIRECTIVES_N = {"maxntid", "reqntid", "reqnctapercluster"}
_DIRECTIVES_1 = {"minnctapersm", "maxnctapersm", "maxnreg", "maxclusterrank"}
_DIRECTIVES_0 = {"noreturn", "explicitcluster", "blocksareclusters"}
_CHUNK = 1 << 16


def inspect_ptx(text: str | bytes, *, source: str | None = None) -> PtxInfo:
    """Read the header, kernels, parameters, directives, globals, metadata and debug
    information of a PTX module.

    Parameters
    ----------
    text: the PTX (``bytes`` are decoded as UTF-8; trailing NULs are ignored).
    source: a name for error messages (e.g. the file path).

    Raises
    ------
    PtxParseError: the text is not well-formed PTX; the message names the line.
    """
    return _Parser(_as_text(text, source), source).parse()


def _as_text(text: str | bytes, source: str | None) -> str:
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise PtxParseError(f"not UTF-8 text (byte {e.start})", source=source) from None
    elif not isinstance(text, str):
        raise TypeError(f"PTX must be str or bytes, not {type(text).__name__}")
    return text.rstrip("\0")


class _Parser:
    """Scans the text as it is and blanks comments and strings (``_blank``) only in the
    regions it reads closely: declarations, the module scope between bodies, and any body
    whose braces a comment or string could fake. Function bodies, the bulk of the text,
    are only scanned for their closing brace."""

    def __init__(self, text: str, source: str | None):
        self.t = text
        self.source = source
        self.meta: list[tuple[str, str, int]] = []
        # Block comments can span anything: then blank the whole text once up front.
        self.v = self.blank(0, len(text), self.meta, text) if _BLOCK_OPEN.search(text) else text

    def error(self, msg: str, pos: int | None = None) -> PtxParseError:
        return PtxParseError(msg, source=self.source, line=None if pos is None else _line(self.t, pos))

    def blank(self, a: int, b: int, meta: list | None = None, text: str | None = None) -> str:
        try:
            return _blank((self.v if text is None else text)[a:b], meta)
        except _Unterminated as e:
            raise self.error(f"unterminated {e.what}", a + e.pos) from None

    def line_span(self, i: int) -> tuple[int, int]:
        b = self.v.find("\n", i)
        return self.v.rfind("\n", 0, i) + 1, len(self.v) if b == -1 else b

    def in_code(self, i: int) -> bool:
        """Whether position ``i`` is code, not inside a comment or string."""
        a, b = self.line_span(i)
        return self.blank(a, b)[i - a] == self.v[i]

    def find_code(self, rx: re.Pattern, pos: int, end: int | None = None) -> re.Match | None:
        end = len(self.v) if end is None else end
        while True:
            m = rx.search(self.v, pos, end)
            if m is None or self.in_code(m.start()):
                return m
            pos = m.start() + 1

    def check_chars(self) -> None:
        v = self.v
        if v.isascii() and not v.encode("ascii").translate(None, _ALLOWED):
            return
        pos = 0
        while True:  # non-ASCII text may sit in comments and strings
            bad = _NOT_ALLOWED.search(v, pos)
            if bad is None:
                return
            a, b = self.line_span(bad.start())
            bl = self.blank(a, b)
            for k in range(bad.start() - a, b - a):
                ch = bl[k]
                if ch not in " x" and not ("\x20" <= ch <= "\x7e" or ch in "\t\r"):
                    raise self.error(f"unexpected character {ch!r} (binary data in PTX text?)", a + k)
            pos = b + 1

    # -- header
    def header(self, g: str) -> tuple[tuple[int, int], tuple[str, ...], bool, int | None]:
        v = _VERSION.search(g)
        if not v:
            raise self.error("no '.version MAJOR.MINOR' directive: is this PTX?")
        t = _TARGET.search(g)
        if not t:
            raise self.error("no '.target' directive", v.end())
        items = [x.strip() for x in t.group(1).split(",")]
        if not all(re.fullmatch(r"\w+", x) for x in items):
            raise self.error(f"malformed .target list {t.group(1).strip()!r}", t.start())
        debug = "debug" in items
        targets = tuple(x for x in items if x != "debug")
        if not targets:
            raise self.error("'.target' names no architecture", t.start())
        a = _ADDR.search(g)
        return (int(v.group(1)), int(v.group(2))), targets, debug, int(a.group(1)) if a else None

    # -- declarations
    def parse(self) -> PtxInfo:
        self.check_chars()
        v = self.v
        entries: list[KernelInfo] = []
        funcs: list[FuncInfo] = []
        gaps: list[tuple[int, str]] = []  # (offset, blanked module-scope text)
        pos = 0
        header = None
        while True:
            d = self.find_code(_DECL, pos)
            gap_end = len(v) if d is None else d.start()
            g = self.blank(pos, gap_end, self.meta)
            lk = _LINKAGE.search(g).group(1)
            gaps.append((pos, g[: len(g) - len(lk)]))
            if header is None:
                header = self.header(g)
            if d is None:
                break
            linkage = lk.split()[-1][1:] if lk.strip() else None
            if d.group() == ".entry":
                info, pos = self.entry(d.end(), linkage)
                entries.append(info)
            else:
                fn, pos = self.func(d.end(), linkage)
                funcs.append(fn)
        version, targets, target_debug, addr = header
        # .file, .section and variables live at module scope: look only between bodies.
        globals_ = [x for off, g in gaps for x in self.variables(g, off)]
        debug = DebugInfo(
            lineinfo=self.find_code(_LOC, 0) is not None,
            files=tuple(self.files(gaps)),
            sections=tuple(x.group(1) for _, g in gaps for x in _SECTION.finditer(g)
                           if x.group(1).startswith(".debug")),
            dwarf_legacy=any("@@DWARF" in g for _, g in gaps),
            target_debug=target_debug,
        )
        metadata, keys = _metadata(self.meta, entries)
        return PtxInfo(version, targets, addr, tuple(entries), tuple(funcs), tuple(globals_), debug,
                       metadata, keys, self.source)

    def files(self, gaps):
        for off, g in gaps:
            for f in _FILE.finditer(g):
                q = f.end()
                yield int(f.group(1)), self.t[off + q: off + g.index('"', q)]

    def declaration(self, pos: int, what: str) -> tuple[str, int, int]:
        """The blanked text from ``pos`` to the '{' or ';' that ends a declaration's head,
        and where that head ends."""
        end = self.find_code(re.compile(r"[{;]"), pos)
        if end is None:
            raise self.error(f"{what} has no body (truncated text?)", pos)
        return self.blank(pos, end.start()), end.start(), end.group() == "{"

    def name_at(self, h: str, p: int, pos: int, what: str) -> tuple[str, int]:
        n = _NAME.match(h, p)
        if not n:
            raise self.error(f"expected a name after {what}", pos + p)
        return n.group(1), n.end()

    def paren_list(self, h: str, p: int, pos: int, what: str) -> tuple[str | None, int]:
        """If a '(' follows (after blanks), return its contents and the index after ')'."""
        q = p
        while q < len(h) and h[q] in " \t\r\n":
            q += 1
        if q >= len(h) or h[q] != "(":
            return None, p
        close = h.find(")", q + 1)
        if close == -1:
            raise self.error(f"unclosed '(' in {what}", pos + q)
        inner = h[q + 1: close]
        if "(" in inner:
            raise self.error(f"unbalanced parentheses in {what}", pos + q)
        return inner, close + 1

    def match_brace(self, start: int, what: str) -> int:
        """The end of the body whose '{' is at ``start``."""
        v = self.v
        # Fast path: compilers close a function with '}' in column 0, and their comments
        # hold no braces; then the raw counts are exact.
        cand = _CLOSE_LINE.search(v, start)
        tries = 0
        while cand is not None and tries < 8:
            end = cand.end()
            if v.count("{", start, end) == v.count("}", start, end):
                if _COMMENT_BRACE.search(v, start, end) is None and (
                        v.find('"', start, end) == -1 or _STRING_BRACE.search(v, start, end) is None):
                    return end
                break
            cand = _CLOSE_LINE.search(v, end)
            tries += 1
        # Exact path: count code braces chunk by chunk (each chunk ends at a line break).
        depth = 0
        p = start
        while p < len(v):
            q = v.find("\n", min(p + _CHUNK, len(v)))
            q = len(v) if q == -1 else q + 1
            chunk = self.blank(p, q)
            for b in re.finditer(r"[{}]", chunk):
                depth += 1 if b.group() == "{" else -1
                if depth == 0:
                    return p + b.end()
            p = q
        raise self.error(f"unterminated body of {what} (missing '}}'; truncated text?)", start)

    def params(self, inner: str, pos: int, what: str) -> KernelSignature:
        specs = []
        if inner.strip():
            for i, chunk in enumerate(inner.split(",")):
                specs.append(self.param(chunk, i, pos, what))
        return layout(specs)

    def param(self, chunk: str, index: int, pos: int, what: str):
        toks = _PTOKEN.findall(chunk)
        if not toks or toks[0] not in (".param", ".reg"):
            raise self.error(f"parameter {index} of {what}: expected '.param', got {chunk.strip()[:40]!r}", pos)
        typ = name = space = None
        align = palign = count = None
        pointer = False
        i = 1
        while i < len(toks):
            tk = toks[i]
            if tk == ".align":
                if i + 1 >= len(toks) or not toks[i + 1].isdigit():
                    raise self.error(f"parameter {index} of {what}: '.align' needs a number", pos)
                val = int(toks[i + 1])
                if val <= 0 or val & (val - 1):
                    raise self.error(f"parameter {index} of {what}: alignment {val} is not a power of two", pos)
                if pointer:
                    palign = val
                else:
                    align = val
                i += 2
                continue
            if tk == ".ptr":
                pointer = True
            elif tk.startswith("."):
                word = tk[1:]
                if word in SCALAR_TYPES and typ is None:
                    typ = word
                elif pointer and word in _SPACES and space is None:
                    space = word
                else:
                    raise self.error(f"parameter {index} of {what}: unknown type or qualifier {tk!r}", pos)
            elif tk == "[":
                if i + 2 < len(toks) and toks[i + 1].isdigit() and toks[i + 2] == "]":
                    count = int(toks[i + 1])
                    i += 3
                    continue
                if i + 1 < len(toks) and toks[i + 1] == "]":
                    count = 0
                    i += 2
                    continue
                raise self.error(f"parameter {index} of {what}: malformed array size", pos)
            elif name is None and (tk[0].isalpha() or tk[0] in "_$%"):
                name = tk
            else:
                raise self.error(f"parameter {index} of {what}: unexpected {tk!r}", pos)
            i += 1
        if typ is None:
            raise self.error(f"parameter {index} of {what}: no type", pos)
        if name is None:
            raise self.error(f"parameter {index} of {what}: no name", pos)
        return (name, typ, SCALAR_TYPES[typ], count, pointer, space, align, palign)

    def directives(self, text: str, pos: int, what: str) -> Directives:
        kw: dict = {}
        for d in _DIRECTIVE.finditer(text):
            word, nums = d.group(1), d.group(2)
            if word is None:
                raise self.error(f"unexpected {d.group()[:30]!r} before the body of {what}", pos)
            vals = tuple(int(x) for x in nums.split(",")) if nums else ()
            if word in _DIRECTIVES_N:
                if not 1 <= len(vals) <= 3:
                    raise self.error(f".{word} of {what} needs 1 to 3 values", pos)
                kw[word] = vals
            elif word in _DIRECTIVES_1:
                if len(vals) != 1:
                    raise self.error(f".{word} of {what} needs one value", pos)
                kw[word] = vals[0]
            elif word in _DIRECTIVES_0:
                if vals:
                    raise self.error(f".{word} of {what} takes no value", pos)
                kw[word] = True
            else:
                raise self.error(f"unknown directive .{word} on {what}", pos)
        return Directives(**kw)

    def entry(self, pos: int, linkage: str | None) -> tuple[KernelInfo, int]:
        h, hend, defined = self.declaration(pos, "'.entry'")
        name, p = self.name_at(h, 0, pos, ".entry")
        what = f"kernel {name!r}"
        inner, p = self.paren_list(h, p, pos, what)
        sig = self.params(inner or "", pos + p, what)
        d = self.directives(_PRAGMA.sub("", h[p:]), pos + p, what)
        end = self.match_brace(hend, what) if defined else hend + 1
        return KernelInfo(name, sig, d, linkage), end

    def func(self, pos: int, linkage: str | None) -> tuple[FuncInfo, int]:
        h, hend, defined = self.declaration(pos, "'.func'")
        _, p = self.paren_list(h, 0, pos, ".func return list")
        name, p = self.name_at(h, p, pos, ".func")
        what = f"function {name!r}"
        inner, p = self.paren_list(h, p, pos, what)
        self.params(inner or "", pos + p, what)
        d = self.directives(_PRAGMA.sub("", h[p:]), pos + p, what)
        end = self.match_brace(hend, what) if defined else hend + 1
        return FuncInfo(name, linkage, defined, d.noreturn), end

    def variables(self, g: str, off: int):
        for v in _VAR.finditer(g):
            toks = _VARTOK.findall(v.group(2))
            lk = _LINKAGE.search(g, max(0, v.start() - 64), v.start()).group(1)
            linkage = lk.split()[-1][1:] if lk.strip() else None
            typ = name = None
            align = None
            dims: list[int | None] = []
            init = False
            i = 0
            while i < len(toks):
                tk = toks[i]
                if tk == "=":
                    init = True
                    break
                if tk == ".align" and i + 1 < len(toks) and toks[i + 1].isdigit():
                    align = int(toks[i + 1])
                    i += 2
                    continue
                if tk.startswith("."):
                    if tk[1:] in SCALAR_TYPES:
                        typ = tk[1:]
                elif tk == "[":
                    if i + 1 < len(toks) and toks[i + 1].isdigit():
                        dims.append(int(toks[i + 1]))
                        i += 3
                        continue
                    dims.append(None)
                    i += 2
                    continue
                elif name is None and not tk.isdigit():
                    name = tk
                i += 1
            if typ is None or name is None:
                raise self.error(f"malformed .{v.group(1)} variable declaration", off + v.start())
            elem = SCALAR_TYPES[typ]
            size: int | None = elem
            for n in dims:
                size = None if (n is None or size is None) else size * n
            yield GlobalVar(name, v.group(1), typ, size, align or elem, linkage, init)


def _metadata(meta: list[tuple[str, str, int]], entries: list[KernelInfo]) -> tuple[dict, tuple[str, ...]]:
    if not meta:
        return {}, ()
    found: dict[str, object] = {}
    legacy: dict[str, object] = {}
    for key, raw, is_legacy in meta:
        val: object = int(raw) if re.fullmatch(r"-?\d+", raw) else raw
        (legacy if is_legacy else found)[key] = val
    out: dict[str, object] = {**legacy, **found}  # a // meta: value wins over an old comment
    keys = tuple(out)
    if "name" not in out:
        visible = [e for e in entries if e.linkage == "visible"] or entries
        if visible:
            out["name"] = visible[0].name
    if "num_warps" not in out:
        req = next((e.directives.reqntid for e in entries if e.directives.reqntid), None)
        if req:
            threads = 1
            for r in req:
                threads *= r
            out["num_warps"] = -(-threads // 32)
    for k, v in TRITON_META_DEFAULTS.items():
        out.setdefault(k, v)
    return out, keys


# --------------------------------------------------------------------------- rewriting

# One pass over the text removes whole debug lines: each alternative starts right after a
# line break. A .section .debug_* block runs from its header through '{' (maybe on the next
# line) to the closing '}'; its body never holds braces, but its '//' comments may.
# Each '//' comment runs to its line break ((?=\n) forbids stopping early), which keeps the
# pattern unambiguous: linear even on a truncated section with no closing brace.
_SECTION_BLOCK = (r"\.section[ \t]+\.debug\w*[^\n{/]*(?://[^\n]*(?=\n))?\s*\{"
                  r"(?:[^}/]|/(?!/)|//[^\n]*(?=\n))*\}[ \t]*(?://[^\n]*)?")
_DEBUG_LINES = re.compile(r"\n[ \t]*(?:\.(?:loc|file)\b[^\n]*|@@DWARF[^\n]*|" + _SECTION_BLOCK + ")")
_DWARF_ONLY = re.compile(r"\n[ \t]*(?:@@DWARF[^\n]*|" + _SECTION_BLOCK + ")")
_LOC_TAIL = re.compile(r"(\.loc[ \t]+\d+[ \t]+\d+[ \t]+\d+)[ \t]*,[ \t]*function_name[^\n/]*?"
                       r"(?=[ \t]*(?://|\n|$))")
_TARGET_DEBUG = re.compile(r"([ \t]*\.target[ \t]+[^\n]*?)(?:[ \t]*,[ \t]*debug\b|\bdebug[ \t]*,[ \t]*)")


def strip_debug(text: str | bytes, keep_lineinfo: bool = False) -> str:
    """Remove debug information that keeps the driver's JIT from accepting or optimising PTX.

    Removes the DWARF ``.section .debug_*`` blocks (and the relocations in them),
    ``@@DWARF`` lines and ``debug`` from ``.target``; ``.file``/``.loc`` too unless
    ``keep_lineinfo`` (then only the ``function_name``/``inlined_at`` tails of ``.loc``,
    which point into the removed ``.debug_str``). Every other byte is left alone.
    """
    text = _as_text(text, None)
    if _BLOCK_OPEN.search(text):
        return _strip_view(text, _blank_text(text), keep_lineinfo)
    out = (_DWARF_ONLY if keep_lineinfo else _DEBUG_LINES).sub("", text)
    if keep_lineinfo and "function_name" in out:
        out = _LOC_TAIL.sub(r"\1", out)
    t = _target_line(out)
    if t is not None:
        x = _TARGET_DEBUG.match(out, *t)
        if x:
            out = out[:x.end(1)] + out[x.end():]
    return out


def _strip_view(text: str, view: str, keep_lineinfo: bool) -> str:
    """strip_debug deciding on ``view`` (comments blanked, same offsets), cutting ``text``:
    block comments could hide or fake any of the patterns."""
    cuts = [(x.start(), x.end()) for x in (_DWARF_ONLY if keep_lineinfo else _DEBUG_LINES).finditer(view)]
    if keep_lineinfo and "function_name" in view:
        cuts += [(x.end(1), x.end()) for x in _LOC_TAIL.finditer(view)]
    t = _target_line(view)
    if t is not None:
        x = _TARGET_DEBUG.match(view, *t)
        if x:
            cuts.append((x.end(1), x.end()))
    out = []
    pos = 0
    for a, b in sorted(cuts):
        out.append(text[pos:a])
        pos = b
    out.append(text[pos:])
    return "".join(out)


def _target_line(view: str) -> tuple[int, int] | None:
    """Start and end of the line holding the .target directive (not one in a comment)."""
    i = view.find(".target")
    while i != -1:
        a = view.rfind("\n", 0, i) + 1
        if not view[a:i].strip():
            b = view.find("\n", i)
            return a, len(view) if b == -1 else b
        i = view.find(".target", i + 1)
    return None


def _blank_text(text: str) -> str:
    try:
        return _blank(text)
    except _Unterminated as e:
        raise PtxParseError(f"unterminated {e.what}", line=_line(text, e.pos)) from None


def set_version(text: str, version: tuple[int, int]) -> str:
    """Rewrite the ``.version`` directive (for a driver older than the PTX's producer)."""
    v = _VERSION.search(_blank_text(text))
    if not v:
        raise PtxParseError("no '.version' directive")
    return f"{text[:v.start()]}.version {version[0]}.{version[1]}{text[v.end():]}"


# PTX ISA version -> the CUDA release that introduced it (FORMATS.md §5.4; cuda-bindings'
# ptx utilities carry the same table).
_ISA_TO_CUDA = {
    (7, 0): (11, 0), (7, 1): (11, 1), (7, 2): (11, 2), (7, 3): (11, 3), (7, 4): (11, 4), (7, 5): (11, 5),
    (7, 6): (11, 6), (7, 7): (11, 7), (7, 8): (11, 8), (8, 0): (12, 0), (8, 1): (12, 1), (8, 2): (12, 2),
    (8, 3): (12, 3), (8, 4): (12, 4), (8, 5): (12, 5), (8, 6): (12, 7), (8, 7): (12, 8), (8, 8): (12, 9),
}


def cuda_for_ptx(version: tuple[int, int]) -> tuple[int, int]:
    """The oldest CUDA release (major, minor) whose tools accept this PTX ISA version."""
    if version in _ISA_TO_CUDA:
        return _ISA_TO_CUDA[version]
    if version[0] >= 9:  # 9.x came with 13.x, one for one
        return (version[0] + 4, version[1])
    return (version[0] + 4, 0) if version < (7, 0) else (12, 9)


def max_ptx_for_cuda(cuda: tuple[int, int]) -> tuple[int, int]:
    """The newest PTX ISA version a CUDA release (driver or assembler) accepts."""
    if cuda[0] >= 13:
        return (cuda[0] - 4, cuda[1])
    best = (6, 0)
    for isa, rel in _ISA_TO_CUDA.items():
        if rel <= cuda and isa > best:
            best = isa
    return best
