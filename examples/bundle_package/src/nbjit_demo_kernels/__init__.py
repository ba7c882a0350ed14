"""CUDA kernels shipped in this package as an nbjit bundle (``kernels.nbjit``: cubins for
sm_80, sm_90, sm_100 and sm_120, PTX for every newer device), loaded with no compiler and no
Numba: ``axpy`` and ``scale<T>`` from CUDA C++, ``scale_rows`` a ``@cuda.jit`` kernel.

    from nbjit_demo_kernels import kernels, numba_kernels
    mod = kernels()                      # loads on first use (no GPU needed until then)
    mod.axpy[blocks, 256](2.0, x, y, n)  # y = 2 x + y
    mod["scale<float>"][blocks, 256](x, 0.5, n)
    numba_kernels().scale_rows[(rows, cols), (16, 16)](m, factors)  # m[i, j] *= factors[i]
"""
from __future__ import annotations

from importlib.resources import files

import nbjit

__all__ = ["BUNDLE", "kernels", "numba_kernels"]

# the bundle as package data: a file in site-packages, or a member of a zip on sys.path
BUNDLE = files(__name__) / "kernels.nbjit"


def kernels(lazy: bool = True) -> "nbjit.Module":
    """The CUDA C++ kernels (axpy, scale<float>, scale<double>) as an nbjit Module; with
    ``lazy`` it loads into the current device's context on first use."""
    return nbjit.load_bundle(BUNDLE, name="axpy", lazy=lazy)


def numba_kernels(lazy: bool = True) -> "nbjit.Module":
    """The @cuda.jit kernel ``scale_rows(m, factors)`` (float32 2-D ``m``, any layout; float32
    ``factors``, one per row) as an nbjit Module: launched on PyTorch, CuPy, JAX or Numba arrays."""
    return nbjit.load_bundle(BUNDLE, name="scale_rows", lazy=lazy)
