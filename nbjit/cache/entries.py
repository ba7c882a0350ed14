"""A cache entry and its file: ``CacheEntry`` (what a compile made: the payload, its kind and
architecture, the compiler's log and lowered names, the facts nbjit read of it) and the
self-checking file it is kept in: a fixed header (magic, format version, the length of a
JSON description, a BLAKE2b checksum over the description and the payload's digest), the
description, the payload. Anything that does not verify is no entry."""
from __future__ import annotations

import hashlib
import json
import json.encoder
import os
import re
import secrets
import struct
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from nbjit.read.image import content_digest, content_hash
from nbjit.files import read_regular_stat
from nbjit.records import field, record

if TYPE_CHECKING:
    from nbjit.cache.facts import Facts

__all__ = ["CacheEntry", "FORMAT_VERSION", "entry_file"]

FORMAT_VERSION = 3  # 3: the checksum over the payload's digest; 2: BLAKE2b-256 keys and checksums (1: SHA-256)
OTHER_FORMAT = "cache format"  # how a reason given for an entry of another format begins
_MAGIC = b"NBJITC\x00\x01"


_HEAD = struct.Struct("<8sII32s")  # magic, format version, description length, checksum


_SUFFIX = ".nbjit"


_READ_NONBLOCK = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)


_KEY = re.compile(r"[0-9a-f]{64}")


_MAX_ENTRY_BYTES = 1 << 30  # far past any cubin: a bigger file is not an entry


_KINDS = ("cubin", "ptx", "ltoir", "tuning")  # (LTO-IR: what nbjit.link_image links; tuning: an answer, JSON)


_MAX_DESC_BYTES = 16 << 20  # an entry's JSON description (one kernel's: ~2 KB)


@record
class CacheEntry:
    """What a cache entry holds: the produced image and what came with it."""

    kind: str  # "cubin", "ptx", "ltoir" or "tuning" (nbjit.tune's answer: JSON, tuning/answers.py)
    arch: str
    payload: bytes
    lowered_names: dict = field(default_factory=dict)
    log: str = ""
    producer: str = ""
    # what nbjit read from the payload and its source (``facts.Facts``), decoded; None where
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
        from nbjit.cache import facts  # (a cache that is only listed or cleared decodes no facts)
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
        from nbjit.cache.facts import read as read_facts
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
        return None, f"kind {desc.get('kind')!r} / arch {desc.get('arch')!r} is not an entry nbjit makes"
    if not (isinstance(names, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in names.items())
            and isinstance(log, str) and isinstance(producer, str) and isinstance(facts, dict)):
        return None, "malformed description"
    desc.update(lowered_names=names, log=log, producer=producer, facts=facts)
    return desc, ""


def _hasher():
    """``content_hash``, fed in parts."""
    return hashlib.blake2b(digest_size=32)


_LOCK_SUFFIX = ".lock"


_TMP_PREFIX = ".tmp-"  # .tmp-<writer pid>-<12 random hex digits>: a writer that is gone leaves one to reclaim


_SHARD = re.compile(r"[0-9a-f]{2}")


PCH_DIR = "pch"  # the cache directory's subdirectory for PCH files (toolchain.pch writes them)


PCH_NAME = re.compile(r"\d+-\d+-[0-9a-f]{32}\.pch")  # what ``Store.path_for`` names a PCH file (pid-generation-key)


def writer_alive(name: str) -> bool:
    """Whether the process that named a file ``<pid>-...`` (a PCH file, a cache's temporary
    file without its prefix) still runs."""
    try:
        pid = int(name.split("-", 1)[0])
    except ValueError:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


# the marker of a cache directory (the Cache Directory Tagging Specification's: backup tools
# skip such a directory), written with its first shard; ``clear`` refuses a directory without it
_MARKER = "CACHEDIR.TAG"


_MARKER_HEAD = b"Signature: 8a477f597d28d172789f06886806bc55\n# This file is a cache directory tag created by nbjit."


_MARKER_TEXT = _MARKER_HEAD + b"\n# For information about cache directory tags, see https://bford.info/cachedir/\n"


def _new_temporary(f: "Path | str") -> tuple[str, int]:
    """A new temporary file beside entry ``f`` (made with its directory), open for writing."""
    tmp = os.path.join(os.path.dirname(f), f"{_TMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}")
    # mode 0666 less the umask, as any file a user makes: a team can share a cache
    return tmp, _open_making_directory(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC)


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


def _remove(f) -> int:
    try:
        os.unlink(f)
        return 1
    except OSError:
        return 0


# What a key's fields mean: bump by hand where a producer's key holds the same fields with
# another meaning (2: "includes" names every file NVRTC reads, found as NVRTC finds it).
KEY_SCHEMA_VERSION = 2


def cache_key(fields: dict) -> str:
    """The BLAKE2b-256 (``content_digest``) of a canonical JSON of everything that changes an
    output, plus the cache format and key schema versions (a new format never reads an old
    entry; a key whose fields mean something new never finds one made under the old meaning)."""
    return content_digest(_KEY_JSON({"format": FORMAT_VERSION, "schema": KEY_SCHEMA_VERSION, **fields}).encode())
