"""Precompiled headers for NVRTC (12.8+): which compiles get one, what names one, where its
file lives, and what NVRTC says about it. Plain data and files; ``nvrtc.py`` runs NVRTC.

NVRTC 13.5's PCH file is an image of its PCH heap, valid only in the process (the NVRTC
library instance, at that heap address) that made it and only until that heap is resized:
another process (address-space randomisation puts its heap elsewhere) gets warning
#20282-D and compiles everything itself. So a PCH is kept per process: made by its first
compile of a set of headers, used by every later compile of the same headers there, in
``<cache>/pch/`` under the maker's process id, removed when that process exits (or, when it
was killed, by the next ``prune``/``clear`` of the cache, which sees that the process is gone)."""
from __future__ import annotations

import atexit
import os
import re
import threading

from nbjit.cache.entries import PCH_DIR
from nbjit.errors import NbjitCompileError

__all__ = ["PCH_ENV", "pch_mode", "header_prefix", "worth_it", "pch_options", "Store", "clean_log"]

PCH_ENV = "NBJIT_PCH"
PCH_SUFFIX = ".pch"
# headers known to take NVRTC long (CCCL: CUB, Thrust, libcu++ and its nv/ target macros;
# cooperative groups; CUTLASS/CuTe), and how much text from the user's include directories
# makes a prefix worth a PCH on its own (a few hundred KB of templates is seconds of NVRTC)
HEAVY_HEADERS = re.compile(r"(cub|thrust|cuda|nv|cutlass|cute)/|cooperative_groups")
HEAVY_USER_BYTES = 256 << 10
# NVRTC's PCH heap: the size set before the first PCH (NVRTC's default, 256 MiB, is too small
# for CUB's block algorithms: 317 MiB); where a PCH needs more, what it needs plus a quarter
HEAP_BYTES = 512 << 20
HEAP_ALIGN = 64 << 20

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def check_arg(pch: object) -> None:
    """Refuse a ``pch`` argument that ``pch_mode`` refuses, at the cost of a few identity
    tests for the usual ones (before a call's memo finds what it made: ``pch=3`` was let by)."""
    if not (pch is None or pch is True or pch is False or (type(pch) is str and pch == "auto")):
        pch_mode(pch)


def pch_mode(pch: object) -> str:
    """``"auto"`` (heavy headers only), ``"on"`` (any source that includes headers) or
    ``"off"`` for a ``pch`` argument: None follows ``NBJIT_PCH`` (unset: auto)."""
    if pch is None:
        raw = os.environ.get(PCH_ENV, "").strip().lower()
        if raw in ("", "auto"):
            return "auto"
        if raw in _ON:
            return "on"
        if raw in _OFF:
            return "off"
        raise NbjitCompileError(f"{PCH_ENV}={raw!r} is not a PCH setting: 0 (off), 1 (on) or auto (for sources that "
                                "include large headers, the default)")
    if pch is True or pch is False:
        return "on" if pch else "off"
    if pch == "auto":
        return "auto"
    raise NbjitCompileError(f"pch must be True, False, 'auto' or None (NBJIT_PCH decides), not {pch!r}")


_DIRECTIVE_CONT = re.compile(r"\\\s*$")


def header_prefix(source: str) -> str:
    """The source's initial sequence of preprocessing directives (with the blank lines and
    comments among them): the part NVRTC precompiles, which ends before the first line that
    holds code. Two sources with the same prefix can share a PCH (NVRTC checks it too)."""
    lines = source.splitlines(keepends=True)
    end, i, in_comment, continued = 0, 0, False, False
    while i < len(lines):
        text = lines[i]
        s = text.strip()
        if continued:
            continued = bool(_DIRECTIVE_CONT.search(text))
        elif in_comment:
            if "*/" in s:
                in_comment = False
                if s.split("*/", 1)[1].strip():  # code after the comment: the prefix ends here
                    break
        elif not s or s.startswith("//"):
            pass
        elif s.startswith("/*"):
            rest = s[2:]
            if "*/" in rest:
                if rest.split("*/", 1)[1].strip():
                    break
            else:
                in_comment = True
        elif s.startswith("#"):
            continued = bool(_DIRECTIVE_CONT.search(text))
        else:
            break
        i += 1
        if not in_comment and not continued:
            end = i
    return "".join(lines[:end])


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\n]+)[>"]', re.M)


def includes(prefix: str) -> list[str]:
    """The headers a prefix ``#include``s, as written."""
    return _INCLUDE.findall(prefix)


def worth_it(mode: str, prefix: str, user_bytes: int) -> bool:
    """Whether a compile should make or use a PCH: never "off"; "on" for any prefix that
    includes a header; "auto" where one of them is a heavy library header (CCCL, cooperative
    groups, CUTLASS) or the user's headers it reaches hold ``HEAVY_USER_BYTES`` or more."""
    if mode == "off":
        return False
    names = includes(prefix)
    if not names:
        return False  # nothing to precompile
    return mode == "on" or any(HEAVY_HEADERS.match(n) for n in names) or user_bytes >= HEAVY_USER_BYTES


# options NVRTC does not compare when it takes a PCH (13.0, 13.5: a PCH made without them, or with
# another value, is used, and the cubin is the one the same options make without a PCH; the
# tests check both): they act after the front end (NVVM, ptxas) or only time it. The PCH's key
# leaves them out, so that a new register limit or ptxas option is a warm compile too.
_BACK_END = re.compile(r"--?(maxrregcount|extra-device-vectorization|split-compile|ptxas-options|Xptxas|time)(=|$)")
_TAKES_NEXT = ("-maxrregcount", "--maxrregcount", "-Xptxas", "--ptxas-options", "-ptxas-options", "-split-compile",
               "--split-compile", "-time", "--time")  # (spelt without '=': the value is the next item)


def pch_options(options) -> list[str]:
    """The options a PCH depends on: ``options`` without the back-end ones NVRTC does not
    compare for a PCH (``-maxrregcount``, ``-Xptxas``/``--ptxas-options``,
    ``--extra-device-vectorization``, ``-split-compile``, ``-time``)."""
    out, skip = [], False
    for o in options:
        if skip:
            skip = False
        elif _BACK_END.match(o):
            skip = o in _TAKES_NEXT
        else:
            out.append(o)
    return out


def user_pch_option(options) -> bool:
    """Whether the user's own options already ask NVRTC for PCH work (then nbjit adds none)."""
    return any(re.match(r"--?(pch|create-pch|use-pch|pch-dir)\b", o) for o in options)


def heap_for(required: int) -> int:
    """The PCH heap size to set for a PCH that needs ``required`` bytes."""
    want = required + required // 4
    return -(-want // HEAP_ALIGN) * HEAP_ALIGN


# ------------------------------------------------------------------ NVRTC's PCH log lines

_MESSAGE = re.compile(r'^"[^"\n]*": (creating|using) precompiled header file "([^"\n]*)"\s*$', re.M)
# #629 options differ, #630 the initial directives differ, #20282 another heap (another
# process, or resized since), #639 the heap is too small to make it: nbjit's business, not
# the user's; each is followed by NVRTC's "suppress" remark
_OURS = re.compile(r"#(629|630|20282|639)-D\b")
_REMARK = re.compile(r'^Remark: The warnings can be suppressed with[^\n]*$', re.M)


def clean_log(log: str) -> tuple[str, dict]:
    """NVRTC's log without its PCH messages and warnings (so that it reads as the same
    compile without a PCH), and what they said: {"created": path, "used": path, "refused":
    warning numbers}."""
    said: dict = {"refused": []}
    for verb, path in _MESSAGE.findall(log):
        said["created" if verb == "creating" else "used"] = path
    log = _MESSAGE.sub("", log)
    kept = []
    for part in re.split(r"\n\s*\n", log):
        m = _OURS.search(part)
        if m:
            said["refused"].append(int(m.group(1)))
        elif part.strip():
            kept.append(part.strip("\n"))
    if said["refused"] and not any(re.search(r"\bwarning\b", p, re.I) for p in kept if not _REMARK.match(p.strip())):
        kept = [p for p in kept if not _REMARK.fullmatch(p.strip())]  # the remark was for ours alone
    return "\n\n".join(kept).strip(), said


# ------------------------------------------------------------------ this process's PCH files


class Store:
    """This process's PCH files: key -> file, for the heap they were made in. ``lock`` is
    held around every compile that makes or uses one, and around heap changes (the heap is
    one per process)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.files: dict[str, str] = {}
        self.seen: set[str] = set()  # keys "auto" compiled once without a PCH (the second makes one)
        self.generation = 0  # bumped when the heap is resized: every PCH made before is void
        self.heap_set = False
        self.stats = {"created": 0, "used": 0, "refused": 0, "heap_resized": 0}
        self._tmpdir: str | None = None
        atexit.register(self.forget_all)

    def path_for(self, key: str, cache_dir: str | None) -> str:
        """Where this process writes the PCH for ``key``: the cache's ``pch/`` directory, or a
        private temporary directory for a cache without one."""
        if cache_dir is not None:
            d = os.path.join(cache_dir, PCH_DIR)
            try:
                os.makedirs(d, exist_ok=True)
            except OSError:
                d = None
        else:
            d = None
        if d is None:
            if self._tmpdir is None:
                import tempfile  # (only for a cache without a directory)
                self._tmpdir = tempfile.mkdtemp(prefix=f"nbjit-pch-{os.getpid()}-")
            d = self._tmpdir
        return os.path.join(d, f"{os.getpid()}-{self.generation}-{key[:32]}{PCH_SUFFIX}")

    def get(self, key: str) -> str | None:
        """The usable PCH file for ``key`` in this process, or None."""
        f = self.files.get(key)
        if f is not None and not os.path.isfile(f):  # removed under us (a cache clear): make it again
            del self.files[key]
            return None
        return f

    def add(self, key: str, path: str) -> None:
        self.files[key] = path
        self.stats["created"] += 1

    def forget(self, key: str) -> None:
        f = self.files.pop(key, None)
        if f is not None:
            _remove(f)

    def forget_all(self) -> None:
        """Drop every PCH of this process (at exit; when the heap is resized they are void)."""
        for k in list(self.files):
            self.forget(k)
        if self._tmpdir is not None:
            try:
                os.rmdir(self._tmpdir)
            except OSError:
                pass

    def resized(self) -> None:
        """The heap was resized: every PCH made so far is void."""
        self.forget_all()
        self.generation += 1
        self.stats["heap_resized"] += 1


def _remove(f: str) -> None:
    try:
        os.unlink(f)
    except OSError:
        pass


STORE = Store()
