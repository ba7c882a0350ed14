"""Whether nbjit's optional C extension (``nbjit.gpu._launcher``: the launch hot path) is
used, decided here alone, once per process: where it is built and ``NBJIT_PURE_PYTHON`` is
not set. Every other module asks ``extension()``; none imports ``_launcher`` itself."""
from __future__ import annotations

import functools
import os
from types import ModuleType

__all__ = ["extension", "switched_off"]


def switched_off() -> bool:
    """Whether ``NBJIT_PURE_PYTHON`` asks for the Python launch path (any value but "" and "0")."""
    return os.environ.get("NBJIT_PURE_PYTHON", "") not in ("", "0")


@functools.lru_cache(maxsize=None)
def extension() -> ModuleType | None:
    """The ``nbjit.gpu._launcher`` module, or None where it is not built or is switched off."""
    if switched_off():
        return None
    try:
        from nbjit.gpu import _launcher
    except ImportError:  # a build without a C compiler: the same rules run in Python
        return None
    return _launcher
