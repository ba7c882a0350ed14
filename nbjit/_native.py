"""Whether nbjit's optional C extension (``nbjit._launch``: the launch hot path, and the
decoder of a cache entry's facts) is used, decided here alone, once per process: where it is
built and ``NBJIT_PURE_PYTHON`` is not set. Every other module asks ``extension()``; none
imports ``_launch`` itself."""
from __future__ import annotations

import functools
import os
from types import ModuleType

__all__ = ["extension", "function", "switched_off"]


def switched_off() -> bool:
    """Whether ``NBJIT_PURE_PYTHON`` asks for the Python launch path (any value but "" and "0")."""
    return os.environ.get("NBJIT_PURE_PYTHON", "") not in ("", "0")


@functools.lru_cache(maxsize=None)
def extension() -> ModuleType | None:
    """The ``nbjit._launch`` module, or None where it is not built or is switched off."""
    if switched_off():
        return None
    try:
        from nbjit import _launch
    except ImportError:  # a build without a C compiler: the same rules run in Python
        return None
    return _launch


def function(name: str):
    """The C extension's function ``name`` (``decode_facts``, ``file_signs``: helpers of a
    warm start), or False where the extension is not used or this build has no such function
    (Linux only, an older build): then the caller's Python does the same."""
    ext = extension()
    return getattr(ext, name, False) if ext is not None else False
