"""The content-addressed cache for everything nbjit produces (NVRTC output, PTX assembled to
cubins by nvJitLink): an in-process layer over a directory of self-checking files.

An entry is a file ``<key[:2]>/<key>.nbjit``: a fixed header (magic, format version, the
length of a JSON description, a BLAKE2b-256 over the description and the payload's own
BLAKE2b-256, so that a hit hashes the payload once and hands its digest to the module
registry), the description
(kind, arch, lowered names, log, producer, key, and the facts nbjit read from the payload
and its source, so that a hit need not read them again) and the payload. Anything that does not
verify is a miss: it is rebuilt and replaced, with one warning. Files are written to a
temporary name and renamed into place, so a reader sees a whole entry or none, and a
writer killed half way leaves only a temporary file that is never read (and is pruned).
"""
from __future__ import annotations

import contextlib
import errno
import json
import json.encoder
import os
import re
import secrets
import stat
import struct
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process lock, each process compiles
    fcntl = None  # type: ignore[assignment]

from .errors import NbjitCacheError
from .image import content_digest, content_hash, read_regular_stat, write_output

__all__ = ["Cache", "CacheEntry", "default_cache", "set_default_cache", "cache_key", "FORMAT_VERSION"]

FORMAT_VERSION = 3  # 3: the checksum over the payload's digest; 2: BLAKE2b-256 keys and checksums (1: SHA-256)
OTHER_FORMAT = "cache format"  # how a reason given for an entry of another format begins
_MAGIC = b"NBJITC\x00\x01"
_HEAD = struct.Struct("<8sII32s")  # magic, format version, description length, checksum
_SUFFIX = ".nbjit"
_LOCK_SUFFIX = ".lock"
_TMP_PREFIX = ".tmp-"  # .tmp-<writer pid>-<random>: a writer that is gone leaves one to reclaim
_KEY = re.compile(r"[0-9a-f]{64}")
_MAX_ENTRY_BYTES = 1 << 30  # far past any cubin: a bigger file is not an entry
_TOUCH_AFTER = 3600.0  # seconds: a hit on an entry older than this marks it used (pruning order)
_KINDS = ("cubin", "ptx")
DEFAULT_MAX_BYTES = 1 << 30
_MEMORY_ENTRIES = 512


def _warn(msg: str) -> None:
    from .errors import NbjitWarning
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
    facts: dict = field(default_factory=dict)  # JSON data: what nbjit read from the payload (see _facts)
    # the payload's content_digest where a read computed it (checking the entry), else ""
    payload_digest: str = field(default="", compare=False, repr=False)


def _key_json():
    """Canonical JSON (sorted keys, no spaces): json's C encoder made once, where this Python
    has it (``JSONEncoder.encode`` makes it again on every call: ~12 us of a warm start)."""
    enc = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is not None:
        try:
            c = make(None, enc.default, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, True)
        except TypeError:  # another Python's C encoder (a key that differs is a miss, never a wrong hit)
            return enc.encode
        return lambda obj: "".join(c(obj, 0))
    return enc.encode


_KEY_JSON = _key_json()
# json's own scanner, called directly: a description is one JSON object with nothing around
# it (json.dumps writes it so), and json.loads's Python layers cost a warm start ~15 us
_SCAN = json.JSONDecoder().scan_once


def _checksum(desc: bytes, payload_hash: bytes) -> bytes:
    """An entry's check: over its description and its payload's ``content_hash``."""
    return content_hash(desc + payload_hash)


def cache_key(fields: dict) -> str:
    """The BLAKE2b-256 (``content_digest``) of a canonical JSON of everything that changes an
    output, plus the cache format version (so a new format never reads an old entry)."""
    return content_digest(_KEY_JSON({"format": FORMAT_VERSION, **fields}).encode())


class Cache:
    """A cache at ``path`` (a directory); ``path=None`` keeps only the in-process layer.

    ``get_or_create(key, make)`` returns the entry for ``key``, running ``make()`` on a miss.
    A directory that cannot be created or written is given up with one warning.
    """

    def __init__(self, path: str | os.PathLike | None, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
                 lock_timeout: float = 300.0):
        self.path = path  # type: ignore[assignment]  # a Path (the setter), kept as text for the hot path
        if max_bytes is not None and (type(max_bytes) is bool or not isinstance(max_bytes, int) or max_bytes < 0):
            raise NbjitCacheError(f"max_bytes must be a byte count >= 0 (or None: no limit), not {max_bytes!r}")
        if type(lock_timeout) is bool or not isinstance(lock_timeout, (int, float)) or not lock_timeout >= 0:
            raise NbjitCacheError(f"lock_timeout must be seconds >= 0, not {lock_timeout!r}")
        self.max_bytes = max_bytes
        self.lock_timeout = lock_timeout  # seconds a process waits for another making the same entry
        self._mem: OrderedDict[str, CacheEntry] = OrderedDict()
        # the first level: a caller's own cheap key (the arguments of a call) -> its result,
        # so a repeated call costs one dictionary look-up (no hashing of sources, no stat())
        self._calls: OrderedDict[object, object] = OrderedDict()
        self._lock = threading.Lock()
        self._warned = False

    @property
    def path(self) -> Path | None:
        """The directory, or None: the in-process layer only."""
        if self._path is None and self._root is not None:
            self._path = Path(self._root)
        return self._path

    @path.setter
    def path(self, value: str | os.PathLike | None) -> None:
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise NbjitCacheError(f"a cache's path must be a directory (str or path) or None (memory only), not "
                                  f"{type(value).__name__}")
        self._root = os.fspath(value) if value is not None else None
        self._prefix = os.path.join(self._root, "") if self._root is not None else ""  # what entries' paths start with
        self._path = None

    def __repr__(self) -> str:
        return f"<nbjit.Cache {self.path or '(memory only)'}>"

    # ------------------------------------------------------------ look-up
    def get_or_create(self, key: str, make: Callable[[], CacheEntry]) -> CacheEntry:
        """The entry for ``key``: from memory, from disk, or ``make()`` (then written)."""
        with self._lock:
            hit = self._mem.get(key)
            if hit is not None:
                self._mem.move_to_end(key)
                return hit
        entry = self.read(key)
        if entry is None:
            with self._key_lock(key):  # one process makes it; the others wait, then read it
                entry = self.read(key, warn=False)  # another process may have made it meanwhile
                if entry is None:
                    entry = make()
                    self.write(key, entry)
        self._remember(key, entry)
        return entry

    @contextlib.contextmanager
    def _key_lock(self, key: str):
        """An exclusive ``flock`` on ``<key>.lock`` while an entry is made, so that processes
        asking for the same entry at once run the compiler once. The OS drops the lock of a
        process that dies; after ``lock_timeout`` seconds a waiter goes on without it."""
        f = self.file(key)
        fd = None
        if f is not None and fcntl is not None:
            try:
                f.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(f.with_suffix(_LOCK_SUFFIX), os.O_RDWR | os.O_CREAT, 0o666)
            except OSError:
                fd = None  # an unwritable cache: no lock, as no write
        if fd is not None:
            deadline = time.monotonic() + self.lock_timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        os.close(fd)  # a holder that takes too long: make it ourselves
                        fd = None
                        break
                    time.sleep(0.01)
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)  # closing releases the lock

    def recall(self, call: object) -> object | None:
        """What ``remember(call, result)`` stored for this call in this process, or None."""
        try:
            with self._lock:
                return self._calls.get(call)
        except TypeError:  # an unhashable call: never remembered
            return None

    def remember(self, call: object, result: object) -> None:
        """Keep ``result`` for a repeated ``call`` (in this process, the latest 512)."""
        try:
            with self._lock:
                self._calls[call] = result
                if len(self._calls) > _MEMORY_ENTRIES:
                    self._calls.popitem(last=False)
        except TypeError:
            pass

    def _remember(self, key: str, entry: CacheEntry) -> None:
        with self._lock:
            self._mem[key] = entry
            if len(self._mem) > _MEMORY_ENTRIES:
                self._mem.popitem(last=False)

    def file(self, key: str) -> Path | None:
        """Where the entry for ``key`` (a cache key: 64 hex digits) lives."""
        f = self._file(key)
        return None if f is None else Path(f)

    def _file(self, key: str) -> str | None:
        """``file(key)`` as text (no Path made on a cache hit)."""
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise NbjitCacheError(f"{key!r} is not a cache key (64 lower-case hex digits, as cache_key() makes)")
        return None if self._root is None else f"{self._prefix}{key[:2]}{os.sep}{key}{_SUFFIX}"

    def read(self, key: str, warn: bool = True) -> CacheEntry | None:
        """The entry on disk, or None (missing, or failing its checks: then warned, once
        per lookup: ``warn=False`` for a second look)."""
        f = self._file(key)
        if f is None:
            return None
        got = _read_entry(f)
        if got is None:
            return None
        raw, mtime = got
        entry, why = _decode(raw, key)
        if entry is None:
            if warn:
                _warn(f"nbjit cache: entry {f} is corrupt ({why}); rebuilding it")
            return None
        if time.time() - mtime > _TOUCH_AFTER:
            try:
                os.utime(f)  # least-recently-used order for pruning (to the hour: a hit writes no more often)
            except OSError:
                pass
        return entry

    def write(self, key: str, entry: CacheEntry, *, refresh: bool = False) -> None:
        """Store ``entry`` on disk (a temporary file renamed into place); then prune to the
        limit. ``refresh``: the entry replaces one that is there (the same image with more
        facts), in memory too; where the disk refuses, it stays as it was (a read-only cache
        is still used)."""
        f = self.file(key)
        if refresh:
            self._remember(key, entry)
        if f is None:
            return
        tmp = f.parent / f"{_TMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        try:
            f.parent.mkdir(parents=True, exist_ok=True)
            # mode 0666 less the umask, as any file a user makes: a team can share a cache
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as e:
            if not refresh:
                self._give_up(e)
            return
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(_encode(key, entry))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, f)
        except OSError as e:
            _remove(tmp)
            if e.errno in (errno.ENOENT, errno.ESTALE) or refresh:
                return  # the temporary file went (another process cleared the cache): this write failed
            self._give_up(e)
            return
        except BaseException:
            _remove(tmp)
            raise
        if self.max_bytes is not None and not refresh:
            self.prune(self.max_bytes, quiet=True)

    def _give_up(self, e: OSError) -> None:
        if not self._warned:
            self._warned = True
            _warn(f"nbjit cache: cannot write to {self.path} ({e.strerror or e}); going on without the disk cache")
        self.path = None

    # ------------------------------------------------------------ management
    def entries(self) -> list[tuple[Path, int, float]]:
        """(file, bytes, last use) of every entry on disk, oldest use first."""
        return sorted(self._files(_SUFFIX), key=lambda t: t[2])

    def _files(self, pattern: str) -> list[tuple[Path, int, float]]:
        """(file, bytes, mtime) of the regular files matching ``??/*pattern``; files that go
        while the directory is read (other processes prune or clear) are left out."""
        if self.path is None or not self.path.is_dir():
            return []
        out = []
        for f in self.path.glob("??/*" + pattern):
            try:
                st = f.lstat()
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                out.append((f, st.st_size, st.st_mtime))
        return out

    def temporary_files(self) -> list[tuple[Path, int, float]]:
        """(file, bytes, mtime) of writers' temporary files (in flight, or left by a killed one)."""
        return [t for t in self._files("") if t[0].name.startswith(_TMP_PREFIX)]

    def info(self) -> dict:
        """Location, entries, writers' temporary files, bytes and limit."""
        es, tmps = self.entries(), self.temporary_files()
        return {"location": str(self.path) if self.path else None, "entries": len(es),
                "bytes": sum(e[1] for e in es) + sum(t[1] for t in tmps), "temporary_files": len(tmps),
                "max_bytes": self.max_bytes}

    def clear(self) -> int:
        """Remove every entry, and temporary files whose writer is gone; returns how many
        entries went. Writers still running lose nothing but the write in progress."""
        with self._lock:
            self._mem.clear()
            self._calls.clear()
        n = sum(_remove(f) for f, _, _ in self.entries())
        for f, _, _ in self._files(_LOCK_SUFFIX):
            _remove(f)
        self._reclaim(max_age=0)
        return n

    def prune(self, max_bytes: int | None = None, *, quiet: bool = False) -> int:
        """Remove least-recently-used entries until the cache (entries and temporary files)
        holds at most ``max_bytes`` (default: its own limit); first reclaims temporary files
        of writers that are gone, or older than an hour. Returns how many entries went."""
        if max_bytes is None:
            max_bytes = self.max_bytes
        if max_bytes is None or max_bytes < 0:
            raise NbjitCacheError(f"prune needs a byte count >= 0, not {max_bytes!r}")
        if self.path is None or not self.path.is_dir():
            return 0
        self._reclaim(max_age=3600)
        es = self.entries()
        total = sum(e[1] for e in es) + sum(t[1] for t in self.temporary_files())
        n = 0
        for f, size, _ in es:
            if total <= max_bytes:
                break
            try:
                f.unlink()
                total -= size
                n += 1
            except FileNotFoundError:
                total -= size
            except OSError as e:
                if not quiet:
                    raise NbjitCacheError(f"cannot remove {f}: {e.strerror}") from None
        return n

    def export_archive(self, dest: str | os.PathLike) -> int:
        """Write every entry that verifies into the tar archive ``dest`` (gzip-compressed);
        returns how many. Corrupt entries are left out."""
        import io
        import tarfile
        if self.path is None:
            raise NbjitCacheError("cannot export: the disk cache is off (NBJIT_CACHE=0)")
        n = 0

        def fill(out) -> None:
            nonlocal n
            with tarfile.open(fileobj=out, mode="w:gz") as tar:
                for f, _, _ in self.entries():
                    got = entry_file(f)
                    if got is None or got[0] is None:
                        continue  # gone meanwhile, or corrupt: not worth shipping
                    raw = got[2]
                    info = tarfile.TarInfo(f.name)
                    info.size, info.mtime, info.mode = len(raw), int(time.time()), 0o644
                    tar.addfile(info, io.BytesIO(raw))
                    n += 1
        try:
            write_output(dest, fill)
        except OSError as e:
            raise NbjitCacheError(f"cannot write the cache archive {dest}: {e.strerror or e}") from None
        except ValueError as e:
            raise NbjitCacheError(f"cannot write the cache archive {dest}: it is {e}") from None
        return n

    def import_archive(self, src: str | os.PathLike) -> tuple[int, list[str]]:
        """Add the entries of an archive made by ``export_archive``, each verified again
        against its key; returns how many were new here and why others were refused."""
        import tarfile
        import zlib
        if self.path is None:
            raise NbjitCacheError("cannot import: the disk cache is off (NBJIT_CACHE=0)")
        try:
            st = os.stat(src)
        except OSError as e:
            raise NbjitCacheError(f"cannot read the cache archive {src}: {e.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise NbjitCacheError(f"{src} is not a regular file, so not a cache archive")
        added, refused = 0, []
        try:
            with tarfile.open(src, "r:*") as tar:
                for m in tar:
                    if m.isdir():
                        continue
                    key = m.name[: -len(_SUFFIX)] if m.name.endswith(_SUFFIX) else ""
                    if not (m.isreg() and _KEY.fullmatch(key)):
                        refused.append(f"{m.name}: not a cache entry (expected <64 hex digits>{_SUFFIX})")
                        continue
                    if m.size > _MAX_ENTRY_BYTES:
                        refused.append(f"{m.name}: {m.size} bytes, more than an entry can be")
                        continue
                    entry, why = _decode(tar.extractfile(m).read(m.size + 1), key)
                    if entry is None:
                        refused.append(f"{m.name}: {why}")
                        continue
                    if self.read(key, warn=False) is None:
                        self.write(key, entry)
                        if self.path is None:
                            raise NbjitCacheError(f"cannot import into the cache: writing {key[:16]}… failed")
                        added += 1
        except tarfile.ReadError:
            raise NbjitCacheError(f"{src}: not a tar archive (plain, gzip, bzip2 or xz), so not a cache "
                                  f"archive (make one with 'nbjit cache export')") from None
        except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise NbjitCacheError(f"{src}: a damaged cache archive ({why})") from None
        return added, refused

    def _reclaim(self, max_age: float) -> None:
        """Remove temporary files whose writer process is gone, or older than ``max_age``."""
        now = time.time()
        for t, _, mtime in self.temporary_files():
            if not _writer_alive(t.name) or now - mtime > max_age and max_age > 0:
                _remove(t)


def _writer_alive(name: str) -> bool:
    """Whether the process that named this temporary file (.tmp-<pid>-...) still runs."""
    try:
        pid = int(name[len(_TMP_PREFIX):].split("-", 1)[0])
    except ValueError:
        return False  # not one of ours (an older nbjit's): reclaimed by age
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _remove(f) -> int:
    try:
        os.unlink(f)
        return 1
    except OSError:
        return 0


def entry_file(f: Path) -> tuple[CacheEntry | None, str, bytes] | None:
    """An entry file on disk (``Cache.entries()``), checked: (the entry or None, why not, its
    bytes); None where it is gone or not a regular file."""
    got = _read_entry(f)
    if got is None:
        return None
    entry, why = _decode(got[0], f.stem)
    return entry, why, got[0]


def _read_entry(f: str | Path) -> tuple[bytes, float] | None:
    """The bytes and modification time of an entry file, or None: missing, not a regular
    file (a FIFO is never waited on, a link to /dev/zero never read), or too large to be an
    entry."""
    try:
        data, st = read_regular_stat(f, _MAX_ENTRY_BYTES)
    except (OSError, ValueError):
        return None
    return data, st.st_mtime


def _encode(key: str, e: CacheEntry) -> bytes:
    d = {"key": key, "kind": e.kind, "arch": e.arch, "lowered_names": e.lowered_names, "log": e.log,
         "producer": e.producer, "payload_bytes": len(e.payload)}
    if e.facts:
        d["facts"] = e.facts
    desc = json.dumps(d, sort_keys=True).encode()
    check = _checksum(desc, content_hash(e.payload))
    return _HEAD.pack(_MAGIC, FORMAT_VERSION, len(desc), check) + desc + e.payload


def _decode(raw: bytes, key: str) -> tuple[CacheEntry | None, str]:
    """The entry in ``raw``, or None and why not: anything that does not verify is a miss."""
    if len(raw) < _HEAD.size:
        return None, "truncated header"
    magic, version, dlen, check = _HEAD.unpack_from(raw)
    if magic != _MAGIC:
        return None, "wrong magic"
    if version != FORMAT_VERSION:
        return None, f"{OTHER_FORMAT} {version} (this nbjit's is {FORMAT_VERSION}): never read, it ages out"
    start = _HEAD.size + dlen  # where the payload starts (each part copied out once)
    if start > len(raw):
        return None, "truncated description"
    desc_bytes, payload = raw[_HEAD.size:start], raw[start:]
    payload_hash = content_hash(payload)
    if _checksum(desc_bytes, payload_hash) != check:
        return None, "checksum mismatch"
    try:
        text = desc_bytes.decode()
        desc, end = _SCAN(text, 0)
        if end != len(text):
            raise ValueError("more after the description")
    except (ValueError, RecursionError, StopIteration):
        return None, "unreadable description"
    if not isinstance(desc, dict):
        return None, "the description is not a JSON object"
    if desc.get("key") != key or desc.get("payload_bytes") != len(payload):
        return None, "entry does not belong to this key"
    names, log, producer = desc.get("lowered_names") or {}, desc.get("log", ""), desc.get("producer", "")
    facts = desc.get("facts", {})
    if desc.get("kind") not in _KINDS or not isinstance(desc.get("arch"), str):
        return None, f"kind {desc.get('kind')!r} / arch {desc.get('arch')!r} is not an image nbjit makes"
    if not (isinstance(names, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in names.items())
            and isinstance(log, str) and isinstance(producer, str) and isinstance(facts, dict)):
        return None, "malformed description"
    return CacheEntry(desc["kind"], desc["arch"], payload, names, log, producer, facts, payload_hash.hex()), ""


# ------------------------------------------------------------------ the default instance

_DEFAULT: list[Cache] = []
_DEFAULT_LOCK = threading.Lock()


def _location_from_env() -> str | None:
    if os.environ.get("NBJIT_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    d = os.environ.get("NBJIT_CACHE_DIR")
    if d:
        return os.path.expanduser(d) if d.startswith("~") else d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nbjit")


def default_cache() -> Cache:
    """The process's default cache: ``NBJIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/nbjit`` or
    ``~/.cache/nbjit``; ``NBJIT_CACHE=0`` keeps it in memory only; ``NBJIT_CACHE_MAX_BYTES``
    caps its size (default 1 GiB)."""
    with _DEFAULT_LOCK:
        if not _DEFAULT:
            _DEFAULT.append(Cache(_location_from_env(), max_bytes=_limit_from_env()))
        return _DEFAULT[0]


_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*(?:([kmgt])i?)?b?", re.I)


def parse_size(text: str) -> int | None:
    """A byte count written as ``1073741824``, ``100k``, ``512M``, ``1G``, ``1.5GiB`` (K, M,
    G, T: powers of 1024); None if ``text`` is not one."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        return None
    return int(float(m[1]) * 1024 ** ("kmgt".index(m[2].lower()) + 1 if m[2] else 0))


def _limit_from_env() -> int:
    raw = os.environ.get("NBJIT_CACHE_MAX_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    limit = parse_size(raw)
    if limit is None:
        raise NbjitCacheError(f"NBJIT_CACHE_MAX_BYTES={raw!r} is not a byte count (e.g. 1073741824, 512M or 1G)")
    return limit


def set_default_cache(cache: "Cache | str | os.PathLike | None") -> None:
    """Replace the default cache: a ``Cache``, or a directory for one (``None``: build it
    again from the environment)."""
    if isinstance(cache, (str, os.PathLike)):
        cache = Cache(cache)
    elif cache is not None and not isinstance(cache, Cache):
        raise NbjitCacheError("set_default_cache takes an nbjit.Cache, a directory or None, not "
                              f"{type(cache).__name__}")
    with _DEFAULT_LOCK:
        _DEFAULT.clear()
        if cache is not None:
            _DEFAULT.append(cache)
