"""A tuning answer as a cache entry: the winning choices of a search, kept under a key made of
what decides them (the GPU's name and architecture, the driver's version, the target, the
space, the metric, the user's key), so that it is exported, imported, shared through the
remote tier and shipped in bundles as any compiled kernel is. The entry's kind is
``"tuning"``, its payload the answer as JSON."""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Mapping

from nbjit.cache.entries import CacheEntry, entry_file
from nbjit.cache.store import Cache, cache_key
from nbjit.errors import NbjitTuneError
from nbjit.records import field, record

__all__ = ["Answer", "KIND", "answer_key", "user_key", "store", "find", "listed", "remove", "named"]

KIND = "tuning"
_SCHEMA = 1  # what an answer's key fields mean; bump where they change meaning


@record
class Answer:
    """What a search found: the winning ``config``, its time, and what the search was."""

    config: dict  # the winning choices
    ms: float  # its median time per launch, milliseconds
    device: dict  # {"name", "arch", "driver"}
    target: str  # how the target was named ("block_sum<{BLOCK}, {ITEMS}> in reduce.cu")
    key: Any  # the user's key, as JSON data
    space: dict  # the space searched (Space.to_json)
    counts: dict = field(default_factory=dict)  # {"variants", "timed", "pruned", "failed"}
    made: str = ""  # when (UTC, ISO 8601)
    # what makes the winner again with a cache hit: a template's program's name expressions
    program: dict = field(default_factory=dict)
    times: dict = field(default_factory=dict)  # {variant label: ms} of the variants timed

    def to_json(self) -> dict:
        return {"config": self.config, "ms": self.ms, "device": self.device, "target": self.target, "key": self.key,
                "space": self.space, "counts": self.counts, "made": self.made, "program": self.program,
                "times": self.times}

    @classmethod
    def from_json(cls, d: Any) -> "Answer":
        if not (isinstance(d, dict) and isinstance(d.get("config"), dict) and isinstance(d.get("ms"), (int, float))):
            raise ValueError("not a tuning answer")
        return cls(d["config"], float(d["ms"]), dict(d.get("device") or {}), str(d.get("target", "")), d.get("key"),
                   dict(d.get("space") or {}), dict(d.get("counts") or {}), str(d.get("made", "")),
                   dict(d.get("program") or {}), dict(d.get("times") or {}))


def user_key(key: Any) -> Any:
    """The user's key as JSON data (tuples as lists), checked: None, bools, ints, finite
    floats, strings, and lists and str-keyed dicts of them."""
    def plain(v, depth=0):
        if depth > 16:
            raise NbjitTuneError("tune: key= nests too deep")
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            if not math.isfinite(v):
                raise NbjitTuneError(f"tune: key= holds {v!r}: a key's numbers are finite")
            return v
        if isinstance(v, (list, tuple)):
            return [plain(x, depth + 1) for x in v]
        if isinstance(v, Mapping) and all(isinstance(k, str) for k in v):
            return {k: plain(x, depth + 1) for k, x in v.items()}
        raise NbjitTuneError(f"tune: key= holds a {type(v).__name__} ({v!r}); a key is made of None, bools, ints, "
                             "floats, strings, and lists and str-keyed dicts of them (a shape bucket: (1024, 'f32'))")
    return plain(key)


def answer_key(device: Mapping, target: Mapping, space: Mapping, metric: str, key: Any) -> str:
    """The cache key of the answer to one search question."""
    return cache_key({"tuning": _SCHEMA, "device": dict(device), "target": dict(target), "space": dict(space),
                      "metric": metric, "key": key})


def store(cache: Cache, key: str, answer: Answer, *, replace: bool = False) -> None:
    """Keep ``answer`` under ``key``: in the cache's memory, its directory, and its remote
    tier (where one is written to; ``replace``: over an answer already there)."""
    cache.put(key, CacheEntry(KIND, answer.device.get("arch", ""), _payload(answer), producer="nbjit.tune"),
              replace=replace)


def _payload(answer: Answer) -> bytes:
    return json.dumps(answer.to_json(), sort_keys=True, separators=(",", ":")).encode()


def find(cache: Cache, key: str) -> Answer | None:
    """The answer kept under ``key`` (memory, directory, then the remote tier), or None."""
    entry = cache.lookup(key, remote=True)
    return None if entry is None else decode(entry)


def decode(entry: CacheEntry) -> Answer | None:
    """The answer an entry holds; None where it is not one (another kind, or unreadable)."""
    if entry.kind != KIND:
        return None
    try:
        return Answer.from_json(json.loads(entry.payload))
    except (ValueError, UnicodeDecodeError):
        return None


def listed(cache: Cache) -> list[tuple[str, Answer, float]]:
    """Every answer in the cache's directory: (its key, the answer, its file's modification
    time), oldest first."""
    out = []
    for f, _size, mtime in cache.entries():
        got = entry_file(f)
        if got is None or got[0] is None:
            continue
        answer = decode(got[0])
        if answer is not None:
            out.append((f.stem, answer, mtime))
    return sorted(out, key=lambda t: t[2])


def named(cache: Cache, prefix: str) -> tuple[str, Answer]:
    """The answer whose key starts with ``prefix`` (4 or more hex digits, as ``nbjit tune
    --list`` shows keys), and its whole key."""
    if len(prefix) < 4 or any(ch not in "0123456789abcdef" for ch in prefix):
        raise NbjitTuneError(f"{prefix!r} is not an answer's key: give its first hex digits (4 or more), as "
                             "nbjit tune --list shows them")
    hits = [(k, a) for k, a, _ in listed(cache) if k.startswith(prefix)]
    if not hits:
        raise NbjitTuneError(f"no tuning answer's key starts with {prefix} in {cache.path} (nbjit tune --list shows "
                             "them)")
    if len(hits) > 1:
        raise NbjitTuneError(f"{len(hits)} answers' keys start with {prefix}: give more digits")
    return hits[0]


def remove(cache: Cache, keys: list[str] | None = None) -> int:
    """Remove the answers of ``keys`` (every answer: None) from the cache's directory; how
    many were removed. Compiled kernels stay."""
    n = 0
    wanted = None if keys is None else set(keys)
    for key, _answer, _ in listed(cache):
        if wanted is None or key in wanted:
            try:
                os.unlink(cache.file(key))
                n += 1
            except OSError:
                pass
    cache.forget(wanted)
    return n


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
