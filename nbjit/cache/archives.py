"""Cache archives: ``nbjit cache export`` / ``import`` (``Cache.export_archive``,
``Cache.import_archive``): the verified entries of a cache in a tar archive (gzip), signed
with an archive key where one is set (HMAC-SHA256 over every member), and read back with
every bound an archive could break: header sizes, members claiming more than the archive can
expand to, sparse members, damage, a signature that does not hold."""
from __future__ import annotations

import functools
import hashlib
import hmac
import io
import os
import stat
import struct
import tarfile
import time
from typing import TYPE_CHECKING, BinaryIO

from nbjit.files import read_regular, write_file
from nbjit.cache.entries import (
    _HEAD, _KEY, _MAX_DESC_BYTES, _MAX_ENTRY_BYTES, _SUFFIX, _check_head, _checksum, _describe, _hasher,
    _new_temporary, _remove, entry_file)
from nbjit.errors import NbjitCacheError

if TYPE_CHECKING:
    from nbjit.cache.store import Cache

__all__ = ["export_archive", "import_archive", "Imported", "ARCHIVE_KEY_ENV", "ARCHIVE_KEY_FILE_ENV"]

# archives (import_archive): what one member or header may be, before any of it is read
_MAX_HEADER_BYTES = 1 << 20  # a GNU long name or pax header (export writes none; a real one is < 1 KiB)


_MAX_GLOBAL_HEADER_BYTES = 1 << 20  # all global pax headers together (each is kept for every later member)


# what an archive may expand to: deflate (export writes gzip) expands at most 1032 times, and
# a small archive's tar headers and padding need some room
_MAX_EXPANSION = 1032


_EXPANSION_ROOM = 1 << 20


_SIGNATURE = "nbjit-archive.hmac-sha256"  # the signature member: the last of a signed archive


_SIGNATURE_CONTEXT = b"nbjit cache archive signature 1\0"


_MIN_ARCHIVE_KEY = 16  # bytes: shorter secrets are guessable


ARCHIVE_KEY_ENV = "NBJIT_CACHE_ARCHIVE_KEY"


ARCHIVE_KEY_FILE_ENV = "NBJIT_CACHE_ARCHIVE_KEY_FILE"


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


class BoundedTarInfo(tarfile.TarInfo):
    """tarfile's TarInfo, refusing what an nbjit archive never holds before tarfile reads
    it into memory: long-name and pax headers over a MiB, global headers over a MiB in all,
    and sparse members (their holes are read as zeros: a few KB claim gigabytes)."""

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


def _open_archive(fobj):
    """``fobj`` (seekable, at the archive's start) opened as a tar archive (plain or
    compressed), headers bounded; and how far its members may reach into the archive
    decompressed (``_MAX_EXPANSION`` times its size), for ``_members``."""
    start = fobj.tell()
    first = fobj.read(512)
    size = fobj.seek(0, os.SEEK_END) - start
    fobj.seek(start)
    if first and not first.strip(b"\0"):  # (tarfile reads zeros as an empty archive)
        raise _NotAnArchive("a file of zeros, so not a cache archive (make one with 'nbjit cache export')")
    try:
        tar = tarfile.open(fileobj=fobj, mode="r:*", tarinfo=BoundedTarInfo)
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


_CHUNK = 1 << 20  # members are copied through this much memory at a time
_MAX_REFUSALS_LISTED = 1000


def export_archive(cache: "Cache", dest: str | os.PathLike | BinaryIO, *, archive_key: bytes | str | None = None,
               archive_key_file: str | os.PathLike | None = None) -> int:
    """``cache.export_archive(dest, ...)`` (``Cache.export_archive`` documents it): its
    entries that verify, written as a gzip-compressed tar archive; how many."""
    if cache.path is None:
        raise NbjitCacheError("cannot export: the disk cache is off (NBJIT_CACHE=0)")
    secret = _archive_key(archive_key, archive_key_file)
    mac = None if secret is None else hmac.new(secret, _SIGNATURE_CONTEXT, hashlib.sha256)
    n = 0

    def fill(out) -> None:
        nonlocal n
        with tarfile.open(fileobj=out, mode="w:gz") as tar:
            for f, _, _ in cache.entries():
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
    write_file(dest, fill, NbjitCacheError, f"the cache archive {os.fsdecode(dest)}")
    return n

def import_archive(cache: "Cache", src: str | os.PathLike | BinaryIO, *, archive_key: bytes | str | None = None,
                   archive_key_file: str | os.PathLike | None = None) -> "Imported":
    """``cache.import_archive(src, ...)`` (``Cache.import_archive`` documents it): the
    archive's entries verified and added."""
    if cache.path is None:
        raise NbjitCacheError("cannot import: the disk cache is off (NBJIT_CACHE=0)")
    secret = _archive_key(archive_key, archive_key_file)
    if hasattr(src, "read"):
        name = getattr(src, "name", None)
        return _import_file(cache, src, name if isinstance(name, str) else "<archive>", secret)
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
        return _import_file(cache, fobj, src, secret)

def _import_file(cache: "Cache", fobj, src, secret: bytes | None) -> "Imported":
    """``import_archive`` of the open, seekable archive ``fobj`` (``src`` names it)."""
    start = fobj.tell()
    added = [0]  # entries imported so far (each checked whole: those before any damage are kept)
    try:
        digests = None if secret is None else _check_signature(fobj, secret)
        fobj.seek(start)
        return _import_members(cache, *_open_archive(fobj), digests, added)
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

def _import_members(cache: "Cache", tar, limit: int, digests: list | None, added: list) -> "Imported":
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
            elif cache.read(key, warn=False) is None:
                signed = None if digests is None else (m.name, m.type, digests[i] if i < len(digests) else b"")
                why = _import_entry(cache, key, tar.extractfile(m), m.size, signed)
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

def _import_entry(cache: "Cache", key: str, src, size: int, signed: tuple | None) -> str:
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
    f = cache.file(key)
    try:
        tmp, fd = _new_temporary(f)
    except OSError as e:
        raise NbjitCacheError(f"cannot import into the cache {cache.path}: {e.strerror or e}") from None
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
        raise NbjitCacheError(f"cannot import into the cache {cache.path}: {e.strerror or e}") from None
    except BaseException:
        _remove(tmp)
        raise
    if why:
        _remove(tmp)
        return why
    cache.note_written(size)
    return ""
