"""PTX text -> PtxInfo (header, entries, parameters, directives, globals, metadata, debug info),
and strip_debug. Pure data: no CUDA needed.

The scanner works on a *masked* copy of the text in which comments are blanked and string
contents hidden, byte for byte, so offsets and line numbers stay those of the original and
no comment or string can look like code (FORMATS.md §1.8). Everything else is a handful of
whole-text regular expressions; Python-level work is per declaration, not per line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import PtxParseError
from .signature import SCALAR_TYPES, Directives, KernelInfo, KernelSignature, layout

__all__ = [
    "PtxInfo",
    "FuncInfo",
    "GlobalVar",
    "DebugInfo",
    "inspect_ptx",
    "strip_debug",
    "set_version",
    "TRITON_META_DEFAULTS",
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
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(name)

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
# string and "/*" inside a line comment are what they are).
_LEX = re.compile(r'"[^"\n]*"|//[^\n]*|/\*.*?\*/', re.S)
_META = re.compile(r"//[ \t]*meta:[ \t]*(\w+)[ \t]*=[ \t]*(\S*)")
_LEGACY = re.compile(r"//[ \t]*(TRITON_\w+)[ \t]*:[ \t]*(\d+)")
_BAD_CHAR = re.compile(r"[^\t\n\r\x20-\x7e]")
_BLANK = re.compile(r"[^\n]")


def _mask(text: str, meta: list[tuple[str, str, int]]) -> str:
    """Blank comments and hide string contents; collect Triton metadata comments."""

    def repl(m: re.Match) -> str:
        s = m.group()
        if s[0] == '"':
            return '"' + "x" * (len(s) - 2) + '"'
        if s[1] == "/":
            if "meta:" in s or "TRITON_" in s:
                mm = _META.match(s)
                if mm:
                    meta.append((mm.group(1), mm.group(2), 0))
                else:
                    mm = _LEGACY.match(s)
                    if mm and mm.group(1) in _LEGACY_META:
                        meta.append((_LEGACY_META[mm.group(1)], mm.group(2), 1))
            return " " * len(s)
        return _BLANK.sub(" ", s)

    return _LEX.sub(repl, text)


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


# --------------------------------------------------------------------------- parsing

_VERSION = re.compile(r"\.version\s+(\d+)\.(\d+)\b")
_TARGET = re.compile(r"\.target\s+([^\n;]*)")
_ADDR = re.compile(r"\.address_size\s+(\d+)")
_DECL = re.compile(r"((?:\.(?:visible|weak|extern|common)\s+)*)\.(entry|func)\b")
_NAME = re.compile(r"\s*([A-Za-z_$%][\w$%]*)")
_PTOKEN = re.compile(r"\.\w+|\d+|[A-Za-z_$%][\w$%]*|\S")
_DIRECTIVE = re.compile(r"\.(\w+)((?:\s*\d+\s*,)*\s*\d+)?|\S+")
_VAR = re.compile(r"((?:\.(?:visible|weak|extern|common)\s+)*)\.(global|const|shared)\b([^;]*);")
_VARTOK = re.compile(r"\.\w+|\d+|[A-Za-z_$%][\w$%]*|\[|\]|=")
_LOC = re.compile(r"\.loc\b")
_FILE = re.compile(r"\.file\s+(\d+)\s+\"")
_PRAGMA = re.compile(r'\.pragma\s*"x*"\s*;')
_SECTION = re.compile(r"\.section\s+(\.[\w.$]+)")

_SPACES = ("global", "shared", "const", "local", "param")
_DIRECTIVES_N = {"maxntid", "reqntid", "reqnctapercluster"}
_DIRECTIVES_1 = {"minnctapersm", "maxnctapersm", "maxnreg", "maxclusterrank"}
_DIRECTIVES_0 = {"noreturn", "explicitcluster", "blocksareclusters"}


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
    text = _as_text(text, source)
    meta: list[tuple[str, str, int]] = []
    parser = _Parser(text, _mask(text, meta), source)
    parser.check_chars()
    return parser.parse(meta)


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
    def __init__(self, text: str, masked: str, source: str | None):
        self.t = text
        self.m = masked
        self.source = source

    def error(self, msg: str, pos: int | None = None) -> PtxParseError:
        return PtxParseError(msg, source=self.source, line=None if pos is None else _line(self.m, pos))

    def check_chars(self) -> None:
        bad = _BAD_CHAR.search(self.m)
        if bad:
            raise self.error(f"unexpected character {bad.group()!r} (binary data in PTX text?)", bad.start())
        if "/*" in self.m:
            raise self.error("unterminated /* comment", self.m.index("/*"))
        q = self.m.find('"')
        while q != -1:  # every quote left in the mask belongs to a string "xxx"
            end = self.m.find('"', q + 1)
            if end == -1 or "\n" in self.m[q:end]:
                raise self.error("unterminated string", q)
            q = self.m.find('"', end + 1)

    # -- header
    def header(self) -> tuple[tuple[int, int], tuple[str, ...], bool, int | None]:
        m = self.m
        v = _VERSION.search(m)
        if not v:
            raise self.error("no '.version MAJOR.MINOR' directive: is this PTX?")
        t = _TARGET.search(m)
        if not t:
            raise self.error("no '.target' directive", v.end())
        items = [x.strip() for x in t.group(1).split(",")]
        if not all(re.fullmatch(r"\w+", x) for x in items):
            raise self.error(f"malformed .target list {t.group(1).strip()!r}", t.start())
        debug = "debug" in items
        targets = tuple(x for x in items if x != "debug")
        if not targets:
            raise self.error("'.target' names no architecture", t.start())
        a = _ADDR.search(m)
        return (int(v.group(1)), int(v.group(2))), targets, debug, int(a.group(1)) if a else None

    # -- declarations
    def parse(self, meta: list[tuple[str, str, int]]) -> PtxInfo:
        version, targets, target_debug, addr = self.header()
        m = self.m
        entries: list[KernelInfo] = []
        funcs: list[FuncInfo] = []
        gaps: list[tuple[int, int]] = []
        pos = 0
        for d in _DECL.finditer(m):
            if d.start() < pos:
                raise self.error(f"'.{d.group(2)}' inside another function's body", d.start())
            gaps.append((pos, d.start()))
            linkage = d.group(1).split()[-1][1:] if d.group(1).strip() else None
            if d.group(2) == "entry":
                info, pos = self.entry(d.end(), linkage)
                entries.append(info)
            else:
                fn, pos = self.func(d.end(), linkage)
                funcs.append(fn)
        gaps.append((pos, len(m)))
        globals_ = [g for a, b in gaps for g in self.variables(a, b)]
        debug = DebugInfo(
            lineinfo=_LOC.search(m) is not None,
            files=tuple(self.files()),
            sections=tuple(s.group(1) for s in _SECTION.finditer(m) if s.group(1).startswith(".debug")),
            dwarf_legacy="@@DWARF" in m,
            target_debug=target_debug,
        )
        metadata, keys = _metadata(meta, entries)
        return PtxInfo(version, targets, addr, tuple(entries), tuple(funcs), tuple(globals_), debug,
                       metadata, keys, self.source)

    def name_at(self, pos: int, what: str) -> tuple[str, int]:
        n = _NAME.match(self.m, pos)
        if not n:
            raise self.error(f"expected a name after {what}", pos)
        return n.group(1), n.end()

    def paren_list(self, pos: int, what: str) -> tuple[str | None, int]:
        """If a '(' follows (after blanks), return its contents and the position after ')'."""
        m = self.m
        p = pos
        while p < len(m) and m[p] in " \t\r\n":
            p += 1
        if p >= len(m) or m[p] != "(":
            return None, pos
        close = m.find(")", p + 1)
        if close == -1:
            raise self.error(f"unclosed '(' in {what}", p)
        inner = m[p + 1 : close]
        if "(" in inner:
            raise self.error(f"unbalanced parentheses in {what}", p)
        return inner, close + 1

    def body(self, pos: int, what: str) -> tuple[bool, str, int]:
        """Find '{' (definition) or ';' (declaration) after the directives; return
        (defined, directive text, end position)."""
        m = self.m
        brace, semi = m.find("{", pos), m.find(";", pos)
        if brace == -1 and semi == -1:
            raise self.error(f"{what} has no body (truncated text?)", pos)
        if semi != -1 and (brace == -1 or semi < brace):
            return False, m[pos:semi], semi + 1
        return True, m[pos:brace], self.match_brace(brace, what)

    def match_brace(self, start: int, what: str) -> int:
        m = self.m
        # Fast path: compilers close a function with '}' in column 0.
        cand = m.find("\n}", start)
        tries = 0
        while cand != -1 and tries < 4:
            end = cand + 2
            if m.count("{", start, end) == m.count("}", start, end):
                return end
            cand = m.find("\n}", end)
            tries += 1
        depth = 0
        for b in re.finditer(r"[{}]", m[start:]):
            depth += 1 if b.group() == "{" else -1
            if depth == 0:
                return start + b.end()
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
        name, p = self.name_at(pos, ".entry")
        what = f"kernel {name!r}"
        inner, p = self.paren_list(p, what)
        sig = self.params(inner or "", p, what)
        defined, dtext, end = self.body(p, what)
        dtext = _PRAGMA.sub("", dtext)
        return KernelInfo(name, sig, self.directives(dtext, p, what), linkage), end

    def func(self, pos: int, linkage: str | None) -> tuple[FuncInfo, int]:
        _, p = self.paren_list(pos, ".func return list")
        name, p = self.name_at(p, ".func")
        what = f"function {name!r}"
        inner, p = self.paren_list(p, what)
        self.params(inner or "", p, what)
        defined, dtext, end = self.body(p, what)
        dtext = _PRAGMA.sub("", dtext)
        d = self.directives(dtext, p, what)
        return FuncInfo(name, linkage, defined, d.noreturn), end

    def variables(self, a: int, b: int):
        for v in _VAR.finditer(self.m, a, b):
            toks = _VARTOK.findall(v.group(3))
            linkage = v.group(1).split()[-1][1:] if v.group(1).strip() else None
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
                raise self.error(f"malformed .{v.group(2)} variable declaration", v.start())
            elem = SCALAR_TYPES[typ]
            size: int | None = elem
            for n in dims:
                size = None if (n is None or size is None) else size * n
            yield GlobalVar(name, v.group(2), typ, size, align or elem, linkage, init)

    def files(self):
        for f in _FILE.finditer(self.m):
            q = f.end() - 1
            end = self.m.find('"', q + 1)
            yield int(f.group(1)), self.t[q + 1 : end]


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

# A .section .debug_* header, its '{' (maybe on the next line) and its body up to the
# closing '}'; the body never holds braces, but '//' comments in it may, so skip those.
_DBG_SECTION = re.compile(
    r"^[ \t]*\.section[ \t]+\.debug\w*[^\n{/]*(?://[^\n]*)?\s*\{(?:[^}/]|/(?!/)|//[^\n]*)*\}[ \t]*(?://[^\n]*)?\n?",
    re.M)
_DWARF_LINE = re.compile(r"^[ \t]*@@DWARF\b[^\n]*\n?", re.M)
_LOC_FILE_LINE = re.compile(r"^[ \t]*\.(?:loc|file)\b[^\n]*\n?", re.M)
_LOC_TAIL = re.compile(r"(\.loc[ \t]+\d+[ \t]+\d+[ \t]+\d+)[ \t]*,[ \t]*function_name[^\n/]*?"
                       r"(?=[ \t]*(?://|\n|$))")
_TARGET_DEBUG = re.compile(r"^([ \t]*\.target[ \t]+[^\n]*?)(?:[ \t]*,[ \t]*debug\b|\bdebug[ \t]*,[ \t]*)", re.M)


def strip_debug(text: str | bytes, keep_lineinfo: bool = False) -> str:
    """Remove debug information that keeps the driver's JIT from accepting or optimising PTX.

    Removes the DWARF ``.section .debug_*`` blocks (and the relocations in them),
    ``@@DWARF`` lines and ``debug`` from ``.target``; ``.file``/``.loc`` too unless
    ``keep_lineinfo`` (then only the ``function_name``/``inlined_at`` tails of ``.loc``,
    which point into the removed ``.debug_str``). Every other byte is left alone.
    """
    text = _as_text(text, None)
    if ".section" not in text and "@@DWARF" not in text and ".loc" not in text \
            and ".file" not in text and "debug" not in text:
        return text
    if "/*" in text:
        # Block comments could hide or fake any of the patterns: decide on the masked
        # text, cut the original.
        return _strip_masked(text, keep_lineinfo)
    return _strip_plain(text, keep_lineinfo)


def _strip_plain(text: str, keep_lineinfo: bool) -> str:
    if ".section" in text:
        text = _DBG_SECTION.sub("", text)
    if "@@DWARF" in text:
        text = _DWARF_LINE.sub("", text)
    if keep_lineinfo:
        if "function_name" in text:
            text = _LOC_TAIL.sub(r"\1", text)
    elif ".loc" in text or ".file" in text:
        text = _LOC_FILE_LINE.sub("", text)
    return _TARGET_DEBUG.sub(r"\1", text, count=1)


def _strip_masked(text: str, keep_lineinfo: bool) -> str:
    masked = _mask(text, [])
    cuts: list[tuple[int, int, str]] = []
    for rx in (_DBG_SECTION, _DWARF_LINE) + (() if keep_lineinfo else (_LOC_FILE_LINE,)):
        cuts += [(x.start(), x.end(), "") for x in rx.finditer(masked)]
    if keep_lineinfo:
        cuts += [(x.end(1), x.end(), "") for x in _LOC_TAIL.finditer(masked)]
    t = _TARGET_DEBUG.search(masked)
    if t:
        cuts.append((t.end(1), t.end(), ""))
    out = []
    pos = 0
    for a, b, rep in sorted(cuts):
        if a < pos:
            continue
        out.append(text[pos:a])
        out.append(rep)
        pos = b
    out.append(text[pos:])
    return "".join(out)


def set_version(text: str, version: tuple[int, int]) -> str:
    """Rewrite the ``.version`` directive (for a driver older than the PTX's producer)."""
    masked = _mask(text, [])
    v = _VERSION.search(masked)
    if not v:
        raise PtxParseError("no '.version' directive")
    return f"{text[:v.start()]}.version {version[0]}.{version[1]}{text[v.end():]}"
