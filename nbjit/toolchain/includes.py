"""Which files NVRTC reads for a source: its ``#include`` directives followed as NVRTC
follows them, so that the compile cache's key holds every file that decides the output.

NVRTC (13.x; checked by tests/test_includes.py against NVRTC itself) looks for a header
named ``S`` in this order:

- an in-memory header (``headers=``) whose name is ``S`` as written, for any include;
- ``S`` itself where it is an absolute path;
- for ``#include "S"``: the directory of the file that includes it (the source's: the
  directory part of its name, the working directory for ``kernel.cu``; an in-memory
  header's: the directory part of its name), then each ``-I`` directory in order;
- for ``#include <S>``: each ``-I`` directory in order;
- for ``--pre-include=S`` (``-include=S``): the working directory, then each ``-I`` directory.

The walk reads the first file found for each include and follows its own includes. A file
found in CUDA's or CCCL's directories is named by the toolchain's identity instead, and is
not followed. Conditionals are not evaluated: a file behind ``#if 0`` is still read (the
key may change where the output does not, never the other way). An include whose file
cannot be named from the text (``#include MACRO``) makes the walk ``unknown``: such a
compile is not cached.
"""
from __future__ import annotations

import os
import re
from typing import Iterable, Mapping

from nbjit.errors import NbjitCompileError
from nbjit.read.image import content_digest
from nbjit.files import read_regular
from nbjit.records import record

__all__ = ["IncludeWalk", "MAX_INCLUDED_BYTES", "MAX_INCLUDED_FILES", "pre_includes", "walk_includes"]

# what the walk reads at most (a header including itself under thousands of spellings once
# drove an earlier walk to 1.9 GiB)
MAX_INCLUDED_FILES = 4096
MAX_INCLUDED_BYTES = 256 << 20

# comments (replaced by a space, as the preprocessor does) and the literals they may not start in
_COMMENT_OR_LITERAL = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?(?:\*/|\Z)', re.S)
# a directive that names a file: #include, #include_next, #import; and __has_include(...)
_DIRECTIVE = re.compile(r'^[ \t]*#[ \t]*(include_next|include|import)\b[ \t]*(.*)$', re.M)
_HAS_INCLUDE = re.compile(r'\b__has_include(_next)?[ \t]*\([ \t]*(.*)$', re.M)
_NAMED = re.compile(r'"([^"\n]+)"|<([^>\n]+)>')


@record
class IncludeWalk:
    """What the walk found.

    files: (path as NVRTC opens it, content digest) of each file read, sorted.
    reaches_disk: whether any include was looked for outside the toolchain's directories (a
        file there may appear, change or go between two calls with the same arguments).
    unknown: the first include whose file cannot be named from the text, or None.
    size: bytes read.
    found_in: (path as NVRTC opens it, a directory NVRTC finds it through) for each way a file
        is reached: the ``-I`` directory it was looked for in, or the one its including file
        was found through (for the source, its own directory); "" for an in-memory header's
        includes. (The walk is not in NVRTC's order: a file reached two ways is listed twice.)
    """

    files: tuple[tuple[str, str], ...] = ()
    reaches_disk: bool = False
    unknown: str | None = None
    size: int = 0
    found_in: tuple[tuple[str, str], ...] = ()

    @property
    def repeatable(self) -> bool:
        """Whether a call with the same arguments reads the same files (none outside the
        toolchain's directories, none unknown): its result may be remembered by the call."""
        return not self.reaches_disk and self.unknown is None


def pre_includes(options: Iterable[str]) -> list[str]:
    """The headers ``--pre-include=S`` / ``-include=S`` options name, in order."""
    out = []
    for o in options:
        for flag in ("--pre-include=", "-include="):
            if o.startswith(flag):
                out.append(o[len(flag):])
    return out


def _directives(text: str) -> list[tuple[str, str]]:
    """(kind, what follows it) for each file-naming directive in ``text``: kind is
    ``include``, ``include_next``, ``import`` or ``has_include``."""
    text = text.replace("\\\r\n", "").replace("\\\n", "")  # line splices, before anything else
    if "/" in text:
        text = _COMMENT_OR_LITERAL.sub(lambda m: " " if m[0][0] == "/" else m[0], text)
    found = [(m[1], m[2]) for m in _DIRECTIVE.finditer(text)]
    if "__has_include" in text:
        found += [("include_next" if m[1] else "has_include", m[2]) for m in _HAS_INCLUDE.finditer(text)]
    return found


class _Walk:
    """One walk's state: the search directories, what was read, the limits."""

    def __init__(self, headers: Mapping[str, str], user_dirs: list[str], toolchain_dirs: list[str], name: str):
        self.headers, self.name = headers, name
        self.dirs = [(d, False) for d in user_dirs] + [(d, True) for d in toolchain_dirs]
        self.read: dict[str, str] = {}  # path as opened -> digest
        self.real: dict[str, str] = {}  # resolved path -> digest (one read per file, however spelled)
        self.found_in: set[tuple[str, str]] = set()  # (path as opened, a directory it was found through)
        self.todo: list[tuple[str, str, str]] = []  # (text, its directory, the directory it was found through)
        self.reaches_disk = False
        self.unknown: str | None = None
        self.size = 0

    def candidates(self, quoted: bool, spelled: str, here: str, base: str) -> list[tuple[str, bool, str]]:
        """(path, whether it is in the toolchain's directories, the directory it is found
        through) in NVRTC's search order."""
        if os.path.isabs(spelled):
            return [(spelled, False, "")]
        dirs = [(os.path.join(d, spelled), ours, d) for d, ours in self.dirs]
        return [(os.path.join(here, spelled), False, base), *dirs] if quoted else dirs

    def include(self, kind: str, rest: str, here: str, base: str = "") -> None:
        """Follow one directive from a file in directory ``here``, found through ``base``."""
        m = _NAMED.match(rest.strip())
        if m is None:
            if self.unknown is None:
                self.unknown = f"#{kind} {rest.strip()[:80]}".replace("#has_include", "__has_include")
            return
        spelled, quoted = (m[1], True) if m[1] is not None else (m[2], False)
        if spelled in self.headers:  # (an in-memory header, whatever else has that name)
            return
        for path, ours, through in self.candidates(quoted, spelled, here, base):
            self.reaches_disk |= not ours
            if os.path.exists(path) and not os.path.isdir(path):
                if not ours:  # (one in the toolchain's directories is named by its identity)
                    self.read_file(path, spelled, through)
                if kind != "include_next":  # (#include_next: any later one may be the one read)
                    return

    def read_file(self, path: str, spelled: str, through: str = "") -> None:
        """Read the header at ``path`` (found through the directory ``through``) once, count
        it, and queue its own includes."""
        self.found_in.add((path, through))  # (every one: NVRTC names the file through the first it meets)
        if path in self.read:
            return
        real = os.path.realpath(path)
        if real in self.real:
            self.read[path] = self.real[real]
            return
        try:
            data = read_regular(real, MAX_INCLUDED_BYTES)
        except ValueError as e:  # a FIFO, a device: NVRTC would wait on it or read it forever
            raise NbjitCompileError(f"{self.name}: #include \"{spelled}\" finds {path}, which is {e}: headers must be "
                                    "regular files") from None
        except OSError as e:
            raise NbjitCompileError(f"{self.name}: #include \"{spelled}\" finds {path}, which cannot be read "
                                    f"({e.strerror})") from None
        self.size += len(data)
        if len(self.real) >= MAX_INCLUDED_FILES or self.size > MAX_INCLUDED_BYTES:
            raise NbjitCompileError(f"{self.name}: its #includes reach more than {MAX_INCLUDED_FILES} files or "
                                    f"{MAX_INCLUDED_BYTES >> 20} MiB")
        self.read[path] = self.real[real] = content_digest(data)
        self.todo.append((data.decode(errors="replace"), os.path.dirname(path), through))


def walk_includes(source: str, name: str, headers: Mapping[str, str], user_dirs: Iterable[str],
                  toolchain_dirs: Iterable[str] = (), options: Iterable[str] = ()) -> IncludeWalk:
    """The files NVRTC reads compiling ``source`` named ``name`` with the in-memory
    ``headers``, the user's ``-I`` directories ``user_dirs`` then ``toolchain_dirs`` (CUDA's,
    CCCL's: found there, a file is not read) and the ``options`` (their ``--pre-include``).
    ``NbjitCompileError`` where a file found is a FIFO or device, or past the limits."""
    w = _Walk(headers, list(user_dirs), list(toolchain_dirs), name)
    for spelled in pre_includes(options):
        w.include("include", f'"{spelled}"', "")
    w.todo.append((source, os.path.dirname(name), os.path.dirname(name) or "."))
    w.todo += [(text, os.path.dirname(h), "") for h, text in headers.items()]
    while w.todo:
        text, here, base = w.todo.pop()
        for kind, rest in _directives(text):
            w.include(kind, rest, here, base)
    return IncludeWalk(tuple(sorted(w.read.items())), w.reaches_disk, w.unknown, w.size,
                       tuple(sorted(w.found_in)))
