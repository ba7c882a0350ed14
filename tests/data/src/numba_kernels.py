"""Numba kernel compiled to PTX for nbjit's fixtures (see make_fixtures.py)."""
from numba import cuda


def axpy(y, x, a, n):
    i = cuda.grid(1)
    if i < n:
        y[i] = a * x[i] + y[i]
