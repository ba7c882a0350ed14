"""Graphs that outlive the process: ``g.save(path, bindings)`` writes a captured graph as a
bundle (its kernels' images, checked by digest as any bundle's) with ``graph.json`` beside
them (``file_format.py``); ``nbjit.load_graph(path, bindings)`` rebuilds it node by node in
another process, with no NVRTC and no compiler, and instantiates it; ``rebind(x=array)``
swaps an array in the instantiated graph (node updates, no rebuild).

Device arrays are recorded as *bindings*: a kernel parameter (any 8-byte word of one), a
memset's destination or a copy's source and destination that points into an array named in
``bindings`` is saved as that name plus a byte offset; one that points to other device memory
is refused at save (it would not exist in the other process). Scalars are saved as the bytes
the kernel received; conditions as their index, made again on load.
"""
from __future__ import annotations

import json
import os
import struct
import weakref
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from nbjit.bundles.archive import MAX_MANIFEST_BYTES, load_image, open_bundle, pick, read_json, read_member, records
from nbjit.errors import BundleError, NbjitGraphError
from nbjit.files import write_file
from nbjit.gpu import driver as _driver
from nbjit.gpu import graphs as _graphs
from nbjit.gpu.driver import stream_handle
from nbjit.graphs.file_format import BINDING_NAME, FORMAT, MEMBER, VERSION, check_description, extent, summary
from nbjit.graphs.nodes import GraphNodes, KernelNode, parameter_layout, walk
from nbjit.launch.arrays import c_strides
from nbjit.records import record

__all__ = ["save_graph", "load_graph", "LoadedGraph", "array_facts", "graph_summary"]

if TYPE_CHECKING:
    from nbjit.graphs.capture import Capture

_WORD = struct.Struct("<Q")  # (an 8-byte parameter word: an address, a handle)


@record
class ArrayFacts:
    """What a binding records of an array: its address, element type, shape, strides (bytes)."""

    ptr: int
    dtype: np.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return extent(list(self.shape), list(self.strides), self.dtype.itemsize)

    def to_json(self) -> dict:
        return {"dtype": self.dtype.str, "shape": list(self.shape), "strides": list(self.strides)}

    def describe(self) -> str:
        article = "an" if self.dtype.name[0] in "aeio" else "a"
        return f"{article} {self.dtype.name} array of shape {self.shape}, strides {self.strides}"


def array_facts(a: Any, name: str, src: str = "") -> ArrayFacts:
    """A device array's facts, through ``__cuda_array_interface__`` (Numba, CuPy, PyTorch,
    nbjit's own); ``src`` names the graph's file in errors."""
    where = f"{src}: binding {name!r}" if src else f"binding {name!r}"
    cai = getattr(a, "__cuda_array_interface__", None)
    if not isinstance(cai, dict):
        raise NbjitGraphError(f"{where}: a {type(a).__name__} is not a device array (an array with "
                              "__cuda_array_interface__: Numba, CuPy, PyTorch)")
    try:
        dtype = np.dtype(cai["typestr"])
        shape = tuple(int(n) for n in cai["shape"])
        ptr = int(cai["data"][0] or 0)
        strides = cai.get("strides")
        strides = tuple(int(x) for x in strides) if strides is not None else c_strides(shape, dtype.itemsize)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise NbjitGraphError(f"{where}: its __cuda_array_interface__ does not read: {e!r}") from None
    if any(x < 0 for x in strides):
        raise NbjitGraphError(f"{where}: strides {strides} run backwards; bind a copy with strides >= 0")
    return ArrayFacts(ptr, dtype, shape, strides)


# ------------------------------------------------------------------ saving


class _Describer:
    """A captured graph described as ``file_format`` lays it out."""

    def __init__(self, g, bindings: Mapping[str, Any]):
        self.rec = g.recorded()
        self.arrays = {name: array_facts(a, name) for name, a in bindings.items()}
        for name in self.arrays:
            if not BINDING_NAME.fullmatch(name):
                raise NbjitGraphError(f"binding {name!r}: a binding's name is a Python identifier (it is given back "
                                      "as load_graph(..., bindings={name: array}) and rebind(name=array))")
        self.kernels: list[dict] = []
        self.kernel_index: dict[tuple, int] = {}
        self.images: dict[int, tuple[str, Any]] = {}  # id(module) -> (image name, Image)
        self.graph_paths: dict[int, list[int]] = {}
        self.nodes = {int(n.node): n for n in g.nodes}  # (the nodes' parameters as they are now)

    def binding(self, v: int) -> tuple[str, int] | None:
        for name, f in self.arrays.items():
            if f.ptr <= v < f.ptr + max(f.nbytes, 1):
                return name, v - f.ptr
        return None

    def address(self, v: int, where: str) -> list:
        hit = self.binding(v)
        if hit is None:
            raise self.unbound(v, where)
        return list(hit)

    def unbound(self, v: int, where: str) -> NbjitGraphError:
        return NbjitGraphError(f"{where} uses device address {v:#x}, which no binding covers: name the array it lies "
                               "in, g.save(path, bindings={'x': x, ...}) (the loading process passes its own)")

    def kernel(self, kn: KernelNode, where: str) -> int:
        k = kn.kernel
        if k is None:
            raise NbjitGraphError(f"{where} runs kernel {kn.name!r}, which Numba launched itself: launch it through "
                                  "nbjit in the capture (nbjit.from_numba(kernel, signature)) to save it")
        module = k.module
        if id(module) not in self.images:
            self.images[id(module)] = (f"m{len(self.images)}", module.image)
        key = (id(module), k.name)
        if key not in self.kernel_index:
            self.kernel_index[key] = len(self.kernels)
            self.kernels.append({"image": self.images[id(module)][0], "name": k.name, "label": kn.name})
        return self.kernel_index[key]

    def kernel_node(self, node, after: list[int], where: str) -> dict:
        kn = self.nodes[int(node)]
        attrs = _graphs.kernel_node_launch_attributes(node)
        if attrs:
            raise NbjitGraphError(f"{where} ({kn.name!r}) is launched with {' and '.join(attrs)}, which a saved graph "
                                  "does not hold: launch it without (a cluster shape compiled in, __cluster_dims__, "
                                  "is the kernel's own and is kept)")
        if not kn.complete:
            raise NbjitGraphError(f"{where} ({kn.name!r}): the driver (older than CUDA 12.4) does not say where the "
                                  "kernel's parameters lie, so they cannot be saved")
        data = bytes(kn.data[:max((o + n for o, n in kn.layout), default=0)])
        handles = [c.handle for c in self.rec.conditions]
        given = {off: i for off, i in self.rec.refs.get(int(node), {}).items()  # (conditions the launch was given)
                 if off + 8 <= len(data) and _WORD.unpack_from(data, off)[0] == handles[i]}
        refs: list[list] = [[off, "condition", i] for off, i in sorted(given.items())]
        for off, size in kn.layout:
            for w in range(off, off + size - 7, 8) if off % 8 == 0 else ():
                v = _WORD.unpack_from(data, w)[0]
                if w in given:
                    continue
                if (hit := self.binding(v)) is not None:
                    refs.append([w, "binding", *hit])
                elif v and _driver.pointer_context(v) is not None:
                    raise self.unbound(v, f"{where} ({kn.name!r}), its parameter at byte {off},")
        return {"kind": "kernel", "after": after, "kernel": self.kernel(kn, where), "grid": list(kn.grid),
                "block": list(kn.block), "shared": kn.shared, "enabled": kn.enabled, "params": data.hex(),
                "layout": [list(p) for p in kn.layout], "refs": refs}

    def node(self, node, kind: str, after: list[int], path: list[int], i: int) -> dict:
        where = f"graph node {i} of graph {path}"
        if kind == "kernel":
            return self.kernel_node(node, after, where)
        if kind == "memset":
            m = _graphs.memset_node(node)
            return {"kind": "memset", "after": after, "enabled": True, "dst": self.address(m.pop("dst"), where),
                    **m}
        if kind == "memcpy":
            try:
                m = _graphs.memcpy_node(node)
            except NbjitGraphError as e:
                raise NbjitGraphError(f"{where}: {e}") from None
            return {"kind": "memcpy", "after": after, "enabled": True, "src": self.address(m["src"], where),
                    "dst": self.address(m["dst"], where), "bytes": m["bytes"]}
        if kind == "empty":
            return {"kind": "empty", "after": after}
        if kind == "conditional":
            c = self.rec.conditionals[int(node)]
            return {"kind": "conditional", "after": after, "type": c.kind, "condition": c.condition.index,
                    "bodies": [self.graph(b, path + [i, n]) for n, b in enumerate(c.bodies)]}
        raise NbjitGraphError(f"{where} is a {kind} node, which a saved graph cannot hold (kernels, memsets, copies "
                              "between device arrays and conditionals can)")

    def graph(self, graph, path: list[int]) -> list[dict]:
        self.graph_paths[int(graph)] = path
        nodes = _graphs.nodes(graph)
        index = {int(n): i for i, n in enumerate(nodes)}
        return [self.node(n, _graphs.node_kind(n), sorted(index[int(d)] for d in _graphs.dependencies(n)), path, i)
                for i, n in enumerate(nodes)]

    def describe(self) -> tuple[dict, dict]:
        top = self.graph(self.rec.graph, [])
        conditions = [{"default": c.default, "reset": c.reset, "graph": self.graph_paths.get(c.graph, [])}
                      for c in self.rec.conditions]
        doc = {"format": FORMAT, "version": VERSION, "kernels": self.kernels,
               "bindings": {name: f.to_json() for name, f in self.arrays.items()}, "conditions": conditions,
               "graph": top}
        return doc, {name: image for name, image in self.images.values()}


def save_graph(g: "Capture", path: str | os.PathLike, bindings: Mapping[str, Any]) -> None:
    """``Capture.save``: the graph and its kernels' images written to ``path`` (whole or not at all)."""
    if not isinstance(bindings, Mapping):
        raise NbjitGraphError(f"bindings is a dict {{name: device array}}, not {type(bindings).__name__}")
    doc, images = _Describer(g, bindings).describe()
    if not images:
        raise NbjitGraphError("the graph runs no nbjit kernel: a saved graph holds at least one")
    check_description(doc, os.fsdecode(path))  # what a reader will check, before it is written
    raw = json.dumps(doc, indent=1).encode() + b"\n"
    from nbjit.bundles.build import bundle_bytes  # (cold: the bundle writer, which a loading process never needs)
    data, _info = bundle_bytes(images, members=[(MEMBER, raw)])
    write_file(path, lambda f: f.write(data), NbjitGraphError)


# ------------------------------------------------------------------ loading


@record(frozen=False)
class _Use:
    """Where a binding's address goes: a kernel node's word, or a memset's / copy's field."""

    node: Any  # a KernelNode, or the driver's node
    offset: int  # the word's byte offset (kernel), else 0
    delta: int  # bytes into the array
    fields: dict | None = None  # a memset's or copy's fields
    field: str = ""  # which of them: "dst", "src"
    kind: str = "kernel"


@record
class _Bodies:
    bodies: tuple


class LoadedGraph:
    """A saved graph rebuilt and instantiated in this process (``nbjit.load_graph``):
    ``launch(stream=None)`` replays it, ``rebind(name=array)`` swaps arrays in place,
    ``nodes`` lists its kernel nodes (``set_grid``, ``enable``/``disable``, ``set_args``),
    ``bindings`` says what each binding takes."""

    def __init__(self, source: str, doc: dict, kernels: list, arrays: dict[str, ArrayFacts], keep: dict):
        self.source = source
        self._doc = doc
        self._kernels = kernels
        self._arrays = arrays
        self._keep = dict(keep)  # the arrays bound now: alive while the graph may run them
        self._uses: dict[str, list[_Use]] = {name: [] for name in doc["bindings"]}
        self._handles: dict[int, int] = {}
        self._conditionals: dict[int, _Bodies] = {}
        self._kernel_nodes: list[KernelNode] = []
        self._disabled: list[KernelNode] = []  # (saved disabled: switched off once instantiated)
        self._ctx = _driver.current_context_key()
        self.version = 1
        self._exec = None
        self._graph = _graphs.new_graph()
        try:
            self._build(self._graph, doc["graph"], [])
            self._exec = _graphs.instantiate(self._graph)
        except BaseException:
            _graphs.release(self._graph, None)
            raise
        self._exec_int = _driver.as_int(self._exec)
        self._finalizer = weakref.finalize(self, _graphs.release, self._graph, self._exec)
        self._finalizer.atexit = False
        self._nodes = GraphNodes(self._kernel_nodes)
        for kn in self._disabled:
            kn.disable()

    def instantiated(self) -> int:
        """The instantiated graph's handle, as an int (for node updates)."""
        if self._exec is None:
            raise self._nothing("")
        return self._exec_int

    def begin_arguments(self) -> list:
        """(``KernelNode.set_args``: a loaded graph's conditions are its own, never given anew.)"""
        return []

    def end_arguments(self, node: int, given: list | None) -> None:
        """(Nothing to note: see ``begin_arguments``.)"""

    @property
    def bindings(self) -> dict[str, str]:
        """Each binding's name and what it takes (element type, shape, strides in bytes)."""
        return {name: f.describe() for name, f in self._arrays.items()}

    @property
    def nodes(self) -> GraphNodes:
        """The kernel nodes, in the order they were saved (as ``Capture.nodes``)."""
        return self._nodes

    @property
    def node_count(self) -> int:
        """Every node, those of conditional bodies too."""
        return sum(1 for _ in walk(self._graph, self._conditionals))

    def _address(self, ref: list) -> int:
        return self._arrays[ref[0]].ptr + ref[1]

    def _build(self, graph, nodes: list[dict], path: list[int]) -> None:
        for ci, c in enumerate(self._doc["conditions"]):
            if c["graph"] == path:
                self._handles[ci] = _graphs.conditional_handle(graph, self._ctx, c["default"], c["reset"])
        made: list = []
        for i, n in enumerate(nodes):
            after = [made[j] for j in n["after"]]
            kind = n["kind"]
            if kind == "kernel":
                node = self._kernel_node(graph, after, n, tuple(path))
            elif kind in ("memset", "memcpy"):
                node = self._memory_node(graph, after, n)
            elif kind == "empty":
                node = _graphs.add_empty_node(graph, after)
            else:
                node, bodies = _graphs.add_conditional(graph, tuple(after), self._handles[n["condition"]], n["type"],
                                                       len(n["bodies"]), self._ctx)
                self._conditionals[int(node)] = _Bodies(bodies)
                for b, body in enumerate(n["bodies"]):
                    self._build(bodies[b], body, path + [i, b])
            made.append(node)

    def _kernel_node(self, graph, after: list, n: dict, path: tuple):
        """A kernel node as saved: its parameters, the bindings' and conditions' words written."""
        kernel = self._kernels[n["kernel"]]
        label = self._doc["kernels"][n["kernel"]]["label"]
        func = _driver.as_int(kernel._loaded().func)
        layout = [tuple(pair) for pair in n["layout"]]
        known = parameter_layout(func, kernel)
        if known is not None and layout != known:
            raise NbjitGraphError(f"{self.source}: kernel {label!r}: the saved parameters lie at {layout}, and the "
                                  f"kernel's at {known} (the file was altered, or its image is of another kernel)")
        kn = KernelNode(self, path, func, kernel, label, (tuple(n["grid"]), tuple(n["block"]), n["shared"]), layout)
        saved = bytes.fromhex(n["params"])
        if len(saved) > len(kn.data):
            raise NbjitGraphError(f"{self.source}: kernel {label!r}: {len(saved)} bytes of saved parameters, and the "
                                  f"kernel takes {len(kn.data)}")
        kn.data[:len(saved)] = saved
        for ref in n["refs"]:
            if ref[1] == "condition":
                _WORD.pack_into(kn.data, ref[0], self._handles[ref[2]])
            else:
                _WORD.pack_into(kn.data, ref[0], self._address(ref[2:]))
                self._uses[ref[2]].append(_Use(kn, ref[0], ref[3]))
        node = _graphs.add_kernel_node(graph, after, kn.func, kn.grid, kn.block, kn.shared, kn.buf.address)
        kn.placed(node)
        self._kernel_nodes.append(kn)
        if not n["enabled"]:
            self._disabled.append(kn)
        return node

    def _memory_node(self, graph, after: list, n: dict):
        m = {k: v for k, v in n.items() if k not in ("kind", "after", "enabled")}
        fields = ("dst",) if n["kind"] == "memset" else ("src", "dst")
        refs = {f: m[f] for f in fields}
        for f in fields:
            m[f] = self._address(refs[f])
        add = _graphs.add_memset_node if n["kind"] == "memset" else _graphs.add_memcpy_node
        node = add(graph, after, self._ctx, m)
        for f in fields:
            self._uses[refs[f][0]].append(_Use(node, 0, refs[f][1], m, f, n["kind"]))
        return node

    # ------------------------------------------------------------ replaying and rebinding
    def launch(self, stream: Any = None) -> None:
        """Replay the graph on ``stream`` (a Numba stream, an int handle, anything nbjit takes;
        default: the legacy default stream)."""
        if self._exec is None:
            raise self._nothing("")
        err = _graphs.graph_launch(self._exec, stream_handle(stream))
        if err:
            raise NbjitGraphError(f"{self.source}: graph launch failed: {_driver.error_text(err)}")

    __call__ = launch

    def rebind(self, **arrays: Any) -> None:
        """Swap bound arrays (``rebind(x=new_x)``): every node that uses one is updated in the
        instantiated graph. Each must match its binding's element type, shape and strides."""
        checked = {name: _bound(self.source, name, self._doc["bindings"].get(name), a) for name, a in arrays.items()}
        ex = self._exec
        if ex is None:
            raise self._nothing("")
        for name, facts in checked.items():
            before = self._keep.get(name)
            self._keep[name] = (arrays[name], before)  # (both alive until every node uses the new one)
            for use in self._uses[name]:
                address = facts.ptr + use.delta
                if use.kind == "kernel":
                    use.node.set_word(use.offset, address)
                    continue
                kept, use.fields[use.field] = use.fields[use.field], address
                setter = _graphs.set_memset_node if use.kind == "memset" else _graphs.set_memcpy_node
                err = setter(ex, use.node, self._ctx, use.fields)
                if err:
                    use.fields[use.field] = kept
                    raise NbjitGraphError(f"{self.source}: rebinding {name!r}: the driver refused a node update: "
                                          f"{_driver.error_text(err)}")
            self._arrays[name] = facts
            self._keep[name] = arrays[name]

    def _nothing(self, what_to_do: str) -> NbjitGraphError:
        return NbjitGraphError(f"{self.source}: the graph was closed")

    def close(self) -> None:
        """Free the graph now (replays are refused afterwards)."""
        self._finalizer()
        self._exec = None

    def __repr__(self) -> str:
        return f"<nbjit.LoadedGraph {self.source}: {len(self._nodes)} kernel nodes, bindings {sorted(self._arrays)}>"


def _bound(src: str, name: str, want: dict | None, a: Any) -> ArrayFacts:
    """Array ``a`` for binding ``name`` (``want``: what it records), checked."""
    if want is None:
        raise NbjitGraphError(f"{src}: the graph has no binding {name!r}")
    f = array_facts(a, name, src)
    if f.dtype != np.dtype(want["dtype"]) or list(f.shape) != want["shape"] or \
            (f.nbytes and list(f.strides) != want["strides"]):
        w = ArrayFacts(0, np.dtype(want["dtype"]), tuple(want["shape"]), tuple(want["strides"]))
        raise NbjitGraphError(f"{src}: binding {name!r} takes {w.describe()}; got {f.describe()}")
    return f


def _description(archive) -> dict | None:
    """The archive's saved-graph description, checked; None where it holds none."""
    raw = read_member(archive, MEMBER)
    if raw is None:
        return None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise NbjitGraphError(f"{archive.source}: {MEMBER} has more than {MAX_MANIFEST_BYTES} bytes")
    return check_description(read_json(raw, f"{archive.source}: {MEMBER}", NbjitGraphError), archive.source)


def graph_summary(source: Any, name: str | None = None) -> dict | None:
    """What a saved graph file holds (``file_format.summary``), checked as ``load_graph``
    checks it; None for a bundle that holds no graph (``nbjit inspect``)."""
    archive = open_bundle(source, name)
    records(archive)
    doc = _description(archive)
    return None if doc is None else summary(doc)


def load_graph(source: Any, bindings: Mapping[str, Any] | None = None) -> LoadedGraph:
    """Rebuild and instantiate a graph saved by ``g.save`` (a path, or its bytes), in the
    current context: its kernels loaded from the file's images (no NVRTC, no compiler; each
    payload checked against its digest first), every binding given an array of the same
    element type, shape and strides (``bindings={"x": x, ...}``).

    ``launch(stream=None)`` of what it returns replays on ``stream``, the legacy default stream
    where none is given (a loaded graph has no captured stream).

    Raises (before anything is launched) ``NbjitGraphError``: a bundle that holds no graph, a
    description out of the format or of a newer version, bindings that are missing, unknown or
    of another element type, shape or strides; ``BundleError``: no such file, not a bundle, a
    damaged or altered one (a member's CRC-32 or SHA-256 does not match)."""
    archive = open_bundle(source)
    src = archive.source
    recs = records(archive)  # (every image's and member's listing checked first)
    doc = _description(archive)
    if doc is None:
        raise NbjitGraphError(f"{src}: a bundle of kernels, not a saved graph (no {MEMBER}): load it with "
                              "nbjit.load_bundle")
    if bindings is not None and not isinstance(bindings, Mapping):
        raise NbjitGraphError(f"{src}: bindings is a dict {{name: device array}}, not {type(bindings).__name__}")
    bindings = dict(bindings or {})
    missing = sorted(set(doc["bindings"]) - set(bindings))
    unknown = sorted(set(bindings) - set(doc["bindings"]))
    if missing or unknown:
        raise NbjitGraphError(f"{src}: " + "; ".join(
            ([f"bindings {missing} are missing"] if missing else []) + ([f"it has no bindings {unknown}"] if unknown
                                                                        else []))
            + f" (the graph's: {sorted(doc['bindings'])})")
    arrays = {name: _bound(src, name, doc["bindings"][name], a) for name, a in bindings.items()}
    modules: dict[str, Any] = {}
    kernels = []
    for k in doc["kernels"]:
        try:
            rec = pick(recs, k["image"], src)
        except BundleError as e:
            raise NbjitGraphError(f"{e} (the image of the graph's kernel {k['label']!r})") from None
        if k["image"] not in modules:
            modules[k["image"]] = load_image(archive, rec)
        kernels.append(modules[k["image"]][k["name"]])
    return LoadedGraph(src, doc, kernels, arrays, bindings)
