"""Device memory without a Numba: the array the bare host gives where a Numba host gives its
own device array (``DeviceGlobal.as_array``, Triton's scratch buffers). It is a view of
device memory with ``__cuda_array_interface__`` (version 3), so that PyTorch
(``torch.as_tensor(a, device="cuda")``), CuPy (``cupy.asarray(a)``), Numba and nbjit's own
launches take it as they take each other's arrays; ``copy_to_host`` and ``copy_from_host``
move its bytes."""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from nbjit.errors import NbjitArgumentError
from nbjit.gpu import driver as _driver

__all__ = ["DeviceArray", "allocate"]


class DeviceArray:
    """A C-ordered array of ``shape`` items of ``dtype`` at device address ``ptr``, keeping
    ``owner`` (what the memory belongs to) alive."""

    __slots__ = ("ptr", "shape", "dtype", "owner", "__weakref__")

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: Any, owner: Any = None) -> None:
        self.ptr = int(ptr)
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.owner = owner

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        out, step = [], self.dtype.itemsize
        for n in reversed(self.shape):
            out.append(step)
            step *= n
        return tuple(reversed(out))

    @property
    def __cuda_array_interface__(self) -> dict:
        d = self.dtype
        return {"shape": self.shape, "typestr": d.str, "data": (self.ptr, False), "strides": None,
                "descr": d.descr if d.fields else [("", d.str)], "stream": None, "version": 3}

    def copy_to_host(self) -> np.ndarray:
        """The array's items, copied into a new numpy array (waits for the default stream)."""
        out = np.empty(self.shape, self.dtype)
        _driver.copy_to_host(memoryview(out.reshape(-1).view(np.uint8)), self.ptr)
        return out

    def copy_from_host(self, values: Any) -> None:
        """Overwrite the array's items with ``values`` (a numpy array of its shape and dtype,
        or what ``numpy.asarray`` makes one of)."""
        try:
            a = np.ascontiguousarray(values, dtype=self.dtype)
        except (TypeError, ValueError) as e:
            raise NbjitArgumentError(f"values for a {self.dtype} array: {e}") from None
        if a.shape != self.shape:
            raise NbjitArgumentError(f"values of shape {a.shape} for an array of shape {self.shape}")
        _driver.copy_from_host(self.ptr, memoryview(a.reshape(-1).view(np.uint8)))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"<nbjit DeviceArray {self.shape} {self.dtype} at 0x{self.ptr:x}>"


class _Allocation:
    """Device memory freed when the last array over it goes."""

    __slots__ = ("ptr", "__weakref__")

    def __init__(self, nbytes: int) -> None:
        self.ptr = _driver.mem_alloc(nbytes)
        weakref.finalize(self, _driver.mem_free, self.ptr).atexit = False


def allocate(nbytes: int) -> DeviceArray:
    """A new array of ``nbytes`` bytes (uint8) in the current context, freed with its last view."""
    block = _Allocation(nbytes)
    return DeviceArray(block.ptr, (int(nbytes),), np.uint8, block)
