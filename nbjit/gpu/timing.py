"""Timing launches on the GPU for the tuner: a stream of its own, CUDA events around a run of
launches, and waits that give up at a deadline instead of blocking (a kernel that never
ends keeps its SMs, but the caller goes on). Also what a search needs beside the timing:
device-to-device copies on the stream (inputs saved and restored) and the device's name."""
from __future__ import annotations

import functools
import time
from typing import Callable

from nbjit.errors import NbjitLaunchError
from nbjit.gpu.driver import _cu, check, stream_object

__all__ = ["TimingStream", "device_name", "synchronize_context"]

_NOT_READY = 600  # CUDA_ERROR_NOT_READY


@functools.lru_cache(maxsize=None)
def device_name(ordinal: int) -> str:
    """The device's marketing name (cuDeviceGetName), e.g. ``"NVIDIA H100 80GB HBM3"``."""
    cu = _cu()
    dev = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
    raw = check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
    return bytes(raw).split(b"\0", 1)[0].decode(errors="replace").strip()


def synchronize_context() -> None:
    """Wait for all work of the current context (the caller's, on its inputs) to end."""
    check(_cu().cuCtxSynchronize(), "cuCtxSynchronize", NbjitLaunchError)


def _elapsed_call():
    cu = _cu()
    return getattr(cu, "cuEventElapsedTime_v2", None) or cu.cuEventElapsedTime


class TimingStream:
    """A non-blocking stream of the current context with a pair of timing events.

    ``time(run, deadline)`` records an event, calls ``run(stream)`` (which launches there),
    records a second and waits for it until ``deadline`` (``time.monotonic()``): the
    milliseconds between the two, or None where the deadline passed first. After a None the
    stream may still hold the late work: ``close()`` leaves it (nothing waits for it) and the
    caller makes a new ``TimingStream``."""

    def __init__(self) -> None:
        cu = _cu()
        self.handle = int(check(cu.cuStreamCreate(1), "cuStreamCreate (CU_STREAM_NON_BLOCKING)", NbjitLaunchError))
        self._stream = stream_object(self.handle)
        self._start = check(cu.cuEventCreate(0), "cuEventCreate", NbjitLaunchError)
        self._end = check(cu.cuEventCreate(0), "cuEventCreate", NbjitLaunchError)
        self.stuck = False  # the deadline passed: work may still be running on it

    def time(self, run: Callable[[int], None], deadline: float) -> float | None:
        cu = _cu()
        check(cu.cuEventRecord(self._start, self._stream), "cuEventRecord", NbjitLaunchError)
        run(self.handle)
        check(cu.cuEventRecord(self._end, self._stream), "cuEventRecord", NbjitLaunchError)
        if not self.wait(deadline):
            return None
        return float(check(_elapsed_call()(self._start, self._end), "cuEventElapsedTime", NbjitLaunchError))

    def wait(self, deadline: float) -> bool:
        """Whether the stream's last recorded event completed before ``deadline`` (polled:
        spinning for the first millisecond, then sleeping a little between looks)."""
        cu = _cu()
        began = time.monotonic()
        while True:
            err = cu.cuEventQuery(self._end)[0]
            if err == 0:
                return True
            if int(err) != _NOT_READY:
                check((err,), "a timed launch", NbjitLaunchError)
            now = time.monotonic()
            if now > deadline:
                self.stuck = True
                return False
            if now - began > 1e-3:
                time.sleep(2e-4)

    def done(self) -> bool:
        """Whether the work queued before the last recorded event has ended (no waiting)."""
        return _cu().cuEventQuery(self._end)[0] == 0

    def settle(self, deadline: float) -> bool:
        """Record the end event after whatever was queued (copies) and wait for it."""
        check(_cu().cuEventRecord(self._end, self._stream), "cuEventRecord", NbjitLaunchError)
        return self.wait(deadline)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Queue a device-to-device copy of ``nbytes`` on the stream."""
        if nbytes:
            check(_cu().cuMemcpyDtoDAsync(dst, src, nbytes, self._stream), "cuMemcpyDtoDAsync", NbjitLaunchError)

    def close(self) -> None:
        """Destroy the events and the stream (their resources go once queued work ends)."""
        cu = _cu()
        for ev in (self._start, self._end):
            cu.cuEventDestroy(ev)
        cu.cuStreamDestroy(self._stream)
