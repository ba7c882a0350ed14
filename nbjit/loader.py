"""Decide what to hand the driver for an image on a given device and driver: pure data in,
plain data out, so every route is tested without a GPU.

PTX routes (FORMATS.md §8: on the CUDA 13.0 driver the ISA version is what blocks external
PTX, and a ``debug`` target compiles unoptimised):
* ``"driver"``: the driver's JIT takes the PTX as it is (debug information stripped unless
  asked to keep it);
* ``"nvjitlink"``: the PTX is newer than the driver accepts, and nvJitLink (same version as
  the PTX's producer or newer) assembles it to a cubin for the device on the host;
* ``"lowered"``: no such nvJitLink; ``.version`` is rewritten to the newest the driver
  takes, which works whenever the PTX uses no newer instruction.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from .cache import Cache, CacheEntry, cache_key, default_cache
from .compiler import _toolchain_fingerprint, assemble_ptx, nvjitlink_version
from .cubin import CubinInfo, inspect_cubin
from .errors import NbjitCompileError, NbjitLoadError
from .fatbin import FatbinInfo, inspect_fatbin, select_entry
from .image import Image
from .ptx import PtxInfo, cuda_for_ptx, inspect_ptx, max_ptx_for_cuda, set_version, strip_debug

__all__ = ["Prepared", "prepare"]


@dataclass
class Prepared:
    """What to load: ``data`` of ``kind`` ("ptx" NUL-terminated, "cubin", "fatbin"), the
    inspection that gives kernel signatures (``info``), the ``route`` a PTX took and a
    ``note`` for the user, and the fatbin entry used, if any."""

    data: bytes
    kind: str
    info: PtxInfo | CubinInfo | None
    route: str | None = None
    note: str | None = None
    entry: int | None = None
    ptx: PtxInfo | None = None  # the PTX's own inspection (signatures with types), if PTX was given
    details: dict = field(default_factory=dict)


def _device_arch(cc: tuple[int, int], ptx_arch: str | None = None) -> str:
    sm = cc[0] * 10 + cc[1]
    # keep an arch-specific target (sm_90a PTX, as Triton writes) when it is this very chip
    suffix = "a" if ptx_arch and ptx_arch.endswith("a") and ptx_arch[3:-1] == str(sm) else ""
    return f"sm_{sm}{suffix}"


def prepare(img: Image, cc: tuple[int, int], driver: int, *, keep_debug: bool = False,
            cache: Cache | None = None, nvjitlink: tuple[int, int] | None | bool = True) -> Prepared:
    """Plan the load of ``img`` on a device of compute capability ``cc`` under a driver of
    CUDA version ``driver`` (e.g. 13000). ``nvjitlink``: True to use the installed one,
    None to act as if there were none, or a version to pretend. Cubins nvJitLink makes go
    to ``cache`` (default: ``nbjit.default_cache()``)."""
    cache = cache or default_cache()
    if img.kind == "ptx":
        return _prepare_ptx(img.data, img.name, cc, driver, keep_debug, cache, nvjitlink)
    if img.kind == "cubin":
        info = inspect_cubin(img.data, source=img.name)
        _check_cubin_arch(info, cc, img.name)
        return Prepared(img.data, "cubin", info)
    fb = inspect_fatbin(img.data, source=img.name)
    return _prepare_fatbin(img, fb, cc, driver, keep_debug, cache, nvjitlink)


def _check_cubin_arch(info: CubinInfo, cc: tuple[int, int], name: str) -> None:
    dev = cc[0] * 10 + cc[1]
    ok = info.sm == dev or (info.sm // 10 == dev // 10 and info.sm < dev and not info.arch_specific)
    if not ok:
        raise NbjitLoadError(f"{name}: a cubin for {info.arch} cannot run on this sm_{dev} device (cubins run on "
                             "the same major version at an equal or newer minor, 'a' builds only on their own "
                             "chip): build it for sm_{0} or load PTX instead".format(dev))


def _prepare_ptx(raw: bytes, name: str, cc, driver: int, keep_debug: bool, cache: Cache,
                 nvjitlink) -> Prepared:
    text = raw.decode("utf-8", errors="strict").rstrip("\0") if isinstance(raw, bytes) else raw
    info = inspect_ptx(text, source=name)
    dev = cc[0] * 10 + cc[1]
    target = int("".join(ch for ch in info.arch[3:] if ch.isdigit()) or 0)
    if target > dev or (info.arch.endswith("a") and target != dev):
        raise NbjitLoadError(f"{name}: PTX for {info.arch} cannot run on this sm_{dev} device")
    if not keep_debug and info.debug.kind != "none":
        text = strip_debug(text)
    driver_cuda = (driver // 1000, driver % 1000 // 10)
    limit = max_ptx_for_cuda(driver_cuda)
    details = {"ptx_version": info.version, "driver_accepts": limit, "target": info.arch}
    if info.version <= limit:
        return Prepared(text.encode() + b"\0", "ptx", info, "driver", None, ptx=info, details=details)

    need = cuda_for_ptx(info.version)
    have = nvjitlink_version() if nvjitlink is True else nvjitlink
    details["nvjitlink"] = have
    if have is not None and tuple(have) >= need:
        arch = _device_arch(cc, info.arch)
        key = cache_key({"producer": "nvjitlink", "toolchain": _toolchain_fingerprint(), "nvjitlink": list(have),
                         "ptx": hashlib.sha256(text.encode()).hexdigest(), "arch": arch})

        def make() -> CacheEntry:
            out = assemble_ptx(text, arch, name=name)
            return CacheEntry("cubin", arch, out.data, {}, out.log, f"nvJitLink {have[0]}.{have[1]}")

        try:
            cubin = cache.get_or_create(key, make).payload
        except NbjitCompileError as e:
            raise NbjitLoadError(f"{name}: PTX {info.version[0]}.{info.version[1]} is newer than this driver takes "
                                 f"(CUDA {driver_cuda[0]}.{driver_cuda[1]}: PTX up to {limit[0]}.{limit[1]}), and "
                                 f"nvJitLink {have[0]}.{have[1]} could not assemble it:\n{e}") from None
        note = (f"{name}: PTX {info.version[0]}.{info.version[1]} is newer than the driver accepts "
                f"({limit[0]}.{limit[1]}); assembled to a {arch} cubin with nvJitLink {have[0]}.{have[1]}")
        return Prepared(cubin, "cubin", inspect_cubin(cubin, source=name), "nvjitlink", note, ptx=info,
                        details=details)
    lowered = set_version(text, limit)
    note = (f"{name}: PTX {info.version[0]}.{info.version[1]} is newer than the driver accepts "
            f"({limit[0]}.{limit[1]}) and no nvJitLink >= {need[0]}.{need[1]} is installed; "
            f".version lowered to {limit[0]}.{limit[1]} (fine unless the PTX uses newer instructions; "
            f"'pip install -U nvidia-nvjitlink' assembles it properly)")
    return Prepared(lowered.encode() + b"\0", "ptx", info, "lowered", note, ptx=info, details=details)


def _prepare_fatbin(img: Image, fb: FatbinInfo, cc, driver, keep_debug, cache, nvjitlink) -> Prepared:
    dev = cc[0] * 10 + cc[1]
    entry = select_entry(fb.entries, dev)
    if entry is None:
        have = ", ".join(e.arch for e in fb.entries)
        raise NbjitLoadError(f"{img.name}: no image in this fatbin runs on sm_{dev} (it holds {have})")
    if entry.payload is None:
        # compressed in a way Python cannot undo: the driver reads the whole container;
        # signatures come from any entry we can read, else from the driver
        readable = next((e for e in fb.entries if e.payload is not None and e.kind == "cubin"), None)
        info = inspect_cubin(readable.payload, source=img.name) if readable else None
        return Prepared(img.data, "fatbin", info, None,
                        f"{img.name}: image {entry.index} ({entry.arch}) is zstd-compressed and 'zstandard' is not "
                        "installed; the driver loads the whole fatbin", entry.index)
    sub = Image(entry.payload, entry.kind, f"{img.name}[{entry.index}:{entry.arch}]")
    p = prepare(sub, cc, driver, keep_debug=keep_debug, cache=cache, nvjitlink=nvjitlink)
    p.entry = entry.index
    return p
