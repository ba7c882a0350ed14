"""Device arrays and streams as compiled code takes them: ``DeviceView`` (address, extents,
strides in bytes, dtype) made from any device array with one call, and ``StreamHandle`` (a
CUstream's handle) made from any stream. Both pass into ``@numba.njit`` functions, where a
view slices by rows and a kernel launched there takes views and handles
(``nbjit/frameworks/njit.py``)."""
from __future__ import annotations

from typing import Any

import numpy as np

from nbjit.errors import NbjitArgumentError, NbjitLaunchError
from nbjit.gpu import driver as _driver
from nbjit.launch.arrays import array_layout

__all__ = ["DeviceView", "StreamHandle", "device_view"]


class DeviceView:
    """A device array's memory as compiled code sees it: ``data`` (the address), ``shape``,
    ``strides`` (bytes) and ``dtype``; ``owner`` is the array it views (kept alive with the
    view). ``view[i]`` is row ``i`` (a view of one dimension less), ``view[a:b:c]`` a range of
    rows: in Python and in ``@njit`` code alike, with no copy."""

    __slots__ = ("data", "shape", "strides", "dtype", "owner")

    def __init__(self, data: int, shape: tuple, strides: tuple, dtype: Any, owner: Any = None):
        self.data = int(data)
        self.shape = tuple(int(n) for n in shape)
        self.strides = tuple(int(n) for n in strides)
        self.dtype = np.dtype(dtype)
        self.owner = owner
        if len(self.strides) != len(self.shape) or any(n < 0 for n in self.shape):
            raise NbjitArgumentError(f"a device view needs one stride per extent and no negative extent, got shape "
                                     f"{self.shape}, strides {self.strides}")

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of items."""
        n = 1
        for x in self.shape:
            n *= x
        return n

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d device view")
        return self.shape[0]

    def __getitem__(self, index) -> "DeviceView":
        if not self.shape:
            raise NbjitArgumentError("a 0-d device view has no rows to index")
        n, step = self.shape[0], self.strides[0]
        if isinstance(index, slice):
            start, stop, by = index.indices(n)
            return DeviceView(self.data + start * step, (len(range(start, stop, by)), *self.shape[1:]),
                              (by * step, *self.strides[1:]), self.dtype, self.owner)
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            i = int(index) + n if index < 0 else int(index)
            if not 0 <= i < n:
                raise IndexError(f"row {int(index)} of a device view of {n} rows")
            return DeviceView(self.data + i * step, self.shape[1:], self.strides[1:], self.dtype, self.owner)
        raise NbjitArgumentError(f"a device view takes a row index or a slice of rows, not {type(index).__name__}")

    def __repr__(self) -> str:
        return f"<nbjit.DeviceView {self.dtype} shape {self.shape} strides {self.strides} at {self.data:#x}>"


def device_view(array: Any) -> DeviceView:
    """A ``DeviceView`` of a device array: a Numba device array, anything with
    ``__cuda_array_interface__`` (CuPy, PyTorch, numba-cuda-mlir) or DLPack on a CUDA device
    (JAX). Raises ``NbjitArgumentError`` for host arrays and other objects."""
    if isinstance(array, DeviceView):
        return array
    try:
        ptr, shape, strides, dt = array_layout(array)
    except ValueError as e:
        raise NbjitArgumentError(f"device_view: {e}") from None
    return DeviceView(ptr, shape, strides, dt, array)


class StreamHandle:
    """A CUDA stream as compiled code takes it: ``handle`` (the CUstream's address; 0 the
    default stream). Made from a Numba or numba-cuda-mlir stream, an object with
    ``__cuda_stream__`` (CuPy, cuda.core, PyTorch's ``cuda_stream``), an int or None; the
    stream object is kept alive with it. ``synchronize()`` waits for its work, in Python and in
    ``@njit`` code."""

    __slots__ = ("handle", "owner")

    def __init__(self, stream: Any = None):
        if isinstance(stream, StreamHandle):
            stream = stream.handle
        if isinstance(stream, bool) or (isinstance(stream, int) and not 0 <= stream < 1 << 64):
            raise NbjitLaunchError(f"a stream handle is an address from 0 to 2**64 - 1, got {stream!r}")
        self.handle = _driver.as_int(_driver.stream_handle(stream))
        self.owner = stream

    def synchronize(self) -> None:
        """Wait until the stream's work is done."""
        _driver.synchronize(self.handle)

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol (version 0, the handle): Python launches take it too."""
        return (0, self.handle)

    def __repr__(self) -> str:
        return f"<nbjit.StreamHandle {self.handle:#x}>"
