"""CUDA graphs for Numba users, built on the driver's stream capture (no graph engine of our
own): everything issued on a stream inside ``with nbjit.capture(stream) as g:`` — nbjit
kernels, ``@cuda.jit`` kernels, Numba's asynchronous copies and memsets on that stream —
becomes one graph, instantiated on exit; ``g.launch(stream)`` replays it.

Loops and branches on the GPU: ``with g.while_loop(cond):``, ``g.if_then(cond)``,
``g.if_else(cond)`` and ``g.switch(cond, n)`` record their bodies as conditional nodes
(CUDA 12.4; if_else and switch 12.8). ``cond = g.condition(default, reset=True)`` is a
handle of the graph being recorded; a kernel sets it on the device (CUDA C++:
``cudaGraphSetConditional(handle, value)``; ``@cuda.jit``: ``nbjit.set_condition``), the
handle passed as a 64-bit argument.

How a body is recorded: the capture of the stream is ended where the conditional node goes,
the node is added to the graph after the work captured so far, its body graphs are captured
on the *same* stream (``cuStreamBeginCaptureToGraph``), and then the capture of the graph
around it resumes after the node. So the user launches on the one stream they captured,
bodies nest, and every launch form (nbjit, Numba, copies) records alike. The price: work
forked to other streams must join the captured stream before a conditional begins or ends.

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
from nbjit.gpu import graphs as _graphs
from nbjit.gpu import host as _host
from nbjit.gpu.driver import stream_handle
from nbjit.launch.arrays import register_handle
from nbjit.graphs.nodes import GraphNodes, kernel_nodes, walk
from nbjit.records import record

__all__ = ["capture", "Capture", "Condition", "ConditionalNode", "Recorded"]

_HINTS = {
    900: "an operation a capture cannot record ran on this thread: a synchronous copy "
         "(cuda.to_device(host) without stream=, copy_to_host() without stream=), an allocation "
         "(cuda.device_array, or a @cuda.jit call with host arrays, which Numba copies), or a "
         "synchronize(). Allocate and copy before the capture; inside it, pass stream= to every copy",
    901: "the capture was invalidated by an earlier error in it (see above), or by work that joined this "
         "stream from outside: another thread's work on the legacy default stream joins every blocking "
         "stream; capture on a non-blocking stream (cuda.stream() is blocking) or keep other threads off "
         "the default stream meanwhile",
    904: "work forked from the captured stream to another one did not join it again before this point: "
         "record an event on the other stream and wait for it on the captured one",
    906: "work on the legacy default stream joined the captured stream: a synchronous copy (copy_to_host() or "
         "cuda.to_device() without stream=) or a launch on the default stream; issue everything on the captured "
         "stream, with stream= on every copy",
    908: "the capture was ended from another thread than the one that began it",
}


def _capture_code(exc: BaseException) -> int | None:
    """The capture error a CUDA error stands for, whoever raised it: nbjit's launch errors
    and the host's (Numba's CudaAPIError) carry the CUresult; cuda.core's CUDAError
    (numba-cuda allocates through it) names the error in its message."""
    code = getattr(exc, "code", None) if isinstance(exc, NbjitLaunchError) else _host.error_code(exc)
    if code in _graphs.CAPTURE_ERRORS:
        return code
    text = str(exc)
    return next((c for c, name in _graphs.CAPTURE_ERRORS.items() if name in text), None)


def _explain(code: int, what: str) -> NbjitGraphError:
    name = _graphs.CAPTURE_ERRORS.get(code, f"CUDA error {code}")
    return NbjitGraphError(f"{what}: {name}: {_HINTS.get(code, 'not allowed while a stream is captured')}")


class Condition:
    """A graph condition, made by ``g.condition(default, reset=True)`` inside a capture (not
    constructed directly): a value a kernel sets on the device and a conditional node reads.
    Pass it to an nbjit kernel's 64-bit parameter (``cudaGraphConditionalHandle`` in CUDA C++,
    ``uint64`` in a ``@cuda.jit`` signature) or, to a kernel Numba launches itself,
    ``np.uint64(cond.handle)``.

    Attributes: ``handle`` (the driver's value), ``default`` (its value when each replay
    begins, where ``reset``; else only at the first, later replays keeping what the last
    left), ``reset``, ``index`` (its place among the capture's ``conditions``)."""

    __slots__ = ("capture", "handle", "default", "reset", "index", "graph", "__weakref__")

    def __init__(self, capture: "Capture", handle: int, default: int, reset: bool, index: int, graph: int):
        self.capture, self.handle, self.default, self.reset = capture, handle, default, reset
        self.index = index  # its place among the capture's conditions
        self.graph = graph  # the graph (or body) it was made in: its conditional node goes there

    def _value(self, param) -> int:
        """The handle, for a kernel's parameter ``param`` (its capture decides whether it may)."""
        return self.capture._given(self, param)

    def __repr__(self) -> str:
        return f"<nbjit graph condition {self.index} (default {self.default}, reset={self.reset})>"


register_handle(Condition, Condition._value)


@record
class Recorded:
    """A capture's graph as recorded (``Capture.recorded``): ``graph``; ``conditionals`` {node:
    ConditionalNode}; ``conditions``; ``refs`` {kernel node: {parameter offset: condition index}}."""

    graph: Any
    conditionals: dict
    conditions: tuple
    refs: dict


@record
class ConditionalNode:
    """A conditional node as recorded: its kind, condition and body graphs."""

    kind: str
    condition: Condition
    bodies: tuple


class _Body:
    """One body of a conditional node being recorded (``with body:``)."""

    def __init__(self, cond_node: "_Conditional", index: int):
        self.parent = cond_node
        self.index = index
        self.entered = False

    def where(self) -> str:
        c = self.parent
        return f"body {self.index} of {c.kind}" if c.multi else f"the body of {c.kind}"

    def __enter__(self) -> None:
        c = self.parent
        cap = c.capture
        if c.node is None or c.open_body is not None or c.done:
            raise NbjitGraphError(f"{self.where()}: record it inside its `with g.{c.kind}(...)` block, one body at "
                                  "a time")
        if self.entered:
            raise NbjitGraphError(f"{self.where()} was recorded already: a body is recorded once")
        if c.idle is not None:
            c.end_idle()
        _graphs.begin_capture(cap._handle, cap.mode, c.bodies[self.index])
        self.entered = True
        c.open_body = self

    def __exit__(self, exc_type, exc, tb) -> None:
        c = self.parent
        cap = c.capture
        c.open_body = None
        if exc is None:
            cap._settle()
        err, _graph = _graphs.end_capture(cap._handle)
        if exc is not None or err:
            cap._broken = cap._body_failed = True
        if exc is not None:
            code = _capture_code(exc)
            if code is not None:
                raise _explain(code, f"{self.where()} (capture on {cap.stream!r})") from exc
            return
        if err:
            raise _explain(err, f"{self.where()} (capture on {cap.stream!r})")
        if c.multi:
            c.begin_idle()


class _Conditional:
    """``with g.while_loop(cond):`` and its kinds: the conditional node added where the block
    begins; the body (or ``if_else``'s two, ``switch``'s n, returned by ``with``) recorded
    inside; the capture of the graph around it resumed after the node on exit. Between the
    bodies of an ``if_else`` or a ``switch`` the stream is captured into a graph of no use
    (``idle``), so that work issued there is refused instead of run at once."""

    def __init__(self, capture: "Capture", kind: str, cond: Condition, size: int):
        self.capture, self.kind, self.cond, self.size = capture, kind, cond, size
        self.node = None
        self.bodies: tuple = ()
        self.graph = None
        self.open_body: _Body | None = None
        self.idle = None  # the graph capturing what is issued between bodies
        self.done = False
        self.multi = kind in ("if_else", "switch")  # bodies entered one by one (`with then:`)

    def __enter__(self):
        cap = self.capture
        cap._check_condition(self.cond, self.kind)
        _graphs.require(self.kind)
        self.graph, after = cap._suspend(self.kind)
        ctx = _driver.current_context_key()
        try:
            self.node, self.bodies = _graphs.add_conditional(self.graph, after, self.cond.handle,
                                                             self.kind, self.size, ctx)
        except BaseException:
            cap._broken = True
            raise
        cap._conditionals[int(self.node)] = ConditionalNode(self.kind, self.cond, self.bodies)
        bodies = tuple(_Body(self, i) for i in range(self.size))
        if not self.multi:
            self._only = bodies[0]
            self._only.__enter__()
            return None
        self._only = None
        self.begin_idle()
        return bodies

    def begin_idle(self) -> None:
        self.idle = _graphs.new_graph()
        _graphs.begin_capture(self.capture._handle, self.capture.mode, self.idle)
        self.capture._between = self

    def end_idle(self, refuse: bool = True) -> None:
        """End the capture between bodies; NbjitGraphError where anything was issued there
        (``refuse``; else, on the way out of a failed block, only ended)."""
        cap, idle = self.capture, self.idle
        self.idle, cap._between = None, None
        err, _graph = _graphs.end_capture(cap._handle)
        issued = _graphs.graph_nodes(idle) if not err else 1
        if not err:  # (a graph whose capture failed may be freed by the driver with it: see _end)
            _graphs.release(idle, None)
        if issued and refuse:
            cap._broken = True
            raise NbjitGraphError(f"work was issued between the bodies of {self.kind} (outside every `with body:`), "
                                  "where it would run in no body: record it inside one, or before the "
                                  f"`with g.{self.kind}(...)` block")

    def __exit__(self, exc_type, exc, tb) -> None:
        cap = self.capture
        self.done = True
        if self._only is not None:
            self._only.__exit__(exc_type, exc, tb)
        if self.idle is not None:
            self.end_idle(refuse=exc is None and not cap._broken)
        if self.open_body is not None:
            cap._broken = True
            raise NbjitGraphError(f"a body of {self.kind} was left open")
        if exc is not None or cap._broken:
            cap._broken = True
            return
        _graphs.begin_capture(cap._handle, cap.mode, self.graph, (self.node,))


class Capture:
    """The context manager ``nbjit.capture`` returns; after the ``with`` block it is the
    instantiated graph: ``launch(stream=None)`` replays it (any number of times, on any
    stream; the captured one by default), ``with g.update():`` re-captures new arguments into
    it, ``nodes`` lists its kernel nodes for updates in place, ``save(path, bindings)`` writes
    it to a file. Inside the block: ``condition()``, ``while_loop``, ``if_then``, ``if_else``,
    ``switch``.

    Attributes: ``node_count`` (every node, those of conditional bodies too),
    ``instantiations`` (how often the graph was instantiated: once, and again where an
    ``update()`` changed its shape), ``conditions``, ``stream``, ``mode``."""

    def __init__(self, stream: Any, mode: str = "thread_local"):
        if mode not in _graphs.CAPTURE_MODES:
            raise NbjitGraphError(f"capture mode must be one of {_graphs.CAPTURE_MODES}, not {mode!r}")
        self.stream = stream
        self.mode = mode
        self._handle = stream_handle(stream)
        if int(self._handle) == 0:
            raise NbjitGraphError("the default stream cannot be captured: capture a stream of your own, "
                                  "e.g. s = numba.cuda.stream()")
        self._graph = None
        self._exec = None
        self._exec_int = 0  # (its handle as an int, for node updates)
        self.node_count = 0
        self.instantiations = 0
        self._finalizer = None
        self._closed = False
        self.version = 0  # counts the graphs adopted: a node listed of an older one is refused
        self._nodes: GraphNodes | None = None
        self._recording: int | None = None  # the thread recording now, inside the `with` block
        self._setting: list | None = None  # a node's set_args is packing: the conditions it is given
        self._pending: list[tuple] = []  # (nodes followed, offset, condition) given to the launch being captured
        self._refs: dict[int, dict[int, int]] = {}  # kernel node -> {parameter offset: condition}
        self._conditions: list[Condition] = []
        self._conditionals: dict[int, ConditionalNode] = {}
        self._between: _Conditional | None = None  # an if_else or switch between its bodies
        self._suspended = None  # the top graph, once its capture was first ended for a conditional
        self._broken = False
        self._body_failed = False

    def __enter__(self) -> "Capture":
        """Begin capturing the stream (the host's context made current first: a capture needs one)."""
        _host.current_host().current_context()  # (no GPU or driver: the host's one clear error)
        if _graphs.capture_status(self._handle) != "none":
            raise NbjitGraphError("this stream is being captured already (captures do not nest: record loops "
                                  "and branches with g.while_loop, g.if_then, g.if_else, g.switch)")
        self._no_frees = _host.current_host().defer_cleanup()  # (a free would invalidate the capture)
        self._no_frees.__enter__()
        try:
            _graphs.begin_capture(self._handle, self.mode)
        except BaseException:
            self._no_frees.__exit__(None, None, None)
            raise
        _driver.recording(True)
        self._recording = threading.get_ident()
        # (what the graph captured before was recorded with: back where this capture fails)
        self._kept = (self._conditions, self._conditionals, self._refs)
        self._conditions, self._conditionals, self._between = [], {}, None
        self._pending, self._refs = [], {}
        self._suspended, self._broken, self._body_failed = None, False, False
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """End the capture (always) and instantiate the graph; a capture error said as nbjit's."""
        version = self.version
        try:
            self._end(exc)
        finally:
            self._recording = None
            self._no_frees.__exit__(None, None, None)
            _driver.recording(False)
            if self.version == version:  # no graph adopted: the one before stays, as it was recorded
                self._conditions, self._conditionals, self._refs = self._kept

    def _end(self, exc) -> None:
        if self._broken:  # a conditional failed: the stream's capture was ended there
            # A body whose capture failed is freed by the driver with it, and the graph around it
            # still names it as its conditional node's body: destroying that graph frees the body
            # twice (a crash, driver 580). It is left then: a few hundred bytes per failed capture.
            if self._suspended is not None and not self._body_failed:
                _graphs.release(self._suspended, None)
            if _graphs.capture_status(self._handle) != "none":
                _graphs.end_capture(self._handle)
            if exc is None:
                raise NbjitGraphError(f"capture on {self.stream!r}: a conditional body failed (see above)")
            return
        if exc is None:
            self._settle()
        err, graph = _graphs.end_capture(self._handle)  # always: the stream must not stay in capture mode
        if exc is not None:
            if graph is not None:
                _graphs.release(graph, None)
            code = _capture_code(exc)
            if code is not None:
                raise _explain(code, f"capture on {self.stream!r}") from exc
            return  # the block's own exception goes on as it is
        if err:
            raise _explain(err, f"capture on {self.stream!r}")
        self._adopt(graph)

    def _given(self, cond: Condition, param) -> int:
        """``cond``'s handle for a kernel's parameter ``param``, where a kernel may be given it:
        while this capture records (the parameter noted, for ``save``), or to a node's new
        arguments (``begin_arguments``)."""
        if cond not in self._conditions:
            raise NbjitGraphError(f"{cond!r} belongs to an earlier capture of this graph: make it again with "
                                  "g.condition() in the capture that uses it")
        if self._setting is not None:
            self._setting.append((param.offset, cond.index))
        elif self._recording is not None:
            now = self._last_nodes()
            if self._pending and self._pending[0][0] != now:  # (a launch captured since: theirs)
                self._settle()
            self._pending.append((now, param.offset, cond.index))
        else:
            raise NbjitGraphError(f"{cond!r} was passed to a kernel outside its graph: a condition is set only by "
                                  "kernels captured in the graph that made it (inside `with nbjit.capture(...)`)")
        return cond.handle

    def _last_nodes(self) -> tuple[int, ...]:
        """The nodes the stream's capture follows now."""
        _status, _graph, after = _graphs.capture_info(self._handle)
        return tuple(int(n) for n in after)

    def _settle(self) -> None:
        """The conditions given to the launch packed last, noted with its kernel node (for
        ``save``): the kernel node captured since, after the nodes the capture followed when
        they were packed, whose parameters hold their handles (the latest such). Where no node
        is (the launch failed), they are dropped."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        before = pending[0][0]
        status, graph, now = _graphs.capture_info(self._handle)
        if status != "active" or tuple(int(n) for n in now) == before:
            return
        before = sorted(before)
        for node in reversed(_graphs.nodes(graph)):
            if _graphs.node_kind(node) != "kernel" or sorted(int(d) for d in _graphs.dependencies(node)) != before:
                continue
            if all(_graphs.kernel_node_word(node, off) == self._conditions[i].handle for _b, off, i in pending):
                self._refs.setdefault(int(node), {}).update({off: i for _b, off, i in pending})
                return

    def _suspend(self, kind: str):
        """End the stream's capture where a conditional node goes: (the graph being recorded
        into, the nodes the node goes after)."""
        if self._recording != threading.get_ident():
            raise NbjitGraphError(f"g.{kind}(...) records a conditional inside `with nbjit.capture(stream) as g:`, "
                                  "on the thread that began it")
        self._settle()
        status, graph, after = _graphs.capture_info(self._handle)
        if status != "active" or self._between is not None:
            raise self._not_recording(f"g.{kind}(...)", status)
        err, ended = _graphs.end_capture(self._handle)
        if err:
            self._broken = True
            raise _explain(err, f"capture on {self.stream!r}, where {kind} begins")
        if self._suspended is None:  # (the first conditional is always the top graph's)
            self._suspended = ended
        return ended, after

    def condition(self, default: int = 0, reset: bool = True) -> Condition:
        """A condition of the graph (or body) being recorded, for a conditional node recorded
        at the same level: ``default`` its value when a replay begins (each replay where
        ``reset``, else the first)."""
        if self._recording != threading.get_ident():
            raise NbjitGraphError("g.condition() is made inside `with nbjit.capture(stream) as g:` (or a body of "
                                  "it), on the thread that began it")
        if not isinstance(default, int) or not 0 <= default < 1 << 32:
            raise NbjitGraphError(f"a condition's default is an unsigned 32-bit int, not {default!r}")
        _graphs.require("if_then")
        self._settle()
        status, graph, _after = _graphs.capture_info(self._handle)
        if status != "active" or self._between is not None:
            raise self._not_recording("g.condition()", status)
        handle = _graphs.conditional_handle(graph, _driver.current_context_key(), int(default), bool(reset))
        cond = Condition(self, handle, int(default), bool(reset), len(self._conditions), int(graph))
        self._conditions.append(cond)
        return cond

    def _not_recording(self, what: str, status: str) -> NbjitGraphError:
        if status == "none" or self._between is not None:  # between the bodies of an if_else or a switch
            return NbjitGraphError(f"{what} inside `with g.if_else(c) as (then, otherwise):` or `with g.switch(c, n) "
                                   "as cases:` goes in a body: `with then:`, `with cases[i]:`")
        return NbjitGraphError(f"{what}: the capture on {self.stream!r} is {status}")

    def _check_condition(self, cond: Any, kind: str) -> None:
        if not isinstance(cond, Condition):
            raise NbjitGraphError(f"g.{kind}(cond): cond is a condition made by g.condition(), not "
                                  f"{type(cond).__name__}")
        if cond.capture is not self or cond not in self._conditions:
            raise NbjitGraphError(f"g.{kind}({cond!r}): the condition belongs to another capture (or an earlier "
                                  "capture of this one): make it with this capture's g.condition()")
        if self._between is not None:
            raise self._not_recording(f"g.{kind}(...)", "active")
        status, graph, _ = _graphs.capture_info(self._handle) if self._recording else ("none", None, ())
        if status == "active" and int(graph) != cond.graph:
            raise NbjitGraphError(f"g.{kind}({cond!r}): the condition was made in another graph level (a body "
                                  "or the graph around it): make it with g.condition() where this conditional is")

    def while_loop(self, cond: Condition) -> _Conditional:
        """``with g.while_loop(cond):`` records a body that runs while ``cond`` is non-zero
        (tested before each pass: a default of 0 runs it never)."""
        return _Conditional(self, "while_loop", cond, 1)

    def if_then(self, cond: Condition) -> _Conditional:
        """``with g.if_then(cond):`` records a body that runs where ``cond`` is non-zero."""
        return _Conditional(self, "if_then", cond, 1)

    def if_else(self, cond: Condition) -> _Conditional:
        """``with g.if_else(cond) as (then, otherwise):`` then ``with then: ...`` and ``with
        otherwise: ...`` record the two bodies."""
        return _Conditional(self, "if_else", cond, 2)

    def switch(self, cond: Condition, n: int) -> _Conditional:
        """``with g.switch(cond, n) as cases:`` then ``with cases[i]: ...`` records the body
        run where ``cond == i`` (none where it is ``n`` or more)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise NbjitGraphError(f"g.switch(cond, n): n is the number of cases, an int >= 1, not {n!r}")
        return _Conditional(self, "switch", cond, n)

    def _adopt(self, graph) -> None:
        """Make ``graph`` this capture's graph: update the instantiated one in place where
        the driver can, else instantiate it."""
        old_graph, old_exec = self._graph, None
        if self._exec is None or not _graphs.exec_update(self._exec, graph)[0]:
            try:
                new_exec = _graphs.instantiate(graph)
            except BaseException:
                _graphs.release(graph, None)  # (the graph before, and its instantiation, stay)
                raise
            old_exec, self._exec = self._exec, new_exec
            self._exec_int = _driver.as_int(new_exec)
            self.instantiations += 1
        self._closed = False  # (captured again after close())
        self._graph = graph
        self.version += 1
        self._nodes = None
        self.node_count = sum(1 for _ in walk(graph, self._conditionals))
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _graphs.release, self._graph, self._exec)
        self._finalizer.atexit = False
        if old_graph is not None or old_exec is not None:
            _graphs.release(old_graph, old_exec)

    # ------------------------------------------------------------ replaying and updating
    def launch(self, stream: Any = None) -> None:
        """Replay the graph on ``stream`` (default: the captured one)."""
        if self._exec is None:
            raise self._nothing("use the capture as `with nbjit.capture(stream) as g:`")
        err = _graphs.graph_launch(self._exec, self._handle if stream is None else stream_handle(stream))
        if err:
            raise NbjitGraphError(f"graph launch failed: {_driver.error_text(err)}")

    __call__ = launch

    @property
    def nodes(self) -> GraphNodes:
        """The kernel nodes, in the order they were recorded (bodies after their conditional
        node): ``g.nodes[i].set_args(...)``, ``set_grid``, ``enable``/``disable``."""
        if self._exec is None:
            raise self._nothing("capture first")
        if self._nodes is None:
            self._nodes = kernel_nodes(self, self._graph, self._conditionals)
        return self._nodes

    def instantiated(self) -> int:
        """The instantiated graph's handle, as an int (for node updates)."""
        if self._exec is None:
            raise self._nothing("capture first")
        return self._exec_int

    def begin_arguments(self) -> list:
        """A node's new arguments are being packed (``KernelNode.set_args``): the list where the
        conditions among them are noted, (parameter offset, condition)."""
        self._setting = []
        return self._setting

    def end_arguments(self, node: int, given: list | None) -> None:
        """The node's new arguments were taken (``given``: the conditions among them) or refused (None)."""
        self._setting = None
        if given is not None and (given or node in self._refs):
            self._refs[node] = dict(given)

    def recorded(self) -> "Recorded":
        """What ``save`` needs of the capture: its graph, conditional nodes, conditions and
        which kernel-node parameters took which condition."""
        if self._exec is None:
            raise self._nothing("capture first")
        return Recorded(self._graph, dict(self._conditionals), tuple(self._conditions), dict(self._refs))

    @property
    def conditions(self) -> tuple[Condition, ...]:
        """The conditions made in the capture, in order."""
        return tuple(self._conditions)

    def update(self) -> "Capture":
        """Capture the same work again (new arrays of the same shapes, new scalars) and
        update the instantiated graph in place; where the driver cannot (the work changed
        shape: other kernels, more nodes), it is instantiated anew (``instantiations``
        counts). Use as ``with g.update(): ...``. Nodes listed before are then stale."""
        if self._exec is None:
            raise self._nothing("capture first")
        return self

    def save(self, path: Any, bindings: dict | None = None) -> None:
        """Write the graph to ``path`` (see ``nbjit.load_graph``): its kernels' images, its
        topology with conditional bodies, launch configurations and arguments, each device
        array named in ``bindings`` ({name: array}) recorded as that name."""
        if self._exec is None:
            raise self._nothing("capture first")
        from nbjit.graphs.saved import save_graph  # (cold: the file format and bundles' writer)
        save_graph(self, path, bindings or {})

    def _nothing(self, what_to_do: str) -> NbjitGraphError:
        if self._closed:
            return NbjitGraphError("this capture was closed (its graph is freed): capture the work again")
        return NbjitGraphError(f"nothing captured yet: {what_to_do}")

    def close(self) -> None:
        """Free the graph now (replays are refused afterwards)."""
        if self._finalizer is not None:
            self._finalizer()
        self._graph = self._exec = None
        self._nodes = None
        self._closed = True

    def __repr__(self) -> str:
        state = f"{self.node_count} nodes" if self._exec is not None else "not captured"
        return f"<nbjit.Capture on {self.stream!r}: {state}>"


def capture(stream: Any, *, mode: str = "thread_local") -> Capture:
    """Capture everything issued on ``stream`` (a Numba stream, an int handle, anything nbjit
    takes as a stream; not the default stream) into a CUDA graph::

        with nbjit.capture(s) as g:
            numba_kernel[grid, block, s](a)
            nbjit_kernel[grid, block, s](a, b, 2.0)
            b.copy_to_device(a, stream=s)
            again = g.condition(default=1)
            with g.while_loop(again):
                step[grid, block, s](a, again)   # sets `again` to 0 to stop
        for _ in range(100):
            g.launch()

    ``mode``: ``"thread_local"`` (default: a call on this thread that a capture cannot
    record, such as a synchronous copy, fails at once and is reported), ``"global"`` or
    ``"relaxed"`` (the driver's other modes). Raises ``NbjitGraphError`` naming what broke the
    capture; the stream is never left capturing. Loops and branches: ``Capture.while_loop``
    and its kinds; updates in place: ``Capture.nodes``; a file: ``Capture.save``.
    """
    return Capture(stream, mode)
