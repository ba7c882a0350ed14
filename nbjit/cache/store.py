"""The content-addressed cache for everything nbjit produces (NVRTC output, PTX assembled to
cubins by nvJitLink, LTO-IR, linked cubins): ``Cache``, an in-process layer over a directory
of self-checking entry files (``entries.py``), behind which an optional remote tier
(``remote.py``: the same files in an object store) is looked in on a miss and given what is
compiled here.

Whether something was made before is answered by ``Cache.get_or_create``: the memory, the
directory, the remote tier, in that order, under the key's lock (``locks.py``) for what is
made here. Files are written to a temporary name and renamed into place, so a reader sees a
whole entry or none; anything that does not verify is a miss (rebuilt and replaced, with one
warning). The directory's size is kept under its limit by pruning the least recently used
entries; its archives are ``archives.py``'s.
"""
from __future__ import annotations

import errno
import os
import random
import re
import stat
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable

from nbjit.cache.entries import (
    _KEY, _LOCK_SUFFIX, _MARKER, _MARKER_HEAD, _MAX_ENTRY_BYTES, _READ_NONBLOCK, _SHARD, _SUFFIX, _TMP_PREFIX,
    FORMAT_VERSION, KEY_SCHEMA_VERSION, PCH_DIR, PCH_NAME, CacheEntry, _decode, _encode, _encode_digest, _mark,
    _new_temporary, _read_entry, _remove, _with, cache_key, entry_file, writer_alive)
from nbjit.cache.locks import _key_lock, _remove_lock, _writer_alive
from nbjit import errors
from nbjit.errors import NbjitCacheError
from nbjit.records import field, record

if TYPE_CHECKING:
    from nbjit.cache.archives import Imported
    from nbjit.cache.facts import Facts
    from nbjit.cache.remote import RemoteTier

__all__ = ["Cache", "CacheEntry", "default_cache", "set_default_cache", "cache_key", "FORMAT_VERSION",
           "KEY_SCHEMA_VERSION"]

_CALL_SUFFIX = ".call"  # an older nbjit's call index (a call's digest -> its key): removed by prune and clear
_TOUCH_AFTER = 3600.0  # seconds: a hit on an entry older than this marks it used (pruning order)
DEFAULT_MAX_BYTES = 1 << 30
_MEMORY_ENTRIES = 512


# the files nbjit makes in a shard <key[:2]>: entries, their locks, call files (an older nbjit's)
# and writers' temporary files (``_new_temporary``); nothing else there is listed or removed
_SHARD_FILE = re.compile(rf"([0-9a-f]{{64}})({re.escape(_SUFFIX)}|{re.escape(_LOCK_SUFFIX)}|{re.escape(_CALL_SUFFIX)})"
                         rf"|{re.escape(_TMP_PREFIX)}\d+-[0-9a-f]{{12}}")
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
               warn: bool = True, *, remote: bool = False) -> CacheEntry | None:
        """``get_or_create``'s look-up without a make: the entry for ``key`` in memory or on
        disk (with its facts, as ``get_or_create`` keeps them), or None. ``remote=True``: on a
        miss, the remote tier's entry (kept on disk), where there is a tier. ``warn=False``: a
        corrupt entry is a miss without a warning (the look-up that follows warns)."""
        with self._lock:
            hit = self._mem.get(key)
            if hit is not None:
                self._mem.move_to_end(key)
        if hit is not None:
            return hit if hit.facts is not None or derive is None else self._with_facts(key, hit, derive)
        entry = self.read(key, warn)
        if entry is None and remote and self.remote is not None:
            entry = self._from_remote(key)
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
                errors.warn(f"nbjit cache: entry {f} is corrupt ({why}); rebuilding it")
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

    def put(self, key: str, entry: CacheEntry, *, replace: bool = False) -> None:
        """Keep ``entry`` for ``key`` here (in memory and on disk, over an entry there) and
        give it to the remote tier where there is one that is written to (``replace``: over
        the object there; a tier that refuses is warned about, and the entry stays here)."""
        self.write(key, entry, refresh=True)
        if self.remote is None or not self.remote.write:
            return
        data = _encode(key, entry)
        if not replace:
            self.remote.put(key, data)
            return
        try:
            self.remote.publish(key, data, overwrite=True)
        except NbjitCacheError as e:
            errors.warn(f"nbjit cache: {e}; the entry is kept in {self.path or 'memory'} only")

    def forget(self, keys: "set[str] | None" = None) -> None:
        """Drop ``keys`` (all: None) from this process's memory of entries (their files stay:
        after removing files, so that no look-up finds them in memory)."""
        with self._lock:
            if keys is None:
                self._mem.clear()
            else:
                for k in keys:
                    self._mem.pop(k, None)

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
            self.note_written(size)
        return bool(size)

    def note_written(self, n: int) -> None:
        """Count ``n`` bytes this process added to the directory (an entry written, one
        imported from an archive); prune when a scan is due (see _SCAN_FRACTION)."""
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
            errors.warn(f"nbjit cache: cannot write to {self.path} ({e.strerror or e}); going on without the "
                        "disk cache")
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
            from nbjit.cache.remote import REMOTE_ENV
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
        for f, _, _ in listing.calls:  # (an older nbjit's call index: nothing reads its files)
            _remove(f)
        return n, freed

    def export_archive(self, dest: str | os.PathLike | BinaryIO, *, archive_key: bytes | str | None = None,
                       archive_key_file: str | os.PathLike | None = None) -> int:
        """Write every entry that verifies into the tar archive ``dest`` (gzip-compressed): a
        path, or a binary file object it is streamed to (``sys.stdout.buffer``); returns how
        many. Corrupt entries are left out. With an archive key (``archive_key``,
        ``archive_key_file``, else ``NBJIT_CACHE_ARCHIVE_KEY_FILE`` or
        ``NBJIT_CACHE_ARCHIVE_KEY``) the archive ends with an HMAC-SHA256 signature of
        everything in it, which ``import_archive`` with the same key checks."""
        from nbjit.cache.archives import export_archive
        return export_archive(self, dest, archive_key=archive_key, archive_key_file=archive_key_file)

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
        from nbjit.cache.archives import import_archive
        return import_archive(self, src, archive_key=archive_key, archive_key_file=archive_key_file)


@record(frozen=False)
class _Listing:
    """One scan of a cache directory: (file, bytes, mtime) of each kind of file in it."""

    entries: list = field(default_factory=list)
    temporary: list = field(default_factory=list)
    locks: list = field(default_factory=list)
    pch: list = field(default_factory=list)  # NVRTC precompiled headers, each its making process's (see pch.py)
    calls: list = field(default_factory=list)  # an older nbjit's call files (not counted; prune removes them)

    @property
    def bytes(self) -> int:
        """What counts toward the size limit: entries and writers' temporary files."""
        return sum(e[1] for e in self.entries) + sum(t[1] for t in self.temporary)


# per cache directory, in this process: [bytes at the last scan (None: none yet), bytes written since]
_USAGE: dict[str, list] = {}
_USAGE_LOCK = threading.Lock()


def read_small(f: str, limit: int) -> bytes | None:
    """The bytes of the small file ``f`` nbjit wrote (the toolchain's identities), or
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


def _reclaim(listing: _Listing, max_age: float) -> int:
    """Remove temporary files whose writer process is gone, or older than ``max_age``, and
    precompiled headers whose process is gone (only it could use them); returns the bytes
    of temporary files freed."""
    now, freed = time.time(), 0
    for t, size, mtime in listing.temporary:
        if (not _writer_alive(t.name) or now - mtime > max_age and max_age > 0) and _remove(t):
            freed += size
    for p, _, _ in listing.pch:
        if not writer_alive(p.name):
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


# ------------------------------------------------------------------ archives


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
                from nbjit.cache.remote import tier_from_env
                remote = tier_from_env()
            _DEFAULT.append(Cache(_location_from_env(), max_bytes=_limit_from_env(), remote=remote))
        return _DEFAULT[0]


def _tier(remote, write: bool | None) -> "RemoteTier | None":
    """``Cache(remote=..., remote_write=...)`` as a tier, or None."""
    if remote is None:
        if write is not None:
            raise NbjitCacheError("remote_write applies to a cache with a remote tier (remote=...)")
        return None
    from nbjit.cache.remote import RemoteTier
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
