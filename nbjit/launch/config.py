"""The launch configuration: one type (``LaunchConfig``), one validator (``LaunchConfig.make``)
that every launch form goes through."""
from __future__ import annotations

from typing import Any

import numpy as np

from nbjit.errors import NbjitLaunchError
from nbjit.records import record

__all__ = ["LaunchConfig"]


@record
class LaunchConfig:
    """How to launch: grid and block (3 ints each), stream, dynamic shared memory bytes,
    cluster shape, whether the launch is cooperative and whether it is a programmatic
    dependent launch (``pdl``: it may start before the grid before it on the stream ends;
    None: as the kernel's ``pdl`` says). ``LaunchConfig.make`` is the one validator, and
    ``Kernel.configure`` the one way from a configuration to a launcher, for every launch
    form (``kernel[...]``, ``launch``, ``bind``, Triton's grids)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    stream: Any = None
    shared: int = 0
    cluster: tuple[int, int, int] | None = None
    cooperative: bool = False
    pdl: bool | None = None

    @classmethod
    def make(cls, grid: Any, block: Any, stream: Any = None, shared: Any = 0, cluster: Any = None,
             cooperative: Any = False, pdl: Any = None, *, kernel: str = "<kernel>") -> "LaunchConfig":
        """A validated configuration; ``NbjitLaunchError`` names the kernel and the value."""
        if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
            raise NbjitLaunchError(f"kernel {kernel!r}: dynamic shared memory must be a byte count >= 0, "
                                   f"got {shared!r}")
        if not isinstance(cooperative, bool):
            raise NbjitLaunchError(f"kernel {kernel!r}: cooperative must be True or False, got {cooperative!r}")
        if pdl is not None and not isinstance(pdl, bool):
            raise NbjitLaunchError(f"kernel {kernel!r}: pdl must be True, False or None (the kernel's), got {pdl!r}")
        return cls(_dims(grid, "grid", kernel), _dims(block, "block", kernel), stream, shared,
                   None if cluster is None else _dims(cluster, "cluster", kernel), cooperative, pdl)

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def extended(self) -> bool:
        """Whether the launch needs cuLaunchKernelEx (launch attributes; ``pdl`` as configured)."""
        return self.cooperative or self.pdl or self.cluster is not None


def _dims(v, what: str, kernel: str) -> tuple[int, int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        t = (v,)
    elif isinstance(v, (tuple, list)) and 1 <= len(v) <= 3:
        t = tuple(v)
    else:
        raise NbjitLaunchError(f"kernel {kernel!r}: {what} must be an int or a tuple of 1 to 3 ints, got {v!r}")
    if any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) for x in t):
        raise NbjitLaunchError(f"kernel {kernel!r}: {what} must hold ints, got {v!r}")
    t = tuple(int(x) for x in t)
    if any(x < 1 or x >= 1 << 32 for x in t):
        raise NbjitLaunchError(f"kernel {kernel!r}: {what} values must be from 1 to 2**32 - 1 (got {v!r})")
    return (t + (1, 1))[:3]  # type: ignore[return-value]
