"""The module stage without a GPU: lazy modules and kernels, and pickling them (plain pickle
and cloudpickle) as data. Loading them on first use is tested on the GPU (test_process.py)."""
from __future__ import annotations

import pickle
import re
import zlib

import cloudpickle
import pytest

import nbjit
from nbjit import _driver, inspect_ptx, module as module_stage
from nbjit.triton import TritonKernel, describe, read_triton

FILL = r'''template <typename T> __global__ void fill(T* out, T v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v;
}
extern "C" __global__ void scale(float* y, float a, int n) { if (threadIdx.x < n) y[threadIdx.x] *= a; }
'''


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    """Everything here must work without a CUDA call: fail loudly if one is made."""
    def refuse(*a, **k):
        raise AssertionError("a CUDA call was made")
    monkeypatch.setattr(_driver, "current_context", refuse)
    monkeypatch.setattr(_driver, "get_function", refuse)
    module_stage._RESTORED.clear()


@pytest.fixture
def ptx_module(data):
    return nbjit.load(data / "nvcc/kernels_sm90.ptx", lazy=True)


@pytest.mark.parametrize("dumps, loads", [(pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)],
                         ids=["pickle", "cloudpickle"])
def test_kernel_and_module_round_trip(ptx_module, dumps, loads):
    k = ptx_module["k_basic"]
    assert "loads on first use" in repr(k) and "loads on first use" in repr(ptx_module)
    k2 = loads(dumps(k))
    assert isinstance(k2, nbjit.Kernel) and isinstance(k2.module, nbjit.Module)
    assert k2._recipe == ("k_basic", None, ())
    assert k2.module.image.data == ptx_module.image.data and k2.module.name == ptx_module.name
    assert k2.module.kernels == ptx_module.kernels
    m2 = loads(dumps(ptx_module))
    assert m2 is k2.module  # the same bytes unpickled again: one module in this process
    assert loads(dumps(k2))._recipe == k2._recipe


def test_compiled_module_keeps_name_expressions_and_declarations():
    m = nbjit.compile(FILL, name_expressions=["fill<float>"], arch="sm_90", lazy=True)
    k = m["fill<float>"]
    real = m.image.lowered_names["fill<float>"]
    assert k._recipe[0] == real and real.startswith("_Z")
    m2 = pickle.loads(pickle.dumps(m))
    assert m2["fill<float>"]._recipe[0] == real
    assert m2.image.declarations == m.image.declarations and "scale" in m2.image.declarations
    # a declared signature travels with its kernel
    k3 = pickle.loads(pickle.dumps(m.get_kernel("scale", signature="float*, float, int")))
    assert k3._recipe == ("scale", "float*, float, int", ())


def test_a_module_is_shipped_once_per_pickle_and_compressed_once(ptx_module, monkeypatch):
    calls = []
    real = zlib.compress
    monkeypatch.setattr(zlib, "compress", lambda *a: calls.append(1) or real(*a))
    one = pickle.dumps(ptx_module["k_basic"])
    many = pickle.dumps([ptx_module[n] for n in ptx_module.kernels for _ in range(100)])  # 1,100 kernels
    blob = ptx_module._wire()[6]
    assert one.count(blob) == 1 and many.count(blob) == 1
    assert len(many) < len(one) + 40 * 1100, (len(one), len(many))  # a name and references each
    assert len(one) < len(ptx_module.image.data) / 2  # compressed
    for _ in range(5):
        pickle.dumps(ptx_module)
    assert len(calls) == 1


def test_unpickling_later_pickles_adds_facts():
    m = nbjit.compile(FILL, name_expressions=["fill<float>"], arch="sm_90", lazy=True)
    first = pickle.loads(pickle.dumps(m))
    with pytest.raises(nbjit.KernelNotFoundError):
        first["fill_f"]
    img = m.image
    real = img.lowered_names["fill<float>"]
    more = nbjit.load(nbjit.Image(img.data, img.kind, img.name, img.arch, {"fill_f": real}), lazy=True)
    second = pickle.loads(pickle.dumps(more))
    assert second is first
    assert first["fill_f"]._recipe[0] == first["fill<float>"]._recipe[0] == real


def test_damaged_or_foreign_pickles_are_load_errors(ptx_module):
    wire = ptx_module._wire()
    sha, size, blob = wire[4:7]
    bad = wire[:6] + (zlib.compress(b"not the module"),) + wire[7:]
    with pytest.raises(nbjit.NbjitLoadError, match="SHA-256"):
        module_stage._restore_module(bad)
    with pytest.raises(nbjit.NbjitLoadError, match="format 99"):
        module_stage._restore_module((99,) + wire[1:])
    with pytest.raises(nbjit.NbjitLoadError, match="format"):
        module_stage._restore_module("junk")


def test_lazy_kernel_names_are_checked_without_a_gpu(ptx_module, data):
    with pytest.raises(nbjit.KernelNotFoundError, match="k_basic"):
        ptx_module["k_basik"]
    assert "_Z9k_mangledPi" in ptx_module
    cubin = nbjit.load(data / "nvcc/kernels_sm_90.cubin", lazy=True)
    assert "k_basic" in cubin.kernels
    fatbin = nbjit.load(data / "nvcc/kernels_multi.fatbin", lazy=True)
    assert fatbin.kernels and fatbin.kernels[0] in fatbin
    assert pickle.loads(pickle.dumps(fatbin)).image.kind == "fatbin"


def test_first_use_of_a_lazy_kernel_loads_it(ptx_module, monkeypatch):
    k = pickle.loads(pickle.dumps(ptx_module["k_basic"]))
    monkeypatch.setattr(_driver, "current_context", lambda: (_ for _ in ()).throw(nbjit.NbjitLoadError("no GPU")))
    for use in (lambda: k[1, 32], lambda: k.module.get_global("g"), lambda: k.module.route):
        with pytest.raises(nbjit.NbjitLoadError, match="no GPU"):
            use()
    assert "loads on first use" in repr(k)
    assert [p.type for p in k.params] == [p.type for p in inspect_ptx(ptx_module.image.data).entries[0].params]
    assert "loads on first use" in repr(k)  # describing it loaded nothing


@pytest.mark.parametrize("path,kernel", [("nvcc/kernels_sm90.ptx", "k_basic"), ("nvcc/kernels_sm_90.cubin", "k_basic"),
                                         ("nvcc/kernels_multi.fatbin", "k_basic")])
def test_a_lazy_kernel_describes_itself_without_a_gpu(data, monkeypatch, path, kernel):
    """A lazy kernel on a machine without a GPU shows its signature from the image (it asked
    for a device), and a declared signature that does not fit the image is refused at once
    (it was accepted, to fail at first use on the GPU)."""
    monkeypatch.setattr(_driver, "current_context", lambda: (_ for _ in ()).throw(nbjit.NbjitLoadError("no GPU")))
    m = nbjit.load(data / path, lazy=True)
    k = m[kernel]
    assert k.name == kernel and [(p.offset, p.size) for p in k.params] == [(0, 8), (8, 8), (16, 4), (20, 4)]
    assert k.signature.size == 24 and k.info.name == kernel
    typed = m.get_kernel(kernel, signature="float*, const float*, float, int")
    assert [p.ctype for p in typed.params][:3] == ["float*", "const float*", "float"]
    for bad in ("float*, const float*, float", "float*, const float*, double, int", "f32, f32, f32, i32"):
        with pytest.raises(nbjit.NbjitArgumentError, match="signature"):
            m.get_kernel(kernel, signature=bad)
    assert "loads on first use" in repr(m)


def test_triton_kernel_round_trip(data):
    path = data / "triton/add_kernel"
    art = read_triton(path)
    k = nbjit.load(art.cubin, lazy=True)[art.meta.name]
    tk = TritonKernel(k, art.meta, "cubin", describe(path)["launch"])
    tk2 = cloudpickle.loads(cloudpickle.dumps(tk))
    assert tk2.meta == tk.meta and tk2.rules == tk.rules and tk2.route == "cubin"
    assert tk2.kernel._recipe == k._recipe and tk2._n == tk._n
    assert tk2.kernel.module.image.data == k.module.image.data


@pytest.mark.parametrize("kwargs", [{"lazy": "no"}, {"keep_debug": "yes"}, {"lazy": 2}, {"keep_debug": None}])
def test_yes_no_arguments_take_only_yes_or_no(kwargs):
    """lazy="no" would have been taken as yes (and keep_debug="yes" made a second module)."""
    from conftest import DATA
    what, value = next(iter(kwargs.items()))
    with pytest.raises(nbjit.NbjitLoadError, match=f"{what} must be True or False, not {value!r}"):
        nbjit.load(DATA / "nvcc/kernels_sm90.ptx", **kwargs)
    with pytest.raises(nbjit.NbjitCompileError, match=f"{what} must be True or False, not {value!r}"):
        nbjit.compile('extern "C" __global__ void k() {}', arch="sm_90", **kwargs)
    m = nbjit.load(DATA / "nvcc/kernels_sm90.ptx", lazy=1, keep_debug=0)  # 1 and 0 are yes and no
    assert "loads on first use" in repr(m)
    import numpy as np
    assert "loads on first use" in repr(nbjit.load(DATA / "nvcc/kernels_sm90.ptx", lazy=np.True_))


def test_kernels_found_by_their_demangled_names():
    """module["fill<float>"] without name expressions, module["ns::op(double)"]: a kernel by
    its C++ name (the demangled name, or its start up to the template or parameter list,
    where one kernel fits), not only by the mangled one."""
    src = ("template <class T> __global__ void fill(T* p, int n) { p[0] = n; }\n"
           "template __global__ void fill<float>(float*, int);\ntemplate __global__ void fill<int>(int*, int);\n"
           "__global__ void fill_rows(float* p) {}\nnamespace ns { __global__ void op(double x) {} }\n")
    m = nbjit.compile(src, arch="sm_90", lazy=True)
    for name, real in (("fill<float>(float*, int)", "_Z4fillIfEvPT_i"), ("void fill<float>(float *, int)",
                       "_Z4fillIfEvPT_i"), ("fill<int>", "_Z4fillIiEvPT_i"), ("fill_rows", "_Z9fill_rowsPf"),
                       ("ns::op", "_ZN2ns2opEd"), ("ns::op(double)", "_ZN2ns2opEd")):
        assert m[name].name == real and name in m
    with pytest.raises(nbjit.KernelNotFoundError, match=r"'fill' could be any of 2 kernels in kernel.cu: "
                       r"void fill<\w+>\(\w+\*, int\); void fill"):
        m["fill"]
    for name in ("fil", "ns", "fill<double>"):
        with pytest.raises(nbjit.KernelNotFoundError, match=re.escape("_Z9fill_rowsPf (fill_rows(float*))")):
            m[name]


def test_the_path_endings_are_the_compilers_source_suffixes():
    """nbjit.compile tells a path from source text by its last letter before importing the
    compiler (loading a bundle or a cubin never imports it): the letters are its suffixes'."""
    from nbjit.compiler import SOURCE_SUFFIXES
    want = {s[-1] for s in SOURCE_SUFFIXES} | {s[-1].upper() for s in SOURCE_SUFFIXES}
    assert module_stage._PATH_ENDS == want
