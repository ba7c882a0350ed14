"""The CUDA C++ source of a kernel compiled with line information (``-lineinfo``, ``-G``),
kept with its cache entry and written where its line table points when it is loaded, so that
``cuda-gdb``, ``compute-sanitizer`` and Nsight Compute show source lines in any process.

NVRTC names the program's file in the line table as nbjit names the program. For such a
compile that name is a placeholder of fixed length: ``/nbjit-sources`` padded with slashes to
``PREFIX_BYTES``, then ``/<digest>/<file name>``, where ``<digest>`` is the first 16 hex digits
of the source's SHA-256. The placeholder is the same on every machine, so the cache entry stays
portable. A loader replaces the padded prefix with this user's directory, ``sources/`` under
the cache, padded with slashes to the same length (a path reads the same with any run of
slashes). Every offset in the image stays where it was. The source is written there under its
digest.

Headers the source includes keep the paths NVRTC read them from."""
from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Iterable, Mapping

from nbjit.files import read_regular

__all__ = ["PREFIX_BYTES", "kept_sources", "local_path", "program_name", "relocated", "sources_root",
           "wants_sources"]

MARK = "/nbjit-sources"
PREFIX_BYTES = 128  # the placeholder's prefix: MARK and slashes
_PREFIX = (MARK + "/" * (PREFIX_BYTES - len(MARK))).encode()
_LINE_INFO = frozenset({"-lineinfo", "-G"})  # (as normalize_options spells them)
_DIGEST = re.compile(r"[0-9a-f]{16}")


def wants_sources(options: Iterable[str]) -> bool:
    """Whether a compile with ``options`` (normalised) writes a line table."""
    return any(o in _LINE_INFO for o in options)


def program_name(source: str, name: str) -> str:
    """The program name NVRTC is given for ``source`` (named ``name``) compiled with line
    information: the placeholder path its line table will hold."""
    digest = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{_PREFIX.decode()}/{digest}/{os.path.basename(name) or 'kernel.cu'}"


def kept_sources(program: str, source: str) -> dict:
    """What a cache entry keeps of its source (its ``meta``): ``{"sources": {program: text}}``."""
    return {"sources": {program: source}}


def sources_root() -> str | None:
    """Where this user's sources are written: ``sources`` in the default cache's directory
    (``NBJIT_CACHE_DIR`` and the rest, as ``default_cache`` reads them), or None where the cache
    is in memory only."""
    from nbjit.cache.store import default_cache  # (deferred: a loader whose image names no source reads no cache)
    root = default_cache().path
    return None if root is None else os.path.join(os.path.abspath(str(root)), "sources")


def local_path(path: str) -> str:
    """Where a line table's file is here: a placeholder's in this user's ``sources_root()``,
    any other path as it is."""
    rest = _kept_file(path)
    root = sources_root() if rest is not None else None
    return path if root is None else os.path.join(root, rest)


def _kept_file(program: str, text: str | None = None) -> str | None:
    """``<digest>/<file name>`` of a placeholder ``program`` (the digest the text's, where
    ``text`` is given); None for anything else: a name with a directory in it, ``..``, a NUL,
    another digest (what a crafted cache entry or bundle manifest could hold)."""
    prefix = _PREFIX.decode()
    if not program.startswith(prefix):
        return None
    digest, sep, name = program[PREFIX_BYTES:].lstrip("/").partition("/")
    if not sep or not _DIGEST.fullmatch(digest) or not name or "/" in name or "\0" in name or name in (".", ".."):
        return None
    if text is not None and hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16] != digest:
        return None
    return f"{digest}/{name}"


def relocated(data: bytes, sources: Mapping[str, str], root: str | None = None) -> bytes:
    """``data`` (a cubin, PTX or fatbin) with each placeholder prefix in its line tables
    pointing at ``root`` (default ``sources_root()``), and the texts of ``sources`` (an entry's
    ``kept_sources``) written there: each under its own digest, and only where the placeholder
    is one nbjit makes for that text. ``data`` as it is where it names no placeholder, or where
    ``root`` is None or longer than the prefix (the lines then stay unresolved)."""
    if _PREFIX not in data:
        return data
    root = sources_root() if root is None else os.path.abspath(root)
    target = None if root is None else os.fsencode(root)
    if target is None or len(target) > PREFIX_BYTES:
        return data
    for program, text in sources.items():
        rest = _kept_file(program, text) if isinstance(program, str) and isinstance(text, str) else None
        if rest is not None:
            _write(root, rest, text)
    return data.replace(_PREFIX, target + b"/" * (PREFIX_BYTES - len(target)))


def _write(root: str, rest: str, text: str) -> None:
    """``text`` at ``root/rest`` where it is not there already: written whole under a name of
    its own, then renamed (a reader never sees part of it), with the mode a new file gets (the
    umask applies, as to a cache entry); never through a link that leads out of ``root``. A
    directory that cannot be written leaves it unwritten."""
    data = text.encode("utf-8", "surrogatepass")
    path = os.path.join(root, rest)
    try:
        if read_regular(path, len(data) + 1) == data:
            return
    except (OSError, ValueError):
        pass
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        real_root = os.path.realpath(root)
        if os.path.commonpath([real_root, os.path.realpath(os.path.dirname(path))]) != real_root:
            return
        tmp = os.path.join(os.path.dirname(path), f".tmp-{secrets.token_hex(8)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
