"""A saved graph's description (``graph.json`` beside the kernels' images in the bundle that
``g.save`` writes): its layout, and the checks a reader runs on it before anything reaches
the driver. Pure data: no GPU, no driver (the format's and version's rule is bundles').

Layout (version 1)::

    {"format": "nbjit-graph", "version": 1,
     "kernels":   [{"image": "m0", "name": "<the kernel's name in its image>", "label": "axpy"}],
     "bindings":  {"x": {"dtype": "<f4", "shape": [1024], "strides": [4]}},   (strides >= 0)
     "conditions": [{"default": 1, "reset": true, "graph": [2, 0]}],
     "graph": [node, ...]}

A node is one of (``after``: the indices of the nodes of the same graph it follows)::

    {"kind": "kernel", "after": [], "kernel": 0, "grid": [8, 1, 1], "block": [128, 1, 1],
     "shared": 0, "enabled": true, "params": "<hex>", "layout": [[offset, size], ...],
     "refs": [[offset, "binding", "x", byte offset into x], [offset, "condition", 0]]}
    {"kind": "memset", "after": [], "enabled": true, "dst": ["x", 0], "value": 0,
     "element_size": 4, "width": 1024, "height": 1, "pitch": 0}
    {"kind": "memcpy", "after": [], "enabled": true, "src": ["x", 0], "dst": ["y", 0], "bytes": 4096}
    {"kind": "empty", "after": []}
    {"kind": "conditional", "after": [], "type": "while_loop", "condition": 0, "bodies": [[node, ...]]}

A condition's ``graph`` is the path to the graph it was made in (and whose conditional node
reads it): [] the top graph, [i, b] body b of the top graph's node i, and so on. A kernel
parameter's ``refs`` are 8-byte words the loader writes: a binding's address (plus the byte
offset) or a condition's handle; every other byte is the value recorded. Every address points
into its binding, and what a memset or a copy touches from there lies inside it.
"""
from __future__ import annotations

import re
from typing import Any

from nbjit.bundles.archive import check_format
from nbjit.errors import NbjitGraphError

__all__ = ["FORMAT", "VERSION", "MEMBER", "BINDING_NAME", "check_description", "extent", "summary"]

FORMAT = "nbjit-graph"
VERSION = 1
MEMBER = "graph.json"  # its member in the bundle
MAX_NODES = 1 << 16
MAX_DEPTH = 16
MAX_PARAM_BYTES = 32764  # CUDA 12.1's kernel parameter limit
BINDING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_DTYPE = re.compile(r"[<>|=](?:[fiuc](?:1|2|4|8|16)|b1|V[1-9][0-9]{0,5})")
KINDS = ("kernel", "memset", "memcpy", "empty", "conditional")
BODIES = {"while_loop": 1, "if_then": 1, "if_else": 2}  # how many bodies each has; a switch any number >= 1


def extent(shape: list[int], strides: list[int], itemsize: int) -> int:
    """The bytes an array of ``shape`` and ``strides`` spans from its first element."""
    if any(n == 0 for n in shape):
        return 0
    return itemsize + sum((n - 1) * abs(s) for n, s in zip(shape, strides))


class _Checker:
    """One description's checks; ``bad(where, what)`` is the error naming the file and the place."""

    def __init__(self, doc: dict, src: str):
        self.doc, self.src = doc, src
        self.nodes = 0
        self.sizes: dict[str, int] = {}  # binding -> the bytes it spans
        self.paths: set[tuple] = set()  # the graphs met: the top one, bodies
        self.readers: dict[int, list] = {}  # condition -> the paths of the graphs that read it

    def bad(self, where: str, what: str) -> NbjitGraphError:
        return NbjitGraphError(f"{self.src}: saved graph, {where}: {what}")

    def int_in(self, v: Any, lo: int, hi: int, where: str) -> int:
        if type(v) is not int or not lo <= v <= hi:
            raise self.bad(where, f"{v!r} is not an int from {lo} to {hi}")
        return v

    def ints(self, v: Any, n: int | None, lo: int, hi: int, where: str, most: int = 32) -> list[int]:
        if not isinstance(v, list) or (n is not None and len(v) != n) or len(v) > most:
            raise self.bad(where, f"{v!r} is not a list of {n or f'at most {most}'} ints")
        return [self.int_in(x, lo, hi, where) for x in v]

    def fields(self, d: Any, want: set, where: str) -> dict:
        if not isinstance(d, dict):
            raise self.bad(where, f"an object was expected, not {type(d).__name__}")
        if set(d) != want:
            extra, missing = sorted(set(d) - want), sorted(want - set(d))
            raise self.bad(where, f"fields {sorted(d)}: " + ", ".join(
                ([f"unknown {extra}"] if extra else []) + ([f"missing {missing}"] if missing else [])))
        return d

    # ------------------------------------------------------------ the parts
    def kernels(self) -> None:
        ks = self.doc["kernels"]
        if not isinstance(ks, list) or len(ks) > MAX_NODES:
            raise self.bad("kernels", "not a list")
        for i, k in enumerate(ks):
            self.fields(k, {"image", "name", "label"}, f"kernel {i}")
            for f in ("image", "name", "label"):
                if not isinstance(k[f], str) or not 0 < len(k[f]) <= 4096:
                    raise self.bad(f"kernel {i}", f"{f} {k[f]!r} is not a name")

    def bindings(self) -> None:
        bs = self.doc["bindings"]
        if not isinstance(bs, dict):
            raise self.bad("bindings", "not an object")
        for name, b in bs.items():
            where = f"binding {name!r}"
            if not BINDING_NAME.fullmatch(name):
                raise self.bad(where, "a binding's name is a Python identifier")
            self.fields(b, {"dtype", "shape", "strides"}, where)
            if not isinstance(b["dtype"], str) or not _DTYPE.fullmatch(b["dtype"]):
                raise self.bad(where, f"dtype {b['dtype']!r} is not a numpy type string ('<f4', '|V16', ...)")
            shape = self.ints(b["shape"], None, 0, 1 << 48, where + " shape")
            strides = self.ints(b["strides"], len(shape), 0, 1 << 48, where + " strides")
            self.sizes[name] = extent(shape, strides, int(b["dtype"][2:]))

    def conditions(self) -> None:
        cs = self.doc["conditions"]
        if not isinstance(cs, list) or len(cs) > MAX_NODES:
            raise self.bad("conditions", "not a list")
        for i, c in enumerate(cs):
            self.fields(c, {"default", "reset", "graph"}, f"condition {i}")
            self.int_in(c["default"], 0, (1 << 32) - 1, f"condition {i} default")
            if not isinstance(c["reset"], bool):
                raise self.bad(f"condition {i}", "reset is true or false")
            self.ints(c["graph"], None, 0, MAX_NODES, f"condition {i} graph", most=2 * MAX_DEPTH)

    def ref(self, r: Any, span: int, where: str) -> None:
        """A [binding name, byte offset] pair of a memset or a copy that touches ``span`` bytes."""
        if not (isinstance(r, list) and len(r) == 2 and isinstance(r[0], str)):
            raise self.bad(where, f"{r!r} is not [binding name, byte offset]")
        self.binding_at(r[0], r[1], span, where)

    def binding_at(self, name: str, delta: Any, span: int | None, where: str) -> None:
        """Binding ``name`` at byte ``delta``, ``span`` bytes from there inside it (None: a
        kernel's pointer, which points into it)."""
        if name not in self.doc["bindings"]:
            raise self.bad(where, f"binding {name!r} is not among the graph's bindings {sorted(self.doc['bindings'])}")
        size = self.sizes[name]
        self.int_in(delta, 0, 1 << 48, where + " byte offset")
        if (delta >= max(size, 1)) if span is None else (delta + span > size):
            what = "points" if span is None else f"with {span} bytes from there, reaches"
            raise self.bad(where, f"byte {delta} of binding {name!r} {what} past its {size} bytes")

    def kernel_node(self, n: dict, path: list[int], where: str) -> None:
        self.fields(n, {"kind", "after", "kernel", "grid", "block", "shared", "enabled", "params", "layout", "refs"},
                    where)
        self.int_in(n["kernel"], 0, len(self.doc["kernels"]) - 1, where + " kernel")
        self.ints(n["grid"], 3, 1, (1 << 32) - 1, where + " grid")
        self.ints(n["block"], 3, 1, 1024, where + " block")
        self.int_in(n["shared"], 0, 1 << 24, where + " shared")
        if not isinstance(n["enabled"], bool):
            raise self.bad(where, "enabled is true or false")
        p = n["params"]
        if not isinstance(p, str) or len(p) > 2 * MAX_PARAM_BYTES or len(p) % 2 or not re.fullmatch(r"[0-9a-f]*", p):
            raise self.bad(where, "params is the parameter buffer as lower-case hex")
        size = len(p) // 2
        if not isinstance(n["layout"], list) or len(n["layout"]) > MAX_PARAM_BYTES:
            raise self.bad(where, "layout is a list of [offset, size] pairs")
        for pair in n["layout"]:
            off, sz = self.ints(pair, 2, 0, MAX_PARAM_BYTES, where + " layout")
            if off + sz > size:
                raise self.bad(where, f"parameter at {off} of {sz} bytes runs past the {size}-byte buffer")
        if not isinstance(n["refs"], list):
            raise self.bad(where, "refs is a list")
        for r in n["refs"]:
            if not isinstance(r, list) or len(r) not in (3, 4) or r[1] not in ("binding", "condition"):
                raise self.bad(where, f"ref {r!r} is not [offset, 'binding', name, byte offset] or "
                                      "[offset, 'condition', index]")
            off = self.int_in(r[0], 0, max(0, size - 8), where + " ref offset")
            if off % 8:
                raise self.bad(where, f"ref offset {off} is not a multiple of 8")
            if r[1] == "binding" and len(r) == 4:
                self.binding_at(r[2], r[3], None, where)
            elif r[1] == "condition" and len(r) == 3:
                made = self.doc["conditions"][self.int_in(r[2], 0, len(self.doc["conditions"]) - 1,
                                                          where + " condition")]["graph"]
                if path[:len(made)] != made:
                    raise self.bad(where, f"condition {r[2]} was made in graph {made}, which is neither this node's "
                                          "graph nor one around it")
            else:
                raise self.bad(where, f"ref {r!r} has the wrong number of fields")

    def node(self, n: Any, i: int, path: list[int], depth: int) -> None:
        where = f"node {i} of graph {path}"
        kind = n.get("kind") if isinstance(n, dict) else None
        if kind not in KINDS:
            raise self.bad(where, f"kind {kind!r} is not one of {KINDS}")
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.bad("graph", f"more than {MAX_NODES} nodes")
        after = self.ints(n.get("after"), None, 0, MAX_NODES, where + " after", most=MAX_NODES)
        if any(j >= i for j in after):
            raise self.bad(where, f"it follows nodes {after}: a node follows only nodes before it")
        if kind == "kernel":
            self.kernel_node(n, path, where)
        elif kind == "memset":
            self.fields(n, {"kind", "after", "enabled", "dst", "value", "element_size", "width", "height", "pitch"},
                        where)
            self.int_in(n["value"], 0, (1 << 32) - 1, where + " value")
            if n["element_size"] not in (1, 2, 4):
                raise self.bad(where, "element_size is 1, 2 or 4")
            w, h, pitch = (self.int_in(n[f], 0, 1 << 48, f"{where} {f}") for f in ("width", "height", "pitch"))
            self.ref(n["dst"], (h - 1) * pitch + w * n["element_size"] if w and h else 0, where + " dst")
        elif kind == "memcpy":
            self.fields(n, {"kind", "after", "enabled", "src", "dst", "bytes"}, where)
            nbytes = self.int_in(n["bytes"], 0, 1 << 48, where + " bytes")
            self.ref(n["src"], nbytes, where + " src")
            self.ref(n["dst"], nbytes, where + " dst")
        elif kind == "empty":
            self.fields(n, {"kind", "after"}, where)
        else:
            self.conditional(n, i, path, depth, where)

    def conditional(self, n: dict, i: int, path: list[int], depth: int, where: str) -> None:
        self.fields(n, {"kind", "after", "type", "condition", "bodies"}, where)
        t = n["type"]
        if t not in BODIES and t != "switch":
            raise self.bad(where, f"type {t!r} is not while_loop, if_then, if_else or switch")
        c = self.int_in(n["condition"], 0, len(self.doc["conditions"]) - 1, where + " condition")
        self.readers.setdefault(c, []).append(path)
        bodies = n["bodies"]
        want = BODIES.get(t)
        if not isinstance(bodies, list) or (want is not None and len(bodies) != want) or not bodies:
            raise self.bad(where, f"a {t} has {want or 'at least one'} bodies")
        if depth >= MAX_DEPTH:
            raise self.bad(where, f"conditionals nested more than {MAX_DEPTH} deep")
        for b, body in enumerate(bodies):
            self.graph(body, path + [i, b], depth + 1)

    def graph(self, nodes: Any, path: list[int], depth: int) -> None:
        self.paths.add(tuple(path))
        if not isinstance(nodes, list):
            raise self.bad(f"graph {path}", "not a list of nodes")
        for i, n in enumerate(nodes):
            self.node(n, i, path, depth)


def check_description(doc: Any, src: str) -> dict:
    """``doc`` (graph.json, parsed) checked whole; ``NbjitGraphError`` naming the file and
    the place for anything out of the format (a newer version: upgrade nbjit)."""
    check_format(doc, FORMAT, VERSION, f"{src}: {MEMBER}", "a saved graph's description", NbjitGraphError)
    c = _Checker(doc, src)
    c.fields(doc, {"format", "version", "kernels", "bindings", "conditions", "graph"}, "the description")
    c.kernels()
    c.bindings()
    c.conditions()
    c.graph(doc["graph"], [], 0)
    for i, cond in enumerate(doc["conditions"]):
        if tuple(cond["graph"]) not in c.paths:
            raise c.bad(f"condition {i}", f"made in graph {cond['graph']}, which the graph has not")
        for path in c.readers.get(i, []):
            if path != cond["graph"]:
                raise c.bad(f"condition {i}", f"made in graph {cond['graph']} but read by a conditional node of "
                                              f"graph {path}")
    return doc


def summary(doc: dict) -> dict:
    """What a checked description holds, counted: nodes by kind (conditionals by type, bodies
    included), kernels, bindings (element type and shape), conditions."""
    counts: dict[str, int] = {}

    def count(nodes: list) -> None:
        for n in nodes:
            kind = n["type"] if n["kind"] == "conditional" else n["kind"]
            counts[kind] = counts.get(kind, 0) + 1
            for body in n.get("bodies", ()):
                count(body)

    count(doc["graph"])
    return {"format": doc["format"], "version": doc["version"], "nodes": sum(counts.values()), "by_kind": counts,
            "kernels": [k["label"] for k in doc["kernels"]],
            "bindings": {name: {"dtype": b["dtype"], "shape": b["shape"]} for name, b in doc["bindings"].items()},
            "conditions": len(doc["conditions"])}
