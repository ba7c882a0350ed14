"""A saved graph's description where no GPU is needed: what the format's checks accept and
what they refuse (one clear error each, naming the file and the place), and what
``nbjit.load_graph`` refuses before anything reaches the driver: not a saved graph, a newer
format, a damaged member, a missing, unknown or mismatched binding. The graphs themselves are
saved and loaded on a GPU in test_gpu_graph_saved.py."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import nbjit
from nbjit import BundleError, NbjitGraphError
from nbjit.bundles.build import bundle_bytes
from nbjit.graphs.file_format import MEMBER, check_description, extent

from conftest import DATA  # noqa: E402

CUBIN = DATA / "nvcc" / "kernels_sm_90.cubin"  # nvcc's (tests/data/make_fixtures.py); k_tmpl<int>(int*, int*, int)


def kernel_node(**over) -> dict:
    n = {"kind": "kernel", "after": [], "kernel": 0, "grid": [1, 1, 1], "block": [32, 1, 1], "shared": 0,
         "enabled": True, "params": "00" * 16, "layout": [[0, 8], [8, 4], [12, 4]],
         "refs": [[0, "binding", "x", 0]]}
    n.update(over)
    return n


def doc() -> dict:
    return {"format": "nbjit-graph", "version": 1,
            "kernels": [{"image": "m0", "name": "_Z6k_tmplIiEvPT_S0_i", "label": "k_tmpl<int>"}],
            "bindings": {"x": {"dtype": "<i4", "shape": [64], "strides": [4]}},
            "conditions": [{"default": 1, "reset": True, "graph": []}, {"default": 0, "reset": True, "graph": [1, 0]}],
            "graph": [kernel_node(),
                      {"kind": "conditional", "after": [0], "type": "while_loop", "condition": 0,
                       "bodies": [[kernel_node(refs=[[0, "binding", "x", 4], [8, "condition", 0]]),
                                   {"kind": "memset", "after": [0], "enabled": True, "dst": ["x", 0], "value": 0,
                                    "element_size": 4, "width": 64, "height": 1, "pitch": 0}]]},
                      {"kind": "memcpy", "after": [1], "enabled": True, "src": ["x", 0], "dst": ["x", 128],
                       "bytes": 128},
                      {"kind": "empty", "after": [2]}]}


def test_a_whole_description_is_accepted():
    d = doc()
    assert check_description(d, "g.nbjit") is d
    assert extent([64], [4], 4) == 256 and extent([2, 3], [12, 4], 4) == 24 and extent([0, 3], [12, 4], 4) == 0


def _set(d: dict, path: tuple, value) -> dict:
    d = copy.deepcopy(d)
    at = d
    for k in path[:-1]:
        at = at[k]
    if value is KeyError:
        del at[path[-1]]
    else:
        at[path[-1]] = value
    return d


@pytest.mark.parametrize("path, value, message", [
    (("format",), "nbjit-bundle", "not a saved graph"),
    (("version",), 2, "made by a newer nbjit .format 2; this one reads 1.: upgrade nbjit"),
    (("version",), "1", "format version '1' is not one nbjit writes"),
    (("surprise",), 1, "unknown \\['surprise'\\]"),
    (("kernels", 0, "name"), "", "kernel 0: name '' is not a name"),
    (("bindings", "x y"), {"dtype": "<f4", "shape": [1], "strides": [4]}, "a binding's name is a Python identifier"),
    (("bindings", "x", "dtype"), "object", "dtype 'object' is not a numpy type string"),
    (("bindings", "x", "strides"), [4, 4], "is not a list of 1 ints"),
    (("conditions", 0, "default"), -1, "condition 0 default: -1 is not an int from 0 to 4294967295"),
    (("conditions", 0, "graph"), [1, 0], "made in graph \\[1, 0\\] but read by a conditional node of graph \\[\\]"),
    (("graph", 0, "kind"), "host", "kind 'host' is not one of"),
    (("graph", 0, "after"), [0], "a node follows only nodes before it"),
    (("graph", 0, "kernel"), 1, "node 0 of graph \\[\\] kernel: 1 is not an int from 0 to 0"),
    (("graph", 0, "block"), [2048, 1, 1], "block: 2048 is not an int from 1 to 1024"),
    (("graph", 0, "params"), "0g", "params is the parameter buffer as lower-case hex"),
    (("graph", 0, "layout"), [[12, 8]], "parameter at 12 of 8 bytes runs past the 16-byte buffer"),
    (("graph", 0, "refs"), [[4, "binding", "x", 0]], "ref offset 4 is not a multiple of 8"),
    (("graph", 0, "refs"), [[0, "binding", "y", 0]], "binding 'y' is not among the graph's bindings \\['x'\\]"),
    (("graph", 0, "refs"), [[0, "condition", 3]], "condition: 3 is not an int from 0 to 1"),
    (("graph", 0, "refs"), [[0, "pointer", 3]], "is not \\[offset, 'binding', name, byte offset\\]"),
    (("graph", 1, "type"), "for_loop", "type 'for_loop' is not while_loop, if_then, if_else or switch"),
    (("graph", 1, "bodies"), [[], []], "a while_loop has 1 bodies"),
    (("graph", 1, "bodies", 0, 1, "element_size"), 8, "element_size is 1, 2 or 4"),
    (("graph", 2, "src"), ["x"], "is not \\[binding name, byte offset\\]"),
    (("graph", 3, "after"), KeyError, "is not a list of at most 65536 ints"),
    # every address inside its binding (x: 64 int32, 256 bytes), and what a copy or memset touches
    (("graph", 0, "refs"), [[0, "binding", "x", 256]], "byte 256 of binding 'x' points past its 256 bytes"),
    (("graph", 0, "refs"), [[0, "binding", "x", -4]], "byte offset: -4 is not an int from 0"),
    (("graph", 2, "bytes"), 129, "byte 128 of binding 'x' with 129 bytes from there, reaches past its 256 bytes"),
    (("graph", 1, "bodies", 0, 1, "width"), 65, "byte 0 of binding 'x' with 260 bytes from there, reaches past"),
    (("bindings", "x", "strides"), [-4], "strides: -4 is not an int from 0"),
    (("conditions", 1, "graph"), [3, 0], "condition 1: made in graph \\[3, 0\\], which the graph has not"),
    # a kernel inside the loop's body may set the loop's condition; one around it may not set a body's
    (("graph", 0, "refs"), [[0, "binding", "x", 0], [8, "condition", 1]],
     "condition 1 was made in graph \\[1, 0\\], which is neither this node's graph nor one around it"),
])
def test_what_the_checks_refuse(path, value, message):
    with pytest.raises(NbjitGraphError, match=message) as e:
        check_description(_set(doc(), path, value), "g.nbjit")
    assert str(e.value).startswith("g.nbjit")


def test_nesting_is_bounded():
    d = doc()
    inner = d["graph"][1]
    for _ in range(20):
        inner = {"kind": "conditional", "after": [], "type": "if_then", "condition": 0, "bodies": [[inner]]}
    d["graph"] = [inner]
    d["conditions"][0]["graph"] = []
    with pytest.raises(NbjitGraphError, match="nested more than 16 deep"):
        check_description(d, "g.nbjit")


class FakeArray:
    """A device array as far as its interface goes (no GPU: nothing reads its memory)."""

    def __init__(self, dtype: str, shape: tuple, ptr: int = 1 << 40):
        self.__cuda_array_interface__ = {"typestr": np.dtype(dtype).str, "shape": shape, "strides": None,
                                         "data": (ptr, False), "version": 3}


def saved(tmp_path, d: dict | None = None, name: str = "g.nbjit"):
    raw = json.dumps(doc() if d is None else d).encode()
    data, _ = bundle_bytes({"m0": nbjit.Image(CUBIN.read_bytes(), "cubin")}, members=[(MEMBER, raw)])
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_load_graph_refuses_before_the_driver(tmp_path):
    path = saved(tmp_path)
    with pytest.raises(NbjitGraphError, match=r"bindings \['x'\] are missing"):
        nbjit.load_graph(path)
    with pytest.raises(NbjitGraphError, match=r"it has no bindings \['y'\]"):
        nbjit.load_graph(path, bindings={"x": FakeArray("i4", (64,)), "y": FakeArray("i4", (64,))})
    with pytest.raises(NbjitGraphError, match=r"binding 'x' takes an int32 array of shape \(64,\), strides \(4,\); "
                                              r"got a float32 array of shape \(64,\)"):
        nbjit.load_graph(path, bindings={"x": FakeArray("f4", (64,))})
    with pytest.raises(NbjitGraphError, match="g.nbjit: binding 'x': a list is not a device array"):
        nbjit.load_graph(path, bindings={"x": [1, 2]})
    with pytest.raises(NbjitGraphError, match="bindings is a dict {name: device array}, not str"):
        nbjit.load_graph(path, bindings="x")
    backwards = FakeArray("i4", (64,))
    backwards.__cuda_array_interface__["strides"] = (-4,)
    with pytest.raises(NbjitGraphError, match=r"binding 'x': strides \(-4,\) run backwards"):
        nbjit.load_graph(path, bindings={"x": backwards})
    newer = saved(tmp_path, {**doc(), "version": 9}, "newer.nbjit")
    with pytest.raises(NbjitGraphError, match="upgrade nbjit"):
        nbjit.load_graph(newer, bindings={"x": FakeArray("i4", (64,))})


def test_a_bundle_is_not_a_saved_graph_and_damage_is_named(tmp_path):
    data, _ = bundle_bytes({"m0": nbjit.Image(CUBIN.read_bytes(), "cubin")})
    with pytest.raises(NbjitGraphError, match="a bundle of kernels, not a saved graph"):
        nbjit.load_graph(data)
    good = saved(tmp_path).read_bytes()
    at = good.rfind(b'"format": "nbjit-graph"')
    bad = good[:at] + good[at:].replace(b"nbjit-graph", b"nbjit-grapH", 1)
    with pytest.raises(BundleError, match="member 'graph.json' is damaged: bad CRC-32"):
        nbjit.load_graph(bad, bindings={"x": FakeArray("i4", (64,))})
    with pytest.raises(BundleError, match="not an nbjit bundle"):
        nbjit.load_graph(b"not a zip at all")


def test_nbjit_inspect_says_a_file_is_a_saved_graph(tmp_path, capsys):
    from nbjit.cli import main as cli
    path = saved(tmp_path)
    assert cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    said = "a saved graph (format 1): 6 nodes (2 kernel, 1 while_loop, 1 memset, 1 memcpy, 1 empty), 2 conditions"
    assert said in out
    assert "bindings: x <i4[64]" in out
    assert cli.main(["inspect", str(path), "--json"]) == 0
    graph = json.loads(capsys.readouterr().out)["graph"]
    assert graph["nodes"] == 6 and graph["kernels"] == ["k_tmpl<int>"] and graph["conditions"] == 2
    newer = saved(tmp_path, {**doc(), "version": 2}, "newer.nbjit")
    assert cli.main(["inspect", str(newer)]) != 0
    assert "made by a newer nbjit (format 2; this one reads 1): upgrade nbjit" in capsys.readouterr().err
