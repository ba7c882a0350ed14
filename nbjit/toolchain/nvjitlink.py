"""nvJitLink: PTX assembled to a cubin for a device (where the driver is older than the PTX's
producer: ``assemble_cached``, through the cache), and inputs linked into one cubin
(``nvjitlink_cubin``: what ``link.py`` hands it)."""
from __future__ import annotations

import functools
from typing import Iterable

from nbjit.arch import Arch
from nbjit.cache.entries import CacheEntry, cache_key
from nbjit.cache.store import Cache, default_cache
from nbjit.errors import LinkFailure, NbjitCompileError, install_hint
from nbjit.read.image import content_digest
from nbjit.records import record
from nbjit.toolchain.identity import _toolchain_fingerprint

__all__ = ["AssembledCubin", "assemble_ptx", "assemble_cached", "nvjitlink_version", "nvjitlink_cubin",
           "LINK_INPUT_KINDS"]


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
