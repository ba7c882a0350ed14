"""Host-side compilers: NVRTC (CUDA C++ -> cubin or PTX) and nvJitLink (PTX -> cubin for the
device, e.g. when the driver is older than the PTX's producer). No GPU needed: each compile is
told the architecture it is for (``nbjit.compile_image``, ``nbjit.compile`` and
``nbjit.compile_many`` fill in the current device's where the caller names none)."""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import re
import shlex
import signal
import stat
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Iterable, Mapping

from nbjit import _native
from nbjit import cache as _cache
from nbjit import pch as _pch
from nbjit._facts import Facts, stamp as facts_stamp
from nbjit._defs import record
from nbjit.arch import Arch, existence_problem
from nbjit.cache import _KEY_JSON, _SCAN, Cache, CacheEntry, Written, cache_key, default_cache, make_locked, write_entry
from nbjit._csource import source_declarations
from nbjit.cubin import inspect_cubin
from nbjit.errors import CompileFailure, LinkFailure, NbjitCompileError, NbjitWarning, install_hint
from nbjit._elf import gnu_build_id
from nbjit.image import Image, content_digest, read_regular
from nbjit.includes import IncludeWalk, walk_includes
from nbjit._signature_build import typed_entries

# patterns used on every call, compiled once at import
_ARCH_NAME = re.compile(r"(sm|compute)_\d+[af]?", re.ASCII)

__all__ = ["AssembledCubin", "assemble_ptx", "assemble_cached", "nvjitlink_version", "nvjitlink_cubin",
           "LINK_INPUT_KINDS", "compile_image", "compile_many",
           "nvrtc_version",
           "normalize_options", "CompileFailure"]


@record
class AssembledCubin:
    """A cubin produced by nvJitLink from PTX, with nvJitLink's info log."""

    data: bytes
    arch: Arch
    log: str


@functools.lru_cache(maxsize=None)
def nvjitlink_version() -> tuple[int, int] | None:
    """(major, minor) of the nvJitLink library cuda-bindings finds, or None if there is none."""
    try:
        from cuda.bindings import nvjitlink
        return tuple(nvjitlink.version())  # type: ignore[return-value]
    except Exception:  # library missing or too old for cuda-bindings: no nvJitLink
        return None


def assemble_ptx(ptx: str | bytes, arch: Arch | str, *, name: str = "<ptx>",
                 options: tuple[str, ...] = ()) -> AssembledCubin:
    """Assemble PTX to a cubin for ``arch`` (``"sm_90"``, ``"sm_90a"``) with nvJitLink.

    Raises
    ------
    NbjitCompileError: nvJitLink is missing or rejected the PTX (with its error log).
    """
    data = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
    if not data.endswith(b"\0"):
        data += b"\0"
    try:
        return nvjitlink_cubin([("ptx", data, name)], arch, options=options)
    except LinkFailure as e:
        if e.input is None and not e.log:  # no nvJitLink at all, or options it refused
            raise NbjitCompileError(f"{name}: {e}") from None
        raise NbjitCompileError(f"{name}: nvJitLink could not assemble PTX for {arch}: {e.error}\n{e.log}") from None


# nbjit's names of nvJitLink's input kinds (nvJitLinkInputType)
LINK_INPUT_KINDS = ("ptx", "ltoir", "cubin", "object", "fatbin", "library")


def nvjitlink_cubin(inputs: Iterable[tuple[str, bytes, str]], arch: Arch | str, *,
                    options: Iterable[str] = ()) -> AssembledCubin:
    """The cubin nvJitLink links for ``arch`` from ``inputs``, each ``(kind, data, label)``
    with ``kind`` one of ``LINK_INPUT_KINDS`` (``options``: more nvJitLink options, ``-lto``
    for LTO-IR).

    Raises
    ------
    LinkFailure: nvJitLink is missing, or refused an input (``.input`` is its label) or the
    link (``.input`` None), with nvJitLink's error log (``.log``).
    """
    if nvjitlink_version() is None:
        raise LinkFailure("nvJitLink is not available; install it with 'pip install nvidia-nvjitlink' "
                          f"(it comes with {install_hint('cu13')})")
    from cuda.bindings import nvjitlink as J

    opts = [f"-arch={arch}", *options]
    parts = list(inputs)
    labels = [label for _, _, label in parts]
    try:
        handle = J.create(len(opts), opts)
    except J.nvJitLinkError as e:
        raise LinkFailure(f"nvJitLink refused the options {' '.join(opts)}: {e}", inputs=labels, error=str(e)) from None
    try:
        label = None
        try:
            for kind, data, label in parts:
                J.add_data(handle, getattr(J.InputType, kind.upper()), data, len(data), label)
            label = None
            J.complete(handle)
        except J.nvJitLinkError as e:
            log = _log(J, handle, error=True)
            what = f"refused {label}" if label is not None else "could not link " + ", ".join(labels)
            raise LinkFailure(f"nvJitLink {what} for {arch}: {e}\n{log}", log=log, input=label, inputs=labels,
                              error=str(e)) from None
        size = J.get_linked_cubin_size(handle)
        buf = bytearray(size)  # nvJitLink writes here
        J.get_linked_cubin(handle, buf)
        return AssembledCubin(bytes(buf), Arch.parse(arch), _log(J, handle, error=False))
    finally:
        J.destroy(handle)


def assemble_cached(ptx: str, arch: Arch, *, name: str = "<ptx>", cache: "Cache | None" = None) -> bytes:
    """``assemble_ptx`` through the cache: the cubin nvJitLink makes of ``ptx`` for ``arch``."""
    have = nvjitlink_version()
    cache = cache or default_cache()
    key = cache_key({"producer": "nvjitlink", "toolchain": _toolchain_fingerprint("nvJitLink"),
                     "nvjitlink": list(have or ()), "ptx": content_digest(ptx.encode()), "arch": str(arch)})

    def make() -> CacheEntry:
        out = assemble_ptx(ptx, arch, name=name)
        return CacheEntry("cubin", str(arch), out.data, {}, out.log, f"nvJitLink {have[0]}.{have[1]}" if have else "")

    return cache.get_or_create(key, make).payload


def _log(J, handle, *, error: bool) -> str:
    try:
        size = (J.get_error_log_size if error else J.get_info_log_size)(handle)
        buf = bytearray(size)
        (J.get_error_log if error else J.get_info_log)(handle, buf)
        return bytes(buf).rstrip(b"\0").decode(errors="replace").strip()
    except Exception:  # a log that cannot be read must not hide the real error
        return ""


# ------------------------------------------------------------------ NVRTC

_FINGERPRINTS: dict = {}  # library -> fingerprint: computed once per process


def _nvrtc():
    """cuda.bindings' NVRTC module, its library loaded; NbjitCompileError saying what to
    install where it is missing."""
    try:
        from cuda.bindings import nvrtc as N
        N.nvrtcVersion()  # loads the library (cuda.pathfinder raises here when it is missing)
        return N
    except Exception as e:  # ImportError, cuda.pathfinder's DynamicLibNotFoundError, RuntimeError
        why = (str(e).strip().splitlines() or [""])[0][:160]
        raise NbjitCompileError(
            f"NVRTC is not installed ({type(e).__name__}: {why}): it comes with {install_hint('cu13')}; "
            "'cu12' for CUDA 12 drivers, 'mlir' with numba-cuda-mlir instead of numba-cuda"
        ) from None


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC that cuda-bindings loads (as numba-cuda does)."""
    N = _nvrtc()
    err, major, minor = N.nvrtcVersion()
    if err != N.nvrtcResult.NVRTC_SUCCESS:
        raise NbjitCompileError(f"NVRTC is not usable: {err}")
    return major, minor


@functools.lru_cache(maxsize=None)
def supported_archs() -> tuple[int, ...]:
    N = _nvrtc()
    err, archs = N.nvrtcGetSupportedArchs()
    return tuple(archs) if err == N.nvrtcResult.NVRTC_SUCCESS else ()


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
_IDS: dict = {}  # cache directory -> its file as this process read it (once), with what it identified since


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


# ------------------------------------------------------------------ the call index
# A fresh process's warm start finds a compile's key without probing the toolchain, building
# the request or hashing it: the toolchain's probes note what they look at (``_SEEN``: each
# path's ``_sig``, each environment variable), a process that computed a key the long way
# records that as a state (``toolchain-state.json`` in the cache's directory) and files the
# key under a digest of the call and the state (``Cache.index``). A later process re-checks
# a recorded state once (the same stats the probes make, in one loop) and, where it holds, looks
# its calls up by digest; anything else takes the long way, which files the call afresh.


class _Seen:
    """What the toolchain's probes looked at in this process: each path's ``_sig`` and each
    environment variable's value, in the order they were looked at; ``unseeable`` where they
    used what cannot be re-checked so (cuda-pathfinder's search)."""

    def __init__(self):
        self.paths: dict = {}
        self.env: dict = {}
        self.unseeable = False


_SEEN = _Seen()


def _sig(st: os.stat_result | None) -> list | None:
    """What a probe saw of a path: None (nothing there), else its type, inode, size,
    modification and change times (a rewrite in place moves the last, which no one can set;
    a directory's move when an entry is added to it or removed)."""
    if st is None:
        return None
    return [stat.S_IFMT(st.st_mode), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _stat_or_none(path, how=os.stat) -> os.stat_result | None:
    """``how(path)`` (``os.stat``, ``os.lstat``), or None."""
    try:
        return how(path)
    except (OSError, ValueError, TypeError):
        return None


def _signs(paths: list) -> list:
    """``[_sig(os.stat(p)) or None, ...]`` of ``paths``: by nbjit's C extension where it is
    used (one call, no ``stat_result`` made: a warm start's check of its toolchain state),
    else here."""
    c = _FILE_SIGNS[0]
    if c is None:
        c = _FILE_SIGNS[0] = _native.function("file_signs")
    if c:
        try:
            return c(paths)
        except ValueError:  # (a path that is not a str: os.stat says what it makes of it)
            pass
    return [_sig(_stat_or_none(p)) for p in paths]


_FILE_SIGNS: list = [None]  # nbjit._launch.file_signs, False (none), None (not looked for yet)


def _stat(path: str) -> os.stat_result | None:
    """``os.stat(path)``, or None; noted in ``_SEEN``: where nothing is there, the nearest
    directory above it that is (while its times stand still, nothing was added in it: the
    path is still missing; several missing paths share it, so a warm start stats it once)."""
    st = _stat_or_none(path)
    if st is not None:
        _note(_SEEN.paths, path, _sig(st))
        return st
    d = path
    while True:
        if _stat_or_none(d, os.lstat) is not None:  # a link to nothing: what it names is not watched
            _SEEN.unseeable = True
        up = os.path.dirname(d)
        if up == d or not up:
            _note(_SEEN.paths, path, None)
            return None
        d = up
        got = _stat_or_none(d)
        if got is not None:
            _note(_SEEN.paths, d, _sig(got))
            return None


def _note(seen: dict, name: str, value) -> None:
    """Note in ``seen`` (``_SEEN.paths`` or ``.env``) what a probe saw of ``name``: the first
    sight stands (the keys of this process were made from it); another sight later (the file
    or variable changed while the process ran) makes this process's state one that cannot be
    recorded."""
    if name in seen:
        if seen[name] != value:
            _SEEN.unseeable = True
    else:
        seen[name] = value


def _isdir(path: str) -> bool:
    st = _stat(path)
    return st is not None and stat.S_ISDIR(st.st_mode)


def _env(name: str) -> str | None:
    """The environment variable ``name``; noted in ``_SEEN``."""
    value = os.environ.get(name)
    _note(_SEEN.env, name, value)
    return value


_STATE_FILE = "toolchain-state.json"  # [state, ...], newest first (``_record_state``)
_STATES_KEPT = 4  # environments sharing one cache directory (venvs, containers), each its own
_STATE_BYTES = 1 << 16
_STATES: dict = {}  # cache directory -> (the id of the recorded state this process is in, or ""; its fingerprint)


def _state_stamp() -> str:
    """What the keys a state's calls are filed under depend on besides the toolchain: the
    code that makes requests and keys (the facts' stamp covers this module) and the cache's
    format."""
    return f"{facts_stamp()}/{_cache.FORMAT_VERSION}"


def _state_id(root: str) -> str | None:
    """The id of the state recorded in the cache directory ``root`` that this process's
    toolchain is in (checked once per process), or None."""
    got = _STATES.get(root)
    if got is None:
        got = _STATES[root] = _matching_state(_read_small(root, _STATE_FILE, _STATE_BYTES, list))
    fp = _FINGERPRINTS.get("nvrtc")  # (computed in this process since: it must still be the state's)
    return got[0] if got[0] and (fp is None or fp == got[1]) else None


def _matching_state(states: list) -> tuple[str, object]:
    """(id, fingerprint) of the first state in ``states`` that holds here: the same code and
    cache format, the same wheel directories on sys.path, environment variables and paths as
    its probes saw them, the fingerprint this process computed (where it did); else ("", None)."""
    stamp, fp, nvidia = _state_stamp(), _FINGERPRINTS.get("nvrtc"), None
    for s in states:
        try:
            if s["stamp"] != stamp or type(s["id"]) is not str or (fp is not None and s["fp"] != fp):
                continue
            if nvidia is None:
                nvidia = list(_nvidia_dirs())
            if s["nvidia"] != nvidia or any(os.environ.get(k) != v for k, v in s["env"].items()):
                continue
            paths, wants = zip(*s["paths"])  # ([path, sign], ...) -> (paths, signs)
            if _signs(list(paths)) == list(wants):
                return s["id"], s["fp"]
        except (TypeError, KeyError, ValueError, AttributeError):  # not a state _record_state writes
            continue
    return "", None


def _record_state(root: str) -> str | None:
    """Record this process's toolchain state (what its probes saw, and the fingerprint they
    gave) in the cache directory ``root``, newest first; its id, or None where there is none
    to record (the probes have not run, or saw what cannot be re-checked)."""
    fp = _FINGERPRINTS.get("nvrtc")
    if fp is None or _SEEN.unseeable or not _SEEN.paths:
        return None
    state = {"stamp": _state_stamp(), "nvidia": list(_nvidia_dirs()), "env": dict(_SEEN.env),
             "paths": [[p, v] for p, v in list(_SEEN.paths.items())], "fp": fp}  # (copies: another thread may probe)
    try:
        sid = cache_key(state)
    except (TypeError, ValueError):  # (a fingerprint that is not JSON data: a test's stand-in)
        return None
    state["id"] = sid
    states = [state] + [s for s in _read_small(root, _STATE_FILE, _STATE_BYTES, list)
                        if type(s) is dict and s.get("id") != sid]
    text = json.dumps(states[:_STATES_KEPT])
    if len(text) < _STATE_BYTES:
        _write_small(root, _STATE_FILE, text)
    _STATES[root] = (sid, fp)
    return sid


def _call_digest(call: tuple, sid: str) -> str | None:
    """The digest a compile's call (``_plan``'s, without its last item) is filed under in a
    toolchain state ``sid``; None where its arguments are not JSON data."""
    arch = call[6]
    try:
        return content_digest(_KEY_JSON([sid, *call[1:6], str(arch) if type(arch) is Arch else arch, call[7]]).encode())
    except (TypeError, ValueError, UnicodeEncodeError):
        return None


def _indexed(cache: Cache, call: tuple) -> str | None:
    """The key a process in this toolchain's state filed ``call`` under in ``cache``, or None."""
    root = cache._root
    sid = _state_id(root) if root is not None else None
    digest = _call_digest(call, sid) if sid is not None else None
    return cache.indexed(digest) if digest is not None else None


def _index(cache: Cache, call: tuple, key: str) -> None:
    """File ``call``'s ``key`` (``_indexed``), with this process's toolchain state (kept in
    the cache's directory)."""
    root = cache._root
    if root is None:
        return
    sid = _state_id(root) or _record_state(root)
    digest = _call_digest(call, sid) if sid is not None else None
    if digest is not None and cache.indexed(digest) != key:
        cache.index(digest, key)


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
    _SEEN.unseeable = True  # (what cuda-pathfinder looks at is not re-checked: no call index)
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
    """CCCL's headers beside CUDA's (the CUDA wheel's include/cccl) and the identity of its
    version: a digest of its version header (a few hundred bytes; no path, no file time;
    remembered: ``_remembered``)."""
    inc = cuda_include_dir()
    if not inc:
        return None
    d = f"{inc}/cccl"
    f = f"{d}/cuda/std/__cccl/version.h"
    st = _stat(f)
    if st is None:
        return None
    ident = _remembered(f, st, _version_digest) if stat.S_ISREG(st.st_mode) else None
    return (d, ident) if ident is not None else None


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


_ALIASES = {"--std": "-std", "--device-debug": "-G", "--generate-line-info": "-lineinfo",
            "-use_fast_math": "--use_fast_math", "-fmad": "--fmad", "--gpu-architecture": "-arch",
            "--define-macro": "-D", "--include-path": "-I", "-default-device": "--device-as-default-execution-space",
            "-dopt": "--dopt", "-rdc": "--relocatable-device-code"}


def normalize_options(options: Iterable[object]) -> list[str]:
    """Compiler options in one spelling each (``-I DIR``, ``-IDIR``, ``--include-path=DIR`` ->
    ``--include-path=<absolute DIR>``; ``-D X``/``--define-macro=X`` -> ``-DX``; long and short
    aliases unified), order kept: what the cache key and NVRTC both see."""
    out: list[str] = []
    it = iter(str(o).strip() for o in options if str(o).strip())
    for o in it:
        if o in ("-I", "-D", "--include-path", "--define-macro"):
            try:
                o = o + ("=" if o.startswith("--") else "") + next(it)
            except StopIteration:
                raise NbjitCompileError(f"option {o} needs a value") from None
        name, eq, val = o.partition("=")
        if o[:2] in ("-I", "-D") and len(o) > 2:  # (-DX=1: the macro is all after -D, '=' and all)
            name, eq, val = o[:2], "=", o[2:]
        name = _ALIASES.get(name, name)
        if name == "-I":
            out.append(f"--include-path={os.path.abspath(val)}")
        elif name == "-D":
            if not val or val.startswith("="):
                raise NbjitCompileError(f"option {o!r} defines no macro name (-D NAME or -D NAME=VALUE)")
            out.append(f"-D{val}")
        elif name == "-arch":
            raise NbjitCompileError("give the architecture as arch=... (on the command line: --arch), not in options")
        else:
            out.append(name + (eq + val if eq else ""))
    return out


def one_or_many(value):
    """A str given where a list of them goes (``name_expressions="fill<float>"``) as the
    one item it is."""
    return (value,) if isinstance(value, str) else value


def option_list(options):
    """Options given as one str (``"-std=c++17 -DN=4"``) split as a shell splits a command
    line; a list as it is."""
    if not isinstance(options, str):
        return options
    if len(options) > MAX_OPTION_BYTES:  # (before the split, which takes seconds per megabyte)
        raise NbjitCompileError(f"options: one str of {len(options)} characters: more than NVRTC is given "
                                f"({MAX_OPTION_BYTES >> 10} KiB of options)")
    try:
        return tuple(shlex.split(options))
    except ValueError as e:  # an unclosed quote
        raise NbjitCompileError(f"options {options!r}: {e}") from None


def _text_items(values, what: str, *, paths: bool = False) -> list[str]:
    """``values`` (str or paths; one of them alone is one item, an empty one none) as a list
    of str; ``NbjitCompileError`` naming ``what`` and the item that is not one."""
    if type(values) is tuple and not values:  # (the default)
        return []
    if isinstance(values, str) or (paths and isinstance(values, os.PathLike)):
        values = (values,)
    kind = "path" if paths else "str"
    try:
        items = list(values)
    except TypeError:
        raise NbjitCompileError(f"{what} must be a list of {'paths' if paths else 'str'}, not "
                                f"{type(values).__name__}") from None
    out = []
    for v in items:
        if isinstance(v, os.PathLike):
            v = os.fspath(v)
        if not isinstance(v, str):
            raise NbjitCompileError(f"{what}: {v!r} ({type(v).__name__}) is not a {kind}")
        if v.strip():  # (an empty one is none, as NVRTC's options go)
            out.append(v)
    return out


MAX_OPTIONS = 4096
MAX_OPTION_BYTES = 1 << 20


def _check_encodable(text: str, what: str, name: str) -> None:
    """``text`` goes to NVRTC as UTF-8: a lone surrogate (from a file name read with
    ``surrogateescape``, say) cannot, and is named with its position."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        where = f"{what} {text[:60]!r}" if what != "source" else "the source"
        at = f" (line {text.count(chr(10), 0, e.start) + 1})" if what == "source" else ""
        raise NbjitCompileError(f"{name}: {where} holds {text[e.start]!r}{at}, which is not Unicode text (a lone "
                                "surrogate): it cannot be given to NVRTC") from None


def _headers(headers) -> dict[str, str]:
    """``headers`` checked: {include name: text}, both str."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise NbjitCompileError(f"headers must be a dict {{include name: text}}, not {type(headers).__name__}")
    for k, v in headers.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise NbjitCompileError(f"headers: {k!r} -> {type(v).__name__}: both the include name and the header's "
                                    "text must be str")
    return dict(headers)


def _arch_for(arch: "Arch | str | None", name: str) -> Arch:
    """The architecture a compile is for: ``arch`` (an ``Arch``, or its text) checked; an
    ``NbjitCompileError`` naming ``name`` where it is missing or not an architecture."""
    if type(arch) is Arch:
        return arch
    if arch is None:
        raise NbjitCompileError(
            f"{name}: no architecture to compile for: give arch= (e.g. 'sm_90'); nbjit.compile_image, nbjit.compile "
            "and nbjit.compile_many take the current device's where none is given")
    a = arch.strip().lower() if isinstance(arch, str) else None  # (as the command line reads --arch SM_90)
    if a is None or not _ARCH_NAME.fullmatch(a):
        raise NbjitCompileError(f"{name}: arch {arch!r} is not an architecture (expected e.g. 'sm_90', 'sm_90a', "
                                "'compute_90')")
    return Arch.parse(a)


def compile_image(source: str, *, name: str | None = None, name_expressions: Iterable[str] = (),
                  headers: Mapping[str, str] | None = None, include_paths: Iterable[str] = (),
                  options: Iterable[str] = (), arch: Arch | str | None = None, output: str = "auto",
                  cache: Cache | None = None, pch: bool | str | None = None) -> Image:
    """Compile CUDA C++ with NVRTC to an ``Image`` (cubin or PTX) for ``arch``, loading
    nothing: no GPU is needed. (``nbjit.compile_image`` is this function, with the current
    device's architecture where ``arch`` is not given.)

    Parameters
    ----------
    source: CUDA C++ text.
    name: the source's name in messages and line info (default ``"kernel.cu"``).
    name_expressions: kernels to instantiate and find by the expression written
        (``"fill<float>"``); their mangled names are in ``image.lowered_names``.
    headers: {include name: text} for ``#include "name"`` without files on disk.
    include_paths: real directories to search.
    options: further NVRTC options (``-std=c++17``, ``-DN=4``, ``--use_fast_math`` ...).
        ``options``, ``name_expressions`` and ``include_paths`` are lists; one str alone is one item
        (options in one str are split as a shell splits them).
    arch: ``"sm_90"``, ``"sm_90a"``, ``"compute_90"`` or an ``Arch``: what to compile for (here
        it must be given; ``nbjit.compile_image`` takes the current device's where it is not).
    output: ``"auto"`` (a cubin where this NVRTC can target the arch, else PTX), ``"cubin"``
        or ``"ptx"``.
    cache: a ``nbjit.Cache`` (default: ``nbjit.default_cache()``).
    pch: NVRTC precompiled headers (12.8+): ``None`` follows ``NBJIT_PCH`` (unset: ``"auto"``,
        for sources that include large headers such as CUB, Thrust or ``cuda/std``); ``True``
        for any source that includes headers; ``False`` never. The first compile of a set of
        headers in a process makes the PCH, later ones use it; the output is the same either
        way (and so is the cache key).

    Raises
    ------
    NbjitCompileError: NVRTC rejected the source (with its log, options and source name), no
    architecture or one it cannot compile for, or an argument of the wrong kind (named).
    """
    got = _plan(source, name, name_expressions, headers, include_paths, options, arch, output, cache, pch)
    if type(got) is Image:
        return got
    req, key, cache, call, entry = got
    if entry is not None:  # (the call index's)
        return _finish(entry, req, cache, call, 3)
    route = getattr(_ROUTE, "pool", None)
    if route is None:
        entry = cache.get_or_create(key, lambda: _run_nvrtc(req), lambda e: _derive_facts(e, req))
    else:
        entry = _through_worker(route, req, key, cache)
    return _finish(entry, req, cache, call, 3, key)


def compile_key(source: str, *, name: str | None = None, name_expressions: Iterable[str] = (),
                headers: Mapping[str, str] | None = None, include_paths: Iterable[str] = (),
                options: Iterable[str] = (), arch: Arch | str | None = None, output: str = "auto") -> str:
    """The cache key ``compile_image`` files its output under for these arguments (what
    ``nbjit compile --cache-only`` looks for on disk after compiling). ``NbjitCompileError``
    for a source that is never cached (an ``#include`` through a macro)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NbjitWarning)
        req, key = _plan(source, name, name_expressions, headers, include_paths, options, arch, output, Cache(None),
                         None)[:2]
    unknown = includes_of(req).unknown
    if unknown is not None:
        raise NbjitCompileError(uncached_warning(req.name, unknown))
    return key


def _plan(source, name, name_expressions, headers, include_paths, options, arch, output, cache, pch):
    """``compile_image``'s first half: its image where the cache's first level remembers the
    call; else (the request, its cache key, the cache, the call to remember or None, None);
    where the call index (``_indexed``) names an entry with facts, (what ``_finish`` needs of
    the request, the key, the cache, the call, that entry)."""
    source, name, include_paths = source_text(source, name, include_paths)
    if pch is not None:  # (before the first level, which does not hold it)
        _pch.check_arg(pch)
    if cache is not None and not isinstance(cache, Cache):
        raise NbjitCompileError(f"cache must be an nbjit.Cache (or None for the default), not {type(cache).__name__}")
    # read once: a generator would be consumed by the look-up key below and reach NVRTC empty
    name_expressions, options = read_once(one_or_many(name_expressions)), read_once(option_list(options))
    include_paths = read_once(include_paths)
    cache = cache or default_cache()
    # A repeated call is one look-up in the cache's first level. Not with include_paths,
    # whose files may change on disk between calls (the disk key sees that).
    call = None
    if not include_paths:
        try:
            call = ("nvrtc", source, name, tuple(name_expressions), tuple(sorted((headers or {}).items())),
                    tuple(options), arch, output, id(_FINGERPRINTS))
            hash(call)
        except Exception:  # something unhashable: take the long way (it says what is wrong)
            call = None
        hit = cache.recall(call) if call is not None else None
        if hit is not None:
            return hit
        key = _indexed(cache, call) if call is not None else None
        entry = cache.lookup(key, warn=False) if key is not None else None
        if entry is not None and entry.facts is not None:  # (an entry without them: the long way derives them)
            return _Named(name or "kernel.cu", source), key, cache, call, entry
    req = _request(source, name, name_expressions, headers, include_paths, options, arch, output,
                   _pch.pch_mode(pch), cache._root)  # (text: no Path made on a warm start)
    walk = includes_of(req)
    if not walk.repeatable:  # (a header on disk may change before the next call: the key is made each time)
        call = None
    if walk.unknown is not None:
        warnings.warn(uncached_warning(req.name, walk.unknown), NbjitWarning, stacklevel=3)
        return req, _key(req, walk), Cache(None), None, None
    return req, _key(req, walk), cache, call, None


def uncached_warning(name: str, directive: str) -> str:
    """What a compile that cannot be cached says."""
    return (f"{name}: {directive} names its file through a macro: nbjit cannot tell which file NVRTC reads, so "
            "this source is compiled every time and never cached (write the header's name in the #include)")


def repeatable(source: str, name: str | None, headers: Mapping[str, str] | None, options: Iterable[str]) -> bool:
    """Whether compiling ``source`` with these arguments reads no file outside CUDA's and
    CCCL's directories, and names each it reads: a repeated call then compiles the same."""
    opts = normalize_options(list(options))
    ours = [d for d in (cuda_include_dir(), cccl_include_dir()) if d]
    user = [o.split("=", 1)[1] for o in opts if o.startswith("--include-path=") and o.split("=", 1)[1] not in ours]
    return walk_includes(source, name or "kernel.cu", dict(headers or {}), user, ours, opts).repeatable


def includes_of(req: "CompileRequest", source: str | None = None) -> IncludeWalk:
    """The files NVRTC reads for ``req`` (or for ``source`` with ``req``'s headers and
    options): CUDA's and CCCL's directories are the toolchain's, the others the user's."""
    ours = [d for d in (cuda_include_dir(), cccl_include_dir()) if d]
    return walk_includes(req.source if source is None else source, req.name, dict(req.headers), req.user_dirs,
                         ours, req.options)


def _finish(entry: CacheEntry, req: "CompileRequest | _Named", cache: Cache, call, stacklevel: int,
            key: str | None = None) -> Image:
    """``compile_image``'s second half: the image of the entry found or made (warned of where
    it holds no kernel: ``stacklevel`` names the user's call), remembered for the call; with
    the ``key`` the long way found, the call filed under it for later processes (``_index``)
    where it names no include directory (their files, and a relative one's working directory,
    are in the key or read where the process runs)."""
    img = _image(entry, req)
    if _no_kernels(img):
        warnings.warn(f"{img.name}: NVRTC compiled no kernel (the {img.kind} for {img.arch} holds none): a template "
                      "kernel is compiled only where it is instantiated (name_expressions=['kern<float>']; on the "
                      "command line --expr 'kern<float>'), and a kernel is declared __global__", NbjitWarning,
                      stacklevel=stacklevel)
    if call is not None:
        cache.remember(call, img)
        if key is not None and not _include_options(call[5]):  # (include_paths: no call)
            _index(cache, call, key)
    return img


def _include_options(options) -> bool:
    """Whether the options name include directories (``-I``, ``--include-path``): a call with
    them is not filed (a relative one is read in the working directory, which no key holds)."""
    return any(str(o).strip().startswith(("-I", "--include-path")) for o in options)


@record
class _Named:
    """What ``_image`` and ``_finish`` need of a request, where the call index found the
    entry (no request was made)."""

    name: str
    source: str


def _image(entry: CacheEntry, req: "CompileRequest | _Named") -> Image:
    """The ``Image`` of a compile's cache entry, with the facts it carries (where it carries
    none, nbjit could not read the image: the source's declarations alone)."""
    f = entry.facts
    if f is None:
        decls, info, typed, resources = _source_decls(req.source), None, {}, {}
    else:  # (copies: the entry in the cache's memory is shared by every image made from it)
        decls, info, typed, resources = dict(f.declarations), f.info, dict(f.typed), dict(f.resources)
    img = Image(entry.payload, entry.kind, req.name, Arch.parse(entry.arch), dict(entry.lowered_names), entry.log,
                decls, info, typed, resources)
    if entry.payload_digest:  # hashed once already, checking the entry
        img.__dict__["digest"] = entry.payload_digest
    return img


def _no_kernels(img: Image) -> bool:
    """Whether a compiled image has no kernel (where that can be told without parsing it)."""
    if img.kind == "ptx":
        return _PTX_ENTRY.search(img.data) is None
    return img.info is not None and not img.info.entries


_PTX_ENTRY = re.compile(rb"\.entry\s")
SOURCE_SUFFIXES = (".cu", ".cuh", ".cuda")
IMAGE_SUFFIXES = (".ptx", ".cubin", ".fatbin", ".nbjit")  # (a one-line str ending so is a path, not a source)
MAX_SOURCE_BYTES = 256 << 20


def source_text(source, name: str | None, include_paths) -> tuple[str, str | None, object]:
    """(CUDA C++ text, name, include paths) for ``source`` given as text or as a file: a
    ``pathlib.Path`` or a str naming a ``.cu``/``.cuh`` file (one line, no code). A file's
    name is the default name and its directory is searched first for ``#include "..."``, as
    nvcc does."""
    if type(source) is not str and isinstance(source, os.PathLike):  # (a str skips the ABC: its first check ~10 us)
        path = os.fspath(source)
    elif isinstance(source, str) and "\n" not in source and source.rstrip().lower().endswith(SOURCE_SUFFIXES):
        path = source.rstrip()
    elif isinstance(source, str):
        if "\n" not in source and source.rstrip().lower().endswith(IMAGE_SUFFIXES):
            raise NbjitCompileError(f"{source.rstrip()!r} names compiled code, not CUDA C++: load it with "
                                    "nbjit.load(path) (compile_image compiles CUDA C++ source text or a .cu file)")
        return source, name, include_paths
    else:
        raise NbjitCompileError(f"source must be CUDA C++ text (str) or a .cu file's path, not "
                                f"{type(source).__name__}")
    path = os.fsdecode(path)
    try:
        raw = read_regular(path, MAX_SOURCE_BYTES)
    except FileNotFoundError:
        raise NbjitCompileError(f"{path}: no such file" + ("" if isinstance(source, os.PathLike) else
                                f" (a str ending in {'/'.join(SOURCE_SUFFIXES)} is taken as a source file's path; "
                                "pass the file's text to compile it as text)")) from None
    except OSError as e:
        raise NbjitCompileError(f"{path}: cannot read it as CUDA source: {e.strerror or e}") from None
    except ValueError as e:
        raise NbjitCompileError(f"{path}: cannot read it as CUDA source: {e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NbjitCompileError(f"{path}: not UTF-8 text (byte {e.start}): CUDA source must be UTF-8") from None
    here = os.path.dirname(os.path.abspath(path))
    if isinstance(include_paths, (str, os.PathLike)):
        include_paths = (include_paths,)
    try:
        include_paths = (here, *include_paths)
    except TypeError:  # not a list of paths: the request's check names it
        pass
    return text, name if name is not None else os.path.basename(path), include_paths


def read_once(values):
    """``values`` as a tuple where reading it would use it up (a generator, an iterator); as
    it is otherwise (a str, a list, something that is not a list: checked later)."""
    if type(values) in _NOT_ITERATORS:  # (no check against Iterator, whose first costs a warm start ~10 us)
        return values
    return tuple(values) if isinstance(values, Iterator) else values


_NOT_ITERATORS = (tuple, list, str, type(None))


def _source_decls(source: str) -> dict:
    """The kernels' C declarations in ``source``, labelled as an image's declarations are."""
    return {k: ("source", v) for k, v in source_declarations(source).items()}


def _derive_facts(entry: CacheEntry, req: "CompileRequest") -> Facts | None:
    """The facts nbjit reads from a compile's entry and its request (see ``_facts``): the
    source's C declarations and, for a cubin, its inspection, its kernels typed with them and
    what ptxas reported of each function in NVRTC's log (where the options asked for its
    report); None where they cannot be read (the loader then reports what is wrong). An
    entry a worker process made carries them already."""
    if entry.facts is not None:
        return entry.facts
    try:
        decls = _source_decls(req.source)
        info = inspect_cubin(entry.payload, source=req.name) if entry.kind == "cubin" else None
        entries = info.entries if info is not None else ()
        # kernels whose sources agree (the others are merged, and refused, when asked for)
        typed = {e.name: t for e, t in zip(entries, typed_entries(entries, "cubin", decls)) if t is not e}
    except Exception:  # an image nbjit cannot read (the loader reports it)
        return None
    return Facts(decls, info, typed, ptxas_report(entry.log) if info is not None else {})


@record
class CompileRequest:
    """One NVRTC compile as data: what ``_key`` hashes and ``_run_nvrtc`` runs."""

    source: str
    name: str
    expressions: tuple[str, ...]
    headers: tuple[tuple[str, str], ...]
    options: tuple[str, ...]  # normalised, with CUDA's and CCCL's include directories
    user_dirs: tuple[str, ...]  # the user's include directories (their files go in the key)
    arch: Arch
    output: str
    pch: str = "off"  # "auto", "on" or "off": whether NVRTC makes or uses a PCH (not in the key)
    cache_dir: str | None = None  # where PCH files go (not in the key)


def _request(source: str, name: str | None, name_expressions, headers, include_paths, options, arch,
             output: str, pch: str = "off", cache_dir=None) -> CompileRequest:
    """The compile request, checked, with options normalised (no NVRTC needed)."""
    if output not in ("auto", "cubin", "ptx"):
        raise NbjitCompileError(f"output must be 'auto', 'cubin' or 'ptx', not {output!r}")
    if name is not None and not isinstance(name, str):
        raise NbjitCompileError(f"name must be the source's name (str), not {type(name).__name__}")
    include_paths = _text_items(include_paths, "include_paths", paths=True)
    options, name_expressions = _text_items(options, "options"), _text_items(name_expressions, "name_expressions")
    headers = _headers(headers)
    label = name or "kernel.cu"
    if len(options) > MAX_OPTIONS or sum(map(len, options)) > MAX_OPTION_BYTES:
        raise NbjitCompileError(f"{label}: {len(options)} options ({sum(map(len, options))} characters): more than "
                                f"NVRTC is given ({MAX_OPTIONS} options, {MAX_OPTION_BYTES >> 10} KiB); NVRTC crashed "
                                "on millions")
    for what, texts in (("source", (source,)), ("name", (label,)), ("options", options),
                        ("name_expressions", name_expressions), ("include_paths", include_paths),
                        ("headers", [t for kv in headers.items() for t in kv])):
        for t in texts:
            _check_encodable(t, what, label)
    a = _arch_for(arch, label)
    if output == "cubin" and a.virtual:
        raise NbjitCompileError(f"{label}: a cubin needs a real architecture (sm_XX), not {a}")
    opts = normalize_options([*(f"--include-path={p}" for p in include_paths), *options])
    ours = [f"--include-path={d}" for d in (cuda_include_dir(), cccl_include_dir()) if d]
    user_dirs = tuple(o.split("=", 1)[1] for o in opts if o.startswith("--include-path=") and o not in ours)
    opts += [o for o in ours if o not in opts]  # CUDA's headers, then CCCL's (<cub/...>, <cuda/std/...>)
    return CompileRequest(source, name or "kernel.cu", tuple(name_expressions), tuple(sorted(headers.items())),
                          tuple(opts), user_dirs, a, output, pch, None if cache_dir is None else os.fspath(cache_dir))


def _key(req: CompileRequest, walk: IncludeWalk | None = None) -> str:
    """The cache key: everything that changes NVRTC's output (see cache.md), the files the
    source includes (``walk``, else walked here) among it."""
    walk = includes_of(req) if walk is None else walk
    cccl = _cccl()
    return cache_key({
        "producer": "nvrtc", "toolchain": _toolchain_fingerprint(), "cccl": cccl[1] if cccl else None,
        "cuda_headers": _cuda_headers_id(),
        "source": req.source, "name": req.name, "headers": [list(h) for h in req.headers],
        "options": _portable_options(req.options),
        "arch": str(req.arch), "output": req.output, "expressions": list(req.expressions),
        "includes": [list(f) for f in walk.files],
    })


def _portable_options(options) -> list[str]:
    """Options as the key holds them: CUDA's and CCCL's include directories by what they
    are (the toolchain's fingerprint and CCCL's version identify them), not where they are."""
    ours = {f"--include-path={d}": f"--include-path=<{what}>"
            for what, d in (("cuda", cuda_include_dir()), ("cccl", cccl_include_dir())) if d}
    return [ours.get(o, o) for o in options]


def _nvrtc_arch(target: Arch, output: str, name: str, nvrtc: str) -> Arch:
    """The -arch NVRTC compiles ``target`` for: ``target`` where this NVRTC knows it; for
    output "auto" and a real device newer than this NVRTC, PTX for the newest architecture it
    knows, which the driver compiles for the device; else an ``NbjitCompileError`` naming the
    architectures it knows (an architecture no chip has is refused before NVRTC sees it)."""
    known = supported_archs()
    problem = existence_problem(target)
    if problem is None and (not known or target.number in known):
        return target
    newer = bool(known) and target.number > max(known)
    if problem is None and output == "auto" and not target.virtual and not target.variant and newer:
        return Arch(max(known), virtual=True)
    if problem is not None:
        why = problem
    elif not newer and target.number < min(known):
        why = "older than any it knows (an older CUDA's NVRTC may know it)"
    elif not newer:
        why = "it is not one this NVRTC knows (another CUDA's NVRTC may know it)"
    elif target.variant:
        why = f"'{target.variant}' code runs on that architecture{' family' * (target.variant == 'f')} only"
    else:
        why = ("PTX" if target.virtual or output == "ptx" else "a cubin") + " for exactly that architecture was " \
            "asked for (output='auto' with a real architecture compiles PTX for the newest it knows below)"
    known_text = ", ".join(f"sm_{k}" for k in known) if known else "the architectures it lists"
    raise NbjitCompileError(f"{name}: {nvrtc} cannot compile for {target}: {why}. It compiles for {known_text}")


def _run_nvrtc(req: CompileRequest):
    """Run NVRTC on a request: a CacheEntry (cubin or PTX), or CompileFailure. Called on the
    main thread, NVRTC runs in a thread of its own, waited for so that Ctrl-C stops the
    wait at once (``_interruptible``)."""
    if threading.current_thread() is threading.main_thread():
        return _interruptible(_nvrtc_entry, req)
    return _nvrtc_entry(req)


def _interruptible(fn, *args):
    """``fn(*args)`` in a daemon thread, waited for on this one. NVRTC holds the thread that
    calls it until its compile ends (minutes, for some), and Python runs a signal's handler
    on the main thread between its own steps only, so Ctrl-C waited for the compile; an
    event's wait is interrupted at once (KeyboardInterrupt). The compile left behind ends in
    its thread, its result dropped (and its program destroyed there); a daemon thread, it
    does not hold up the interpreter's exit."""
    box: list = []
    done = threading.Event()

    def run():
        try:
            _no_interrupts_here()
            box.append((True, fn(*args)))
        except BaseException as e:  # raised on the waiting thread
            box.append((False, e))
        finally:
            done.set()
    threading.Thread(target=run, name="nbjit-nvrtc", daemon=True).start()
    try:
        _wait(done)
    except BaseException:
        _left_running()
        raise
    ok, value = box.pop()
    if not ok:
        raise value
    return value


def _in_threads(fn, items: list, n: int) -> list:
    """``[fn(item) for item in items]``, run in ``n`` daemon threads, waited for on this one
    (as ``_interruptible``: Ctrl-C stops the wait at once; the threads then take no new item,
    and what they run ends there, its result dropped)."""
    results: list = [None] * len(items)
    todo = iter(range(len(items)))  # (each next() is one step under the GIL: an item per thread)
    stop: list = []
    errors: list = []
    left, lock, done = [n], threading.Lock(), threading.Event()

    def work():
        try:
            _no_interrupts_here()
            for i in todo:
                if stop:
                    break
                results[i] = fn(items[i])
        except BaseException as e:  # (fn's own errors are its results: this is a failure of the thread's)
            errors.append(e)
        finally:
            finished(1)

    def finished(count: int) -> None:
        with lock:
            left[0] -= count
            if left[0] <= 0:
                done.set()
    started = 0
    try:
        for k in range(n):
            threading.Thread(target=work, name=f"nbjit-compile-{k}", daemon=True).start()
            started += 1
    finally:
        if started < n:  # (a thread that could not start: the others do its share, or this raises)
            finished(n - started)
    try:
        _wait(done)
    except BaseException:
        stop.append(True)
        _left_running()
        raise
    if errors:
        raise errors[0]
    return results


def _no_interrupts_here() -> None:
    """In a compile's thread: Ctrl-C (SIGINT) is delivered to another thread, never this
    one, which NVRTC holds (the kernel gives a process's signal to any thread that does not
    block it, and a signal taken here would not wake the waiting thread)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _wait(done: threading.Event) -> None:
    """Wait for ``done``, looking at signals four times a second (a signal some other thread
    took is handled here all the same: KeyboardInterrupt)."""
    while not done.wait(0.25):
        pass


_LEFT_RUNNING: list = []


def _left_running() -> None:
    """A compile was left running in its thread (Ctrl-C): should the process exit before it
    ends, the C libraries' teardown is skipped (glibc's ``on_exit`` calls ``_exit`` with the
    exit status, before the destructors registered earlier), which would destroy NVRTC's
    state under the compile: a crash at exit (status -11, 1 run in 12 on the 2-core machine).
    Python's own shutdown (its atexit functions, flushing its streams) has run by then."""
    if _LEFT_RUNNING:
        return
    _LEFT_RUNNING.append(True)
    import ctypes
    try:
        libc = ctypes.CDLL(None)
        on_exit, exit_now = libc.on_exit, libc._exit
    except (OSError, AttributeError):  # (not glibc: nothing to register it with)
        return
    on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    on_exit(ctypes.cast(exit_now, ctypes.c_void_p), None)  # (called as _exit(status, NULL): the NULL unread)


def _nvrtc_entry(req: CompileRequest):
    """``_run_nvrtc``'s compile, on the thread that runs it."""
    N = _nvrtc()
    major, minor = nvrtc_version()
    arch = _nvrtc_arch(req.arch, req.output, req.name, f"NVRTC {major}.{minor}")
    full = [f"-arch={arch}", *req.options]
    plan = _pch_plan(req, arch, (major, minor))
    if plan is None:
        return _nvrtc_compile(N, req, arch, full, None)
    with _pch.STORE.lock:  # one PCH heap per process: its files and size change under this lock
        return _nvrtc_compile(N, req, arch, full, plan)


def _pch_supported(version: tuple[int, int]) -> bool:
    """Whether this NVRTC (12.8+) and cuda.bindings have precompiled headers."""
    if version < (12, 8):
        return False
    from cuda.bindings import nvrtc as N
    return all(hasattr(N, f) for f in ("nvrtcGetPCHCreateStatus", "nvrtcGetPCHHeapSizeRequired",
                                       "nvrtcSetPCHHeapSize", "nvrtcGetPCHHeapSize"))


def _pch_plan(req: CompileRequest, arch: Arch, version: tuple[int, int]) -> str | None:
    """The PCH key of a compile that gets a PCH (made or used), else None."""
    if req.pch == "off" or _pch.user_pch_option(req.options):
        return None
    prefix = _pch.header_prefix(req.source)
    if not _pch.includes(prefix) or not _pch_supported(version):
        return None
    walk = includes_of(req, prefix)
    if walk.unknown is not None or not _pch.worth_it(req.pch, prefix, walk.size):
        return None
    cccl = _cccl()
    key = cache_key({
        "producer": "nvrtc-pch", "toolchain": _toolchain_fingerprint(), "cccl": cccl[1] if cccl else None,
        "cuda_headers": _cuda_headers_id(), "prefix": prefix, "name": req.name,
        "headers": [list(h) for h in req.headers], "arch": str(arch), "includes": [list(f) for f in walk.files],
        # (not the back-end options NVRTC does not compare for a PCH: one PCH serves every value)
        "options": _portable_options(_pch.pch_options(req.options)),
    })
    if req.pch == "auto" and key not in _pch.STORE.seen and _pch.STORE.get(key) is None:
        # a PCH serves this process only, and making one costs its compile a quarter more and
        # a file of up to hundreds of MB: "auto" makes it when the same headers come a second time
        _pch.STORE.seen.add(key)
        return None
    return key


def _nvrtc_compile(N, req: CompileRequest, arch: Arch, full: list[str], plan):
    """One NVRTC compile of ``req`` with the options ``full``; with ``plan`` (a PCH key),
    making or using that PCH (under ``pch.STORE.lock``)."""
    source, name, exprs, headers, output = req.source, req.name, req.expressions, dict(req.headers), req.output
    ok = N.nvrtcResult.NVRTC_SUCCESS
    major, minor = nvrtc_version()
    store, pch_file, making = _pch.STORE, None, False
    if plan is not None:
        pch_file = store.get(plan)
        if pch_file is None:
            making, pch_file = True, store.path_for(plan, req.cache_dir)
            _pch_heap(N, store)
    opts = full + ([f"--create-pch={pch_file}" if making else f"--use-pch={pch_file}"] if pch_file else [])
    err, prog = N.nvrtcCreateProgram(source.encode(), name.encode(), len(headers),
                                     [t.encode() for t in headers.values()], [k.encode() for k in headers])
    if err != ok:
        raise NbjitCompileError(f"{name}: nvrtcCreateProgram failed: {err}")
    try:
        for e in exprs:
            N.nvrtcAddNameExpression(prog, e.encode())
        res = N.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])[0]
        log = _nvrtc_log(N, prog)
        if pch_file is not None:
            log = _pch_outcome(N, prog, store, plan, pch_file, making, res == ok, log)
        if res != ok:
            raise CompileFailure(name, source, full, log, f"NVRTC {major}.{minor}", _header_hint(log),
                                 _portable_options(full))
        names = {}
        for e in exprs:
            err, lowered = N.nvrtcGetLoweredName(prog, e.encode())
            if err != ok:
                raise NbjitCompileError(f"{name}: no kernel for name expression {e!r} ({err})")
            names[e] = lowered.decode()
        if output == "ltoir":  # (-dlto: what nvJitLink links, nbjit.link)
            err, size = N.nvrtcGetLTOIRSize(prog)
            buf = bytearray(size)
            N.nvrtcGetLTOIR(prog, buf)
            kind, payload = "ltoir", buf
        elif not arch.virtual and output != "ptx":
            err, size = N.nvrtcGetCUBINSize(prog)
            buf = bytearray(size)  # NVRTC writes here: never a bytes object (CPython shares small ones)
            N.nvrtcGetCUBIN(prog, buf)
            kind, payload = "cubin", buf
        else:
            err, size = N.nvrtcGetPTXSize(prog)
            buf = bytearray(size)
            N.nvrtcGetPTX(prog, buf)
            kind, payload = "ptx", buf.rstrip(b"\0")
        return CacheEntry(kind, str(arch), bytes(payload), names, log, f"NVRTC {major}.{minor}")
    finally:
        N.nvrtcDestroyProgram(prog)


def _pch_heap(N, store) -> None:
    """Before this process's first PCH: a heap large enough for CCCL's headers (NVRTC's
    default is not). Resizing voids every PCH made before, so it happens while there is none."""
    if store.heap_set or store.files:
        return
    store.heap_set = True
    err, size = N.nvrtcGetPCHHeapSize()
    if err == N.nvrtcResult.NVRTC_SUCCESS and size < _pch.HEAP_BYTES:
        N.nvrtcSetPCHHeapSize(_pch.HEAP_BYTES)


def _pch_outcome(N, prog, store, key: str, pch_file: str, making: bool, compiled: bool, log: str) -> str:
    """Record what became of a compile's PCH; its log without NVRTC's PCH lines."""
    log, said = _pch.clean_log(log)
    if making:
        status = N.nvrtcGetPCHCreateStatus(prog)[0]
        if status == N.nvrtcResult.NVRTC_SUCCESS and compiled and os.path.isfile(pch_file):
            store.add(key, pch_file)
            return log
        _pch._remove(pch_file)
        if status == N.nvrtcResult.NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED:
            err, required = N.nvrtcGetPCHHeapSizeRequired(prog)
            if err == N.nvrtcResult.NVRTC_SUCCESS and required:
                store.resized()  # every PCH made in the old heap is void; the next compile makes this one
                N.nvrtcSetPCHHeapSize(_pch.heap_for(required))
        return log
    if said.get("used") == pch_file:
        store.stats["used"] += 1
    elif 20282 in said["refused"]:  # the heap was resized by someone else: every PCH of ours is void
        store.stats["refused"] += 1
        store.resized()
    else:  # its headers or options did not match after all (NVRTC compiled without it): make it again
        store.stats["refused"] += 1
        store.forget(key)
    return log


_MISSING_HEADER = re.compile(r'cannot open source file "([^"\n]+)"')
_C_HEADERS = {"stdint.h": "cstdint", "stddef.h": "cstddef", "limits.h": "climits", "float.h": "cfloat",
              "math.h": "cmath", "assert.h": "cassert", "string.h": "cstring", "stdlib.h": "cstdlib"}


def _header_hint(log: str) -> str:
    """What to include instead of a standard header NVRTC has not got (it compiles device
    code only: no host C++ library), where CCCL's libcu++ has the same under cuda/std."""
    hints = []
    for h in dict.fromkeys(_MISSING_HEADER.findall(log)):
        std = _C_HEADERS.get(h, h)
        cccl = cccl_include_dir()
        if "/" not in std and cccl and os.path.isfile(os.path.join(cccl, "cuda", "std", std)):
            hints.append(f"hint: NVRTC has no C++ standard library headers; for <{h}> include <cuda/std/{std}> "
                         "(CCCL's libcu++, on nbjit's include path) and use cuda::std::")
        elif h in _C_HEADERS or ("/" not in h and "." not in h):
            hints.append(f"hint: <{h}> is a host C++ standard library header, which NVRTC does not have (it "
                         "compiles device code only)")
    return "\n".join(hints)


# ptxas's report, which NVRTC's log holds where the options ask for it (-Xptxas=-v; nvJitLink:
# -verbose): per function, its stack frame and spill stores and loads in bytes. Never asked
# for by nbjit itself: ptxas records its options in the cubin (a note), so -v changes the bytes.
_FUNCTION_PROPERTIES = re.compile(
    r"^ptxas[ \t]+info[ \t]*:[ \t]*Function properties for ([^\s']+)[ \t]*\r?\n"
    r"ptxas[ \t]+\.[ \t]+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", re.M)


def ptxas_report(log: str) -> dict[str, dict[str, int]]:
    """What ptxas reported of each function in a verbose log (NVRTC with ``-Xptxas=-v``,
    nvJitLink with ``-verbose``): ``{function: {"stack_frame": bytes, "spill_stores": bytes,
    "spill_loads": bytes}}``; empty where the log holds no report."""
    if "ptxas" not in log:
        return {}
    return {m[1]: {"stack_frame": int(m[2]), "spill_stores": int(m[3]), "spill_loads": int(m[4])}
            for m in _FUNCTION_PROPERTIES.finditer(log)}


def _nvrtc_log(N, prog) -> str:
    err, size = N.nvrtcGetProgramLogSize(prog)
    buf = bytearray(size)  # written by NVRTC: b" " * 1 would be the interpreter's shared b" "
    N.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\0").decode(errors="replace").strip()


def compile_many(sources: Iterable, *, workers: int | None = None, processes: bool | None = None,
                 return_exceptions: bool = False, **common) -> list[Image]:
    """Compile independent sources at once, each as ``compile_image`` would (through the
    cache and its per-key lock), and return their images in the order given.

    Parameters
    ----------
    sources: each CUDA C++ text, a ``.cu`` path, or a dict of ``compile_image``'s arguments
        (``{"source": ..., "name": ..., "options": ...}``) that override ``common``.
    workers: compiles at once, at most (default: the CPUs this process may use).
    processes: where NVRTC runs. Each source is looked up and cached by this process (the
        cache's memory, its files and their per-key locks as ``compile_image`` has them); what
        must be compiled is compiled in a thread of the call (NVRTC releases the GIL) or, on the
        process route, in one of nbjit's worker processes (fresh interpreters, never forks;
        they stay for the next call and exit after a minute idle), fed by the calling thread
        itself where workers are ready (no thread per source). ``None`` (default):
        the process route where ``workers`` (capped by the sources) is ``PROCESS_ROUTE_MIN``
        or more, compiling in threads until workers have started (the first call starts
        them); ``True``: always in workers, waiting for them to start; ``False``: in threads.
    return_exceptions: ``True``: a source that failed has its error (a ``CompileFailure``
        with NVRTC's log, an ``NbjitCompileError``...) in its place in the list, the others
        their images, and nothing is raised for it (``False``: the first failure is raised).
    common: ``compile_image``'s keyword arguments for every source (``arch``, ``options``...).

    Raises
    ------
    NbjitCompileError: naming the first source (in order) that failed, its index and name,
    with its error as the cause; the others still compiled (and were cached). Not raised for
    failed sources with ``return_exceptions=True`` (a bad argument of the call still is).
    """
    jobs = _many_jobs(sources, common)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise NbjitCompileError(f"compile_many: workers must be an int >= 1, not {workers!r}")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    n = max(1, min(len(jobs), workers or cpus))
    if processes not in (None, True, False):
        raise NbjitCompileError(f"compile_many: processes must be True, False or None, not {processes!r}")
    if type(return_exceptions) is not bool:
        raise NbjitCompileError(f"compile_many: return_exceptions must be True or False, not {return_exceptions!r}")
    route = None
    if processes or (processes is None and n >= PROCESS_ROUTE_MIN):
        if os.name == "posix":  # (the workers' pipes are waited on with select)
            from nbjit import _workers
            # processes=None: while no worker is ready, a few compile in their threads (NVRTC
            # serialises compiles in threads beyond about two); the others wait for a worker
            slots = None if processes else _workers.Slots(max(1, min(n, PROCESS_INLINE, cpus)))
            route = (_workers.pool(_WORKER, _WORKER_INIT), n, processes is True, slots)

    def one(job):
        s, kw = job
        _ROUTE.pool = route
        try:
            return compile_image(s, **kw), None
        except Exception as e:  # reported below, in order, naming the source
            return None, e
        finally:
            _ROUTE.pool = None

    results: list = [None] * len(jobs)
    todo = range(len(jobs))
    if route is not None and not route[0].broken and (route[2] or route[0].ready()):
        # workers ready (or to be waited for): all in this thread, no thread per source (each
        # source whose cache has a remote tier goes to a thread: the key's lock is this process's)
        todo = _on_workers(jobs, route[0], n, results)
    if n == 1 or len(todo) <= 1:
        for i in todo:
            results[i] = one(jobs[i])
    else:  # (daemon threads, waited for so that Ctrl-C stops the call at once: _in_threads)
        for i, r in zip(todo, _in_threads(one, [jobs[i] for i in todo], min(n, len(todo)))):
            results[i] = r
    if return_exceptions:
        return [img if e is None else e for img, e in results]
    failed = [(i, e) for i, (_, e) in enumerate(results) if e is not None]
    if failed:
        i, e = failed[0]
        raise NbjitCompileError(f"compile_many: source {i} ({_label(*jobs[i])}) failed{_more(failed)}: {e}") from e
    return [img for img, _ in results]


def _many_jobs(sources, common: dict) -> list:
    """``compile_many``'s items as ``(source, compile_image's arguments)``, checked before
    anything compiles."""
    jobs = []
    for i, s in enumerate(read_once(sources) if not isinstance(sources, (str, bytes, os.PathLike)) else (sources,)):
        kw = dict(common)
        if isinstance(s, Mapping):
            kw.update(s)
            if "source" not in kw:
                raise NbjitCompileError(f"compile_many: item {i} is a dict without 'source'")
            s = kw.pop("source")
        unknown = sorted(k for k in kw if k not in _IMAGE_ARGS)
        if unknown:  # (before anything compiles: an item's keys, or the call's own keywords)
            where = f"item {i}" if any(k not in common for k in unknown) else "the call"
            raise NbjitCompileError(f"compile_many: {where}: no argument {', '.join(map(repr, unknown))} "
                                    f"(compile_image takes {', '.join(_IMAGE_ARGS)})")
        jobs.append((s, kw))
    return jobs


def _label(s, kw: dict) -> str:
    """How ``compile_many``'s error names a source: its name, its file, or ``kernel.cu``."""
    return kw.get("name") or (os.fspath(s) if isinstance(s, os.PathLike) or (
        isinstance(s, str) and "\n" not in s and s.rstrip().lower().endswith(SOURCE_SUFFIXES)) else "kernel.cu")


def _more(failed: list) -> str:
    """`` (and 2 more: items 3, 5)`` after the first failure, where others failed too."""
    if not failed[1:]:
        return ""
    return f" (and {len(failed) - 1} more: item{'s' if failed[2:] else ''} {', '.join(str(j) for j, _ in failed[1:8])})"


# compile_many's process route: the threads of a call on it hold (pool, workers, wait, slots) here
_ROUTE = threading.local()
PROCESS_ROUTE_MIN = 4  # compile_many(processes=None) takes worker processes from this many at once
PROCESS_INLINE = 4  # ... and compiles at most this many in its threads while no worker is ready
_WORKER = "nbjit.compiler:_compile_entry"
_WORKER_INIT = "nbjit.compiler:_worker_init"


def _worker_init() -> None:
    """A worker process's start: NVRTC loaded (no warm-up compile: one costs a whole small
    compile, ~50 ms on the 2-core machine, to save ~10 ms of the first real one)."""
    try:
        supported_archs()
        _toolchain_fingerprint()
    except Exception:  # (the first real compile reports what is wrong)
        pass


def _through_worker(route: tuple, req: CompileRequest, key: str, cache: Cache) -> CacheEntry:
    """``cache.get_or_create`` on ``compile_many``'s process route: what a miss needs done by
    a worker process where one is ready: the key's lock taken, NVRTC run, the facts read and
    the cache file written there (``cache.make_locked``); where the cache has a remote tier,
    the lock is this process's (the tier is looked in under it) and the worker compiles and
    writes the file under it. Where no worker is ready, compiled here as ``compile_image``
    does (in one of the call's slots, where it has them: given back after)."""
    pool, want, wait, slots = route
    taken = []

    def ask(lock_timeout):
        done, got = pool.try_call((req, _toolchain_fingerprint(), key, cache._file(key), cache.remote is not None,
                                   lock_timeout), want, wait, None if taken else slots)
        if done:
            return got
        if got is not None:
            taken.append(got)
        return None

    def make():
        got = ask(None) if cache.remote is not None else None  # (no remote tier: delegate asked already)
        return got if got is not None else _run_nvrtc(req)

    try:
        return cache.get_or_create(key, make, lambda e: _derive_facts(e, req), lambda: ask(cache.lock_timeout))
    finally:
        if taken:
            pool.release(taken[0])


# compile_image's keyword arguments and their defaults, in its (and _plan's) order
_IMAGE_ARGS = compile_image.__kwdefaults__


def _on_workers(jobs: list, pool, want: int, results: list) -> list[int]:
    """``compile_many``'s process route with workers ready (or ``processes=True``: waited for),
    all in the calling thread: each source planned as ``compile_image`` plans it (the
    first level, the request, its key) and looked up (memory, disk); the misses are sent to
    idle workers (``make_locked`` there: the key's lock, NVRTC, the facts, the file written)
    in a burst once there are enough to fill them, up to ``want`` at once, each worker given
    the next miss as its reply comes (``poll`` over the busy workers' pipes: no limit on
    their descriptors' numbers, as ``select`` has). A thread per source would cost each source
    a thread start and GIL hand-overs before its request leaves, many milliseconds apart
    on busy CPUs (the workers compiling). ``results[i]``: ``(image, None)`` or ``(None,
    error)``; returns the sources left to ``compile_image`` in threads: a cache with a
    remote tier (the key's lock is this process's), and where workers cannot start (the
    pool broke) those not yet sent."""
    import select
    from collections import deque

    from nbjit._workers import WorkerDied

    fingerprint = _toolchain_fingerprint()
    left: list[int] = []
    waiting: dict = {}  # (cache, key) -> [(index, request, call)]: one compile for sources of one key
    pending: deque = deque()  # [(cache, key), request, key, cache, attempts] to send
    busy: dict = {}  # a busy worker's pipe -> (worker, its pending item)
    replies = select.poll()  # (the busy workers' pipes)

    def done(item, entry=None, error=None) -> None:
        for i, req, call in waiting.pop(item[0]):
            if error is None:
                try:  # (a warning names compile_many's caller: _finish, done, receive, _on_workers, compile_many)
                    results[i] = _finish(entry, req, item[3], call, 6, item[2]), None
                except Exception as e:
                    results[i] = None, e
            else:
                results[i] = None, error

    def plan(i: int) -> None:
        s, kw = jobs[i]  # (its keys are compile_image's: compile_many refused others)
        try:
            got = _plan(s, *(kw.get(a, d) for a, d in _IMAGE_ARGS.items()))
            if type(got) is Image:
                results[i] = got, None
                return
            req, key, cache, call, entry = got
            if entry is not None:  # (the call index's)
                results[i] = _finish(entry, req, cache, call, 5), None
                return
            if cache.remote is not None:
                left.append(i)
                return
            entry = cache.lookup(key, lambda e: _derive_facts(e, req))
            if entry is not None:
                results[i] = _finish(entry, req, cache, call, 5, key), None
                return
        except Exception as e:
            results[i] = None, e
            return
        k = (id(cache), key)
        if k in waiting:
            waiting[k].append((i, req, call))
        else:
            waiting[k] = [(i, req, call)]
            pending.append([k, req, key, cache, 0])

    def send(w, item) -> None:
        fd = w.fileno()
        busy[fd] = w, item
        _, req, key, cache, _ = item
        try:
            w.send((req, fingerprint, key, cache._file(key), False, cache.lock_timeout))
        except WorkerDied as e:
            del busy[fd]
            pool.drop(w)
            again(item, e)
            return
        except Exception as e:  # (not sent: a request that does not pickle; the worker read nothing)
            del busy[fd]
            pool.put(w, answered=False)
            done(item, error=e)
            return
        replies.register(fd, select.POLLIN)

    def again(item, e) -> None:
        item[4] += 1
        if item[4] < 2:
            pending.appendleft(item)  # once more, in another worker
        else:
            done(item, error=e)

    def receive(fd) -> None:
        w, item = busy[fd]
        replies.unregister(fd)
        try:
            written = w.receive()
        except WorkerDied as e:
            del busy[fd]
            pool.drop(w)
            again(item, e)
            return
        except Exception as e:  # the target's own error (NVRTC's, say): the worker is fine
            del busy[fd]
            pool.put(w, answered=False)
            done(item, error=e)
            return
        del busy[fd]
        pool.put(w)
        try:
            entry = item[3].adopt(item[2], written, lambda e: _derive_facts(e, item[1]))
        except Exception as e:
            done(item, error=e)
            return
        done(item, entry)

    def feed() -> None:
        while pending and len(busy) < want:
            w = pool.take(want)
            if w is None:
                return
            send(w, pending.popleft())

    try:
        for i in range(len(jobs)):
            plan(i)
            # the misses go out together once there are enough for the workers free (their
            # requests in a burst: sent before this process's time slice ends, the workers
            # woken then compiling); those planned later, as workers reply
            if len(pending) >= want - len(busy) or i == len(jobs) - 1:
                feed()
                if busy and pending:  # (the first replies while many sources are planned)
                    for fd, _ in replies.poll(0):
                        receive(fd)
        while pending or busy:
            feed()
            if not busy:
                if not pending:  # (feed's last sends failed: those sources have their errors)
                    break
                w = pool.take(want, timeout=1.0)  # none ready: wait for one starting
                if w is not None:
                    send(w, pending.popleft())
                elif pool.broken:  # the rest are compiled in threads, as compile_image does
                    left += [i for item in pending for i, _, _ in waiting.pop(item[0])]
                    pending.clear()
                continue
            # while sources wait and workers are starting, look for a ready one now and then
            for fd, _ in replies.poll(10 if pending and pool.starting() else None):
                receive(fd)
    finally:
        if busy:  # interrupted: their replies are never read (nor taken for others')
            pool.drop_all([w for w, _ in busy.values()])
    return sorted(left)


def _compile_entry(req: CompileRequest, fingerprint: dict, key: str | None = None, file: str | None = None,
                   keep: bool = False, lock_timeout: float | None = None) -> "CacheEntry | Written":
    """In a worker process: the entry NVRTC makes of ``req``, with its facts. ``fingerprint``:
    the parent's NVRTC, which made the cache key: this process must load the same. With
    ``key``: the entry encoded as its cache file and written to ``file`` (where not None)
    as the parent's cache writes it (``write_entry``: a ``Written``; ``keep``: with the
    file's bytes, for the remote tier), the parent holding the key's lock; with
    ``lock_timeout`` too, under the key's lock taken here (``make_locked``)."""
    if fingerprint != _toolchain_fingerprint():
        raise NbjitCompileError(f"{req.name}: nbjit's worker process found another NVRTC than its parent's "
                                f"({_toolchain_fingerprint()} against {fingerprint}); compile_many(processes=False) "
                                "compiles in threads")

    def make() -> CacheEntry:
        entry = _run_nvrtc(req)
        facts = _derive_facts(entry, req)
        return entry if facts is None else replace(entry, facts=facts)

    if key is None:
        return make()
    if lock_timeout is None:
        return write_entry(key, make(), file, keep)
    return make_locked(key, file, lock_timeout, make, keep)
