"""What a compile is for where its caller names nothing: the current device's architecture.
The compiling stage (``compiler``) is always told its target; the public entry points ask
here, and only where no architecture is given, so that compiling for a named one needs no
GPU (and imports neither numpy, Numba nor the driver module)."""
from __future__ import annotations

from typing import Any

from nbjit.arch import Arch
from nbjit.compiler import compile_image as _compile_image
from nbjit.image import Image


__all__ = ["compile_image", "current_arch"]


def current_arch() -> Arch:
    """The SASS architecture of the current context's device (``sm_90`` on an H100); Numba's
    context is made current where none is.

    Raises
    ------
    NbjitLoadError: there is no usable GPU or driver (the message says to give ``arch=``).
    """
    from nbjit._host import current_host  # (a named architecture needs no driver, nor Numba)
    return current_host().device_arch()


def compile_image(source: str, *, arch: Arch | str | None = None, **options: Any) -> Image:
    """Compile CUDA C++ with NVRTC to an ``Image`` (cubin or PTX), loading nothing: for
    ``arch`` (``"sm_90"``, ``"sm_90a"``, ``"compute_90"`` or an ``Arch``), or where it is not
    given, the current device's (the one case that needs a GPU).

    Parameters
    ----------
    source: CUDA C++ text, or a ``.cu`` file's path.
    arch: what to compile for; default: the current device's architecture.
    options: the other arguments of ``nbjit.compiler.compile_image`` (``name``,
        ``name_expressions``, ``headers``, ``include_paths``, ``options``, ``output``,
        ``cache``, ``pch``), with the same meaning.

    Raises
    ------
    NbjitCompileError: as ``nbjit.compiler.compile_image``. NbjitLoadError: no ``arch`` and
    no usable GPU.
    """
    return _compile_image(source, arch=current_arch() if arch is None else arch, **options)
