"""PTX text -> PtxInfo (header, entries, parameters, directives, globals, metadata, debug info),
and strip_debug. Pure data: no CUDA needed.

The scanner works on a *masked* copy of the text in which comments are blanked and string
contents hidden, byte for byte, so offsets and line numbers stay those of the original and
no comment or string can look like code (FORMATS.md §1.8). Everything else is a handful of
whole-text regular expressions; Python-level work is per declaration, not per line. The
shapes compilers write (a gap of white space and comments, a head with no comment in it,
'.param .type name' items) are read by one compiled pattern each, which only accepts text
the general reading would read the same way; anything else is read the general way.
"""
from __future__ import annotations

import bisect
import contextlib
import difflib
import functools
import gc
import os
import re
import sys
import threading
from dataclasses import replace

from nbjit.errors import PtxParseError
from nbjit.params.signature import (
    SCALAR_TYPES, Directives, KernelInfo, KernelSignature, find_entry, layout, maker, param_shape, place)
from nbjit.records import field, record

_NO_DIRECTIVES = Directives()
_NO_PARAMS = KernelSignature((), 0)

__all__ = [
    "PtxInfo",
    "FuncInfo",
    "GlobalVar",
    "DebugInfo",
    "inspect_ptx",
    "strip_debug",
    "set_version",
    "cuda_for_ptx",
    "max_ptx_for_cuda",
]

# --------------------------------------------------------------------------- data


@record
class FuncInfo:
    """A ``.func`` device function (definition or ``.extern`` declaration)."""

    name: str
    linkage: str | None
    defined: bool
    noreturn: bool = False
    griddepcontrol: tuple[str, ...] = ()  # as KernelInfo.griddepcontrol, for its own body

    def to_json(self) -> dict:
        d = {"name": self.name, "linkage": self.linkage, "defined": self.defined, "noreturn": self.noreturn}
        if self.griddepcontrol:
            d["griddepcontrol"] = list(self.griddepcontrol)
        return d


@record
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


@record
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
        """``"dwarf"`` (``-G``: debug sections beyond line tables, ``debug`` on ``.target``,
        legacy ``@@DWARF``), ``"lineinfo"`` (``-lineinfo``: ``.loc``/``.file``, with at most
        the ``.debug_line``/``.debug_str`` pair that names inlined code) or ``"none"``."""
        if self.target_debug or self.dwarf_legacy or not set(self.sections) <= _LINE_SECTIONS:
            return "dwarf"
        if self.lineinfo or self.files:
            return "lineinfo"
        return "dwarf" if self.sections else "none"

    def to_json(self) -> dict:
        return {"kind": self.kind, "lineinfo": self.lineinfo, "dwarf": self.dwarf,
                "target_debug": self.target_debug, "sections": list(self.sections),
                "dwarf_legacy": self.dwarf_legacy,
                "files": [{"index": i, "path": p} for i, p in self.files]}


_LINE_SECTIONS = frozenset({".debug_line", ".debug_str"})  # what -lineinfo emits beside .loc

# Triton's older metadata comments and the // meta: keys they stand for.
_LEGACY_META = {
    "TRITON_SHARED_MEM_BYTES": "shared",
    "TRITON_GLOBAL_SCRATCH_BYTES_PER_CTA": "global_scratch_size",
    "TRITON_GLOBAL_SCRATCH_ALIGN": "global_scratch_align",
}


@record
class PtxInfo:
    """Everything nbjit reads from a PTX module."""

    version: tuple[int, int]
    targets: tuple[str, ...]  # every .target item except "debug", arch first
    address_size: int | None
    entries: tuple[KernelInfo, ...]
    functions: tuple[FuncInfo, ...]
    globals: tuple[GlobalVar, ...]
    debug: DebugInfo
    metadata: dict = field(default_factory=dict)  # the // meta: key=value comments as written; {} if none
    source: str | None = None

    @property
    def arch(self) -> str:
        """The first ``.target`` item: the architecture (``sm_90``)."""
        return self.targets[0]

    @property
    def dynamic_shared(self) -> tuple[GlobalVar, ...]:
        """The unsized ``.extern .shared`` arrays (dynamic shared memory)."""
        return tuple(g for g in self.globals if g.dynamic_shared)

    def entry(self, name: str) -> KernelInfo:
        """The kernel called ``name`` (KeyError if none)."""
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


_kernel, _function, _directives, _variable = maker(KernelInfo), maker(FuncInfo), maker(Directives), maker(GlobalVar)

# --------------------------------------------------------------------------- lexing

# A string, a line comment or a block comment, whichever starts first (so "//" inside a
# string and "/*" inside a line comment are what they are); a lone '"' or '/*' is an
# unterminated string or comment.
_LEX = re.compile(r'"[^"\n]*"|//[^\n]*|/\*.*?\*/|/\*|"', re.S)
_LINE_COMMENT = re.compile(r"//[^\n]*")  # (what _LEX finds in text with no '"' or '/*')
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
# regex engine's literal search is not (~1 ns a character); str.find of one character rare in
# PTX ('*', '"') is faster still (memchr), so these are found through it (_block_comment,
# _string_brace), the pattern taking over where that character is common.
_BLOCK_OPEN = re.compile(r"/\*")
_RARE = 64  # that many of a 'rare' character, and the search goes to the regex engine
_LONG_LINE = 4096
_HEAD_END = re.compile(r"[{;]")
_LINKAGE_TAIL = re.compile(r"(?:\.(?:visible|weak|extern|common)\s+)+\Z")


def _block_comment(text: str) -> bool:
    """Whether ``text`` holds a '/*' (what ``_BLOCK_OPEN`` finds), found through its '*'."""
    i = text.find("*", 1)
    for _ in range(_RARE):
        if i == -1 or text[i - 1] == "/":
            return i != -1
        i = text.find("*", i + 1)
    return i != -1 and _BLOCK_OPEN.search(text, i - 1) is not None


def _string_brace(text: str) -> bool:
    """Whether a '"' of ``text`` has a brace after it on its line before another '"' (what
    ``_STRING_BRACE`` finds), tried at each '"'."""
    i = text.find('"')
    for _ in range(_RARE):
        if i == -1 or _STRING_BRACE.match(text, i):
            return i != -1
        i = text.find('"', i + 1)
    return i != -1 and _STRING_BRACE.search(text, i) is not None


class _Unterminated(Exception):
    def __init__(self, what: str, pos: int):
        self.what, self.pos = what, pos


def _blank(seg: str, meta: list | None = None, base: int = 0) -> str:
    """``seg`` with comments turned to spaces (line breaks kept) and string contents to
    'x': same length and offsets, and nothing in a comment or string looks like code.
    Triton metadata comments are appended to ``meta``."""

    def repl(m: re.Match) -> str:
        s = m.group()
        if s == '"' or s == "/*":
            raise _Unterminated("string" if s == '"' else "/* comment", m.start())
        if s[0] == '"':
            return '"' + "x" * (len(s) - 2) + '"'
        if s[1] == "/":  # a line comment: no line break in it
            if meta is not None:
                _note_meta(s, meta, base + m.start())
            return " " * len(s)
        return _NON_NEWLINE.sub(" ", s)

    if '"' not in seg and "/*" not in seg:  # line comments only, as compilers write: a simpler pattern
        return _LINE_COMMENT.sub(repl, seg) if "//" in seg else seg
    return _LEX.sub(repl, seg)


def _note_meta(comment: str, meta: list, pos: int) -> None:
    mm = _META.match(comment)
    if mm:
        meta.append((mm.group(1), mm.group(2), 0, pos))
        return
    mm = _LEGACY.match(comment)
    if mm and mm.group(1) in _LEGACY_META:
        meta.append((_LEGACY_META[mm.group(1)], mm.group(2), 1, pos))


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


# --------------------------------------------------------------------------- parsing

_VERSION = re.compile(r"\.version\s+(\d+)\.(\d+)\b")
_TARGET = re.compile(r"\.target\s+([^\n;]*)")
_ADDR = re.compile(r"\.address_size\s+(\d+)")
_DECL = re.compile(r"\.entry\b|\.func\b")
_LINKAGE_WORDS = (".visible", ".weak", ".extern", ".common")
_NAME = re.compile(r"\s*([A-Za-z_$%][\w$%]*)")
_PTOKEN = re.compile(r"\.\w+|\d+|[A-Za-z_$%][\w$%]*|\S")
_DIRECTIVE = re.compile(r"\.(\w+)((?:\s*\d+\s*,)*\s*\d+)?|\S+")
_VAR_START = re.compile(r"\.(?:global|const|shared)\b")
# what follows .global/.const/.shared as compilers write it: [.align N] .type name[[N]] [= ...]
_VAR_USUAL = re.compile(r"\s+(?:\.align\s+(\d{1,9})\s+)?\.([a-z0-9]+)\s+([A-Za-z_$][A-Za-z0-9_$]*)"
                        r"(?:\s*(\[)\s*(\d{0,9})\s*\])?\s*(?:(=)|\Z)")
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")  # (code is ASCII: check_chars)
_MAX_DIGITS = 19
_VARTOK = re.compile(r"\.[A-Za-z0-9_]+|\d+|[A-Za-z_$%][A-Za-z0-9_$%]*|\[|\]|=")  # (\w, as ASCII: 5x faster)
_LOC = re.compile(r"\.loc\b")
_GRIDDEP = re.compile(r"\bgriddepcontrol\.(wait|launch_dependents)\b")
_GRIDDEP_ORDER = ("wait", "launch_dependents").index  # the order KernelInfo.griddepcontrol lists them in
_CALL = re.compile(r"\bcall(?:\.uni)?\b[^;]*?([A-Za-z_$%][\w$%]*)\s*(?:,\s*\(|;)")
_FILE = re.compile(r'\.file\s+(\d+)\s+"')
_PRAGMA = re.compile(r'\.pragma\s*"x*"\s*;')
_SECTION = re.compile(r"\.section\s+(\.[\w.$]+)")
_SECTION_BODY = re.compile(r"[^\n{;]*\s*\{")

_SPACES = ("global", "shared", "const", "local", "param")
# What may start a line at module scope (directives, and the data directives of DWARF
# sections); anything else beginning with '.' is a misspelling or not PTX.
_MODULE_DIRECTIVES = (
    "version", "target", "address_size", "file", "section", "global", "const", "shared", "local", "extern",
    "visible", "weak", "common", "entry", "func", "pragma", "align", "alias", "callprototype", "loc",
    "b8", "b16", "b32", "b64", "u8", "u16", "u32", "u64", "s8", "s16", "s32", "s64", "f16", "f32", "f64",
    "attribute", "tex", "surf", "sampler", "texref", "surfref", "samplerref")
# Any directive word at module scope: the above, types, vector and DWARF section names.
_SCOPE_UNKNOWN = re.compile(r"\.(?!(?:" + "|".join(_MODULE_DIRECTIVES) + r"|v2|v4|v8|ptr|managed|unified|"
                            r"[bsuf](?:8|16|32|64)|f16x2|bf16|bf16x2|b128|pred|debug_\w+|nv_debug\w*)\b)"
                            r"([A-Za-z_]\w*)")
_DWARF_LINE = re.compile(r"@@DWARF[^\n]*")
# an instruction starting a line: on the first line, or after a newline (a literal first
# character, which the regex engine finds at C speed; '^' with re.M is tried at every character)
_INSTRUCTION_TEXT = r"[ \t]*([a-z][a-z0-9]*(?:\.[\w]+)*)[ \t]+[%\[][^\n]*;"
_SCOPE_INSTRUCTION = (re.compile(_INSTRUCTION_TEXT), re.compile("\n" + _INSTRUCTION_TEXT))
# The shapes compilers write, read by a few compiled patterns and str.find: a gap between
# bodies holding only white space, comments that are not metadata and a linkage word, then
# '.entry' or '.func', its name and '(' (_NEXT_DECL); a head with no comment, string or
# nested parenthesis in it (no '/' or '"': it is code as it stands); parameters '.param
# [.align N] .type [.ptr [.space] [.align N]] name[[N]]' (_PARAM_ITEM). Text of any other
# shape is read by the general code (same results, and the errors).
_QUIET = r"\s*(?://(?![ \t]*(?:meta|TRITON_))[^\n]*(?=\n|\Z)\s*)*"  # each comment runs to its line's end
_HEAD_START = r'\s*([A-Za-z_$%][A-Za-z0-9_$%]*)(?:[ \t\r\n]*(\())?'  # the name, and '(' if a parameter list follows
_RETURN_LIST = r'(?:[ \t\r\n]*\([^()/"{};]*\))?'
_NEXT_DECL = re.compile(_QUIET + r"(?:\.(visible|weak|extern|common)" + _QUIET + r")?(\.entry\b|\.func\b"
                        + _RETURN_LIST + ")" + _HEAD_START)
_ENTRY_START = re.compile(_HEAD_START)
_FUNC_START = re.compile(_RETURN_LIST + _HEAD_START)
_HEAD_REST = re.compile(r'[^()/"{};]*[{;]')
# One item from its start (after the list's '(' or a ','; so no text between items goes
# unread) to the ',' after it or the list's end: (what precedes the name, the name, the
# array size). A list is read whole where it has one item per ','-separated slot; what
# precedes the name repeats from kernel to kernel, and is read once (_PARAM_PREFIX).
_PARAM_PREFIX_TEXT = (r"\s*\.param\s+(?:\.align\s+(\d{1,9})\s+)?\.([a-z0-9]+)"
                      r"(?:\s+(\.ptr)(?:\s+\.(" + "|".join(_SPACES) + r"))?(?:\s+\.align\s+(\d{1,9}))?)?\s+")
_PARAM_PREFIX = re.compile(_PARAM_PREFIX_TEXT)
_PARAM_ITEM = re.compile(r"(?<![^(,])(" + re.sub(r"\((?!\?)", "(?:", _PARAM_PREFIX_TEXT) + r")"
                         r"([A-Za-z_$%][A-Za-z0-9_$%]*)(?:\s*(\[\s*\d{0,9}\s*\]))?\s*(?:,|\Z)")
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
    with _gc_paused():
        return _Parser(_as_text(text, source), source).parse()


_GC_LOCK = threading.Lock()
_gc_pausers = 0  # readers running in _gc_paused
_gc_resume = False  # whether the collector was on when the first of them started


@contextlib.contextmanager
def _gc_paused():
    """Python's cyclic garbage collector off while a reader builds its result: thousands of
    small objects, none in a reference cycle, which CPython otherwise traverses again and
    again in full collections as the result grows (a third of reading 10 MB of PTX). Readers
    in several threads share one pause; a collector that was off stays off."""
    global _gc_pausers, _gc_resume
    with _GC_LOCK:
        if _gc_pausers == 0:
            _gc_resume = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_resume:
                gc.enable()


def _as_text(text: str | bytes, source: str | None, compiled: str = "read it with nbjit.inspect_image") -> str:
    """PTX's text; ``compiled``: what to do with a cubin or fatbin given instead."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            kind = _compiled_kind(bytes(text[:20]))
            if kind:
                raise PtxParseError(f"a {kind}, not PTX: {compiled}", source=source) from None
            raise PtxParseError(f"not UTF-8 text (byte {e.start})", source=source) from None
    elif not isinstance(text, str):
        raise PtxParseError(f"PTX is text (str or bytes), not {type(text).__name__} (read the file first, or use "
                            "nbjit.inspect_image(path))", source=source)
    elif "\n" not in text and ".version" not in text and os.path.isfile(text):
        raise PtxParseError(f"{text!r} is a file's path, not PTX text (read the file first: "
                            "open(path).read())", source=source)
    return text.rstrip("\0")


def _compiled_kind(head: bytes) -> str | None:
    """"cubin" or "fatbin" where ``head`` (an image's first 20 bytes) begins one, else None."""
    from nbjit.read.cubin import EM_CUDA
    from nbjit.read.fatbin import FATBIN_MAGIC
    if head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == EM_CUDA:
        return "cubin"
    return "fatbin" if head[:4] == FATBIN_MAGIC.to_bytes(4, "little") else None


class _Parser:
    """Scans the text as it is and blanks comments and strings (``_blank``) only in the
    regions it reads closely: declarations, the module scope between bodies, and any body
    whose braces a comment or string could fake. Function bodies, the bulk of the text,
    are only scanned for their closing brace. A gap or head of the usual shape (no comment
    or string in it) needs no blanking at all: it is code as it stands."""

    def __init__(self, text: str, source: str | None):
        self.t = text
        self.source = source
        self.meta: list[tuple[str, str, int, int]] = []
        self.full = False  # whether self.v is the whole text with comments and strings blanked
        self._braces: dict[int, int] | None = None
        self._unclosed: list[int] = []
        self._bodies: list[tuple[int, int | None, int | None]] = []  # (entry index, body start, end)
        self._directives: dict[str, Directives] = {}  # directive text -> what it says
        self._unusual = -1  # where the last parameter list head() found not of the usual shape starts
        self.v = text
        self.has_griddep = "griddepcontrol" in text  # (in code or not: griddep looks closer)
        if "//" not in text and '"' not in text and "/*" not in text:
            self.full = True  # nothing to blank: the text is its own code view
        elif _block_comment(text):
            self.to_full()  # block comments can span anything: blank the whole text once

    def to_full(self) -> None:
        """Blank every comment and string of the text, once (linear time), collecting the
        Triton metadata comments afresh; from then on every search reads this view."""
        if not self.full:
            self.meta.clear()
            self.v = self.blank(0, len(self.t), self.meta, self.t)
            self.full = True

    def error(self, msg: str, pos: int | None = None) -> PtxParseError:
        return PtxParseError(msg, source=self.source, line=None if pos is None else _line(self.t, pos))

    def blank(self, a: int, b: int, meta: list | None = None, text: str | None = None) -> str:
        if self.full and text is None:
            return self.v[a:b]
        try:
            return _blank((self.v if text is None else text)[a:b], meta, a)
        except _Unterminated as e:
            raise self.error(f"unterminated {e.what}", a + e.pos) from None

    def line_span(self, i: int) -> tuple[int, int]:
        b = self.v.find("\n", i)
        return self.v.rfind("\n", 0, i) + 1, len(self.v) if b == -1 else b

    def code_matches(self, rx: re.Pattern, pos: int, end: int):
        """Every match of ``rx`` in code between ``pos`` and ``end`` (see ``find_code``)."""
        while (m := self.find_code(rx, pos, end)) is not None:
            yield m
            pos = m.end()

    def find_code(self, rx: re.Pattern, pos: int, end: int | None = None) -> re.Match | None:
        """The first match of ``rx`` in code (not in a comment or string) from ``pos``. A
        match is code if nothing before it on its line could start a comment or string, else
        it is checked by blanking its line; the first one that is not code (or sits on a very
        long line) switches to the fully blanked view, so the cost stays linear."""
        if self.full:
            return rx.search(self.v, pos) if end is None else rx.search(self.v, pos, end)
        v = self.v
        end = len(v) if end is None else end
        m = rx.search(v, pos, end)
        if m is None:
            return m
        i = m.start()
        a = v.rfind("\n", max(0, i - _LONG_LINE), i) + 1  # 0: the text's first line, or a long one
        if (a or i <= _LONG_LINE) and v.find("/", a, i) == -1 and v.find('"', a, i) == -1:
            return m  # nothing before it on its line starts a comment or string (there is no /* */)
        a, b = self.line_span(i)
        if b - a <= _LONG_LINE and self.blank(a, b)[m.start() - a] == self.v[m.start()]:
            return m
        self.to_full()
        return rx.search(self.v, pos, end)

    def braces(self) -> dict[int, int]:
        """Where each code '{' closes: one pass over the text's braces, checking balance."""
        if self._braces is None:
            if not self.full and (_COMMENT_BRACE.search(self.v) or _string_brace(self.v)):
                self.to_full()  # a comment or string holds a brace: count code braces only
            v = self.v
            opens, closes = _positions(v, "{"), _positions(v, "}")
            table: dict[int, int] = {}
            stack: list[int] = []
            i = 0
            for c in closes:  # merge the two sorted lists, matching each '}' to its '{'
                while i < len(opens) and opens[i] < c:
                    stack.append(opens[i])
                    i += 1
                if not stack:
                    raise self.error("unbalanced '}': no '{' opens it", c)
                table[stack.pop()] = c
            stack.extend(opens[i:])
            self._unclosed = stack  # reported by whoever needs one closed, else at the end
            self._braces = table
        return self._braces

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
        n = self.number
        return ((n(v.group(1), ".version", v.start()), n(v.group(2), ".version", v.start())), targets, debug,
                n(a.group(1), ".address_size", a.start()) if a else None)

    # -- declarations
    def parse(self) -> PtxInfo:
        self.check_chars()
        v = self.v
        entries: list[KernelInfo] = []
        funcs: list[FuncInfo] = []
        gaps: list[tuple[int, str]] = []  # (offset, blanked module-scope text)
        spans: list[int] = []  # where module scope is: [start, end, start, end, ...]
        pos = 0
        header = None
        while True:
            nxt = _NEXT_DECL.match(self.v, pos) if header is not None else None
            if nxt is not None:  # the usual gap (white space, comments, a linkage word), then a declaration
                linkage, word, name, paren = nxt.groups()
                start: tuple | None = (name, nxt.end(), paren is not None)
                spans += (pos, nxt.start(2))
                pos = nxt.end(2)
            else:
                d = self.find_code(_DECL, pos)
                gap_end = len(v) if d is None else d.start()
                g = self.blank(pos, gap_end, self.meta)
                spans += (pos, gap_end)
                plain = g.strip()
                if not plain:  # nothing in it to read
                    lk = ""
                elif plain in _LINKAGE_WORDS and header is not None:  # only a linkage word before the next one
                    lk = g
                else:
                    lk = _trailing_linkage(g)
                    scope = g[: len(g) - len(lk)] if lk else g
                    self.check_scope(scope, pos)
                    gaps.append((pos, scope))
                if header is None:
                    header = self.header(g)
                if d is None:
                    break
                linkage = lk.split()[-1][1:] if lk.strip() else None
                word, pos = d.group(), d.end()
                m = (_ENTRY_START if word == ".entry" else _FUNC_START).match(self.v, pos)
                start = None if m is None else (m.group(1), m.end(), m.group(2) is not None)
            if word == ".entry":
                info, pos = self.entry(pos, linkage, start)
                entries.append(info)
            else:
                fn, pos = self.func(pos, linkage, start)
                funcs.append(fn)
        funcs = _merge_functions(funcs)
        entries = self.called_griddep(entries, funcs)
        self.braces()
        if self._unclosed:
            raise self.error("unbalanced '{': no '}' closes it (truncated text?)", self._unclosed[-1])
        version, targets, target_debug, addr = header
        # .file, .section and variables live at module scope: look only between bodies.
        globals_ = [x for off, g in gaps for x in self.variables(g, off)]
        debug = DebugInfo(
            lineinfo=self.find_code(_LOC, 0) is not None,
            files=tuple(self.files(gaps)),
            sections=tuple(self.sections(gaps)),
            dwarf_legacy=any("@@DWARF" in g for _, g in gaps),
            target_debug=target_debug,
        )
        # Metadata comments count at module scope only, whichever view found them: the
        # fully blanked one (a file with a /* */ comment) sees those in bodies too.
        metadata = _metadata([m for m in self.meta if bisect.bisect_right(spans, m[3]) % 2], self.number)
        return PtxInfo(version, targets, addr, tuple(entries), tuple(funcs), tuple(globals_), debug,
                       metadata, self.source)

    def check_scope(self, g: str, off: int) -> None:
        """Module scope holds directives and declarations only: an unknown directive (a
        misspelled ``.entyr``) or an instruction there is an error, as it is for ptxas."""
        if "@@DWARF" in g:  # legacy DWARF lines hold assembler directives of their own
            g = _DWARF_LINE.sub(lambda m: " " * len(m.group()), g)
        bad = _SCOPE_UNKNOWN.search(g)
        if bad:
            word = bad.group(1)
            close = difflib.get_close_matches(word, _MODULE_DIRECTIVES, n=1)
            raise self.error(f"unknown directive .{word} at module scope"
                             + (f" (did you mean .{close[0]}?)" if close else ""), off + bad.start(1))
        first, rest = _SCOPE_INSTRUCTION
        ins = first.match(g) or rest.search(g)
        if ins:
            raise self.error(f"instruction {ins.group(1)!r} outside a function body (a stray '}}' before it?)",
                             off + ins.start(1))

    def sections(self, gaps):
        """Names of the DWARF sections; a section without its '{' body is an error (ptxas
        refuses it, and stripping could not find where it ends)."""
        for off, g in gaps:
            if "@@DWARF" in g:  # legacy DWARF lines name sections of their own, without bodies
                g = _DWARF_LINE.sub(lambda m: " " * len(m.group()), g)
            for x in _SECTION.finditer(g):
                body = _SECTION_BODY.match(g, x.end())
                if not body:
                    raise self.error(f"section {x.group(1)} has no '{{' body", off + x.start())
                nxt = _SECTION.search(g, body.end())
                if nxt is not None and g.find("}", body.end(), nxt.start()) == -1:
                    raise self.error(f"section {nxt.group(1)} starts inside section {x.group(1)} (a '}}' missing "
                                     "before it?)", off + nxt.start())
                if x.group(1).startswith(".debug"):
                    yield x.group(1)

    def files(self, gaps):
        for off, g in gaps:
            for f in _FILE.finditer(g):
                q = f.end()
                yield self.number(f.group(1), ".file", off + f.start()), self.t[off + q: off + g.index('"', q)]

    def declaration(self, pos: int, what: str) -> tuple[str, int, int]:
        """The blanked text from ``pos`` to the '{' or ';' that ends a declaration's head,
        and where that head ends."""
        end = self.find_code(_HEAD_END, pos)
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
        close = self.braces().get(start)
        if close is None:
            raise self.error(f"unterminated body of {what} (missing '}}'; truncated text?)", start)
        return close + 1

    def params(self, inner: str, pos: int, what: str) -> KernelSignature:
        """The parameters of a list whose contents (comments blanked) are ``inner`` and whose
        ')' is just before ``pos``."""
        if not inner or inner.isspace():
            return _NO_PARAMS
        start = pos - 1 - len(inner)
        if start != self._unusual or self.v[start:pos - 1] != inner:  # (head() has not tried it as it stands)
            shapes = _param_shapes(inner, 0, len(inner))
            if shapes is not None:
                return place(shapes)
        # not the usual shape: token by token, with the errors
        return layout([self.param(chunk, i, pos, what) for i, chunk in enumerate(inner.split(","))])

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
                val = self.number(toks[i + 1], ".align", pos)
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
                    count = self.number(toks[i + 1], "array size", pos)
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
        if not text or text.isspace():
            return _NO_DIRECTIVES
        known = self._directives.get(text)  # kernels of one shape repeat their directives word for word
        if known is not None:
            return known
        kw: dict = {}
        for d in _DIRECTIVE.finditer(text):
            word, nums = d.group(1), d.group(2)
            if word is None:
                raise self.error(f"unexpected {d.group()[:30]!r} before the body of {what}", pos)
            vals = tuple(self.number(x.strip(), f".{word}", pos) for x in nums.split(",")) if nums else ()
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
        self._directives[text] = d = _directives(**kw)
        return d

    def head(self, start: tuple[str, int, bool] | None) -> tuple[list, int, int] | None:
        """The rest of a declaration's head of the usual shape (see ``_NEXT_DECL``), given
        ``start``: its name, where the text after the name (and its '(', if any) starts, and
        whether there was a '('. Returns (the parameters as ``place`` takes them, where the
        directives start, where the '{' or ';' ending it is), or None for a head of any other
        shape."""
        if start is None:
            return None
        v = self.v
        _, p, paren = start
        shapes: list | None = []
        if paren:
            close = v.find(")", p)
            if close != p:  # (else no parameters)
                shapes = None if close == -1 else _param_shapes(v, p, close)
                if shapes is None:
                    self._unusual = p
                    return None
            p = close + 1
        r = _HEAD_REST.match(v, p)
        return None if r is None else (shapes, p, r.end() - 1)

    def entry(self, pos: int, linkage: str | None, start: tuple[str, int, bool] | None) -> tuple[KernelInfo, int]:
        h = self.head(start)
        if h is not None:
            name = start[0]
            shapes, p, hend = h
            sig = place(shapes) if shapes else _NO_PARAMS
            rest = self.v[p:hend]
            d = _NO_DIRECTIVES if not rest or rest.isspace() else self.directives(rest, p, f"kernel {name!r}")
            defined = self.v[hend] == "{"
        else:
            h, hend, defined = self.declaration(pos, "'.entry'")
            n = _NAME.match(h)
            if not n:
                raise self.error("expected a name after .entry", pos)
            name, p = n.group(1), n.end()
            what = f"kernel {name!r}"
            inner, p = self.paren_list(h, p, pos, what)
            sig = self.params(inner, pos + p, what) if inner else _NO_PARAMS
            rest = h[p:]
            d = _NO_DIRECTIVES if not rest or rest.isspace() else self.directives(
                _PRAGMA.sub("", rest) if ".pragma" in rest else rest, pos + p, what)
        gdc: tuple[str, ...] = ()
        if defined:
            close = (self._braces if self._braces is not None else self.braces()).get(hend)
            end = close + 1 if close is not None else self.match_brace(hend, f"kernel {name!r}")
            if self.has_griddep:
                gdc = self.griddep(hend, end)
            self._bodies.append((len(self._bodies), hend, end))
        else:
            end = hend + 1
            self._bodies.append((len(self._bodies), None, None))
        return _kernel(name=name, signature=sig, directives=d, linkage=linkage, griddepcontrol=gdc), end

    def called_griddep(self, entries: list[KernelInfo], funcs: list[FuncInfo]) -> list[KernelInfo]:
        """Kernels also run the griddepcontrol instructions of the functions they call
        (directly: compilers inline what they can, and Triton's and CUDA's wrappers are inline)."""
        gdc = {f.name: f.griddepcontrol for f in funcs if f.griddepcontrol}
        if not gdc:
            return entries
        out = list(entries)
        for i, a, b in self._bodies:
            if a is None:
                continue
            found = set(out[i].griddepcontrol)
            for m in self.code_matches(_CALL, a, b):
                found.update(gdc.get(m.group(1), ()))
            if found != set(out[i].griddepcontrol):
                out[i] = replace(out[i], griddepcontrol=tuple(sorted(found, key=_GRIDDEP_ORDER)))
        return out

    def griddep(self, a: int, b: int) -> tuple[str, ...]:
        """The griddepcontrol instructions in code between ``a`` and ``b`` (a body)."""
        if not self.has_griddep or self.v.find("griddepcontrol", a, b) == -1:  # the common case: no regex
            return ()
        found = {m.group(1) for m in self.code_matches(_GRIDDEP, a, b)}
        return tuple(sorted(found, key=_GRIDDEP_ORDER))

    def func(self, pos: int, linkage: str | None, start: tuple[str, int, bool] | None) -> tuple[FuncInfo, int]:
        h = self.head(start)
        if h is not None:
            name = start[0]
            _, p, hend = h
            v = self.v
            rest = v[p:hend]
            d = _NO_DIRECTIVES if not rest or rest.isspace() else self.directives(rest, p, f"function {name!r}")
            defined = v[hend] == "{"
        else:
            h, hend, defined = self.declaration(pos, "'.func'")
            _, p = self.paren_list(h, 0, pos, ".func return list")
            name, p = self.name_at(h, p, pos, ".func")
            what = f"function {name!r}"
            inner, p = self.paren_list(h, p, pos, what)
            self.params(inner or "", pos + p, what)
            d = self.directives(_PRAGMA.sub("", h[p:]), pos + p, what)
        end = hend + 1
        if defined:
            close = (self._braces if self._braces is not None else self.braces()).get(hend)
            end = close + 1 if close is not None else self.match_brace(hend, f"function {name!r}")
        gdc = self.griddep(hend, end) if defined and self.has_griddep else ()
        return _function(name=name, linkage=linkage, defined=defined, noreturn=d.noreturn, griddepcontrol=gdc), end

    def variables(self, g: str, off: int):
        """The variables declared in module-scope text ``g`` (at ``off`` in the text): each
        runs from its ``.global``/``.const``/``.shared`` to the next ';', with no other one
        in between."""
        pos = 0
        while True:
            start = _VAR_START.search(g, pos)
            if start is None:
                return
            semi = g.find(";", start.end())
            if semi == -1 or _VAR_START.search(g, start.end(), semi) is not None:
                raise self.error(f"malformed {start.group()} declaration (no ';' ends it)", off + start.start())
            pos = semi + 1
            yield self.variable(start.group()[1:], start.start(), start.end(), semi, g, off)

    def variable(self, space: str, at: int, a: int, b: int, g: str, off: int) -> GlobalVar:
        """The variable declared at ``at`` in ``g``: ``space`` (``g[at:a]``), then ``g[a:b]``
        (up to its ';')."""
        lk = _trailing_linkage(g, max(0, at - 64), at)
        linkage = lk.split()[-1][1:] if lk.strip() else None
        u = _VAR_USUAL.match(g, a, b)
        if u is not None and u.group(2) in SCALAR_TYPES:  # the usual shape: read by one pattern
            align, typ, name, bracket, count, init = u.groups()
            elem = SCALAR_TYPES[typ]
            return _variable(name=name, space=space, type=typ,
                             size=(elem * int(count) if count else None) if bracket else elem,
                             align=(int(align) if align else 0) or elem, linkage=linkage, initialized=init is not None)
        pos = off + at
        toks = _VARTOK.findall(g, a, b)
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
                align = self.number(toks[i + 1], ".align", pos)
                i += 2
                continue
            if tk.startswith("."):
                if tk[1:] in SCALAR_TYPES:
                    typ = tk[1:]
            elif tk == "[":
                if i + 1 < len(toks) and toks[i + 1].isdigit():
                    dims.append(self.number(toks[i + 1], "array size", pos))
                    i += 3
                    continue
                dims.append(None)
                i += 2
                continue
            elif name is None and not tk.isdigit():
                name = tk
            i += 1
        if typ is None or name is None or not _IDENT.fullmatch(name):
            raise self.error(f"malformed .{space} variable declaration", pos)
        elem = SCALAR_TYPES[typ]
        size: int | None = elem
        for n in dims:
            size = None if (n is None or size is None) else size * n
        return _variable(name=name, space=space, type=typ, size=size, align=align or elem, linkage=linkage,
                         initialized=init)

    def number(self, digits: str, what: str, pos: int) -> int:
        """A decimal number of the text, bounded (Python's int() refuses > 4300 digits)."""
        if len(digits) > _MAX_DIGITS:
            raise self.error(f"{what} {digits[:12]}... has {len(digits)} digits: not a number PTX can hold", pos)
        return int(digits)


def _positions(text: str, ch: str) -> list[int]:
    """Every index of ``ch`` in ``text`` (str.find is far faster than a regex scan)."""
    out = []
    i = text.find(ch)
    while i != -1:
        out.append(i)
        i = text.find(ch, i + 1)
    return out


@functools.lru_cache(maxsize=512)
def _param_shape(prefix: str, dims: str):
    """A parameter as ``_PARAM_ITEM`` matched it (the text before its name, its array size) ->
    what ``_Parser.param`` makes of it after the name, as ``_signature_build.param_shape`` (for
    ``place``); None for an unknown type or an alignment that is no power of two (errors
    ``param`` reports)."""
    align, typ, ptr, space, palign = _PARAM_PREFIX.fullmatch(prefix).groups()
    a = int(align) if align else None
    pa = int(palign) if palign else None
    if (a is not None and (a <= 0 or a & (a - 1))) or (pa is not None and (pa <= 0 or pa & (pa - 1))) or \
            typ not in SCALAR_TYPES:
        return None
    count = (int(dims[1:-1]) if dims[1:-1].strip() else 0) if dims else None
    return param_shape(typ, SCALAR_TYPES[typ], count, bool(ptr), space, a, pa)


def _param_shapes(text: str, a: int, b: int) -> list | None:
    """The parameters between ``a`` and ``b`` (a parenthesised list's contents) as ``(name,
    shape)`` pairs for ``place``, where every one has the usual shape (``_PARAM_ITEM``); else
    None."""
    items = _PARAM_ITEM.findall(text, a, b)
    if len(items) != text.count(",", a, b) + 1 or text.find("(", a, b) != -1:  # an item in each ','-slot, or not
        return [] if not items and (a == b or text[a:b].isspace()) else None
    out = []
    for prefix, name, dims in items:
        # (the cache keeps what compilers write, not whatever white space a text holds)
        shape = _param_shape(prefix, dims) if len(prefix) + len(dims) < 200 else _param_shape.__wrapped__(prefix, dims)
        if shape is None:
            return None
        out.append((name, shape))
    return out


def _merge_functions(funcs: list[FuncInfo]) -> list[FuncInfo]:
    """One FuncInfo per name: a function declared before it is defined is listed once,
    defined, with the definition's linkage."""
    by_name: dict[str, FuncInfo] = {}
    for f in funcs:
        have = by_name.get(f.name)
        if have is None or (f.defined and not have.defined):
            by_name[f.name] = f if have is None else _function(
                name=f.name, linkage=f.linkage or have.linkage, defined=True, noreturn=f.noreturn or have.noreturn,
                griddepcontrol=f.griddepcontrol)
    return list(by_name.values())


def _trailing_linkage(g: str, lo: int = 0, hi: int | None = None) -> str:
    """The run of linkage directives (``.visible .weak .extern .common``, each followed by
    white space) that ``g[lo:hi]`` ends with, walked back from the end: linear in its length."""
    hi = len(g) if hi is None else hi
    lo2 = max(lo, hi - 40)
    tail = g[lo2:hi]
    run = tail.rstrip()
    if len(run) == len(tail) or not run.endswith(_LINKAGE_WORDS):  # the usual cases: none, or one word
        return ""
    before = run[:run.rindex(".")]
    if before and not before.rstrip().endswith(_LINKAGE_WORDS):
        return tail[len(before):]
    m = _LINKAGE_TAIL.search(g, lo2, hi)
    if m is None or m.start() > lo2:  # the usual case: a short run, whole in the window
        return g[m.start():hi] if m else ""
    i = start = hi
    while True:
        j = i
        while j > lo and g[j - 1] in " \t\r\n":
            j -= 1
        if j == i:
            break
        word = next((w for w in _LINKAGE_WORDS if g.endswith(w, lo, j)), None)
        if word is None:
            break
        i = start = j - len(word)
    return g[start:hi]


def _metadata(meta: list[tuple[str, str, int, int]], number) -> dict:
    """The metadata comments as key -> value (whole numbers as ints); a ``// meta:`` value
    wins over an older ``// TRITON_...:`` comment. What they mean, and the defaults where
    they say nothing, are Triton's business (``nbjit.loading.triton``)."""
    found: dict[str, object] = {}
    legacy: dict[str, object] = {}
    for key, raw, is_legacy, pos in meta:
        val: object = raw
        if re.fullmatch(r"-?\d+", raw):
            val = number(raw.lstrip("-"), f"metadata {key}", pos) * (-1 if raw.startswith("-") else 1)
        (legacy if is_legacy else found)[key] = val
    return {**legacy, **found}


# --------------------------------------------------------------------------- rewriting

# One pass over the text removes whole debug lines: each alternative starts right after a
# line break. A .section .debug_* block runs from its header through '{' (maybe on the next
# line) to the closing '}'; its body never holds braces, but its '//' comments may.
# Each '//' comment runs to its line break ((?=\n) forbids stopping early), which keeps the
# pattern unambiguous: linear even on a truncated section with no closing brace.
_SECTION_BLOCK = (r"\.section[ \t]+\.debug\w*[^\n{/]*(?://[^\n]*(?=\n))?\s*\{"
                  r"(?:[^}/.]|\.(?!section\b)|/(?!/)|//[^\n]*(?=\n))*\}[ \t]*(?://[^\n]*|\r)?")
# each from the newline before it, and (the first of each pair) at the start of the text. Two
# patterns, not one beginning (?:\n|\A): a literal first character lets the regex engine skip
# to each newline at C speed instead of trying a match at every character (4-10x slower).
_LINE_INFO_TEXT = r"[ \t]*\.(?:loc|file)\b[^\n]*"
_DWARF_TEXT = r"[ \t]*(?:@@DWARF[^\n]*|" + _SECTION_BLOCK + ")"
_LINE_INFO = (re.compile(_LINE_INFO_TEXT), re.compile("\n" + _LINE_INFO_TEXT))
_DWARF_ONLY = (re.compile(_DWARF_TEXT), re.compile("\n" + _DWARF_TEXT))
_DWARF_LINE_AT = re.compile(r"\n[ \t]*@@DWARF[^\n]*")  # (what _DWARF_ONLY's second finds at an @@DWARF line)
_LOC_TAIL = re.compile(r"(\.loc[ \t]+\d+[ \t]+\d+[ \t]+\d+)[ \t]*,[ \t]*function_name[^\n/]*?"
                       r"(?=[ \t]*(?://|\r?\n|$))")
_TARGET_DEBUG = re.compile(r"([ \t]*\.target[ \t]+[^\n]*?)(?:[ \t]*,[ \t]*debug\b|\bdebug[ \t]*,[ \t]*)")


def strip_debug(text: str | bytes, keep_lineinfo: bool = False) -> str:
    """Remove debug information that keeps the driver's JIT from accepting or optimising PTX.

    Removes the DWARF ``.section .debug_*`` blocks (and the relocations in them),
    ``@@DWARF`` lines and ``debug`` from ``.target``; ``.file``/``.loc`` too unless
    ``keep_lineinfo`` (then only the ``function_name``/``inlined_at`` tails of ``.loc``,
    which point into the removed ``.debug_str``). Every other byte is left alone.
    """
    text = _as_text(text, None, "strip_debug removes debug information from PTX text (for a cubin or fatbin "
                                "without it, build without -G and -lineinfo)")
    if _block_comment(text):  # decide on a view with comments blanked (same offsets), cut the text
        cuts, uncut = _strip_cuts(_blank_text(text), keep_lineinfo)
        out = _cut(text, cuts)
        view = _blank_text(out) if uncut else out
    else:
        out, uncut = _strip_plain(text, keep_lineinfo)
        view = out
    left = uncut and _line_led(view, _SECTION_WORD, _DEBUG_SECTION_AT, ";{}")
    if left:  # a header without its body, or a body holding another .section: not PTX ptxas takes
        raise PtxParseError(f"cannot strip debug section {left.group(1)}: its '{{ ... }}' body is missing or "
                            "holds another .section", line=_line(view, left.start(1)))
    return out


def _strip_plain(text: str, keep_lineinfo: bool) -> tuple[str, bool]:
    """strip_debug of text without block comments (what compilers write): the cuts of
    ``_strip_cuts``, with the lines of line information (one every few lines of compiler
    output) removed by the regex engine's own substitution between the other cuts. Returns
    the text and whether a '.section' of it is in no cut (``_dwarf_cuts``)."""
    cuts, uncut = _dwarf_cuts(text)
    if keep_lineinfo:
        out = _cut(text, cuts)
        return (_LOC_TAIL.sub(r"\1", out) if "function_name" in out else out), uncut
    first, rest = _LINE_INFO
    m = first.match(text)  # a first line is line information too
    if m:
        cuts.insert(0, (0, m.end(), ""))
    parts, pos = [], 0
    for a, b, keep in cuts:
        parts += (rest.sub("", text[pos:a]), keep)
        pos = b
    parts.append(rest.sub("", text[pos:]))
    return "".join(parts), uncut


def _strip_cuts(view: str, keep_lineinfo: bool) -> tuple[list[tuple[int, int, str]], bool]:
    """(start, end, replacement) of everything stripping removes, decided on ``view``: the
    DWARF cuts, and line information in the text between them; and whether a '.section' of
    the view is in no DWARF cut."""
    cuts, uncut = _dwarf_cuts(view)
    if keep_lineinfo and "function_name" not in view:
        return cuts, uncut
    first, rest = _LINE_INFO
    m = None if keep_lineinfo else first.match(view)
    more = [(0, m.end(), "")] if m else []
    pos = 0
    for a, b, _ in [*cuts, (len(view), len(view), "")]:
        if keep_lineinfo:
            more += [(x.end(1), x.end(), "") for x in _LOC_TAIL.finditer(view, pos, a)]
        else:
            more += [(x.start(), x.end(), "") for x in rest.finditer(view, max(pos, m.end() if m else 0), a)]
        pos = b
    return sorted(cuts + more), uncut


def _dwarf_cuts(view: str) -> tuple[list[tuple[int, int, str]], bool]:
    """(start, end, replacement) of the DWARF sections, @@DWARF lines and the .target's
    ``debug``, in order: what ``_DWARF_ONLY`` finds from the start (a first line, then each
    from its newline), the sections among them found through the literal '.section' (the
    pattern tried at every newline took a third of stripping Triton PTX; where a text holds
    many, that pattern's own search again). And whether a '.section' of the view may be in no
    cut (stripping may leave it: strip_debug looks)."""
    first, rest = _DWARF_ONLY
    m = first.match(view)  # a first line is debug information too
    cuts = [(0, m.end(), _line_cut(m))] if m else []
    start = pos = m.end() if m else 0
    uncut = False
    for n, w in enumerate(_SECTION_WORD.finditer(view, pos)):
        if n == _RARE:  # many: the pattern itself is faster through them
            cuts = cuts[:1] if m else []
            cuts += [(x.start(), x.end(), _line_cut(x)) for x in rest.finditer(view, start)]
            return _target_cut(view, cuts), True
        i = w.start()
        if i < pos:  # inside the section cut before it
            continue
        j = i
        while j > pos and view[j - 1] in " \t":
            j -= 1
        x = rest.match(view, j - 1) if j > pos and view[j - 1] == "\n" else None  # a line-led section
        if x is None:
            uncut = True
            continue
        cuts.append((x.start(), x.end(), _line_cut(x)))
        pos = x.end()
    if "@@DWARF" in view:  # legacy DWARF lines (rare), but those inside a section cut
        starts = [a for a, _, _ in cuts]
        for x in _DWARF_LINE_AT.finditer(view, start):
            k = bisect.bisect_right(starts, x.start()) - 1
            if k < 0 or cuts[k][1] <= x.start():
                cuts.append((x.start(), x.end(), _line_cut(x)))
        cuts.sort()
    return _target_cut(view, cuts), uncut


def _target_cut(view: str, cuts: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """``cuts`` with the cut of ``debug`` from the .target line, if any, in order."""
    t = _line_led(view, _TARGET_WORD, _TARGET_AT)
    if t is not None:
        b = view.find("\n", t.start())
        x = _TARGET_DEBUG.match(view, t.start(), len(view) if b == -1 else b)
        if x:
            cuts.append((x.end(1), x.end(), ""))
            cuts.sort()
    return cuts


def _cut(text: str, cuts: list[tuple[int, int, str]]) -> str:
    out = []
    pos = 0
    for a, b, keep in cuts:
        out.append(text[pos:a])
        out.append(keep)
        pos = b
    out.append(text[pos:])
    return "".join(out)


def _line_led(text: str, word: re.Pattern, rx: re.Pattern, after: str = "") -> "re.Match | None":
    """The first match of ``rx`` at an occurrence of ``word`` that starts its line, or that
    follows one of ``after`` (spaces and tabs between) - what ``(?:^|[after])[ \\t]*rx``
    with re.M finds, found through ``word``'s literal search."""
    for m in word.finditer(text):
        j = i = m.start()
        while j and text[j - 1] in " \t":
            j -= 1
        if j == 0 or text[j - 1] == "\n" or text[j - 1] in after:
            x = rx.match(text, i)
            if x:
                return x
    return None


def _line_cut(m: re.Match) -> str:
    """What replaces a removed debug line or section (the newline before it included): nothing,
    or a newline where the section's closing brace has more text after it on its line."""
    s, e = m.string, m.end()
    return "" if e >= len(s) or s[e] in "\r\n" else "\n"


# rare words the patterns above begin with: literals, which the regex engine searches for at C speed
_SECTION_WORD = re.compile(r"\.section")
_TARGET_WORD = re.compile(r"\.target")
_TARGET_AT = re.compile(r"\.target\b")
# a debug section header that stripping left (not in a line comment: at a line's start or after ; { })
_DEBUG_SECTION_AT = re.compile(r"\.section[ \t]+(\.debug\w*)")


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
