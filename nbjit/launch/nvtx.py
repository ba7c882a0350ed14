"""NVTX ranges around launches, for Nsight Systems' timeline: opt in with ``nbjit.nvtx(True)``
or ``NBJIT_NVTX=1``. Each launch from Python (``kernel[grid, block, ...](...)``,
``kernel.launch(...)``, a ``kernel.bind(...)`` call) is then a range of domain ``nbjit`` named
for the kernel and its configuration, pushed before the launch and popped after it, through
the ``nvtx`` package.

Off, a launch checks nothing: the ranged launchers are made when a kernel is configured, and
switching empties every kernel's cache of configured launchers, so the next ``kernel[...]``
configures anew. Launches from ``@njit`` code, ``kernel.c_entry`` and ``nbjit.jax.call`` run
in C and are not ranged."""
from __future__ import annotations

import importlib.util
import os
import weakref
from typing import Any, Callable

from nbjit.errors import NbjitError, install_hint, warn

__all__ = ["RangedLauncher", "nvtx", "ranged", "watch"]

DOMAIN = "nbjit"


def _from_environment() -> bool:
    """``NBJIT_NVTX``: on unless unset, 0, false, no or off; where the nvtx package is missing,
    off, with a warning saying what to install."""
    value = os.environ.get("NBJIT_NVTX", "").strip()
    if value.lower() in ("", "0", "false", "no", "off"):
        return False
    if importlib.util.find_spec("nvtx") is None:
        warn(f"NBJIT_NVTX={value}: NVTX ranges around launches need the nvtx package ({install_hint('nvtx')}); "
             "launches go without them")
        return False
    return True


ON = [_from_environment()]  # (read on every configure)
# every kernel's launcher cache (a dict: by its id), emptied on a switch
_CACHES: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_DOMAIN: list = [None]  # the nvtx package's Domain for DOMAIN, made at the first ranged launcher


def nvtx(on: bool | None = None) -> bool:
    """Whether launches from Python are NVTX ranges; ``on`` switches them on or off first
    (needs the ``nvtx`` package). Returns the state after the call."""
    if on is None:
        return ON[0]
    if not isinstance(on, bool):
        raise NbjitError(f"nbjit.nvtx(on): on must be True, False or None, not {type(on).__name__}")
    if on:
        _domain()  # (refused here, not at the next launch, where the package is missing)
    if on != ON[0]:
        ON[0] = on
        for cache in list(_CACHES.values()):
            cache.clear()
    return ON[0]


def watch(cache: Any) -> None:
    """Empty ``cache`` (a kernel's configured launchers) whenever ranges are switched."""
    _CACHES[id(cache)] = cache


def _domain():
    if _DOMAIN[0] is None:
        try:
            import nvtx as package
        except ImportError:
            raise NbjitError(f"NVTX ranges around launches need the nvtx package: {install_hint('nvtx')}") from None
        _DOMAIN[0] = package.get_domain(DOMAIN)  # (a no-op domain where no tool is attached)
    return _DOMAIN[0]


def message(label: str, config: Any) -> str:
    """A range's name: the kernel, its grid and block, and its dynamic shared memory if any."""
    dims = [f"grid={config.grid}", f"block={config.block}"]  # (tuples of three ints: "(4, 1, 1)")
    if config.shared:
        dims.append(f"shared={config.shared}")
    return f"{label} {' '.join(dims)}"


class RangedLauncher:
    """A launcher (or a ``BoundLaunch``) whose calls are each an NVTX range named ``name``;
    anything else is the launcher's."""

    __slots__ = ("launcher", "name", "_attributes", "_domain")

    def __init__(self, launcher: Callable, name: str) -> None:
        self.launcher, self.name = launcher, name
        self._domain = _domain()
        self._attributes = self._domain.get_event_attributes(message=name)

    def __call__(self, *args: Any) -> None:
        self._domain.push_range(self._attributes)
        try:
            self.launcher(*args)
        finally:
            self._domain.pop_range()

    launch = __call__  # (as a BoundLaunch's)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.launcher, attr)

    def __repr__(self) -> str:
        return f"<NVTX range {self.name!r} around {self.launcher!r}>"


def ranged(launcher: Callable, label: str, config: Any) -> Callable:
    """``launcher`` as it is where ranges are off, else within a range named for ``label`` and
    ``config`` (a ``LaunchConfig``)."""
    return RangedLauncher(launcher, message(label, config)) if ON[0] else launcher
