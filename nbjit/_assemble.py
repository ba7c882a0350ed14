"""``Assemble``: the host step of a loading plan (``loader.Plan.assemble``), PTX newer than
the driver takes assembled to a cubin by nvJitLink (``module.carry_out`` does it). Made only
for such PTX: ``loader.Assemble`` names it."""
from __future__ import annotations

from nbjit._defs import record
from nbjit.arch import Arch

__all__ = ["Assemble"]


@record
class Assemble:
    """A step the plan needs done on the host: PTX assembled to a cubin by nvJitLink."""

    ptx: str
    arch: Arch  # sm_90, sm_90a
    nvjitlink: tuple[int, int]
    name: str
    driver_cuda: tuple[int, int]
    driver_ptx: tuple[int, int]  # the newest PTX the driver takes
    ptx_version: tuple[int, int]


Assemble.__module__ = "nbjit.loader"  # (where users find it; pickles name it so)
