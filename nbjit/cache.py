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
Behind the disk, an optional remote tier (``remote.py``: the same files in an object store)
is looked in on a miss and given what is compiled here; its objects are checked as files are.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import hmac
import json
import json.encoder
import os
import random
import re
import secrets
import stat
import struct
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process lock, each process compiles
    fcntl = None  # type: ignore[assignment]

from nbjit._defs import field, record
from nbjit.errors import NbjitCacheError, NbjitWarning
from nbjit.pch import PCH_DIR, PCH_NAME, writer_alive as _pch_writer_alive
from nbjit._write import write_output
from nbjit.image import content_digest, content_hash, read_regular, read_regular_stat

if TYPE_CHECKING:
    from nbjit._facts import Facts
    from nbjit.remote import RemoteTier

__all__ = ["Cache", "CacheEntry", "default_cache", "set_default_cache", "cache_key", "FORMAT_VERSION"]

FORMAT_VERSION = 3  # 3: the checksum over the payload's digest; 2: BLAKE2b-256 keys and checksums (1: SHA-256)
OTHER_FORMAT = "cache format"  # how a reason given for an entry of another format begins
_MAGIC = b"NBJITC\x00\x01"
_HEAD = struct.Struct("<8sII32s")  # magic, format version, description length, checksum
_SUFFIX = ".nbjit"
_CALL_SUFFIX = ".call"  # a call's digest -> the key it was filed under (``Cache.index``)
_READ_NONBLOCK = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
_LOCK_SUFFIX = ".lock"
_TMP_PREFIX = ".tmp-"  # .tmp-<writer pid>-<12 random hex digits>: a writer that is gone leaves one to reclaim
_KEY = re.compile(r"[0-9a-f]{64}")
_MAX_ENTRY_BYTES = 1 << 30  # far past any cubin: a bigger file is not an entry
_TOUCH_AFTER = 3600.0  # seconds: a hit on an entry older than this marks it used (pruning order)
_KINDS = ("cubin", "ptx", "ltoir")  # (LTO-IR: what nbjit.link_image links)
DEFAULT_MAX_BYTES = 1 << 30
_MEMORY_ENTRIES = 512
_SHARD = re.compile(r"[0-9a-f]{2}")
# the files nbjit makes in a shard <key[:2]>: entries, their locks, call files (``Cache.index``)
# and writers' temporary files (``_new_temporary``); nothing else there is listed or removed
_SHARD_FILE = re.compile(rf"([0-9a-f]{{64}})({re.escape(_SUFFIX)}|{re.escape(_LOCK_SUFFIX)}|{re.escape(_CALL_SUFFIX)})"
                         rf"|{re.escape(_TMP_PREFIX)}\d+-[0-9a-f]{{12}}")
# the marker of a cache directory (the Cache Directory Tagging Specification's: backup tools
# skip such a directory), written with its first shard; ``clear`` refuses a directory without it
_MARKER = "CACHEDIR.TAG"
_MARKER_HEAD = b"Signature: 8a477f597d28d172789f06886806bc55\n# This file is a cache directory tag created by nbjit."
_MARKER_TEXT = _MARKER_HEAD + b"\n# For information about cache directory tags, see https://bford.info/cachedir/\n"
# what else nbjit makes at a cache directory's top (its shards, PCH files, the compiler's
# toolchain records and their temporary files): an older nbjit's cache holds nothing else
_TOP_NAME = re.compile(r"[0-9a-f]{2}|" + PCH_DIR + r"|toolchain-[a-z]+\.json(\.\d+\.\d+\.tmp)?")
# the size limit is checked by a scan of the whole cache (every entry stat()ed), so not on
# every write: when this process has written a tenth of the limit since its last scan, when
# its own count says the limit is passed, or at random with the chance that makes every
# process together scan about once per tenth of the limit written (short-lived processes
# never write a tenth alone); a scan over the limit prunes to 90% of it, so that the next
# one is a tenth of the limit away
_SCAN_FRACTION = 10
_PRUNE_TO = 0.9
# archives (import_archive): what one member or header may be, before any of it is read
_MAX_HEADER_BYTES = 1 << 20  # a GNU long name or pax header (export writes none; a real one is < 1 KiB)
_MAX_GLOBAL_HEADER_BYTES = 1 << 20  # all global pax headers together (each is kept for every later member)
_MAX_DESC_BYTES = 16 << 20  # an entry's JSON description (one kernel's: ~2 KB)
# what an archive may expand to: deflate (export writes gzip) expands at most 1032 times, and
# a small archive's tar headers and padding need some room
_MAX_EXPANSION = 1032
_EXPANSION_ROOM = 1 << 20
_CHUNK = 1 << 20  # members are copied through this much memory at a time
_MAX_REFUSALS_LISTED = 1000
_SIGNATURE = "nbjit-archive.hmac-sha256"  # the signature member: the last of a signed archive
_SIGNATURE_CONTEXT = b"nbjit cache archive signature 1\0"
_MIN_ARCHIVE_KEY = 16  # bytes: shorter secrets are guessable
ARCHIVE_KEY_ENV = "NBJIT_CACHE_ARCHIVE_KEY"
ARCHIVE_KEY_FILE_ENV = "NBJIT_CACHE_ARCHIVE_KEY_FILE"


def _warn(msg: str) -> None:
    warnings.warn(msg, NbjitWarning, stacklevel=4)


@record
class CacheEntry:
    """What a cache entry holds: the produced image and what came with it."""

    kind: str  # "cubin", "ptx" or "ltoir"
    arch: str
    payload: bytes
    lowered_names: dict = field(default_factory=dict)
    log: str = ""
    producer: str = ""
    # what nbjit read from the payload and its source (``_facts.Facts``), decoded; None where
    # the entry keeps none that this nbjit reads (``Cache.get_or_create`` derives them)
    facts: "Facts | None" = field(default=None, compare=False, repr=False)
    # the payload's content_digest where a read computed it (checking the entry), else ""
    payload_digest: str = field(default="", compare=False, repr=False)
    # what its producer says of it beside the payload, as JSON data kept as given (a Python
    # function's LTO-IR: its C return and parameter types); {} for NVRTC's and nvJitLink's
    meta: dict = field(default_factory=dict, compare=False, repr=False)


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
    ``remote``: a shared tier (a URL such as ``s3://bucket/prefix``, or a ``RemoteTier``)
    looked in on a local miss before compiling, and given what is compiled here unless
    ``remote_write=False``.
    """

    def __init__(self, path: str | os.PathLike | None, *, max_bytes: int | str | None = DEFAULT_MAX_BYTES,
                 lock_timeout: float = 300.0, remote: "str | RemoteTier | None" = None,
                 remote_write: bool | None = None):
        self.path = path  # type: ignore[assignment]  # a Path (the setter), kept as text for the hot path
        if isinstance(max_bytes, str) and parse_size(max_bytes) is not None:  # ("1G", as NBJIT_CACHE_MAX_BYTES)
            max_bytes = parse_size(max_bytes)
        if max_bytes is not None and (type(max_bytes) is bool or not isinstance(max_bytes, int) or max_bytes < 0):
            raise NbjitCacheError(f"max_bytes must be a byte count >= 0 or a size such as '1G' (or None: no limit), "
                                  f"not {max_bytes!r}")
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
        self.remote = _tier(remote, remote_write)

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
        tier = f" remote={self.remote.url}" if self.remote is not None else ""
        return f"<nbjit.Cache {self.path or '(memory only)'}{tier}>"

    # ------------------------------------------------------------ look-up
    def get_or_create(self, key: str, make: Callable[[], CacheEntry],
                      derive: "Callable[[CacheEntry], Facts | None] | None" = None,
                      delegate: "Callable[[], Written | None] | None" = None) -> CacheEntry:
        """The entry for ``key``: from memory, from disk, from the remote tier, or ``make()``
        (then written, and published to the remote tier). ``derive(entry)`` gives the facts
        of an entry that keeps none this nbjit reads (one just made, one another nbjit
        version wrote): they are kept with it (the file rewritten where the disk allows), so
        that the entry returned carries them; it returns None where they cannot be read.
        ``make`` may write the file itself (``write_entry``: a ``Written``), while this
        process holds the key's lock. ``delegate``, where there is no remote tier: asked
        first on a miss, it has another process do all that ``make`` and the key's lock do
        here (``make_locked``: a ``Written``), or returns None (then it is done here)."""
        entry = self.lookup(key, derive)
        if entry is not None:
            return entry
        if delegate is not None and self.remote is None:
            written = delegate()
            if written is not None:
                return self.adopt(key, written, derive)
        made = None
        with self._key_lock(key):  # one process makes it; the others wait, then read it
            entry = self.read(key, warn=False)  # another process may have made it meanwhile
            if entry is None and self.remote is not None:
                entry = self._from_remote(key)
            if entry is None:
                entry = make()
                if type(entry) is Written:  # its maker wrote the file (``write_entry``), under our lock
                    written, entry = entry, entry.entry
                    self._stored(written.size, written.error)
                    made = written.data if written.data is not None or self.remote is None \
                        else _encode(key, entry)
                else:
                    if derive is not None:
                        entry = _with(entry, derive(entry))
                    made = _encode(key, entry)
                    self._store(key, made)
                derive = None  # (its facts were read as it was made)
        if made and self.remote is not None:
            self.remote.put(key, made)  # after the lock: local waiters read the entry meanwhile
        return self._settle(key, entry, derive)

    def lookup(self, key: str, derive: "Callable[[CacheEntry], Facts | None] | None" = None,
               warn: bool = True) -> CacheEntry | None:
        """``get_or_create``'s look-up without a make: the entry for ``key`` in memory or on
        disk (with its facts, as ``get_or_create`` keeps them), or None (the remote tier is
        not asked). ``warn=False``: a corrupt entry is a miss without a warning (the look-up
        that follows warns)."""
        with self._lock:
            hit = self._mem.get(key)
            if hit is not None:
                self._mem.move_to_end(key)
        if hit is not None:
            return hit if hit.facts is not None or derive is None else self._with_facts(key, hit, derive)
        entry = self.read(key, warn)
        return None if entry is None else self._settle(key, entry, derive)

    def adopt(self, key: str, written: "Written", derive: "Callable[[CacheEntry], Facts | None] | None" = None
              ) -> CacheEntry:
        """The entry another process wrote for ``key`` (``make_locked``'s ``Written``: what
        ``get_or_create``'s ``delegate`` returns), counted and kept as ``get_or_create`` keeps it."""
        if not written.found:  # (found: another process made it meanwhile: nothing written by this one)
            self._stored(written.size, written.error)
            derive = None  # (its facts were read as it was made)
        return self._settle(key, written.entry, derive)

    def _settle(self, key: str, entry: CacheEntry, derive) -> CacheEntry:
        """(The end of a look-up.) ``entry`` with its facts, kept in memory."""
        if entry.facts is None and derive is not None:
            return self._with_facts(key, entry, derive)
        self._remember(key, entry)
        return entry

    def _with_facts(self, key: str, entry: CacheEntry, derive) -> CacheEntry:
        """``entry`` with the facts ``derive`` reads from it, kept (in memory, and on disk
        where it can be written; a read-only cache is still used); as it is where there are
        none to read."""
        entry = _with(entry, derive(entry))
        if entry.facts is not None:
            self.write(key, entry, refresh=True)
        else:
            self._remember(key, entry)
        return entry

    def _from_remote(self, key: str) -> CacheEntry | None:
        """The remote tier's entry for ``key``, checked as a local file is, and kept on disk."""
        raw = self.remote.get(key, _MAX_ENTRY_BYTES)
        if raw is None:
            return None
        entry, why = _decode(raw, key)
        if entry is None:
            self.remote.corrupt(key, why)
            return None
        self._store(key, raw)
        return entry

    def _key_lock(self, key: str):
        """The key's lock (``_key_lock``) for this cache's entry of ``key``."""
        return _key_lock(self._file(key), self.lock_timeout)

    def recall(self, call: object) -> object | None:
        """What ``remember(call, result)`` stored for this call in this process, or None."""
        try:
            return self._calls.get(call)  # (one dictionary read: no lock, on every repeated call)
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

    def indexed(self, digest: str) -> str | None:
        """The key ``index(digest, key)`` filed on disk for a call's digest (64 hex digits,
        as ``content_digest`` makes), or None: the disk level of ``recall``, for a later
        process (``compiler`` files a compile's call there, with its toolchain's state)."""
        if self._root is None:
            return None
        return _call_key(f"{self._prefix}{digest[:2]}{os.sep}{digest}{_CALL_SUFFIX}")

    def index(self, digest: str, key: str) -> None:
        """File ``key`` for a call's ``digest`` on disk (``indexed``), whole or not at all;
        nothing where the disk refuses (a call file is a short cut: without it a later
        process takes the long way to the same key)."""
        if self._root is None or not _KEY.fullmatch(digest) or not _KEY.fullmatch(key):
            return
        f = f"{self._prefix}{digest[:2]}{os.sep}{digest}{_CALL_SUFFIX}"
        try:
            tmp, fd = _new_temporary(f)
        except OSError:
            return
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(key.encode())
            os.replace(tmp, f)
        except OSError:
            _remove(tmp)

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
        """Store ``entry`` on disk (a temporary file renamed into place), keeping the cache
        near its limit. ``refresh``: the entry replaces one that is there (the same image with
        more facts), in memory too; where the disk refuses, it stays as it was (a read-only
        cache is still used)."""
        if refresh:
            self._remember(key, entry)
        self._store(key, _encode(key, entry), refresh=refresh)

    def _store(self, key: str, data: bytes, *, refresh: bool = False) -> bytes | None:
        """Write the entry file ``data`` for ``key`` (``write``); returns ``data``, or None
        where nothing was written."""
        f = self._file(key)
        if f is None:
            return None
        error = _write_file(f, data)
        return data if self._stored(len(data), error, refresh=refresh) else None

    def _stored(self, size: int, error: "tuple[OSError, bool] | None", *, refresh: bool = False) -> bool:
        """After an entry file of ``size`` bytes was written (``_write_file``, here or in a
        worker process: ``Written``): whether it was. A write that failed gives the disk up
        (one warning), except a refresh, or a temporary file that went (another process
        cleared the cache: this write alone failed)."""
        if error is not None:
            e, made_temporary = error
            if not refresh and not (made_temporary and e.errno in (errno.ENOENT, errno.ESTALE)):
                self._give_up(e)
            return False
        if size and not refresh:
            self._wrote(size)
        return bool(size)

    def _wrote(self, n: int) -> None:
        """Count ``n`` bytes this process added; prune when a scan is due (see _SCAN_FRACTION)."""
        limit = self.max_bytes
        if limit is None or self._root is None:
            return
        with _USAGE_LOCK:
            u = _USAGE.setdefault(self._root, [None, 0])  # bytes at the last scan, bytes written since
            u[1] += n
            due = (limit == 0 or u[1] * _SCAN_FRACTION >= limit or (u[0] is not None and u[0] + u[1] > limit)
                   or random.random() * limit < n * _SCAN_FRACTION)
        if due:
            self._shrink(limit)

    def _shrink(self, limit: int) -> None:
        """Scan the cache; over ``limit``, prune it to 90% of the limit."""
        try:
            listing = self._scan(strict=False)
            total = listing.bytes
            if total > limit:
                total -= self._prune(listing, int(limit * _PRUNE_TO), quiet=True)[1]
        except OSError:
            return  # another process is clearing the cache: the next scan counts again
        with _USAGE_LOCK:
            _USAGE[self._root] = [total, 0]

    def _give_up(self, e: OSError) -> None:
        if not self._warned:
            self._warned = True
            _warn(f"nbjit cache: cannot write to {self.path} ({e.strerror or e}); going on without the disk cache")
        self.path = None

    # ------------------------------------------------------------ management
    def entries(self) -> list[tuple[Path, int, float]]:
        """(file, bytes, last use) of every entry on disk, oldest use first."""
        return sorted(self._scan().entries, key=lambda t: t[2])

    def _scan(self, strict: bool = True) -> "_Listing":
        """Every entry, writer's temporary file and lock file, in one pass over the directory
        (files that go meanwhile, as other processes prune or clear, are left out). A cache
        directory that cannot be read is an ``NbjitCacheError`` (``strict=False``: left out)."""
        out = _Listing()
        root = self._root
        if root is None:
            return out
        try:
            shards = [(d.name, d.path) for d in os.scandir(root)
                      if _SHARD.fullmatch(d.name) and d.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return out  # nothing written yet
        except OSError as e:
            if strict:
                raise NbjitCacheError(f"cannot read the cache directory {root}: {e.strerror or e}") from None
            return out
        out.pch = _pch_files(os.path.join(root, PCH_DIR))
        kinds = {_SUFFIX: out.entries, _LOCK_SUFFIX: out.locks, _CALL_SUFFIX: out.calls, None: out.temporary}
        for prefix, shard in shards:
            try:
                with os.scandir(shard) as it:
                    for d in it:
                        m = _SHARD_FILE.fullmatch(d.name)
                        if m is None or m[1] is not None and not m[1].startswith(prefix):
                            continue  # not a name nbjit makes there
                        kind = kinds[m[2]]
                        try:
                            st = d.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        if stat.S_ISREG(st.st_mode) or kind is out.locks and stat.S_ISLNK(st.st_mode):
                            kind.append((Path(d.path), st.st_size, st.st_mtime))
            except FileNotFoundError:
                continue
            except OSError as e:
                if strict:
                    raise NbjitCacheError(f"cannot read the cache directory {shard}: {e.strerror or e}") from None
        return out

    def temporary_files(self) -> list[tuple[Path, int, float]]:
        """(file, bytes, mtime) of writers' temporary files (in flight, or left by a killed one)."""
        return self._scan().temporary

    def info(self) -> dict:
        """Location, entries, writers' temporary files, bytes and limit; the remote tier's
        URL (no credentials) and whether entries are published to it."""
        listing = self._scan()
        tier = self.remote
        return {"location": str(self.path) if self.path else None, "entries": len(listing.entries),
                "bytes": listing.bytes, "temporary_files": len(listing.temporary), "max_bytes": self.max_bytes,
                "pch_files": len(listing.pch), "pch_bytes": sum(p[1] for p in listing.pch),
                "remote": None if tier is None else tier.url, "remote_write": None if tier is None else tier.write}

    def push(self) -> tuple[int, int]:
        """Publish every local entry that verifies to the remote tier; returns (published,
        already there). ``NbjitCacheError`` where there is no remote tier, it is read-only, or
        it does not answer."""
        tier = self._tier_for("push")
        if self.path is None:
            raise NbjitCacheError("cannot push: the disk cache is off (NBJIT_CACHE=0)")
        pushed = there = 0
        for f, _, _ in self.entries():
            got = entry_file(f)
            if got is None or got[0] is None:
                continue  # gone meanwhile, or corrupt: not worth sharing
            if tier.publish(f.stem, got[2]):
                pushed += 1
            else:
                there += 1
        return pushed, there

    def pull(self) -> tuple[int, list[str]]:
        """Copy every remote entry this cache lacks into it, each checked as a local file is;
        returns how many were new here and why others were refused. ``NbjitCacheError`` where
        there is no remote tier or it does not answer."""
        tier = self._tier_for("pull")
        if self.path is None:
            raise NbjitCacheError("cannot pull: the disk cache is off (NBJIT_CACHE=0)")
        added, refused = 0, []
        for key, _ in tier.listing():
            if self.read(key, warn=False) is not None:
                continue
            raw = tier.fetch(key, _MAX_ENTRY_BYTES)
            if raw is None:
                continue  # removed meanwhile
            entry, why = _decode(raw, key, facts=False)
            if entry is None:
                refused.append(f"{key}: {why}")
                continue
            if self._store(key, raw) is None:
                raise NbjitCacheError(f"cannot write to the cache {self.path or '(gave up writing)'}: "
                                      f"{added} entries pulled")
            added += 1
        return added, refused

    def _tier_for(self, what: str) -> "RemoteTier":
        if self.remote is None:
            from nbjit.remote import REMOTE_ENV
            raise NbjitCacheError(f"cannot {what}: no remote cache (Cache(path, remote='s3://bucket/prefix'), "
                                  f"{REMOTE_ENV}, or --remote)")
        return self.remote

    def clear(self) -> int:
        """Remove every entry, lock files nobody holds, and temporary files whose writer is
        gone; returns how many entries went. Writers still running lose nothing but the write
        in progress; a process making an entry keeps its lock. An entry that cannot be removed
        (a read-only cache) is an ``NbjitCacheError``."""
        with self._lock:
            self._mem.clear()
            self._calls.clear()
        listing = self._scan()
        other = None if self._root is None else self._not_ours(listing)
        if other is not None:
            raise NbjitCacheError(f"{self._root} is not an nbjit cache: it has no {_MARKER} of nbjit's, no cache "
                                  f"entry, and files nbjit does not make ({other!r}); clear removes nothing there "
                                  "(is NBJIT_CACHE_DIR right?)")
        n = 0
        for f, _, _ in listing.entries:
            try:
                os.unlink(f)
                n += 1
            except FileNotFoundError:
                pass
            except OSError as e:
                raise NbjitCacheError(f"cannot remove {f}: {e.strerror or e} ({n} entries removed)") from None
        for f, _, _ in listing.locks:
            _remove_lock(f)
        for f, _, _ in listing.calls:
            _remove(f)
        _reclaim(listing, max_age=0)
        with _USAGE_LOCK:
            _USAGE.pop(self._root, None)
        return n

    def _not_ours(self, listing: "_Listing") -> str | None:
        """None where the cache directory is nbjit's: marked (``_MARKER``), or an older
        nbjit's cache, made before the marker (then marked now): one holding entries
        (``listing``, by their names), or nothing but what nbjit makes, or nothing at all.
        Else the first name in it that nbjit does not make."""
        root = self._root
        marker = read_small(os.path.join(root, _MARKER), 4096)
        if marker is not None and marker.startswith(_MARKER_HEAD):
            return None
        if listing.entries:
            _mark(root)
            return None
        try:
            names = sorted(os.listdir(root))
        except FileNotFoundError:
            return None
        except OSError as e:
            raise NbjitCacheError(f"cannot read the cache directory {root}: {e.strerror or e}") from None
        return next((n for n in names if not _TOP_NAME.fullmatch(n)), None)

    def prune(self, max_bytes: int | None = None, *, quiet: bool = False) -> int:
        """Remove least-recently-used entries until the cache (entries and temporary files)
        holds at most ``max_bytes`` (default: its own limit); first reclaims temporary files
        of writers that are gone, or older than an hour, and lock files nobody holds.
        Returns how many entries went."""
        if max_bytes is None:
            max_bytes = self.max_bytes
        if max_bytes is None or type(max_bytes) is bool or not isinstance(max_bytes, int) or max_bytes < 0:
            raise NbjitCacheError(f"prune needs a byte count >= 0, not {max_bytes!r}")
        if self._root is None:
            return 0
        n, _ = self._prune(self._scan(strict=not quiet), max_bytes, quiet)
        return n

    def _prune(self, listing: "_Listing", max_bytes: int, quiet: bool) -> tuple[int, int]:
        """``prune`` over a scan: (entries removed, bytes freed)."""
        freed = _reclaim(listing, max_age=3600)
        for f, _, _ in listing.locks:
            _remove_lock(f)
        total = listing.bytes - freed
        n, gone = 0, set()
        for f, size, _ in sorted(listing.entries, key=lambda t: t[2]):
            if total <= max_bytes:
                break
            try:
                f.unlink()
                n += 1
                gone.add(f.stem)
            except FileNotFoundError:
                pass
            except OSError as e:
                if not quiet:
                    raise NbjitCacheError(f"cannot remove {f}: {e.strerror}") from None
                continue
            total -= size
            freed += size
        if gone:
            _forget_calls(listing.calls, gone)
        return n, freed

    def export_archive(self, dest: str | os.PathLike | BinaryIO, *, archive_key: bytes | str | None = None,
                       archive_key_file: str | os.PathLike | None = None) -> int:
        """Write every entry that verifies into the tar archive ``dest`` (gzip-compressed): a
        path, or a binary file object it is streamed to (``sys.stdout.buffer``); returns how
        many. Corrupt entries are left out. With an archive key (``archive_key``,
        ``archive_key_file``, else ``NBJIT_CACHE_ARCHIVE_KEY_FILE`` or
        ``NBJIT_CACHE_ARCHIVE_KEY``) the archive ends with an HMAC-SHA256 signature of
        everything in it, which ``import_archive`` with the same key checks."""
        import io
        import tarfile
        if self.path is None:
            raise NbjitCacheError("cannot export: the disk cache is off (NBJIT_CACHE=0)")
        secret = _archive_key(archive_key, archive_key_file)
        mac = None if secret is None else hmac.new(secret, _SIGNATURE_CONTEXT, hashlib.sha256)
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
                    if mac is not None:
                        mac.update(_member_record(info.name, info.type, info.size))
                        mac.update(raw)
                    tar.addfile(info, io.BytesIO(raw))
                    n += 1
                if mac is not None:
                    sig = mac.hexdigest().encode()
                    info = tarfile.TarInfo(_SIGNATURE)
                    info.size, info.mtime, info.mode = len(sig), int(time.time()), 0o644
                    tar.addfile(info, io.BytesIO(sig))
        if hasattr(dest, "write"):  # a file object: written as it is (tar and gzip need no seeking)
            fill(dest)
            return n
        try:
            write_output(dest, fill)
        except OSError as e:
            raise NbjitCacheError(f"cannot write the cache archive {dest}: {e.strerror or e}") from None
        except ValueError as e:
            raise NbjitCacheError(f"cannot write the cache archive {dest}: it is {e}") from None
        return n

    def import_archive(self, src: str | os.PathLike | BinaryIO, *, archive_key: bytes | str | None = None,
                       archive_key_file: str | os.PathLike | None = None) -> "Imported":
        """Add the entries of an archive made by ``export_archive`` (a path, or a seekable
        binary file object), each verified again against its key; returns how many were new
        here and why others were refused (the first 1000 reasons, then how many more), an
        ``Imported`` pair whose ``present`` says how many this cache had already. An
        archive is trusted like code: an entry carries the image its key's compile will use.
        With an archive key (as for ``export_archive``) an archive not signed with that key
        is refused whole, before anything is imported. Archives that are not one (too large headers or descriptions,
        sparse members, damage) are an ``NbjitCacheError``."""
        if self.path is None:
            raise NbjitCacheError("cannot import: the disk cache is off (NBJIT_CACHE=0)")
        secret = _archive_key(archive_key, archive_key_file)
        if hasattr(src, "read"):
            name = getattr(src, "name", None)
            return self._import_file(src, name if isinstance(name, str) else "<archive>", secret)
        try:
            fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, ValueError) as e:
            raise NbjitCacheError(f"cannot read the cache archive {src}: {getattr(e, 'strerror', None) or e}") from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # (before fdopen, which refuses a directory with its own error)
            os.close(fd)
            what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise NbjitCacheError(f"{src} is {what}, so not a cache archive (give the file nbjit cache export wrote)")
        with os.fdopen(fd, "rb") as fobj:
            return self._import_file(fobj, src, secret)

    def _import_file(self, fobj, src, secret: bytes | None) -> "Imported":
        """``import_archive`` of the open, seekable archive ``fobj`` (``src`` names it)."""
        import tarfile
        start = fobj.tell()
        added = [0]  # entries imported so far (each checked whole: those before any damage are kept)
        try:
            digests = None if secret is None else _check_signature(fobj, secret)
            fobj.seek(start)
            return self._import_members(*_open_archive(fobj), digests, added)
        except _NotAnArchive as e:
            why = str(e)
        except _Damaged as e:
            why = f"a damaged cache archive ({e})"
        except RecursionError:
            why = "headers nested too deep, so not a cache archive"
        except (tarfile.TarError, *_stream_errors(), ValueError) as e:
            why = f"a damaged cache archive ({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})"
        n = added[0]
        kept = ("; 1 entry before it was imported, checked whole" if n == 1 else
                f"; {n} entries before it were imported, each checked whole" if n else "")
        raise NbjitCacheError(f"{src}: {why}{kept}")

    def _import_members(self, tar, limit: int, digests: list | None, added: list) -> "Imported":
        """``import_archive`` of an archive ``_open_archive`` opened (``limit``: its members'
        reach); ``digests``: what each member of a signed archive was when its signature was
        checked; ``added[0]`` counts the entries imported."""
        refused, more, present = [], 0, 0
        with tar:
            for i, m in enumerate(_members(tar, limit)):
                if m.isdir() or m.name == _SIGNATURE and m.isreg():
                    continue
                key = m.name[: -len(_SUFFIX)] if m.name.endswith(_SUFFIX) else ""
                why = ""
                if not (m.isreg() and _KEY.fullmatch(key)):
                    why = f"not a cache entry (expected <64 hex digits>{_SUFFIX})"
                elif m.size > _MAX_ENTRY_BYTES:
                    why = f"{m.size} bytes, more than an entry can be"
                elif self.read(key, warn=False) is None:
                    signed = None if digests is None else (m.name, m.type, digests[i] if i < len(digests) else b"")
                    why = self._import_entry(key, tar.extractfile(m), m.size, signed)
                    added[0] += not why
                else:
                    present += 1
                if why:
                    if len(refused) < _MAX_REFUSALS_LISTED:
                        refused.append(f"{_shown(m.name)}: {why}")
                    else:
                        more += 1
        if more:
            refused.append(f"... and {more} more members (reasons not listed)")
        return Imported(added[0], refused, present)

    def _import_entry(self, key: str, src, size: int, signed: tuple | None) -> str:
        """Copy one archive member of ``size`` bytes into the cache as the entry for ``key``,
        checked as it streams through; returns why it was refused, or "". ``signed``: the
        member's (name, type, digest) when the archive's signature was checked."""
        head = _read_exactly(src, min(size, _HEAD.size))
        dlen, check, why = _check_head(head)
        if why:
            return why
        if dlen > size - _HEAD.size:
            return "truncated description"
        if dlen > _MAX_DESC_BYTES:
            return f"a description of {dlen} bytes (nbjit reads at most {_MAX_DESC_BYTES})"
        desc = _read_exactly(src, dlen)
        f = self.file(key)
        try:
            tmp, fd = _new_temporary(f)
        except OSError as e:
            raise NbjitCacheError(f"cannot import into the cache {self.path}: {e.strerror or e}") from None
        try:
            payload = _hasher()
            whole = None
            if signed is not None:
                whole = _hasher()
                whole.update(_member_record(signed[0], signed[1], size))
                whole.update(head)
                whole.update(desc)
            with os.fdopen(fd, "wb") as out:
                out.write(head)
                out.write(desc)
                left = size - len(head) - dlen
                while left:
                    chunk = _read_exactly(src, min(left, _CHUNK))
                    payload.update(chunk)
                    if whole is not None:
                        whole.update(chunk)
                    out.write(chunk)
                    left -= len(chunk)
                if whole is not None and whole.digest() != signed[2]:
                    raise _NotAnArchive("changed while it was imported (it no longer matches its signature)")
                if _checksum(desc, payload.digest()) != check:
                    why = "checksum mismatch"
                else:
                    why = _describe(desc, key, size - _HEAD.size - dlen)[1]
                if not why:
                    out.flush()
                    os.fsync(out.fileno())
            if not why:
                os.replace(tmp, f)
        except OSError as e:
            _remove(tmp)
            raise NbjitCacheError(f"cannot import into the cache {self.path}: {e.strerror or e}") from None
        except BaseException:
            _remove(tmp)
            raise
        if why:
            _remove(tmp)
            return why
        self._wrote(size)
        return ""



@record(frozen=False)
class _Listing:
    """One scan of a cache directory: (file, bytes, mtime) of each kind of file in it."""

    entries: list = field(default_factory=list)
    temporary: list = field(default_factory=list)
    locks: list = field(default_factory=list)
    pch: list = field(default_factory=list)  # NVRTC precompiled headers, each its making process's (see pch.py)
    calls: list = field(default_factory=list)  # calls' digests -> their keys (``Cache.index``; not counted)

    @property
    def bytes(self) -> int:
        """What counts toward the size limit: entries and writers' temporary files."""
        return sum(e[1] for e in self.entries) + sum(t[1] for t in self.temporary)


# per cache directory, in this process: [bytes at the last scan (None: none yet), bytes written since]
_USAGE: dict[str, list] = {}
_USAGE_LOCK = threading.Lock()


def _call_key(f) -> str | None:
    """The key in the call file ``f`` (``Cache.index``), or None."""
    data = read_small(f, 64)
    key = data.decode("latin-1") if data is not None else ""
    return key if _KEY.fullmatch(key) else None


def read_small(f: str, limit: int) -> bytes | None:
    """The bytes of the small file ``f`` nbjit wrote (a call file, the toolchain's state), or
    None where it is missing, unreadable or over ``limit`` bytes: one read, no ``fstat``. (A
    FIFO is never waited on; a directory cannot be read; a device, or a file nbjit did not
    write, gives more than ``limit``.)"""
    try:
        fd = os.open(f, _READ_NONBLOCK)
    except (OSError, ValueError):
        return None
    try:
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def _forget_calls(calls: list, gone: set) -> None:
    """Remove the call files (``Cache.index``) that name a key in ``gone``."""
    for f, _, _ in calls:
        if _call_key(f) in gone:
            _remove(f)


def _reclaim(listing: _Listing, max_age: float) -> int:
    """Remove temporary files whose writer process is gone, or older than ``max_age``, and
    precompiled headers whose process is gone (only it could use them); returns the bytes
    of temporary files freed."""
    now, freed = time.time(), 0
    for t, size, mtime in listing.temporary:
        if (not _writer_alive(t.name) or now - mtime > max_age and max_age > 0) and _remove(t):
            freed += size
    for p, _, _ in listing.pch:
        if not _pch_writer_alive(p.name):
            _remove(p)
    return freed


def _pch_files(d: str) -> list[tuple[Path, int, float]]:
    """(file, bytes, mtime) of the precompiled headers in ``d`` (by the names nbjit gives them)."""
    out = []
    try:
        with os.scandir(d) as it:
            for e in it:
                if PCH_NAME.fullmatch(e.name):
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        out.append((Path(e.path), st.st_size, st.st_mtime))
    except OSError:
        pass
    return out


def _new_temporary(f: "Path | str") -> tuple[str, int]:
    """A new temporary file beside entry ``f`` (made with its directory), open for writing."""
    tmp = os.path.join(os.path.dirname(f), f"{_TMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}")
    # mode 0666 less the umask, as any file a user makes: a team can share a cache
    return tmp, _open_making_directory(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC)


@contextlib.contextmanager
def _key_lock(f: str | None, lock_timeout: float):
    """An exclusive ``flock`` on ``<key>.lock`` beside the entry file ``f`` (None: no lock)
    while the entry is made, so that processes asking for the same entry at once run the
    compiler once. The OS drops the lock of a process that dies; after ``lock_timeout``
    seconds a waiter goes on without it. The holder removes the file as it lets go (so none
    pile up), and a waiter that then holds a removed file's lock takes the one at the path
    instead."""
    fd = None
    if f is not None and fcntl is not None:
        lock = f[:-len(_SUFFIX)] + _LOCK_SUFFIX
        deadline = time.monotonic() + lock_timeout
        while fd is None:
            try:
                # never through a link: a planted one would make a file outside the cache
                fd = _open_making_directory(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                break  # an unwritable cache (no lock, as no write), or a link there: no lock
            if not _flock(fd, deadline):
                os.close(fd)  # a holder that takes too long: make it ourselves
                fd = None
                break
            if not _is_at(fd, lock):
                os.close(fd)  # its holder finished and removed it: lock the file there now
                fd = None
                if time.monotonic() >= deadline:
                    break
    try:
        yield
    finally:
        if fd is not None:
            if _is_at(fd, lock):
                _remove(lock)  # still holding it: a waiter that has it open sees it gone
            os.close(fd)  # closing releases the lock


def _open_making_directory(path: str, flags: int) -> int:
    """``os.open(path, flags, 0o666)`` of a file in a shard, making the shard where that is
    missing (and marking the cache directory with the first: ``_mark``)."""
    try:
        return os.open(path, flags, 0o666)
    except FileNotFoundError:
        shard = os.path.dirname(path)
        os.makedirs(shard, exist_ok=True)
        _mark(os.path.dirname(shard))
        return os.open(path, flags, 0o666)


def _mark(root: str) -> None:
    """Mark ``root`` as nbjit's cache directory (``_MARKER``) where it is not yet; nothing
    where that cannot be written (a read-only cache is read all the same)."""
    try:
        fd = os.open(os.path.join(root, _MARKER), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except OSError:
        return
    try:
        os.write(fd, _MARKER_TEXT)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_file(f: str, data: bytes) -> "tuple[OSError, bool] | None":
    """Write the entry file ``f`` whole or not at all: ``data`` in a temporary file beside
    it, synced, renamed into place. None where it was written, else (the OSError, whether
    the temporary file had been made)."""
    try:
        tmp, fd = _new_temporary(f)
    except OSError as e:
        return e, False
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, f)
    except OSError as e:
        _remove(tmp)
        return e, True
    except BaseException:
        _remove(tmp)
        raise
    return None


@record
class Written:
    """What a process that wrote the entry file for ``Cache.get_or_create`` sends back (a
    ``compile_many`` worker: ``write_entry`` under the caller's lock, or ``make_locked``
    under its own): the entry (with its facts), the bytes written (0: none), the failure
    (``_write_file``'s), where the remote tier takes them the file's bytes, and whether the
    entry was found on disk instead (made by another process: nothing written)."""

    entry: CacheEntry
    size: int = 0
    error: "tuple[OSError, bool] | None" = None
    data: bytes | None = None
    found: bool = False


def make_locked(key: str, file: str | None, lock_timeout: float, make: Callable[[], CacheEntry],
                keep: bool = False) -> Written:
    """What ``Cache.get_or_create`` does on a miss, done by the process that runs ``make``
    (a ``compile_many`` worker: its ``delegate``): the key's lock taken (``_key_lock``: the
    file ``file``'s lock, ``lock_timeout``), the file read again (another process may have
    made the entry: ``found``), else ``make()``'s entry written (``write_entry``)."""
    with _key_lock(file, lock_timeout):
        got = _read_entry(file) if file is not None else None
        if got is not None:
            entry = _decode(got[0], key)[0]
            if entry is not None:
                return Written(entry, found=True)
        return write_entry(key, make(), file, keep)


def write_entry(key: str, entry: CacheEntry, file: str | None, keep: bool) -> Written:
    """``entry`` encoded as the cache file for ``key`` and written to ``file`` (a
    ``Cache``'s ``_file(key)``; None: not written) as ``Cache._store`` writes it: a
    ``Written`` for ``get_or_create``, with the payload's digest (hashed to encode it) and,
    with ``keep``, the file's bytes."""
    data, digest = _encode_digest(key, entry)
    entry = replace(entry, payload_digest=digest)
    if file is None:
        return Written(entry, 0, None, data if keep else None)
    error = _write_file(file, data)
    return Written(entry, len(data) if error is None else 0, error, data if keep else None)


def _writer_alive(name: str) -> bool:
    """Whether the process that named this temporary file (.tmp-<pid>-...) still runs (a
    name of no pid, an older nbjit's, is reclaimed by age)."""
    return _pch_writer_alive(name[len(_TMP_PREFIX):])


def _remove(f) -> int:
    try:
        os.unlink(f)
        return 1
    except OSError:
        return 0


def _flock(fd: int, deadline: float) -> bool:
    """Take an exclusive ``flock`` on ``fd``, waiting until ``deadline`` (monotonic) at most."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def _is_at(fd: int, path) -> bool:
    """Whether the open file ``fd`` is still the one at ``path`` (not removed or replaced)."""
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _remove_lock(path) -> int:
    """Remove a lock file nobody holds (one a killed process left); a held one stays, so
    that nobody makes its entry a second time meanwhile. A link is removed, never followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return _remove(path) if e.errno == errno.ELOOP else 0
    try:
        if fcntl is None:
            return 0
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # held: an entry is being made
        return _remove(path) if _is_at(fd, path) else 0
    finally:
        os.close(fd)


def entry_file(f: Path) -> tuple[CacheEntry | None, str, bytes] | None:
    """An entry file on disk (``Cache.entries()``), checked: (the entry or None, why not, its
    bytes); None where it is gone or not a regular file."""
    got = _read_entry(f)
    if got is None:
        return None
    entry, why = _decode(got[0], f.stem, facts=False)
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


def _with(entry: CacheEntry, facts: "Facts | None") -> CacheEntry:
    """``entry`` carrying ``facts`` (as it is where they are None)."""
    return entry if facts is None else replace(entry, facts=facts)


def _encode(key: str, e: CacheEntry) -> bytes:
    return _encode_digest(key, e)[0]


def _encode_digest(key: str, e: CacheEntry) -> tuple[bytes, str]:
    """The entry file of ``e`` for ``key``, and its payload's ``content_digest``."""
    d = {"key": key, "kind": e.kind, "arch": e.arch, "lowered_names": e.lowered_names, "log": e.log,
         "producer": e.producer, "payload_bytes": len(e.payload)}
    if e.meta:
        d["meta"] = e.meta
    if e.facts is not None:
        from nbjit import _facts as facts  # (a cache that is only listed or cleared decodes no facts)
        try:
            d["facts"] = facts.keep(e.facts)
        except facts.FactsError:  # facts that cannot be kept: the entry without them (they are read again)
            pass
    desc = json.dumps(d, sort_keys=True).encode()
    payload_hash = content_hash(e.payload)
    check = _checksum(desc, payload_hash)
    return _HEAD.pack(_MAGIC, FORMAT_VERSION, len(desc), check) + desc + e.payload, payload_hash.hex()


def _check_head(head: bytes) -> tuple[int, bytes, str]:
    """An entry's header: (description length, checksum, ""), or why it is not one."""
    if len(head) < _HEAD.size:
        return 0, b"", "truncated header"
    magic, version, dlen, check = _HEAD.unpack_from(head)
    if magic != _MAGIC:
        return 0, b"", "wrong magic"
    if version != FORMAT_VERSION:
        return 0, b"", f"{OTHER_FORMAT} {version} (this nbjit's is {FORMAT_VERSION}): never read, it ages out"
    return dlen, check, ""


def _decode(raw: bytes, key: str, facts: bool = True) -> tuple[CacheEntry | None, str]:
    """The entry in ``raw``, or None and why not: anything that does not verify is a miss.
    ``facts``: decode the facts it keeps (None where this nbjit does not read them); False:
    the entry without them (checking, listing)."""
    dlen, check, why = _check_head(raw)
    if why:
        return None, why
    start = _HEAD.size + dlen  # where the payload starts (each part copied out once)
    if start > len(raw):
        return None, "truncated description"
    desc_bytes, payload = raw[_HEAD.size:start], raw[start:]
    payload_hash = content_hash(payload)
    if _checksum(desc_bytes, payload_hash) != check:
        return None, "checksum mismatch"
    desc, why = _describe(desc_bytes, key, len(payload))
    if desc is None:
        return None, why
    kept = None
    if facts and desc["facts"]:
        from nbjit._facts import read as read_facts
        kept = read_facts(desc["facts"], desc["kind"])
    meta = desc.get("meta")
    return CacheEntry(desc["kind"], desc["arch"], payload, desc["lowered_names"], desc["log"], desc["producer"],
                      kept, payload_hash.hex(), meta if type(meta) is dict else {}), ""


def _describe(desc_bytes: bytes, key: str, payload_bytes: int) -> tuple[dict | None, str]:
    """An entry's description, its optional fields filled in, or None and why it is not the
    one an entry for ``key`` with a payload of ``payload_bytes`` has."""
    try:
        text = desc_bytes.decode()
        desc, end = _SCAN(text, 0)
        if end != len(text):
            raise ValueError("more after the description")
    except (ValueError, RecursionError, StopIteration):
        return None, "unreadable description"
    if not isinstance(desc, dict):
        return None, "the description is not a JSON object"
    if desc.get("key") != key or desc.get("payload_bytes") != payload_bytes:
        return None, "entry does not belong to this key"
    names, log, producer = desc.get("lowered_names") or {}, desc.get("log", ""), desc.get("producer", "")
    facts = desc.get("facts", {})
    if desc.get("kind") not in _KINDS or not isinstance(desc.get("arch"), str):
        return None, f"kind {desc.get('kind')!r} / arch {desc.get('arch')!r} is not an image nbjit makes"
    if not (isinstance(names, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in names.items())
            and isinstance(log, str) and isinstance(producer, str) and isinstance(facts, dict)):
        return None, "malformed description"
    desc.update(lowered_names=names, log=log, producer=producer, facts=facts)
    return desc, ""


def _hasher():
    """``content_hash``, fed in parts."""
    return hashlib.blake2b(digest_size=32)


# ------------------------------------------------------------------ archives


class _NotAnArchive(Exception):
    """An archive import_archive refuses whole (the message says why)."""


class _Damaged(Exception):
    """An archive that cannot be read to its end."""


@functools.lru_cache(maxsize=None)
def _stream_errors() -> tuple:
    """What reading a damaged archive raises: the decompressors' errors (xz's is no OSError)."""
    import zlib
    try:
        from lzma import LZMAError
    except ImportError:  # (a Python without lzma: tarfile reads no xz)
        return OSError, EOFError, zlib.error
    return OSError, EOFError, zlib.error, LZMAError


def _read_exactly(src, n: int) -> bytes:
    """``n`` bytes of an archive member (``n`` bounded by the caller)."""
    try:
        data = src.read(n)
    except _stream_errors() as e:
        raise _Damaged(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from None
    if len(data) != n:
        raise _Damaged("a member shorter than its header says")
    return data


def _shown(name: str) -> str:
    """A member's name for a message: at most 100 characters, control characters escaped."""
    short = name if len(name) <= 100 else name[:100] + "..."
    return short if short.isprintable() else ascii(short)


def _member_record(name: str, type_: bytes, size: int) -> bytes:
    """What a signature covers of a member besides its bytes: its name, type and size."""
    raw = name.encode("utf-8", "surrogateescape")
    return struct.pack("<QQ", len(raw), size) + raw + type_


@functools.lru_cache(maxsize=None)
def _bounded_tarinfo():
    """tarfile's TarInfo, refusing what an nbjit archive never holds before tarfile reads
    it into memory: long-name and pax headers over a MiB, global headers over a MiB in all,
    and sparse members (their holes are read as zeros: a few KB claim gigabytes)."""
    import tarfile

    class BoundedTarInfo(tarfile.TarInfo):
        def _proc_member(self, tar):
            if self.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
                             tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE):
                if self.size > _MAX_HEADER_BYTES:
                    raise _NotAnArchive(f"a tar header of {self.size} bytes at offset {self.offset} (nbjit reads "
                                        f"at most {_MAX_HEADER_BYTES}), so not a cache archive")
                if self.type == tarfile.XGLTYPE:
                    seen = getattr(tar, "_nbjit_global_bytes", 0) + self.size
                    if seen > _MAX_GLOBAL_HEADER_BYTES:
                        raise _NotAnArchive(f"global tar headers of more than {_MAX_GLOBAL_HEADER_BYTES} bytes, "
                                            f"so not a cache archive")
                    tar._nbjit_global_bytes = seen
            elif self.type == tarfile.GNUTYPE_SPARSE:
                self._refuse_sparse()
            return super()._proc_member(tar)

        def _refuse_sparse(self, *_):
            raise _NotAnArchive(f"a sparse member at offset {self.offset} (nbjit never writes one), "
                                f"so not a cache archive")

        _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _refuse_sparse

    return BoundedTarInfo


def _open_archive(fobj):
    """``fobj`` (seekable, at the archive's start) opened as a tar archive (plain or
    compressed), headers bounded; and how far its members may reach into the archive
    decompressed (``_MAX_EXPANSION`` times its size), for ``_members``."""
    import tarfile
    start = fobj.tell()
    first = fobj.read(512)
    size = fobj.seek(0, os.SEEK_END) - start
    fobj.seek(start)
    if first and not first.strip(b"\0"):  # (tarfile reads zeros as an empty archive)
        raise _NotAnArchive("a file of zeros, so not a cache archive (make one with 'nbjit cache export')")
    try:
        tar = tarfile.open(fileobj=fobj, mode="r:*", tarinfo=_bounded_tarinfo())
    except tarfile.ReadError:
        raise _NotAnArchive("not a tar archive (plain, gzip, bzip2 or xz), so not a cache archive (make one "
                            "with 'nbjit cache export')") from None
    return tar, size * _MAX_EXPANSION + _EXPANSION_ROOM


def _members(tar, limit: int):
    """The members of ``tar`` one by one, none kept (tarfile keeps every one it has read: a
    small archive of millions of empty members would fill memory), each refused where it
    would end past ``limit`` bytes into the archive decompressed (``_open_archive``), before
    any of it is read or skipped: reading an archive takes time in proportion to its size."""
    while True:
        m = tar.next()
        tar.members.clear()
        if m is None:
            return
        if m.offset_data + m.size > limit:
            raise _NotAnArchive(f"member {_shown(m.name)} claims {m.size} bytes: the archive would expand to more "
                                f"than {_MAX_EXPANSION} times its size (gzip's most: export writes gzip), so not a "
                                "cache archive")
        yield m


def _check_signature(fobj, secret: bytes) -> list:
    """Check a signed archive against ``secret``: every member's (name, type, digest of its
    bytes), in order, for the import to match; ``_NotAnArchive`` where it is not signed with
    this key."""
    mac = hmac.new(secret, _SIGNATURE_CONTEXT, hashlib.sha256)
    digests, sig = [], None
    tar, limit = _open_archive(fobj)
    with tar:
        for m in _members(tar, limit):
            if sig is not None:
                raise _NotAnArchive("members after the archive's signature: not signed as a whole")
            if m.name == _SIGNATURE and m.isreg():
                sig = _read_exactly(tar.extractfile(m), min(m.size, 1024))
                digests.append(None)
                continue
            if m.isreg() and m.size > _MAX_ENTRY_BYTES:  # (never hashed: export writes no such member)
                raise _NotAnArchive(f"member {_shown(m.name)} of {m.size} bytes, more than an entry can be, so "
                                    "not a cache archive nbjit signed")
            record = _member_record(m.name, m.type, m.size)
            mac.update(record)
            h = _hasher()
            h.update(record)
            if m.isreg():
                f, left = tar.extractfile(m), m.size
                while left:
                    chunk = _read_exactly(f, min(left, _CHUNK))
                    mac.update(chunk)
                    h.update(chunk)
                    left -= len(chunk)
            digests.append(h.digest())
    if sig is None:
        raise _NotAnArchive("not signed (an archive key is set: only archives 'nbjit cache export' signed with "
                            "it are imported)")
    if not hmac.compare_digest(sig, mac.hexdigest().encode()):
        raise _NotAnArchive("signed with another key, or changed since it was signed: refused")
    return digests


def _archive_key(given: bytes | str | None, given_file: str | os.PathLike | None) -> bytes | None:
    """The archive key: ``given``, the file ``given_file``, else the environment's (the file
    ``NBJIT_CACHE_ARCHIVE_KEY_FILE`` or ``NBJIT_CACHE_ARCHIVE_KEY`` itself); None: unsigned.
    A key file is read with surrounding white space dropped. Messages never show a key."""
    if given is not None and given_file is not None:
        raise NbjitCacheError("give an archive key or a key file, not both")
    where = "the archive key"
    if given is None and given_file is None:
        env_file, env_key = os.environ.get(ARCHIVE_KEY_FILE_ENV), os.environ.get(ARCHIVE_KEY_ENV)
        if env_file is not None and env_key is not None:
            raise NbjitCacheError(f"both {ARCHIVE_KEY_FILE_ENV} and {ARCHIVE_KEY_ENV} are set: set one")
        for name, value in ((ARCHIVE_KEY_ENV, env_key), (ARCHIVE_KEY_FILE_ENV, env_file)):
            if value is not None and not value.strip():  # ("$(cat key)" of a file that could not be read)
                raise NbjitCacheError(f"{name} is set but empty: set it to the archive key"
                                      f"{' file' if name == ARCHIVE_KEY_FILE_ENV else ''}, or unset it to "
                                      "export and import unsigned archives")
        if env_key is not None:
            given, where = env_key.strip(), ARCHIVE_KEY_ENV  # (as a key file's: a trailing newline is no part)
        elif env_file is not None:
            given_file = env_file
            where = f"{ARCHIVE_KEY_FILE_ENV}={env_file}"
        else:
            return None
    if given_file is not None:
        where = where if where != "the archive key" else f"the archive key file {os.fspath(given_file)}"
        try:
            given = read_regular(given_file, 1 << 16).strip()
        except (OSError, ValueError) as e:
            raise NbjitCacheError(f"cannot read {where}: {getattr(e, 'strerror', None) or e}") from None
    if isinstance(given, str):
        given = given.encode()
    if not isinstance(given, (bytes, bytearray)):
        raise NbjitCacheError(f"an archive key is bytes or text, not {type(given).__name__}")
    if len(given) < _MIN_ARCHIVE_KEY:
        raise NbjitCacheError(f"{where} is {len(given)} bytes long; an archive key needs at least "
                              f"{_MIN_ARCHIVE_KEY} (e.g. 'head -c 32 /dev/urandom | base64 > key')")
    return bytes(given)


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
    caps its size (default 1 GiB); ``NBJIT_CACHE_REMOTE`` names a remote tier
    (``NBJIT_CACHE_REMOTE_WRITE=0``: read it only)."""
    if _DEFAULT:  # (made: no lock on every call; a list's read is atomic)
        try:
            return _DEFAULT[0]
        except IndexError:  # replaced meanwhile: the lock below waits for the new one
            pass
    with _DEFAULT_LOCK:
        if not _DEFAULT:
            remote = None
            if os.environ.get("NBJIT_CACHE_REMOTE", "").strip():
                from nbjit.remote import tier_from_env
                remote = tier_from_env()
            _DEFAULT.append(Cache(_location_from_env(), max_bytes=_limit_from_env(), remote=remote))
        return _DEFAULT[0]


def _tier(remote, write: bool | None) -> "RemoteTier | None":
    """``Cache(remote=..., remote_write=...)`` as a tier, or None."""
    if remote is None:
        if write is not None:
            raise NbjitCacheError("remote_write applies to a cache with a remote tier (remote=...)")
        return None
    from nbjit.remote import RemoteTier
    if isinstance(remote, RemoteTier):
        if write is not None:
            if not isinstance(write, bool):
                raise NbjitCacheError(f"remote_write is True or False, not {write!r}")
            remote.write = write
        return remote
    if isinstance(remote, os.PathLike):
        remote = Path(remote).absolute().as_uri()
    if not isinstance(remote, str):
        raise NbjitCacheError(f"a cache's remote is a URL (s3://bucket/prefix) or an nbjit.RemoteTier, not "
                              f"{type(remote).__name__}")
    return RemoteTier(remote, write=write)


_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*(?:([kmgt])i?)?b?", re.I)


def parse_size(text: str) -> int | None:
    """A byte count written as ``1073741824``, ``100k``, ``512M``, ``1G``, ``1.5GiB`` (K, M,
    G, T: powers of 1024); None if ``text`` is not one."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        return None
    return int(float(m[1]) * 1024 ** ("kmgt".index(m[2].lower()) + 1 if m[2] else 0))


class Imported(tuple):
    """What ``Cache.import_archive`` did: the pair (entries added, reasons others were
    refused), which unpacks as such, and ``present``: the archive's entries the cache had."""

    present: int

    def __new__(cls, added: int, refused: list[str], present: int) -> "Imported":
        self = super().__new__(cls, (added, refused))
        self.present = present
        return self

    def __reduce__(self):
        return Imported, (self[0], self[1], self.present)


def format_size(n: int) -> str:
    """``n`` bytes as a person reads them, in units ``parse_size`` takes (powers of 1024):
    ``871 bytes``, ``366.7 KiB``, ``1 GiB``."""
    if n < 1024:
        return f"{n} byte{'s' * (n != 1)}"
    power = 1
    while power < 4 and round(n / 1024 ** power, 1) >= 1024:
        power += 1
    value = n / 1024 ** power
    return (f"{value:.0f}" if n % 1024 ** power == 0 else f"{value:.1f}") + f" {'KMGT'[power - 1]}iB"


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
