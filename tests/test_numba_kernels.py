"""@cuda.jit kernels compiled for a chip without a GPU (nbjit.toolchain.numba_kernels) and shipped in
bundles (nbjit.build_bundle, nbjit bundle MODULE:FUNCTION:SIGNATURE), by numba-cuda and by
numba-cuda-mlir (each where installed: the CI's main leg has the first, its mlir leg the second).
The kernels are tests/data/numba_src/bundle_kernels.py; tests/test_gpu_bare.py launches them."""
from __future__ import annotations

import importlib
import json
import os
import pickle
import re
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import nbjit
from nbjit import BundleError, NbjitCompileError, NbjitLoadError, build_bundle, inspect_bundle, load_bundle
from nbjit.cache.store import Cache
from nbjit.params.numba_abi import NumbaArray, NumbaScalar, from_json, to_json
from nbjit.read.cubin import inspect_cubin
from nbjit.read.ptx import inspect_ptx

from conftest import DATA  # noqa: E402

SOURCE = (DATA / "numba_src" / "bundle_kernels.py").read_text()
# the checkout's nbjit for the command line run from the kernels' directory
CLI_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(DATA.parent.parent),
                                                                      os.environ.get("PYTHONPATH")]))}
HOSTS = {"numba-cuda": ("numba.cuda", "from numba import cuda"),
         "numba-cuda-mlir": ("numba_cuda_mlir.cuda", "from numba_cuda_mlir import cuda")}


@pytest.fixture(scope="module", params=list(HOSTS))
def kernels(request, tmp_path_factory):
    """bundle_kernels.py as the host's module (numba-cuda-mlir's twin imports its cuda)."""
    package, line = HOSTS[request.param]
    pytest.importorskip(package.split(".")[0], reason=f"{request.param} is not installed")
    importlib.import_module(package)
    d = tmp_path_factory.mktemp(request.param)
    name = "bundle_kernels_" + request.param.replace("-", "_")
    (d / f"{name}.py").write_text(SOURCE.replace("from numba import cuda", line, 1))
    sys.path.insert(0, str(d))
    try:
        mod = importlib.import_module(name)
    finally:
        sys.path.remove(str(d))
    mod.HOST = request.param
    mod.DIR = d
    return mod


def _record_type(kernels):
    """The record array type of weigh's first argument, in the kernel's own Numba."""
    from nbjit.gpu.host import HOSTS as hosts
    host = next(h for h in hosts if h.name == kernels.HOST)
    return host.module("numpy_support").from_dtype(kernels.POINT)[::1]


@pytest.fixture(scope="module")
def built(kernels, tmp_path_factory):
    d = tmp_path_factory.mktemp("built")
    f32 = _record_type(kernels)
    inputs = {k: (getattr(kernels, k), sig) for k, sig in kernels.SIGNATURES.items()}
    inputs["weigh"] = (kernels.weigh, (f32, _float32_array(kernels)))
    info = build_bundle(inputs, d / "k.nbjit", archs="sm_80,sm_90", ptx="compute_80", cache=Cache(d / "cache"))
    return d / "k.nbjit", info


def _float32_array(kernels):
    from nbjit.gpu.host import HOSTS as hosts
    host = next(h for h in hosts if h.name == kernels.HOST)
    return host.module("types").float32[::1]


def test_one_image_per_kernel_with_its_abi_its_numba_and_its_options(kernels, built):
    path, info = built
    assert [i.name for i in info.images] == ["axpy", "rowsum", "scale_int", "shout", "weigh"]
    model = "mlir" if kernels.HOST == "numba-cuda-mlir" else "numba"
    axpy = info.image("axpy")
    assert axpy.archs == ("sm_80", "sm_90", "compute_80")
    assert axpy.producer.startswith(kernels.HOST + " ")
    (name, args), = axpy.numba.items()
    f4 = np.dtype("f4")  # (named as the Python function names them: ops and framework calls declare by name)
    assert args == (NumbaArray(f4, 1, "C", model=model, name="out"), NumbaScalar(f4, model, "a"),
                    NumbaArray(f4, 1, "C", model=model, name="x"), NumbaArray(f4, 1, "C", model=model, name="y"))
    assert axpy.lowered_names == {"axpy": name}  # (module["axpy"] finds it)
    src, = axpy.sources
    assert src["kind"] == "numba" and src["name"] == f"{kernels.__name__}.axpy"
    assert src["signature"] == kernels.SIGNATURES["axpy"]
    assert "fastmath=False" in axpy.options
    rowsum = info.image("rowsum")
    assert "fastmath=True" in rowsum.options and "lineinfo=True" in rowsum.options
    assert list(rowsum.numba.values())[0][0] == NumbaArray(np.dtype("f8"), 2, "A", model=model, name="m")
    weigh = list(info.image("weigh").numba.values())[0]
    assert weigh[0].dtype == kernels.POINT  # a record's fields, kept (its mangled name does not say them)


def test_each_entry_is_the_kernel_for_its_architecture(built):
    path, info = built
    for img in info.images:
        kernel = list(img.numba)[0]
        by_arch = {str(e.arch): e for e in img.entries}
        ptx = inspect_ptx(by_arch["compute_80"].payload)
        assert ptx.arch == "sm_80" and [e.name for e in ptx.entries] == [kernel]
        for arch in ("sm_80", "sm_90"):
            cubin = inspect_cubin(by_arch[arch].payload)
            assert str(cubin.arch) == arch and [e.name for e in cubin.entries] == [kernel]
    shared = next(e for e in info.image("rowsum").entries if e.kind == "cubin").resources
    assert list(shared.values())[0]["shared"] == 128 * 8  # the cuda.shared.array


def test_loaded_lazily_the_kernels_take_numba_arguments(kernels, built):
    path, _ = built
    mod = load_bundle(path, name="rowsum", lazy=True)
    k = mod["rowsum"]
    assert mod.rowsum.name == k.name
    assert [p.ctype for p in k.params] == ["array(float64, 2d, A)", "array(float64, 1d, C)"]
    assert [p.type for p in k.params] == ["numba_array", "numba_array"]
    weigh = load_bundle(path, name="weigh", lazy=True)["weigh"]
    assert weigh.params[0].abi.dtype == kernels.POINT
    again = pickle.loads(pickle.dumps(load_bundle(path, name="weigh", lazy=True)))["weigh"]
    assert again.params[0].abi.dtype == kernels.POINT  # (a pickle carries the facts)
    ints = load_bundle(path, name="scale_int", lazy=True)["scale_int"]
    assert [p.ctype for p in ints.params] == ["array(int64, 1d, C)", "int64"]


def test_the_manifest_records_the_abi_and_refuses_it_damaged(built, tmp_path):
    path, _ = built
    with zipfile.ZipFile(path) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        members = {n: zf.read(n) for n in zf.namelist() if n != "manifest.json"}
    img = next(i for i in manifest["images"] if i["name"] == "axpy")
    (kernel, args), = img["numba"].items()
    assert args[0] == {"array": "<f4", "ndim": 1, "layout": "C", "readonly": False, "model": args[0]["model"],
                       "name": "out"}
    assert from_json(args) == from_json(json.loads(json.dumps(to_json(from_json(args)))))
    img["numba"][kernel][0]["ndim"] = 99
    bad = tmp_path / "bad.nbjit"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("manifest.json", json.dumps(manifest))
        for n, data in members.items():
            zf.writestr(n, data)
    with pytest.raises(BundleError, match=r"image 'axpy'.*numba: kernel '_Z.*': argument 0: an array needs ndim 0 to "
                                          r"64"):
        inspect_bundle(bad)
    img["numba"][kernel][0].update(ndim=1, name="not a name")
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("manifest.json", json.dumps(manifest))
        for n, data in members.items():
            zf.writestr(n, data)
    with pytest.raises(BundleError, match=r"image 'axpy'.*argument 0: name 'not a name' is not a Python parameter"):
        inspect_bundle(bad)


@pytest.mark.parametrize("change,said", [
    (lambda a: a[0].update(array="<i4"), r"argument 0: the manifest says array\(int32, 1d, C\), its name "
                                         r"array\(float32, 1d, C\)"),
    (lambda a: a[0].update(layout="A"), r"argument 0: the manifest says array\(float32, 1d, A\)"),
    (lambda a: a[1].update(scalar="O"), r"argument 1: object is not a type of numbers, booleans or records"),
    (lambda a: a[1].update(scalar="<U4"), r"argument 1: <U4 is not a type of numbers, booleans or records"),
    (lambda a: a[0].update(array=json.loads('{"base": ' * 40 + '"<f4"' + ', "shape": [1]}' * 40)),
     r"argument 0: a dtype nested more than 16 deep"),
])
def test_a_manifest_whose_numba_types_were_altered_is_refused(built, tmp_path, change, said):
    """The argument types a manifest records must be numbers, booleans or records, and agree with
    the kernel's mangled name (read_bundle, inspect_bundle and nbjit inspect check them)."""
    path, _ = built
    with zipfile.ZipFile(path) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        members = {n: zf.read(n) for n in zf.namelist() if n != "manifest.json"}
    img = next(i for i in manifest["images"] if i["name"] == "axpy")
    change(next(iter(img["numba"].values())))
    bad = tmp_path / "bad.nbjit"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("manifest.json", json.dumps(manifest))
        for n, data in members.items():
            zf.writestr(n, data)
    with pytest.raises(BundleError, match=r"image 'axpy'.*numba: .*" + said):
        inspect_bundle(bad)


def test_what_only_numba_runs_is_refused_by_name(kernels, tmp_path):
    out = tmp_path / "x.nbjit"
    host = kernels.HOST
    cases = [
        ((kernels.checked, "void(int32[::1])"), BundleError, r"'checked' is compiled with debug=True, which reports "
                                                             r"exceptions through Numba's own launcher"),
        ((kernels.grid_wide, "void(int32[::1])"), BundleError, rf"'grid_wide' uses cooperative groups "
                                                               rf"\(this_grid\(\).sync\(\)\), whose device runtime "
                                                               rf"\(cudadevrt\) {host}'s linker adds"),
        ((kernels.twice, "float32(float32)"), BundleError, r"'twice' is a device function"),
        (kernels.axpy, BundleError, r"'axpy': give the signature to compile it for"),
        ((kernels.axpy, "int32(float32[::1], float32, float32[::1], float32[::1])"), BundleError,
         r"a kernel returns nothing; the signature says int32"),
        ((kernels.axpy, "void(float32[::1])"), NbjitCompileError,
         rf"'axpy': {host} could not compile it for \(array\(float32, 1d, C\)\) on sm_90: .*1 argument"),
        ((kernels.axpy, "void(float32[::1], notatype)"), BundleError, r"'axpy': 'void\(float32\[::1\], notatype\)' is "
                                                                      r"not a signature"),
    ]
    for item, error, message in cases:
        with pytest.raises(error, match=message):
            build_bundle({"x": item}, out, archs="sm_90")
    with pytest.raises(BundleError, match=r"Numba compiles for a compute capability \(sm_90\), not for sm_90a"):
        build_bundle({"x": (kernels.axpy, kernels.SIGNATURES["axpy"])}, out, archs="sm_90a")
    with pytest.raises(BundleError, match=r"say what to compile it for: archs="):
        build_bundle((kernels.axpy, kernels.SIGNATURES["axpy"]), out)
    assert not out.exists()


def test_print_stays_in_the_kernel(built):
    """``print`` calls vprintf, which the driver provides: no Numba needed to run it."""
    _, info = built
    ptx = next(e for e in info.image("shout").entries if e.kind == "ptx").payload.decode()
    assert ".extern .func  (.param .b32 func_retval0) vprintf" in ptx or "vprintf" in ptx


def test_the_command_line_names_a_kernel_by_module_and_function(kernels, tmp_path):
    out = tmp_path / "cli.nbjit"
    env_path = f"{kernels.DIR}"
    spec = f"{kernels.__name__}:axpy:{kernels.SIGNATURES['axpy']}"
    run = subprocess.run([sys.executable, "-m", "nbjit", "bundle", spec, "--arch", "sm_90", "-o", str(out)],
                         capture_output=True, text=True, cwd=env_path, timeout=300, env=CLI_ENV)
    assert run.returncode == 0, run.stderr
    assert run.stderr.startswith(f"{out}: axpy: sm_90 (1 kernel)\n  axpy -> _Z")
    assert list(inspect_bundle(out).image().numba)
    for bad, said in [(f"{kernels.__name__}:axpy", "give the signature to compile it for, one Numba type per "
                                                   f"argument (out, a, x, y): {kernels.__name__}:axpy:'void("),
                      ("no_such_module:axpy:void()", "cannot import module 'no_such_module' (ModuleNotFoundError"),
                      (f"{kernels.__name__}:nothing:void()", f"module '{kernels.__name__}' ("),
                      (f"{kernels.__name__}:np:void()", f"{kernels.__name__}.np is module, not a @cuda.jit kernel"),
                      (f"{kernels.__name__}:checked:void(int32[::1])", "'checked' is compiled with debug=True")]:
        r = subprocess.run([sys.executable, "-m", "nbjit", "bundle", bad, "--arch", "sm_90", "-o", str(out)],
                           capture_output=True, text=True, cwd=env_path, timeout=300, env=CLI_ENV)
        assert r.returncode == 2 and said in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = subprocess.run([sys.executable, "-m", "nbjit", "bundle", spec, "-o", str(out)], capture_output=True,
                       text=True, cwd=env_path, timeout=300, env=CLI_ENV)
    assert r.returncode == 2 and f"{spec} is a @cuda.jit kernel: say what to compile it for with --arch" in r.stderr


def test_from_numba_checks_before_it_asks_for_a_device(kernels):
    """The kernel's faults are said on a machine without a GPU too (before any context)."""
    with pytest.raises(NbjitLoadError, match="'checked' is compiled with debug=True"):
        nbjit.from_numba(kernels.checked, "void(int32[::1])")
    with pytest.raises(NbjitLoadError, match="is not a @cuda.jit kernel"):
        nbjit.from_numba(np.sum, "void()")


def test_the_committed_numba_cuda_mlir_bundle_describes_its_memrefs():
    """tests/data/numba/bundle_kernels_mlir.nbjit (tests/data/numba_src/make_mlir_bundle.py;
    launched by test_gpu_bare.py without any Numba): numba-cuda-mlir's ABI in its manifest."""
    info = inspect_bundle(DATA / "numba" / "bundle_kernels_mlir.nbjit")
    assert [i.name for i in info.images] == ["axpy", "rowsum", "scale_int", "shout", "weigh"]
    rowsum = info.image("rowsum")
    assert rowsum.archs == ("sm_90", "compute_80") and rowsum.producer.startswith("numba-cuda-mlir ")
    assert list(rowsum.numba.values())[0] == (NumbaArray(np.dtype("f8"), 2, "A", model="mlir"),
                                              NumbaArray(np.dtype("f8"), 1, "C", model="mlir"))
    k = load_bundle(DATA / "numba" / "bundle_kernels_mlir.nbjit", name="rowsum", lazy=True)["rowsum"]
    assert [p.size for p in k.params] == [8 * (3 + 2 * 2), 8 * (3 + 2 * 1)]  # (memrefs)


def test_a_newcomers_command_lines(kernels, tmp_path):
    """--name with @cuda.jit kernels alone; --expr IMAGE= beside a kernel; --expr with no CUDA
    source refused; one kernel for two signatures told how; inspect shows Numba's arguments."""
    out = tmp_path / "n.nbjit"
    spec = f"{kernels.__name__}:axpy:{kernels.SIGNATURES['axpy']}"

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "nbjit", *args], capture_output=True, text=True,
                              cwd=kernels.DIR, timeout=300, env=CLI_ENV)
    r = cli("bundle", spec, "--arch", "sm_90", "--name", "mine", "-o", str(out))
    assert r.returncode == 0 and [i.name for i in inspect_bundle(out).images] == ["mine"], r.stderr
    r = subprocess.run([sys.executable, "-m", "nbjit", "bundle", "-", spec, "--arch", "sm_90", "-o", str(out)],
                       input=b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry e() { ret; }\n",
                       capture_output=True, cwd=kernels.DIR, timeout=300, env=CLI_ENV)
    assert r.returncode == 2 and b"- among other FILEs needs --name NAME" in r.stderr, r.stderr  # (never ./stdin)
    r = cli("bundle", spec, "--arch", "sm_90", "--expr", "x<float>", "-o", str(out))
    assert r.returncode == 2 and "no FILE is one: drop --expr" in r.stderr, r.stderr
    (kernels.DIR / "t.cu").write_text("template <typename T> __global__ void t(T *a) { a[0] = 1; }\n")
    r = cli("bundle", "t.cu", spec, "--arch", "sm_90", "--expr", "t=t<float>", "-o", str(out))
    assert r.returncode == 0 and [i.name for i in inspect_bundle(out).images] == ["t", "axpy"], r.stderr
    r = cli("bundle", spec, spec.replace("float32", "float64"), "--arch", "sm_90", "-o", str(out))
    assert r.returncode == 2 and "given twice: a @cuda.jit kernel for two signatures is two images" in r.stderr
    r = cli("inspect", str(out))
    assert "  @cuda.jit signature: void(float32[::1], float32, float32[::1], float32[::1])" in r.stdout
    assert re.search(r"^  0  out   array\(float32, 1d, C\)  (56|40) .*\n  1  a     float32 ", r.stdout, re.M), r.stdout
    with pytest.raises(BundleError, match="instantiate templates of CUDA C\\+\\+ sources; the inputs hold none"):
        build_bundle((kernels.axpy, kernels.SIGNATURES["axpy"]), out, archs="sm_90", name_expressions=["x<int>"])


def test_numbas_colours_are_left_out_of_a_message():
    from nbjit.toolchain.numba_kernels import _first_lines
    assert _first_lines(Exception("\x1b[1mNo implementation of function\x1b[0m\n\n- of type x\nDuring: typing")) == \
        "No implementation of function"


def test_a_kernel_that_sets_a_graph_condition_builds_without_a_link(tmp_path):
    """``nbjit.set_condition`` is the driver's cudaGraphSetConditional declared to the host
    (ptxas provides it): the kernel builds into a bundle, nothing linked."""
    from nbjit.gpu.host import current_host
    host = current_host()
    if host.name == "bare":
        pytest.skip("no Numba serves")
    cuda = host.module("cuda")
    set_condition = nbjit.set_condition

    @cuda.jit
    def stop_when_small(x, again):
        if cuda.grid(1) == 0:
            set_condition(again, x[0] > 1.0)

    info = build_bundle({"stop": (stop_when_small, "void(float32[::1], uint64)")}, tmp_path / "stop.nbjit",
                        archs="sm_90", ptx="compute_90", cache=Cache(tmp_path / "cache"))
    img = info.image("stop")
    ptx = next(e for e in img.entries if e.kind == "ptx").payload.decode()
    assert re.search(r"\.extern\s+\.func\s+cudaGraphSetConditional", ptx)
    assert [e.kind for e in img.entries] == ["cubin", "ptx"]
