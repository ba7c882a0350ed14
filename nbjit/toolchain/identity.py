"""What a compile's toolchain is, wherever it is installed: the NVRTC and nvJitLink libraries
a compile may load (found without loading them), each identified by its GNU build ID (a
content digest where it has none), CUDA's headers by their version, CCCL's by its version
header. No path, file time or environment variable is in an identity, so that machines,
venvs and containers with the same wheels share cache entries. An identity read once is
remembered in the default cache's directory (``toolchain-ids.json``) by the file's inode,
size and times, so that a warm start opens one small file instead of each library."""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import stat
import sys
import threading

from nbjit.cache import store as _cache
from nbjit.cache.entries import _SCAN
from nbjit.cache.store import default_cache
from nbjit.read.elf import gnu_build_id
from nbjit.read.image import content_digest
from nbjit.files import read_regular

__all__ = ["cuda_include_dir", "cccl_include_dir"]

_FINGERPRINTS: dict = {}  # library -> fingerprint: computed once per process
# Where pip wheels put each library (under an ``nvidia`` directory on sys.path), and the file
# names a search for it can load (its sonames and plain name).
_WHEEL_LIB_DIRS = {"nvrtc": ("cu13", "cu12", "cuda_nvrtc"), "nvJitLink": ("cu13", "cu12", "nvjitlink")}


_SONAMES = (".so.13", ".so.12", ".so")


_STDLIB = os.path.dirname(os.__file__)


_NOT_WHEEL_DIRS = (_STDLIB, f"{_STDLIB}/lib-dynload")  # where pip installs nothing


@functools.lru_cache(maxsize=None)
def _nvidia_dirs() -> tuple[str, ...]:
    """The ``nvidia`` package directories of the pip wheels on sys.path (not looked for in
    zip files or the standard library's own directories, where pip installs nothing)."""
    out: list[str] = []
    for p in sys.path:
        if p and p not in _NOT_WHEEL_DIRS and not p.endswith(".zip"):
            d = f"{p}/nvidia"  # (f-strings: the warm path's joins, cold)
            if d not in out and _dir_exists(d):
                out.append(d)
    return tuple(out)


def _dir_exists(path: str) -> bool:
    """``os.path.isdir``, without an exception where nothing is there (most of sys.path holds no
    ``nvidia`` directory: a raised and caught error each, on a warm start); not noted for the
    call index (``_isdir`` is: the state keeps the directories found instead)."""
    try:
        return os.access(f"{path}/", os.F_OK)  # (the slash: a file there is no directory)
    except (ValueError, TypeError):  # (a NUL in the path)
        return False


def _site_dir(nvidia_dir: str) -> bool:
    """Whether an ``nvidia`` directory is in a site-packages directory, where cuda.bindings
    (cuda-pathfinder) looks for wheels before the system's libraries."""
    return os.path.basename(os.path.dirname(nvidia_dir)) in ("site-packages", "dist-packages")


def _copies(dirs, lib: str) -> list[tuple[str, os.stat_result]]:
    """The files in ``dirs`` named as ``lib`` can be loaded (each file once, however linked),
    with their ``os.stat`` (what their remembered identity is checked against)."""
    seen: list[tuple[str, os.stat_result]] = []
    for d in dirs:
        if not _isdir(d):
            continue
        for suffix in _SONAMES:
            f = f"{d}/lib{lib}{suffix}"
            st = _stat(f)
            if st is not None and stat.S_ISREG(st.st_mode) and all(f != g for g, _ in seen):
                seen.append((f, st))
    return seen


def _toolchain_copies(lib: str = "nvrtc") -> list[str]:
    """The copies of the library ``lib`` ("nvrtc" or "nvJitLink") a compile may load, found
    without loading it (importing and loading NVRTC costs tens of milliseconds): those in the
    pip wheels on sys.path; where none of them is in a site-packages directory (whose wheels
    cuda.bindings loads before any other copy), also those the system search could find
    (CUDA_HOME/CUDA_PATH, LD_LIBRARY_PATH)."""
    return [f for f, _ in _toolchain_copies_stat(lib)]


def _toolchain_copies_stat(lib: str) -> list[tuple[str, os.stat_result]]:
    """``_toolchain_copies(lib)``, each with its ``os.stat``."""
    wheels = [(n, _copies([f"{n}/{sub}/lib" for sub in _WHEEL_LIB_DIRS[lib]], lib)) for n in _nvidia_dirs()]
    seen = [c for _, copies in wheels for c in copies]
    if not any(copies and _site_dir(n) for n, copies in wheels):
        dirs = [f"{_env(v)}/{d}" for v in ("CUDA_HOME", "CUDA_PATH") if _env(v) for d in ("lib64", "lib")]
        seen += _copies(dirs + [d for d in (_env("LD_LIBRARY_PATH") or "").split(os.pathsep) if d], lib)
    return seen


def _toolchain_fingerprint(lib: str = "nvrtc") -> dict:
    """What identifies the library ``lib`` a compile would use, wherever it is installed: the
    GNU build ID of each copy it may load (the build of that exact version; a content digest
    where a copy has none). No path, file time or environment variable: the same wheels in
    another venv, reinstalled, or under another LD_LIBRARY_PATH give the same fingerprint;
    another NVRTC gives another. Once per process."""
    fp = _FINGERPRINTS.get(lib)
    if fp is not None:
        return fp
    fp = {"lib": lib, "builds": sorted({_remembered(f, st, _library_ident) for f, st in _toolchain_copies_stat(lib)})}
    _FINGERPRINTS[lib] = fp
    return fp


def _library_id(path: str) -> str:
    """A library file's identity (``_library_ident``), remembered (``_remembered``)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return "unreadable"
    return _remembered(path, st, _library_ident)


def _library_ident(path: str) -> str:
    """A library file's identity: its GNU build ID (read from its program headers), else its
    size and content digest (NVRTC's library is ~140 MB)."""
    build = gnu_build_id(path)
    if build is not None:
        return "build-id:" + build.hex()
    try:
        with open(path, "rb") as f:
            h = hashlib.blake2b(digest_size=32)
            size = 0
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
                size += len(chunk)
    except OSError:
        return "unreadable"
    return f"content:{size}:{h.hexdigest()}"


def _remembered(path: str, st: os.stat_result, identify) -> str:
    """``identify(path)``: the identity of a toolchain file (a library's build ID or digest,
    CUDA's header version, CCCL's version digest) whose ``os.stat`` is ``st``, remembered in
    the default cache's directory (``toolchain-ids.json``) by the file's path, inode, size,
    modification and change times (a rewrite in place changes the change time, which no one
    can set), so that a warm start opens one small file instead of every toolchain file, and
    only the first process after an install reads them."""
    seen = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    root = default_cache()._root
    known = _ids(root)
    got = known.get(path)
    if type(got) is list and got[:4] == seen and len(got) == 5 and type(got[4]) is str:
        return got[4]
    ident = identify(path)
    if ident is not None and ident != "unreadable":
        known.pop(path, None)
        known[path] = [*seen, ident]
        if root is not None:
            _write_ids(root, {k: v for k, v in list(known.items())[-_IDS_KEPT:] if type(v) is list and len(v) == 5})
    return ident


_IDS_FILE = "toolchain-ids.json"  # in the cache directory: {path: [inode, size, mtime_ns, ctime_ns, identity]}


_IDS_KEPT = 48  # the most recently identified files remembered


_IDS_BYTES = 1 << 15  # what they take at most


def _ids(root: str | None) -> dict:
    """The identities remembered in the cache directory ``root`` (``_remembered``), read
    once per process: {} where there are none, the file is unreadable or not of this shape,
    or the cache is in memory only (``root`` None)."""
    got = _IDS.get(root)
    if got is None:
        got = _IDS[root] = _read_ids(root) if root is not None else {}
    return got


def _read_ids(cache_dir: str) -> dict:
    return _read_small(cache_dir, _IDS_FILE, _IDS_BYTES, dict)  # (each entry is checked where it is used)


def _read_small(cache_dir: str, name: str, limit: int, kind: type):
    """The JSON ``kind`` (dict or list) in the small file ``name`` of the cache directory
    (``_write_small``'s), read with json's scanner (as cache._SCAN); empty where it is missing,
    unreadable, over ``limit`` bytes (not one nbjit wrote) or not of that kind."""
    data = _cache.read_small(f"{cache_dir}/{name}", limit)
    if data is None:
        return kind()
    try:
        text = data.decode()
        got, end = _SCAN(text, 0)
    except (ValueError, RecursionError, StopIteration):
        return kind()
    return got if type(got) is kind and end == len(text) else kind()


def _write_ids(cache_dir: str, ids: dict) -> None:
    """Remember ``ids`` (the oldest left out where they would not fit in ``_IDS_BYTES``), whole
    or not at all (a cache directory that cannot be written keeps nothing: the files are read
    again next time)."""
    text = json.dumps(ids)
    while len(text) >= _IDS_BYTES and ids:
        ids = dict(list(ids.items())[1:])
        text = json.dumps(ids)
    _write_small(cache_dir, _IDS_FILE, text)


def _write_small(cache_dir: str, name: str, text: str) -> None:
    """Write the small file ``name`` in the cache directory: whole or not at all."""
    f = os.path.join(cache_dir, name)
    tmp = f"{f}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(cache_dir, exist_ok=True)
        with open(tmp, "w") as out:
            out.write(text)
        os.replace(tmp, f)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _stat(path: str) -> os.stat_result | None:
    """``os.stat(path)``, or None where nothing (readable) is there."""
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


def _isdir(path: str) -> bool:
    st = _stat(path)
    return st is not None and stat.S_ISDIR(st.st_mode)


def _env(name: str) -> str | None:
    return os.environ.get(name)


def cuda_include_dir() -> str | None:
    """The CUDA headers (cuda_fp16.h, ...) that NVRTC compiles should see: the pip wheels'
    (nvidia/cu13/include, nvidia/cuda_runtime/include), else CUDA_HOME / CUDA_PATH, else
    what cuda-pathfinder finds (importing it costs ~30 ms, so it comes last)."""
    found = _cuda_headers()
    return found[0] if found else None


def _cuda_headers_id() -> str | None:
    """The identity of CUDA's headers on the include path: CUDART_VERSION and the size of
    cuda_runtime_api.h (no path, no file time); None where there are none."""
    found = _cuda_headers()
    return found[1] if found else None


@functools.lru_cache(maxsize=None)
def _cuda_headers() -> tuple[str, str | None] | None:
    """(``cuda_include_dir()``, ``_cuda_headers_id()``): the first directory that holds
    cuda_runtime_api.h, with the identity of that file (remembered: ``_remembered``)."""
    wheels = (f"{n}/{sub}/include" for n in _nvidia_dirs() for sub in ("cu13", "cuda_runtime", "cu12"))
    homes = (f"{_env(v)}/include" for v in ("CUDA_HOME", "CUDA_PATH") if _env(v))
    for d in itertools.chain(wheels, homes):
        found = _runtime_api(d)
        if found is not None:
            return found
    try:
        from cuda.pathfinder import find_nvidia_header_directory
        d = find_nvidia_header_directory("cudart")
    except Exception:  # no headers installed: sources that include none still compile
        return None
    return (_runtime_api(d) or (d, None)) if d else None


def _runtime_api(d: str) -> tuple[str, str | None] | None:
    """(``d``, the identity of its cuda_runtime_api.h), or None where it has none."""
    f = f"{d}/cuda_runtime_api.h"
    st = _stat(f)
    if st is None:
        return None
    return (d, _remembered(f, st, _runtime_api_id)) if stat.S_ISREG(st.st_mode) else None


def _runtime_api_id(path: str) -> str | None:
    """The identity of a cuda_runtime_api.h: CUDART_VERSION and the file's size (no path, no
    file time); None where it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK)
    except OSError:
        return None
    try:
        head, size = os.pread(fd, 1 << 15, 0), os.fstat(fd).st_size
    except OSError:
        return None
    finally:
        os.close(fd)
    return f"{_defined_number(head, b'CUDART_VERSION') or '?'}:{size}"


_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # (a FIFO of a toolchain file's name is never waited on)


@functools.lru_cache(maxsize=None)
def _cccl() -> tuple[str, str] | None:
    """CCCL's headers beside CUDA's (the CUDA wheel's include/cccl; else, where the wheels were
    installed to directories of their own, ``pip install --target``, the same CUDA major's
    include/cccl in another ``nvidia`` directory on sys.path) and the identity of its version:
    a digest of its version header (a few hundred bytes; no path, no file time; remembered:
    ``_remembered``)."""
    inc = cuda_include_dir()
    if not inc:
        return None
    tail = inc.rsplit("/nvidia/", 1)[1] if "/nvidia/" in inc else None  # (cu13/include)
    for d in (f"{inc}/cccl", *(f"{n}/{tail}/cccl" for n in (_nvidia_dirs() if tail else ()))):
        f = f"{d}/cuda/std/__cccl/version.h"
        st = _stat(f)
        if st is not None:
            ident = _remembered(f, st, _version_digest) if stat.S_ISREG(st.st_mode) else None
            return (d, ident) if ident is not None else None
    return None


def _version_digest(path: str) -> str | None:
    """The digest of CCCL's version header, None where it cannot be read."""
    try:
        return content_digest(read_regular(path, 1 << 20))
    except (OSError, ValueError):
        return None


def _defined_number(text: bytes, name: bytes) -> str | None:
    """The number ``#define NAME 12345`` gives in ``text``, or None. (Read without a regular
    expression: compiling one is ~0.2 ms of a fresh process's warm start.)"""
    at = text.find(name)
    while at >= 0:
        start = text.rfind(b"\n", 0, at) + 1
        end = text.find(b"\n", at)
        words = text[start:end if end >= 0 else len(text)].split()
        if len(words) >= 3 and words[0] == b"#define" and words[1] == name and words[2].isdigit():
            return words[2].decode()
        at = text.find(name, at + len(name))
    return None


def cccl_include_dir() -> str | None:
    """CCCL's headers (CUB, Thrust, libcu++) beside CUDA's: the CUDA wheel's include/cccl."""
    c = _cccl()
    return c[0] if c else None


_IDS: dict = {}  # cache directory -> its file as this process read it (once), with what it identified since
