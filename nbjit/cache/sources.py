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
import tempfile
from collections.abc import Iterable, Mapping

__all__ = ["PREFIX_BYTES", "kept_sources", "local_path", "program_name", "relocated", "sources_root",
           "wants_sources"]

MARK = "/nbjit-sources"
PREFIX_BYTES = 128  # the placeholder's prefix: MARK and slashes
_PREFIX = (MARK + "/" * (PREFIX_BYTES - len(MARK))).encode()
_LINE_INFO = frozenset({"-lineinfo", "-G"})  # (as normalize_options spells them)


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
    return None if root is None else os.path.join(str(root), "sources")


def local_path(path: str) -> str:
    """Where a line table's file is here: a placeholder's in this user's ``sources_root()``,
    any other path as it is."""
    prefix = _PREFIX.decode()
    root = sources_root() if path.startswith(prefix) else None
    return path if root is None else os.path.join(root, path[PREFIX_BYTES:].lstrip("/"))


def relocated(data: bytes, sources: Mapping[str, str], root: str | None = None) -> bytes:
    """``data`` (a cubin, PTX or fatbin) with each placeholder prefix in its line tables
    pointing at ``root`` (default ``sources_root()``), and the texts of ``sources`` (an entry's
    ``kept_sources``) written there. ``data`` as it is where it names no placeholder, or where
    ``root`` is None or longer than the prefix (the lines then stay unresolved)."""
    if _PREFIX not in data:
        return data
    root = sources_root() if root is None else root
    if root is None or len(root.encode()) > PREFIX_BYTES:
        return data
    for program, text in sources.items():
        if program.startswith(_PREFIX.decode()):
            _write(os.path.join(root, program[PREFIX_BYTES:].lstrip("/")), text)
    padded = root.encode() + b"/" * (PREFIX_BYTES - len(root.encode()))
    return data.replace(_PREFIX, padded)


def _write(path: str, text: str) -> None:
    """``text`` at ``path`` where it is not there already (written whole, then renamed, so a
    reader never sees part of it); a directory that cannot be written leaves it unwritten."""
    data = text.encode("utf-8", "surrogatepass")
    try:
        with open(path, "rb") as f:
            if f.read(len(data) + 1) == data:
                return
    except OSError:
        pass
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
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
