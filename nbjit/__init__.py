"""nbjit: run GPU kernels compiled outside Numba (PTX, cubins, fatbins, NVRTC, Triton) from Numba.

Public API
----------
Inspection (pure data, no GPU):
    inspect_ptx(text) -> PtxInfo        header, kernels, parameters, directives, globals,
                                        Triton metadata comments, debug information
    strip_debug(text, keep_lineinfo=False) -> str
                                        remove DWARF / line info so the driver JIT takes the PTX

Data types: PtxInfo, KernelInfo, KernelSignature, Param, Directives.

Errors: every error nbjit raises on bad input derives from NbjitError
(PtxParseError, ImageFormatError, NbjitCompileError, NbjitLoadError, NbjitLaunchError,
NbjitArgumentError, NbjitCacheError, KernelNotFoundError).
"""
from .errors import (
    ImageFormatError,
    KernelNotFoundError,
    NbjitArgumentError,
    NbjitCacheError,
    NbjitCompileError,
    NbjitError,
    NbjitLaunchError,
    NbjitLoadError,
    PtxParseError,
)
from .ptx import PtxInfo, inspect_ptx, strip_debug
from .signature import Directives, KernelInfo, KernelSignature, Param

__version__ = "0.1.0"

__all__ = [
    "inspect_ptx",
    "strip_debug",
    "PtxInfo",
    "KernelInfo",
    "KernelSignature",
    "Param",
    "Directives",
    "NbjitError",
    "PtxParseError",
    "ImageFormatError",
    "NbjitCompileError",
    "NbjitLoadError",
    "NbjitLaunchError",
    "NbjitArgumentError",
    "NbjitCacheError",
    "KernelNotFoundError",
]
