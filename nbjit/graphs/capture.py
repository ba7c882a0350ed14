"""CUDA graphs for Numba users, built on the driver's stream capture (no graph engine of our
own): everything issued on a stream inside ``with nbjit.capture(stream) as g:`` — nbjit
kernels, ``@cuda.jit`` kernels, Numba's asynchronous copies and memsets on that stream —
becomes one graph, instantiated on exit; ``g.launch(stream)`` replays it.

Capture mode: thread-local by default. A call on *this* thread that a capture cannot record
(a synchronous copy, an allocation, a synchronisation) fails at once and is reported as an
``NbjitGraphError`` naming it, instead of being silently run outside the graph ("relaxed") or
making unrelated threads' calls fail ("global"). Another thread's work on the legacy default
stream still joins a blocking stream's capture and invalidates it: that is reported at the end.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

from nbjit.errors import NbjitGraphError, NbjitLaunchError
from nbjit.gpu import driver as _driver
from nbjit.gpu import host as _host
from nbjit.gpu.driver import stream_handle

__all__ = ["capture", "Capture"]

_HINTS = {
    900: "an operation a capture cannot record ran on this thread: a synchronous copy "
         "(cuda.to_device(host) without stream=, copy_to_host() without stream=), an allocation "
         "(cuda.device_array, or a @cuda.jit call with host arrays, which Numba copies), or a "
         "synchronize(). Allocate and copy before the capture; inside it, pass stream= to every copy",
    901: "the capture was invalidated by an earlier error in it (see above), or by work that joined this "
         "stream from outside: another thread's work on the legacy default stream joins every blocking "
         "stream; capture on a non-blocking stream (cuda.stream() is blocking) or keep other threads off "
         "the default stream meanwhile",
    906: "work on the legacy default stream joined the captured stream: issue everything on the captured stream",
    908: "the capture was ended from another thread than the one that began it",
}


def _capture_code(exc: BaseException) -> int | None:
    """The capture error a CUDA error stands for, whoever raised it: nbjit's launch errors
    and the host's (Numba's CudaAPIError) carry the CUresult; cuda.core's CUDAError
    (numba-cuda allocates through it) names the error in its message."""
    code = getattr(exc, "code", None) if isinstance(exc, NbjitLaunchError) else _host.error_code(exc)
    if code in _driver.CAPTURE_ERRORS:
        return code
    text = str(exc)
    return next((c for c, name in _driver.CAPTURE_ERRORS.items() if name in text), None)


def _explain(code: int, what: str) -> NbjitGraphError:
    name = _driver.CAPTURE_ERRORS.get(code, f"CUDA error {code}")
    return NbjitGraphError(f"{what}: {name}: {_HINTS.get(code, 'not allowed while a stream is captured')}")


class Capture:
    """The context manager ``nbjit.capture`` returns; after the ``with`` block it is the
    instantiated graph: ``launch(stream=None)`` replays it (any number of times, on any
    stream), ``update(...)`` re-captures new arguments into it, ``nodes`` counts its nodes."""

    def __init__(self, stream: Any, mode: str = "thread_local"):
        if mode not in _driver.CAPTURE_MODES:
            raise NbjitGraphError(f"capture mode must be one of {_driver.CAPTURE_MODES}, not {mode!r}")
        self.stream = stream
        self.mode = mode
        self._handle = stream_handle(stream)
        if int(self._handle) == 0:
            raise NbjitGraphError("the default stream cannot be captured: capture a stream of your own, "
                                  "e.g. s = numba.cuda.stream()")
        self._graph = None
        self._exec = None
        self._thread = None
        self.nodes = 0
        self.instantiations = 0
        self._finalizer = None
        self._closed = False

    # ------------------------------------------------------------ capturing
    def __enter__(self) -> "Capture":
        if _driver.capture_status(self._handle) != "none":
            raise NbjitGraphError("this stream is being captured already (captures do not nest)")
        _driver.begin_capture(self._handle, self.mode)
        self._thread = threading.get_ident()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        err, graph = _driver.end_capture(self._handle)  # always: the stream must not stay in capture mode
        if exc is not None:
            if graph is not None:
                _driver.destroy_graph(graph)
            code = _capture_code(exc)
            if code is not None:
                raise _explain(code, f"capture on {self.stream!r}") from exc
            return  # the block's own exception goes on as it is
        if err:
            raise _explain(err, f"capture on {self.stream!r}")
        self._adopt(graph)

    def _adopt(self, graph) -> None:
        """Make ``graph`` this capture's graph: update the instantiated one in place where
        the driver can, else instantiate it."""
        old_graph = self._graph
        self._closed = False  # (captured again after close())
        if self._exec is not None:
            done, _why = _driver.exec_update(self._exec, graph)
            if not done:
                _driver.destroy_exec(self._exec)
                self._exec = None
        if self._exec is None:
            self._exec = _driver.instantiate(graph)
            self.instantiations += 1
        self._graph = graph
        self.nodes = _driver.graph_nodes(graph)
        if old_graph is not None:
            _driver.destroy_graph(old_graph)
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _release, self._graph, self._exec)
        self._finalizer.atexit = False

    # ------------------------------------------------------------ replaying
    def launch(self, stream: Any = None) -> None:
        """Replay the graph on ``stream`` (default: the captured one)."""
        if self._exec is None:
            raise self._nothing("use the capture as `with nbjit.capture(stream) as g:`")
        err = _driver.graph_launch(self._exec, self._handle if stream is None else stream_handle(stream))
        if err:
            raise NbjitGraphError(f"graph launch failed: {_driver.error_text(err)}")

    __call__ = launch

    def update(self) -> "Capture":
        """Capture the same work again (new arrays of the same shapes, new scalars) and
        update the instantiated graph in place; where the driver cannot (the work changed
        shape: other kernels, more nodes), it is instantiated anew (``instantiations``
        counts). Use as ``with g.update(): ...``."""
        if self._exec is None:
            raise self._nothing("capture first")
        return self

    def _nothing(self, what_to_do: str) -> NbjitGraphError:
        if self._closed:
            return NbjitGraphError("this capture was closed (its graph is freed): capture the work again")
        return NbjitGraphError(f"nothing captured yet: {what_to_do}")

    def close(self) -> None:
        """Free the graph now (replays are refused afterwards)."""
        if self._finalizer is not None:
            self._finalizer()
        self._graph = self._exec = None
        self._closed = True

    def __repr__(self) -> str:
        state = f"{self.nodes} nodes" if self._exec is not None else "not captured"
        return f"<nbjit.Capture on {self.stream!r}: {state}>"


def _release(graph, graph_exec) -> None:
    _driver.destroy_exec(graph_exec)
    _driver.destroy_graph(graph)


def capture(stream: Any, *, mode: str = "thread_local") -> Capture:
    """Capture everything issued on ``stream`` (a Numba stream, an int handle, anything nbjit
    takes as a stream; not the default stream) into a CUDA graph::

        with nbjit.capture(s) as g:
            numba_kernel[grid, block, s](a)
            nbjit_kernel[grid, block, s](a, b, 2.0)
            b.copy_to_device(a, stream=s)
        for _ in range(100):
            g.launch()

    ``mode``: ``"thread_local"`` (default; see the module's note), ``"global"`` or
    ``"relaxed"``. Raises ``NbjitGraphError`` naming what broke the capture; the stream is
    never left capturing.
    """
    return Capture(stream, mode)
