"""compile_many: independent sources compiled at once, through the cache, in order."""
from __future__ import annotations

import threading

import pytest

import nbjit
from nbjit import CompileFailure, NbjitCompileError
from nbjit.compiler import compile_image, compile_many

from conftest import DATA  # noqa: E402


def src(i: int) -> str:
    return f'extern "C" __global__ void k{i}(float* o) {{ o[threadIdx.x] = {i}.0f; }}\n'


def test_images_in_order_through_the_cache():
    images = compile_many([src(i) for i in range(6)], arch="sm_90", workers=3)
    assert [img.info.entries[0].name for img in images] == [f"k{i}" for i in range(6)]
    assert all(img.kind == "cubin" and img.arch == "sm_90" for img in images)
    # the same entries compile_image finds afterwards (the same cache keys)
    again = compile_image(src(4), arch="sm_90")
    assert again.data == images[4].data


def test_items_are_sources_paths_or_argument_dicts():
    tmpl = (DATA / "src/nvrtc_tmpl.cu").read_text()
    hdr = {"scale.cuh": (DATA / "src/scale.cuh").read_text()}
    images = compile_many([src(0), DATA / "src/spill.cu",
                           {"source": tmpl, "name": "tmpl.cu", "headers": hdr, "name_expressions": ["fill<float>"]}],
                          arch="sm_80")
    assert images[1].name == "spill.cu" and {e.name for e in images[1].info.entries} >= {"spills", "tiled"}
    assert "fill<float>" in images[2].lowered_names and images[2].name == "tmpl.cu"
    assert all(img.arch == "sm_80" for img in images)
    assert compile_many([], arch="sm_90") == []


def test_runs_in_threads():
    seen = set()

    class Spy(str):  # a source whose encoding records the thread compiling it
        def encode(self, *a, **k):
            seen.add(threading.current_thread().name)
            return str.encode(self, *a, **k)

    compile_many([Spy(src(10 + i)) for i in range(4)], arch="sm_90", workers=2)
    assert seen and all(n.startswith("nbjit-compile") for n in seen)


def test_errors_name_the_source_that_failed():
    with pytest.raises(NbjitCompileError, match=r"source 1 \(bad\.cu\) failed \(and 1 more: items 2\): bad\.cu: "
                                                r"NVRTC") as e:
        compile_many([src(20), {"source": "not C++ at all", "name": "bad.cu"}, "also bad"], arch="sm_90")
    assert isinstance(e.value.__cause__, CompileFailure)
    with pytest.raises(NbjitCompileError, match="item 0 is a dict without 'source'"):
        compile_many([{"name": "x.cu"}], arch="sm_90")
    with pytest.raises(NbjitCompileError, match="workers must be an int >= 1, not 0"):
        compile_many([src(0)], arch="sm_90", workers=0)


def test_modules_lazily_without_a_gpu():
    mods = nbjit.compile_many([src(30), src(31)], arch="sm_90", lazy=True)
    assert [m.kernels for m in mods] == [("k30",), ("k31",)]
