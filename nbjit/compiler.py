"""Host-side compilers: nvJitLink (PTX -> cubin for the device, e.g. when the driver is older
than the PTX's producer). No GPU needed."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from .errors import NbjitCompileError

__all__ = ["AssembledCubin", "assemble_ptx", "nvjitlink_version"]


@dataclass(frozen=True)
class AssembledCubin:
    """A cubin produced by nvJitLink from PTX, with nvJitLink's info log."""

    data: bytes
    arch: str
    log: str


@functools.lru_cache(maxsize=None)
def nvjitlink_version() -> tuple[int, int] | None:
    """(major, minor) of the nvJitLink library cuda-bindings finds, or None if there is none."""
    try:
        from cuda.bindings import nvjitlink
        return tuple(nvjitlink.version())  # type: ignore[return-value]
    except Exception:  # library missing or too old for cuda-bindings: no nvJitLink
        return None


def assemble_ptx(ptx: str | bytes, arch: str, *, name: str = "<ptx>", options: tuple[str, ...] = ()) -> AssembledCubin:
    """Assemble PTX to a cubin for ``arch`` (``"sm_90"``, ``"sm_90a"``) with nvJitLink.

    Raises
    ------
    NbjitCompileError: nvJitLink is missing or rejected the PTX (with its error log).
    """
    if nvjitlink_version() is None:
        raise NbjitCompileError(
            f"{name}: nvJitLink is not available; install it with 'pip install nvidia-nvjitlink' "
            "(numba-cuda's cu13 extra brings it)")
    from cuda.bindings import nvjitlink as J

    data = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
    if not data.endswith(b"\0"):
        data += b"\0"
    opts = [f"-arch={arch}", *options]
    handle = J.create(len(opts), opts)
    try:
        try:
            J.add_data(handle, J.InputType.PTX, data, len(data), name)
            J.complete(handle)
        except J.nvJitLinkError as e:
            raise NbjitCompileError(f"{name}: nvJitLink could not assemble PTX for {arch}: {e}\n"
                                    f"{_log(J, handle, error=True)}") from None
        size = J.get_linked_cubin_size(handle)
        buf = bytearray(size)
        J.get_linked_cubin(handle, buf)
        return AssembledCubin(bytes(buf), arch, _log(J, handle, error=False))
    finally:
        J.destroy(handle)


def _log(J, handle, *, error: bool) -> str:
    try:
        size = (J.get_error_log_size if error else J.get_info_log_size)(handle)
        buf = bytearray(size)
        (J.get_error_log if error else J.get_info_log)(handle, buf)
        return bytes(buf).rstrip(b"\0").decode(errors="replace").strip()
    except Exception:  # a log that cannot be read must not hide the real error
        return ""
