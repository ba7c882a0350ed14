"""nbjit's exception hierarchy: everything nbjit raises on bad input derives from NbjitError."""
from __future__ import annotations

__all__ = [
    "NbjitError",
    "PtxParseError",
    "ImageFormatError",
    "NbjitCompileError",
    "NbjitLoadError",
    "NbjitLaunchError",
    "NbjitArgumentError",
    "NbjitCacheError",
    "KernelNotFoundError",
    "NbjitWarning",
]


class NbjitError(Exception):
    """Base class of every error nbjit raises."""


class PtxParseError(NbjitError, ValueError):
    """PTX text that nbjit cannot parse; ``source`` and ``line`` say where."""

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None):
        self.source = source
        self.line = line
        where = source or "<ptx>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: {message}")


class ImageFormatError(NbjitError, ValueError):
    """Bytes that are not a usable PTX / cubin / fatbin image (wrong magic, truncated, corrupt)."""


class NbjitCompileError(NbjitError):
    """NVRTC (or nvJitLink) rejected the input."""


class NbjitLoadError(NbjitError):
    """The driver could not load a module."""


class NbjitLaunchError(NbjitError):
    """A kernel launch failed or its configuration is invalid."""


class NbjitArgumentError(NbjitError, TypeError):
    """A launch argument does not fit the kernel's parameter."""


class NbjitCacheError(NbjitError):
    """The on-disk cache cannot be used."""


class KernelNotFoundError(NbjitError, KeyError):
    """No kernel of that name in the module."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class NbjitWarning(UserWarning):
    """Something nbjit did on the user's behalf that they may want to know about."""
