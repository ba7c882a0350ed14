"""The content-addressed cache for everything nbjit produces (NVRTC output, PTX assembled to
cubins by nvJitLink): an in-process layer over a directory of self-checking files.

An entry is a file ``<key[:2]>/<key>.nbjit``: a fixed header (magic, format version, the
length of a JSON description, a SHA-256 over description and payload), the description
(kind, arch, lowered names, log, producer, key) and the payload. Anything that does not
verify is a miss: it is rebuilt and replaced, with one warning. Files are written to a
temporary name and renamed into place, so a reader sees a whole entry or none, and a
writer killed half way leaves only a temporary file that is never read (and is pruned).
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

__all__ = ["Cache", "CacheEntry", "default_cache", "set_default_cache", "cache_key", "FORMAT_VERSION"]

FORMAT_VERSION = 1
_MAGIC = b"NBJITC\x00\x01"
_HEAD = struct.Struct("<8sII32s")  # magic, format version, description length, sha256
_SUFFIX = ".nbjit"
_TMP_PREFIX = ".tmp-"
DEFAULT_MAX_BYTES = 1 << 30
_MEMORY_ENTRIES = 512


def _warn(msg: str) -> None:
    from .module import NbjitWarning
    warnings.warn(msg, NbjitWarning, stacklevel=4)


@dataclass(frozen=True)
class CacheEntry:
    """What a cache entry holds: the produced image and what came with it."""

    kind: str  # "cubin" or "ptx"
    arch: str
    payload: bytes
    lowered_names: dict = field(default_factory=dict)
    log: str = ""
    producer: str = ""


def cache_key(fields: dict) -> str:
    """The SHA-256 of a canonical JSON of everything that changes an output, plus the cache
    format version (so a new format never reads an old entry)."""
    blob = json.dumps({"format": FORMAT_VERSION, **fields}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


class Cache:
    """A cache at ``path`` (a directory); ``path=None`` keeps only the in-process layer.

    ``get_or_create(key, make)`` returns the entry for ``key``, running ``make()`` on a miss.
    A directory that cannot be created or written is given up with one warning.
    """

    def __init__(self, path: str | os.PathLike | None, *, max_bytes: int = DEFAULT_MAX_BYTES):
        self.path = Path(path) if path is not None else None
        self.max_bytes = max_bytes
        self._mem: OrderedDict[str, CacheEntry] = OrderedDict()
        self._lock = threading.Lock()
        self._warned = False

    def __repr__(self) -> str:
        return f"<nbjit.Cache {self.path or '(memory only)'}>"

    # ------------------------------------------------------------ look-up
    def get_or_create(self, key: str, make: Callable[[], CacheEntry]) -> CacheEntry:
        with self._lock:
            hit = self._mem.get(key)
            if hit is not None:
                self._mem.move_to_end(key)
                return hit
        entry = self.read(key)
        if entry is None:
            entry = make()
            self.write(key, entry)
        self._remember(key, entry)
        return entry

    def _remember(self, key: str, entry: CacheEntry) -> None:
        with self._lock:
            self._mem[key] = entry
            if len(self._mem) > _MEMORY_ENTRIES:
                self._mem.popitem(last=False)

    def file(self, key: str) -> Path | None:
        return None if self.path is None else self.path / key[:2] / (key + _SUFFIX)

    def read(self, key: str) -> CacheEntry | None:
        """The entry on disk, or None (missing, or failing its checks: then warned)."""
        f = self.file(key)
        if f is None:
            return None
        try:
            raw = f.read_bytes()
        except OSError:
            return None
        entry, why = _decode(raw, key)
        if entry is None:
            _warn(f"nbjit cache: entry {f} is corrupt ({why}); rebuilding it")
            return None
        try:
            os.utime(f)  # least-recently-used order for pruning
        except OSError:
            pass
        return entry

    def write(self, key: str, entry: CacheEntry) -> None:
        f = self.file(key)
        if f is None:
            return
        try:
            f.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=f.parent)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(_encode(key, entry))
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, f)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError as e:
            self._give_up(e)
            return
        if self.max_bytes is not None:
            self.prune(self.max_bytes, quiet=True)

    def _give_up(self, e: OSError) -> None:
        if not self._warned:
            self._warned = True
            _warn(f"nbjit cache: cannot write to {self.path} ({e.strerror or e}); going on without the disk cache")
        self.path = None

    # ------------------------------------------------------------ management
    def entries(self) -> list[tuple[Path, int, float]]:
        """(file, bytes, last use) of every entry on disk, oldest use first."""
        if self.path is None or not self.path.is_dir():
            return []
        out = []
        for f in self.path.glob("??/*" + _SUFFIX):
            try:
                st = f.stat()
            except OSError:
                continue
            out.append((f, st.st_size, st.st_mtime))
        out.sort(key=lambda t: t[2])
        return out

    def info(self) -> dict:
        es = self.entries()
        return {"location": str(self.path) if self.path else None, "entries": len(es),
                "bytes": sum(e[1] for e in es), "max_bytes": self.max_bytes}

    def clear(self) -> int:
        """Remove every entry (and stray temporary files); returns how many entries went."""
        with self._lock:
            self._mem.clear()
        n = 0
        if self.path is None or not self.path.is_dir():
            return 0
        for f in list(self.path.glob("??/*")):
            if f.name.endswith(_SUFFIX) or f.name.startswith(_TMP_PREFIX):
                try:
                    f.unlink()
                    n += f.name.endswith(_SUFFIX)
                except OSError:
                    pass
        return n

    def prune(self, max_bytes: int, *, quiet: bool = False) -> int:
        """Remove least-recently-used entries until the cache holds at most ``max_bytes``;
        also removes temporary files older than an hour. Returns how many entries went."""
        if self.path is None or not self.path.is_dir():
            return 0
        now = time.time()
        for t in self.path.glob("??/" + _TMP_PREFIX + "*"):
            try:
                if now - t.stat().st_mtime > 3600:
                    t.unlink()
            except OSError:
                pass
        es = self.entries()
        total = sum(e[1] for e in es)
        n = 0
        for f, size, _ in es:
            if total <= max_bytes:
                break
            try:
                f.unlink()
                total -= size
                n += 1
            except OSError:
                if not quiet:
                    raise
        return n


def _encode(key: str, e: CacheEntry) -> bytes:
    desc = json.dumps({"key": key, "kind": e.kind, "arch": e.arch, "lowered_names": e.lowered_names,
                       "log": e.log, "producer": e.producer, "payload_bytes": len(e.payload)},
                      sort_keys=True).encode()
    digest = hashlib.sha256(desc + e.payload).digest()
    return _HEAD.pack(_MAGIC, FORMAT_VERSION, len(desc), digest) + desc + e.payload


def _decode(raw: bytes, key: str) -> tuple[CacheEntry | None, str]:
    if len(raw) < _HEAD.size:
        return None, "truncated header"
    magic, version, dlen, digest = _HEAD.unpack_from(raw)
    if magic != _MAGIC:
        return None, "wrong magic"
    if version != FORMAT_VERSION:
        return None, f"format version {version}, expected {FORMAT_VERSION}"
    body = raw[_HEAD.size:]
    if dlen > len(body):
        return None, "truncated description"
    if hashlib.sha256(body).digest() != digest:
        return None, "checksum mismatch"
    try:
        desc = json.loads(body[:dlen])
    except ValueError:
        return None, "unreadable description"
    payload = body[dlen:]
    if desc.get("key") != key or desc.get("payload_bytes") != len(payload):
        return None, "entry does not belong to this key"
    return CacheEntry(desc["kind"], desc["arch"], payload, desc.get("lowered_names") or {}, desc.get("log", ""),
                      desc.get("producer", "")), ""


# ------------------------------------------------------------------ the default instance

_DEFAULT: list[Cache] = []
_DEFAULT_LOCK = threading.Lock()


def _location_from_env() -> Path | None:
    if os.environ.get("NBJIT_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if os.environ.get("NBJIT_CACHE_DIR"):
        return Path(os.environ["NBJIT_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nbjit"


def default_cache() -> Cache:
    """The process's default cache: ``NBJIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/nbjit`` or
    ``~/.cache/nbjit``; ``NBJIT_CACHE=0`` keeps it in memory only; ``NBJIT_CACHE_MAX_BYTES``
    caps its size (default 1 GiB)."""
    with _DEFAULT_LOCK:
        if not _DEFAULT:
            try:
                limit = int(os.environ.get("NBJIT_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES))
            except ValueError:
                limit = DEFAULT_MAX_BYTES
            _DEFAULT.append(Cache(_location_from_env(), max_bytes=limit))
        return _DEFAULT[0]


def set_default_cache(cache: Cache | None) -> None:
    """Replace the default cache (``None``: build it again from the environment)."""
    with _DEFAULT_LOCK:
        _DEFAULT.clear()
        if cache is not None:
            _DEFAULT.append(cache)
