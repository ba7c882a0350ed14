"""Inputs a kernel writes in place, saved before a search and put back before each variant
runs and once it ends: each variant starts from the caller's data, and the caller gets it
back as it was."""
from __future__ import annotations

from typing import Any, Sequence

from nbjit.errors import NbjitTuneError
from nbjit.gpu import driver
from nbjit.gpu.timing import TimingStream
from nbjit.launch.arrays import array_layout

__all__ = ["SavedInputs", "extent"]


def extent(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """(offset of the lowest byte from the array's address, bytes from there to past the
    highest): the memory an array of ``shape`` and byte ``strides`` covers."""
    if any(s == 0 for s in shape):
        return 0, 0
    low = sum((n - 1) * st for n, st in zip(shape, strides) if st < 0)
    high = sum((n - 1) * st for n, st in zip(shape, strides) if st > 0)
    return low, high - low + itemsize


class SavedInputs:
    """Copies of the device arrays at ``which`` (indices into ``args``), made on ``stream``."""

    def __init__(self, args: Sequence[Any], which: Sequence[int], stream: TimingStream) -> None:
        self.parts: list[tuple[int, int, int]] = []  # (the array's memory, the copy, bytes)
        try:
            for i in which:
                try:
                    ptr, shape, strides, dt = array_layout(args[i])
                except ValueError as e:
                    raise NbjitTuneError(f"tune: restore= names argument {i}, which is not a device array ({e})") \
                        from None
                low, nbytes = extent(shape, strides, dt.itemsize)
                if nbytes:
                    copy = driver.mem_alloc(nbytes)
                    self.parts.append((ptr + low, copy, nbytes))
                    stream.copy(copy, ptr + low, nbytes)
        except BaseException:
            self.free()
            raise

    def restore(self, stream: TimingStream) -> None:
        """Queue the copies back on ``stream``."""
        for ptr, copy, nbytes in self.parts:
            stream.copy(ptr, copy, nbytes)

    def free(self) -> None:
        for _, copy, _ in self.parts:
            driver.mem_free(copy)
        self.parts = []
