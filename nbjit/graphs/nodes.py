"""The nodes of an instantiated graph, for updates without capturing again: ``g.nodes``
lists the kernel nodes (of the graph and of its conditional bodies) in the order they were
recorded; ``node.set_args(*args)`` (packed and checked like a launch, by the same C code),
``set_grid(grid, block)``, ``enable()``/``disable()`` change the *instantiated* graph in
place (cuGraphExecKernelNodeSetParams, cuGraphNodeSetEnabled).

Each node keeps its parameters in a buffer of its own (copied from the graph when listed):
what the node runs now, which a later ``set_grid`` hands over again and ``save`` writes.
"""
from __future__ import annotations

import struct
from typing import Any, Iterator

from nbjit.errors import NbjitGraphError
from nbjit.gpu import driver as _driver
from nbjit.gpu import graphs as _graphs
from nbjit.launch.config import LaunchConfig
from nbjit.launch.kernel import kernel_of_function
from nbjit.launch.launchers import ParamBuffer

__all__ = ["KernelNode", "GraphNodes", "walk", "parameter_layout"]


def parameter_layout(func: int, kernel) -> list[tuple[int, int]] | None:
    """(offset, size) of each parameter of the kernel ``func`` (``kernel``: nbjit's, or None):
    the driver's word (CUDA 12.4 on), else the signature's (not for a @cuda.jit kernel, whose
    arguments are not its parameters), else None."""
    layout = _graphs.function_params(func)
    if not layout and kernel is not None and kernel.info.launch_offsets is None:
        layout = [(q.offset, q.size) for q in kernel.params]
    return layout or None


def walk(graph: Any, conditionals: dict, path: tuple = ()) -> Iterator[tuple[tuple, Any, str]]:
    """(path, node, kind) for every node of ``graph``, in the driver's order, each
    conditional node followed by the nodes of its bodies (depth first). ``path`` names the
    graph a node is in: () the top graph, (i, b, ...) body b of the conditional node that is
    node i of the graph above. ``conditionals`` maps a conditional node's int to its bodies."""
    for i, node in enumerate(_graphs.nodes(graph)):
        kind = _graphs.node_kind(node)
        yield path, node, kind
        if kind == "conditional":
            for b, body in enumerate(conditionals[int(node)].bodies):
                yield from walk(body, conditionals, path + (i, b))


class KernelNode:
    """One kernel node of an instantiated graph (``g.nodes[i]``): ``name``, ``kernel`` (the
    nbjit kernel it runs, or None for a kernel another launcher recorded), ``grid``,
    ``block``, ``shared``, ``enabled``, ``path`` (the conditional body it is in; () the
    top graph)."""

    __slots__ = ("owner", "node", "func", "kernel", "name", "grid", "block", "shared", "enabled", "path",
                 "layout", "buf", "_version", "_node_int", "_set", "_configs", "complete")

    def __init__(self, owner, path: tuple, func: int, kernel, name: str, launch: tuple, layout: list):
        """A node of ``owner`` (the Capture or loaded graph: its instantiated graph is
        ``owner._exec``) running ``func`` (``kernel``, where nbjit's) with ``launch`` (grid,
        block, shared), its parameters at ``layout`` [(offset, size)] in a buffer of its own
        (zeros: ``of_graph`` copies the graph's, a loaded graph writes what it saved)."""
        self.owner, self.path, self.func, self.kernel, self.name = owner, path, func, kernel, name
        self.grid, self.block, self.shared = launch
        self._version = owner.version
        self.node = None
        self._node_int = 0
        self.enabled = True
        self._set = None  # how new arguments are handed over (``_setter``)
        self._configs: dict = {}  # set_grid's configurations, checked
        size = max((o + n for o, n in layout), default=0)
        if kernel is not None:
            size = max(size, kernel._loaded().sig.size)
        self.layout = tuple(layout)
        # where each of the kernel's parameters lies is known (or nbjit does not know the kernel): its
        # arguments can be set in place and saved
        self.complete = kernel is None or len(layout) == len(kernel._loaded().param_offsets or kernel.params)
        self.buf = ParamBuffer(size, [off for off, _n in layout])

    @property
    def data(self) -> bytearray:
        """The node's parameters as it runs them now (its buffer's bytes)."""
        return self.buf.data

    @classmethod
    def of_graph(cls, owner, node, path: tuple) -> "KernelNode":
        """A node of a captured graph, described by the driver (its parameters copied)."""
        p = _graphs.kernel_node(node)
        kernel = kernel_of_function(p.func)
        name = kernel._loaded().label if kernel is not None else _graphs.function_name(p.func)
        layout = parameter_layout(p.func, kernel) or []
        self = cls(owner, path, p.func, kernel, name, (p.grid, p.block, p.shared), layout)
        self.placed(node)
        if p.params:  # the graph's own copy of the parameters
            for i, (off, n) in enumerate(layout):
                self.data[off:off + n] = _graphs.kernel_node_param(p, i, n)
        return self

    def placed(self, node) -> None:
        """The node is ``node`` of the graph."""
        self.node = node
        self._node_int = _driver.as_int(node)

    # ------------------------------------------------------------ updates
    def _exec(self) -> int:
        """The owner's instantiated graph (its handle as an int), where this node is of it."""
        owner = self.owner
        ex = owner.instantiated()
        if owner.version != self._version:
            raise NbjitGraphError(f"node {self.name!r} belongs to the graph as it was before it was captured again: "
                                  "list g.nodes again")
        return ex

    def set_args(self, *args) -> None:
        """Give the node new arguments (of the kernel's signature, checked and packed as a
        launch's are); the next replay runs with them. Refused, the node keeps its arguments."""
        ex = self._exec()
        setter = self._set or self._setter()
        owner = self.owner
        given = owner.begin_arguments()  # (the graph conditions among them, where they go)
        err = 1
        try:
            err = setter(ex, self._node_int, args, self.buf.base, len(self.buf.data))
        finally:
            owner.end_arguments(self._node_int, None if err else given)
        if err:
            raise self._refused(err, "new arguments")

    def _updatable(self) -> None:
        """NbjitGraphError where the node's arguments cannot be changed in place."""
        if self.kernel is None:
            raise NbjitGraphError(f"node {self.name!r} runs a kernel nbjit did not launch (Numba launched it "
                                  "itself): launch it through nbjit in the capture (nbjit.from_numba(kernel, "
                                  "signature)) to update its arguments")
        if not self.complete:
            raise NbjitGraphError(f"node {self.name!r}: the driver (older than CUDA 12.4) does not say where this "
                                  "kernel's parameters lie, so its arguments cannot be set in place: capture again")

    def _setter(self):
        """``set_node(graph_exec, node, args, buf, buf_size) -> CUresult`` of the kernel's
        launcher for this node's configuration: nbjit's C one, else the same rules in Python;
        either copies the arguments into the node's buffer once the driver took them."""
        self._updatable()
        launcher = self.kernel[self.grid, self.block, 0, self.shared]
        if _graphs.node_calls() is not None and hasattr(launcher, "set_node"):
            self._set = launcher.set_node
        else:
            self._set = lambda ex, node, args, _buf, _size: self._replace(ex, 0, launcher._pack(args))
        return self._set

    def set_grid(self, grid: int | tuple, block: int | tuple | None = None, shared: int | None = None) -> None:
        """Give the node a new grid (and block, dynamic shared memory), its arguments kept."""
        ex = self._exec()
        if not self.complete:  # (a node of a kernel nbjit did not launch takes a grid: its arguments stay)
            self._updatable()
        key = (grid, self.block if block is None else block, self.shared if shared is None else shared)
        try:
            c = self._configs[key]
        except (KeyError, TypeError):  # (TypeError: a list, unhashable)
            c = LaunchConfig.make(*key[:2], None, key[2], kernel=self.name)
            if len(self._configs) < 64 and type(grid) is not list and type(block) is not list:
                self._configs[key] = c
        old = self.grid, self.block, self.shared
        self.grid, self.block, self.shared = c.grid, c.block, c.shared
        err = self._hand_over(ex)
        if err:
            self.grid, self.block, self.shared = old
            raise self._refused(err, f"grid {c.grid}, block {c.block}, {c.shared} bytes of shared memory")
        if old != (c.grid, c.block, c.shared):
            self._set = None  # (the launcher of the new configuration hands arguments over)

    def set_word(self, offset: int, value: int) -> None:
        """Write the 8-byte word at byte ``offset`` of the node's parameters (an address, a
        handle) and hand them over; refused, the node keeps its parameters."""
        err = self._replace(self._exec(), offset, struct.pack("<Q", value))
        if err:
            raise self._refused(err, f"a new word at byte {offset}")

    def _replace(self, ex: int, offset: int, new: bytes) -> int:
        """``new`` written into the node's parameters at ``offset`` and handed over; the old
        bytes back where the driver refuses. The CUresult."""
        data = self.buf.data
        kept = bytes(data[offset:offset + len(new)])
        data[offset:offset + len(new)] = new
        err = self._hand_over(ex)
        if err:
            data[offset:offset + len(new)] = kept
        return err

    def _hand_over(self, ex: int) -> int:
        """The node's configuration and its buffer's parameters to the instantiated graph."""
        return _graphs.set_kernel_node(ex, self._node_int, self.func, self.grid, self.block, self.shared,
                                       self.buf.address)

    def enable(self) -> None:
        """Run this node in the next replays (nodes are enabled when captured)."""
        self._switch(True)

    def disable(self) -> None:
        """Skip this node in the next replays (its dependants still wait for what precedes it)."""
        self._switch(False)

    def _switch(self, on: bool) -> None:
        err = _graphs.set_enabled(self._exec(), self._node_int, on)
        if err:
            raise self._refused(err, "enable" if on else "disable")
        self.enabled = on

    def _refused(self, err, what: str) -> NbjitGraphError:
        return NbjitGraphError(f"graph node {self.name!r}: the driver refused {what}: {_driver.error_text(err)}")

    def __repr__(self) -> str:
        where = f" in body {self.path}" if self.path else ""
        state = "" if self.enabled else ", disabled"
        return f"<graph node {self.name!r}{where}: grid {self.grid}, block {self.block}{state}>"


class GraphNodes:
    """The kernel nodes of an instantiated graph, in the order they were recorded:
    ``nodes[i]``, ``nodes["name"]`` (the one node running that kernel), ``named(name)``
    (every such node), ``len``, iteration."""

    def __init__(self, items: list[KernelNode]):
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[KernelNode]:
        return iter(self._items)

    def named(self, name: str) -> list[KernelNode]:
        """The nodes running kernel ``name``, in order: its name as ``node.name`` shows it (a
        @cuda.jit kernel's qualified Python name, whose last part will do too), or its name in
        the module."""
        return [n for n in self._items if name in (n.name, n.name.rpartition(".")[2])
                or (n.kernel is not None and n.kernel.name == name)]

    def __getitem__(self, key: int | str) -> KernelNode:
        if isinstance(key, str):
            found = self.named(key)
            if len(found) != 1:
                names = sorted({n.name for n in self._items})
                raise NbjitGraphError(f"{len(found)} graph nodes run kernel {key!r}"
                                      + (f": pick one with g.nodes.named({key!r})[i]" if found else
                                         f"; the graph's kernels: {names}"))
            return found[0]
        try:
            return self._items[key]
        except IndexError:
            raise NbjitGraphError(f"graph node {key} does not exist: the graph has {len(self._items)} kernel "
                                  "nodes") from None

    def __repr__(self) -> str:
        return f"<{len(self._items)} kernel nodes: {[n.name for n in self._items]}>"


def kernel_nodes(owner: Any, graph: Any, conditionals: dict) -> GraphNodes:
    """``GraphNodes`` of ``owner``'s graph (a Capture or a loaded graph)."""
    return GraphNodes([KernelNode.of_graph(owner, node, path)
                       for path, node, kind in walk(graph, conditionals) if kind == "kernel"])

