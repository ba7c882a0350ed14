"""The module stage without a GPU: lazy modules and kernels, and pickling them (plain pickle
and cloudpickle) as data. Loading them on first use is tested on the GPU (test_process.py)."""
from __future__ import annotations

import pickle
import re
import zlib

import cloudpickle
import pytest

import nbjit
from nbjit import inspect_ptx
from nbjit.loading import module as module_stage
from nbjit.gpu import driver as _driver
from nbjit.toolchain import nvrtc as compiler_stage
from nbjit.gpu.host import current_host
from nbjit.loading.triton import TritonKernel, describe, read_triton

FILL = r'''template <typename T> __global__ void fill(T* out, T v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v;
}
extern "C" __global__ void scale(float* y, float a, int n) { if (threadIdx.x < n) y[threadIdx.x] *= a; }
'''


AXPY = 'extern "C" __global__ void axpy(float* y, const float* x, float a, int n) { y[n] += a * x[n]; }\n'
_REAL_CURRENT_CONTEXT = current_host().current_context  # (refused below; one test needs it to fail as it does here)


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    """Everything here must work without a CUDA call: fail loudly if one is made."""
    def refuse(*a, **k):
        raise AssertionError("a CUDA call was made")
    monkeypatch.setattr(current_host(), "current_context", refuse)
    monkeypatch.setattr(_driver, "get_function", refuse)
    module_stage._RESTORED.clear()


def no_gpu():
    raise nbjit.NbjitLoadError("no GPU")


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
    # iterating a module gives its kernels' names (not module[0], module[1]...), loading nothing
    assert list(ptx_module) == list(ptx_module.kernels) and "_Z9k_mangledPi" in list(ptx_module)
    assert [name for name in fatbin] == list(fatbin.kernels) and not fatbin.loaded
    assert pickle.loads(pickle.dumps(fatbin)).image.kind == "fatbin"


def test_first_use_of_a_lazy_kernel_loads_it(ptx_module, monkeypatch):
    k = pickle.loads(pickle.dumps(ptx_module["k_basic"]))
    monkeypatch.setattr(current_host(), "current_context", no_gpu)
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
    monkeypatch.setattr(current_host(), "current_context", no_gpu)
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


def test_a_signature_is_text_or_a_list_of_types(data, monkeypatch):
    """A signature given as a list or tuple of C types declares the same as the text (a list
    raised "unhashable type", a tuple or a number an AttributeError from deep inside)."""
    monkeypatch.setattr(current_host(), "current_context", no_gpu)
    m = nbjit.load(data / "nvcc/kernels_sm_90.cubin", lazy=True)
    want = [p.ctype for p in m.get_kernel("k_basic", signature="float*, const float*, float, int").params]
    for given in (["float*", "const float*", "float", "int"], ("ptr", "ptr", "f32", "i32")):
        assert [p.ctype is not None for p in m.get_kernel("k_basic", signature=given).params] == [True] * 4
    assert [p.ctype for p in m.get_kernel("k_basic", signature=["float*", "const float*", "float", "int"]).params] \
        == want
    import numpy as np
    for given in (np.str_("float*, const float*, float, int"), [np.str_(t) for t in ("float*", "const float*", "float",
                                                                                      "int")]):
        assert [p.ctype for p in m.get_kernel("k_basic", signature=given).params] == want
    for bad in (42, ("float*, const float*", "float", "int"), [b"float*"], {"y": "float*"}, []):
        with pytest.raises(nbjit.NbjitArgumentError, match="signature for 'k_basic': C types as text"):
            m.get_kernel("k_basic", signature=bad)
    with pytest.raises(nbjit.NbjitArgumentError, match="one type each, not an empty list$"):
        m.get_kernel("k_basic", signature=[])


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


def test_compiling_for_a_named_architecture_needs_no_gpu_until_a_kernel_is_used(tmp_path, monkeypatch):
    """nbjit.compile(src, arch="sm_90") on a machine without a GPU compiled, then failed
    asking for an explicit arch (which it had): the module now loads on first use."""
    from conftest import gpu_available
    if gpu_available()[0]:
        pytest.skip("a GPU is present: the module loads at once")
    monkeypatch.setattr(current_host(), "current_context", _REAL_CURRENT_CONTEXT)  # the real one: no GPU here
    cache = nbjit.Cache(tmp_path)
    mod = nbjit.compile(AXPY, arch="sm_90", cache=cache)
    assert "loads on first use" in repr(mod) and mod.kernels == ("axpy",) and mod.image.arch == "sm_90"
    k = mod["axpy"]
    assert [p.ctype for p in k.params] == ["float*", "const float*", "float", "int"]
    assert pickle.loads(pickle.dumps(k))._recipe == k._recipe
    (many,) = nbjit.compile_many([AXPY], arch="sm_90", cache=cache)
    assert "loads on first use" in repr(many) and many.image.data == mod.image.data
    with pytest.raises(nbjit.NbjitLoadError, match="no usable CUDA GPU"):
        k[1, 32]  # first use: loading needs the GPU
    for call in (lambda: nbjit.compile(AXPY, cache=cache), lambda: nbjit.compile_many([AXPY], cache=cache)):
        with pytest.raises(nbjit.NbjitLoadError, match="arch="):  # the device is the target: it is needed now
            call()


def test_a_repeated_compile_is_one_look_up_per_context(tmp_path, fake_device, monkeypatch, counted):
    """The module a call made is remembered in its cache's memo of calls, per context and
    weakly; the image it compiled, whatever the context."""
    import gc
    import types
    calls = []
    from nbjit.loading import compiling
    real = compiling._compile_image  # (the compiler's compile_image, as the compile route calls it)
    monkeypatch.setattr(compiling, "_compile_image", lambda *a, **k: calls.append(k["arch"]) or real(*a, **k))
    cache = nbjit.Cache(tmp_path)
    first = nbjit.compile(AXPY, cache=cache)  # for the context's device
    assert nbjit.compile(AXPY, cache=cache) is first and len(calls) == 1 and str(calls[0]) == "sm_90"
    assert first.image.arch == "sm_90"
    other = types.SimpleNamespace(device=types.SimpleNamespace(id=1, compute_capability=(9, 0)), handle=8)
    monkeypatch.setattr(current_host(), "current_context", lambda: other)
    monkeypatch.setattr(_driver, "current_context_key", lambda: 8)
    second = nbjit.compile(AXPY, cache=cache)
    assert second is not first and second.device == 1 and len(calls) == 2 and len(counted) == 1
    assert nbjit.compile(AXPY, cache=cache) is second and len(calls) == 2
    del second
    gc.collect()
    assert nbjit.compile(AXPY, cache=cache) is not None and len(calls) == 3  # gone: made again (not compiled)
    assert len(counted) == 1
    assert nbjit.compile(AXPY, cache=nbjit.Cache(tmp_path)).device == 1 and len(calls) == 4  # another cache's memo


def test_repeated_calls_import_nothing(tmp_path, fake_device, data):
    """The calls a program repeats (a compile found in the memo, a cubin loaded again and its
    kernel made, a kernel declared by a signature) run none of importlib's code: an import
    statement in a function does on every call (~1 us each on CPython 3.11, half of a
    repeated ``nbjit.compile``): the modules those paths need only sometimes are imported by
    absolute name in the function, which finds them in ``sys.modules`` without it."""
    import sys
    cache = nbjit.Cache(tmp_path)
    raw = (data / "nvcc" / "kernels_sm_90.cubin").read_bytes()
    calls = {
        "compile": lambda: nbjit.compile(AXPY, cache=cache)["axpy"],
        "compile, options": lambda: nbjit.compile(AXPY, cache=cache, options=["-DN=1"], name_expressions=[]),
        "load": lambda: nbjit.load(raw)["k_basic"],
        "signature": lambda: nbjit.load(raw).get_kernel("k_basic", "float*, const float*, float, int"),
    }
    kept = []
    for name, call in calls.items():
        kept.append(call())  # (kept alive: the memo and the registry of loaded modules hold it weakly)
        seen = []

        def watch(frame, event, arg, seen=seen):
            if event == "call" and "importlib" in frame.f_code.co_filename:
                seen.append(frame.f_code.co_name)
        sys.setprofile(watch)
        try:
            call()
        finally:
            sys.setprofile(None)
        assert seen == [], name


# ------------------------------------------------------------ first use, on a stand-in driver

@pytest.fixture
def fake_gpu(monkeypatch):
    """Loading without a GPU (a context, module and functions that are only numbers): what
    first use does is driven here; launching is tested on the GPU. ``loads`` counts the
    modules handed to the driver."""
    import threading
    import types

    ctx = types.SimpleNamespace(device=types.SimpleNamespace(id=0, compute_capability=(9, 0)), handle=7)
    loads, unloads = [], []
    lock = threading.Lock()

    def load_module(data, what, kind):
        with lock:
            loads.append(what)
        return _driver.Loaded(100 + len(loads), "")

    monkeypatch.setattr(current_host(), "current_context", lambda: ctx)
    monkeypatch.setattr(_driver, "current_context_key", lambda: 7)
    monkeypatch.setattr(_driver, "driver_version", lambda: 13000)
    monkeypatch.setattr(_driver, "load_module", load_module)
    monkeypatch.setattr(_driver, "unload_module", unloads.append)
    functions: dict = {}  # (module, kernel name) -> the function's number
    monkeypatch.setattr(_driver, "get_function", lambda handle, name: functions.setdefault((handle, name),
                                                                                          1000 + len(functions)))
    monkeypatch.setattr(_driver, "param_info", lambda func: None)
    monkeypatch.setattr("nbjit.launch.launchers._MULTI", [False])
    return types.SimpleNamespace(ctx=ctx, loads=loads, unloads=unloads, functions=functions)


def test_a_lazy_module_is_its_recipe_until_first_use(ptx_module, fake_gpu):
    """Waiting for first use, a module answers from its image (names, kernels, their
    parameters) and loads nothing; the first use that needs the GPU loads it once."""
    m = ptx_module
    k = m["k_basic"]
    assert not m.loaded and k._s is None and m.kernels and [p.size for p in k.params] == [8, 8, 4, 4]
    m.close()  # nothing loaded: nothing to unload (and nothing loaded to do it)
    assert fake_gpu.loads == [] and "loads on first use" in repr(m) and "loads on first use" in repr(k)
    assert k.handle == fake_gpu.functions[(101, "k_basic")]  # first use
    assert m.loaded and len(fake_gpu.loads) == 1 and m.device == 0 and m.prepared_kind == "ptx"
    assert k._s is m["k_basic"]._s and k._configs is k._s.launchers
    assert "on device 0" in repr(m) and "loads on first use" not in repr(k)
    m.close()
    assert fake_gpu.unloads == [101]


def test_a_lazy_module_shares_the_copy_loaded_from_the_same_bytes(data, fake_gpu):
    """On first use, a lazy (or unpickled) module shares the module loaded from the same bytes
    in that context: one handle, one state per kernel; the facts either knew are both's."""
    img = nbjit.as_image(data / "nvcc/kernels_sm90.ptx")
    loaded = nbjit.load(img)
    lazy = nbjit.load(nbjit.Image(img.data, img.kind, img.name, img.arch, {"basic": "k_basic"}), lazy=True)
    assert "basic" not in loaded and "basic" in lazy
    k = lazy["basic"]
    assert k.name == "k_basic" and k._s is None
    assert k.handle == fake_gpu.functions[(101, "k_basic")]  # first use: the function of the copy loaded already
    assert len(fake_gpu.loads) == 1 and lazy._live is loaded._live and lazy._owner is loaded
    assert k._s is loaded["k_basic"]._s
    assert "basic" in loaded and loaded["basic"]._s is k._s  # the lazy module's name expression joined
    back = pickle.loads(pickle.dumps(lazy))
    assert not back.loaded and back["basic"].name == "k_basic"  # a pickle is the recipe, never the handle
    assert back["basic"].handle == fake_gpu.functions[(101, "k_basic")]
    assert back._live is loaded._live and len(fake_gpu.loads) == 1


def test_first_use_from_many_threads_loads_once(ptx_module, fake_gpu):
    import threading

    m = pickle.loads(pickle.dumps(ptx_module))
    ks = [m["k_basic"] for _ in range(8)]
    start = threading.Barrier(len(ks))
    got = []

    def use(k):
        start.wait()
        got.append(k._loaded())
    threads = [threading.Thread(target=use, args=(k,)) for k in ks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake_gpu.loads) == 1 and len({id(s) for s in got}) == 1 and m.loaded


def test_a_compile_keeps_its_ptxas_report_where_its_bytes_were_loaded_already(data, tmp_path, fake_gpu, monkeypatch):
    """nbjit.compile(..., options=["-Xptxas=-v"]) for the context's device gives a module whose
    image is the compile's (its log, ptxas's report, the kernels' spill bytes), also where the
    same bytes were loaded in this context before without them (as a file, such as
    tests/data/nvrtc/spill_sm90.cubin: NVRTC's -v output, byte for byte): it shares that module's
    loaded copy (one load), and that module still says what its own image says. (On the GPU a
    module from that file, still alive, was given back instead: no log, no report.)"""
    said = dict(registers=32, shared=0, const=0, local=0, max_threads_per_block=1024, ptx_version=90,
                binary_version=90, max_dynamic_shared=0)
    monkeypatch.setattr(_driver, "function_attributes", lambda func: said)
    src = data / "src/spill.cu"
    made = compiler_stage.compile_image(src, arch="sm_90", options=["-Xptxas=-v"], cache=nbjit.Cache(tmp_path))
    assert made.resources["spills"]["spill_stores"] > 0 and made.log
    plain = nbjit.load(made.data, name="spill_sm90.cubin")  # the same bytes as a file gives them
    assert plain.image.resources == {} and not plain.image.log
    assert plain["spills"].attributes.spill_stores is None  # (the driver's numbers read first, through it)
    for cache in (nbjit.Cache(tmp_path), nbjit.Cache(tmp_path)):  # a hit in a fresh cache object, twice
        m = nbjit.compile(src, options=["-Xptxas=-v"], cache=cache)  # for the device: (9, 0)
        assert m is not plain and m.image.name == "spill.cu" and m.image.log and m.image.arch == "sm_90"
        told = m.image.resources["spills"]
        a = m["spills"].attributes
        assert (a.spill_stores, a.spill_loads, a.frame) == (told["spill_stores"], told["spill_loads"],
                                                            told["stack_frame"])
        assert a.spill_stores > 0 and a.registers == 32
        assert m._live is plain._live and m["spills"]._s is plain["spills"]._s and len(fake_gpu.loads) == 1
    assert nbjit.load(made.data) is plain and plain["spills"].attributes.spill_stores is None
    again = nbjit.load(made)  # the compiled image itself: a module of it, sharing the same copy
    assert again._live is plain._live and again.image.resources == made.resources


def test_new_facts_type_a_kernel_afresh(ptx_module, fake_gpu):
    """A declaration learned after a kernel was typed (the same bytes loaded again with
    more facts) types it afresh, loaded or not."""
    m = ptx_module
    assert [p.ctype for p in m["k_basic"].params][2] != "float"
    from nbjit.params.declarations import source_declarations
    src = 'extern "C" __global__ void k_basic(float* y, const float* x, float a, int n) {}'
    m._learn(decls={k: ("source", v) for k, v in source_declarations(src).items()})
    assert [p.ctype for p in m["k_basic"].params][:3] == ["float*", "const float*", "float"]
    k = m["k_basic"]
    assert k.handle == fake_gpu.functions[(101, "k_basic")] and k._s is not None  # loaded: typed by the same facts
    assert [p.ctype for p in k.params][:3] == ["float*", "const float*", "float"]


def test_the_path_endings_are_the_compilers_source_suffixes():
    """nbjit.compile tells a path from source text by its last letter before importing the
    compiler (loading a bundle or a cubin never imports it): the letters are its suffixes'."""
    from nbjit.toolchain.request import SOURCE_SUFFIXES
    want = {s[-1] for s in SOURCE_SUFFIXES} | {s[-1].upper() for s in SOURCE_SUFFIXES}
    from nbjit.loading.compiling import _PATH_ENDS
    assert _PATH_ENDS == want


def test_a_missing_kernel_is_named_with_a_guess_and_the_sorted_list(data):
    m = nbjit.load(data / "nvcc/kernels_sm90.ptx", lazy=True)
    with pytest.raises(nbjit.KernelNotFoundError) as e:
        m["k_basc"]
    msg = str(e.value)
    assert "no kernel 'k_basc'" in msg and "did you mean 'k_basic'? It has: " in msg and "?." not in msg
    listed = msg.split("It has: ")[1]
    at = [listed.index(k) for k in sorted(m.kernels)]  # every kernel, in sorted order
    assert at == sorted(at) and len(m.kernels) > 3
    with pytest.raises(nbjit.KernelNotFoundError) as e:
        m["zzzz"]
    assert "did you mean" not in str(e.value)
