"""numba-cuda-mlir as nbjit's host (nbjit.gpu.host.NumbaCudaMlir), where it is installed: nbjit
never imports numba-cuda for it; its arrays, pointers and streams give their addresses (the C
launcher's fast path included), its errors their codes, its types what nbjit passes; its
compiler's kernels are read as it emits them and launched by nbjit (``from_numba``); and
on a GPU (marker `gpu`), launches with its arrays and streams, its kernels through
``from_numba``, graphs, pickles and globals, whichever host serves the suite.

numba-cuda-mlir's compiler asks the device for its compute capability even when told one
(``cc=``), so compiling here without a GPU stands in for the device (``no_device_cc``)."""
from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import weakref

import numpy as np
import pytest

pytest.importorskip("numba_cuda_mlir")
from cuda.bindings import driver as cu  # noqa: E402
from numba_cuda_mlir.numba_cuda import types  # noqa: E402
from numba_cuda_mlir.numba_cuda.cudadrv import devicearray as DA  # noqa: E402
from numba_cuda_mlir.numba_cuda.cudadrv import driver as D  # noqa: E402

import nbjit  # noqa: E402
from nbjit import NbjitArgumentError, NbjitLoadError, inspect_ptx  # noqa: E402
from nbjit.gpu import host as _host
from nbjit.gpu.driver import stream_handle  # noqa: E402
from nbjit.gpu.host import HOSTS, NumbaCudaMlir, current_host  # noqa: E402
from nbjit.launch.arguments import ArgPacker  # noqa: E402
from nbjit.launch.arrays import _EXTRACTORS, device_pointer
from nbjit.params.numba_abi import NumbaAbiError, fields, from_mangled, from_numba_types, is_mlir_name  # noqa: E402
from conftest import DATA, expected_path  # noqa: E402
from test_mlir_abi import MIXED, MIXED_PARAMS, c_launcher  # noqa: E402

MLIR = HOSTS[1]


def memory(address: int, nbytes: int):
    """numba-cuda-mlir's pointer object for device memory at ``address`` (no context needed)."""
    return D.MemoryPointer(None, cu.CUdeviceptr(address), nbytes)


def array(address: int, shape: tuple, dtype, strides: tuple | None = None):
    """A numba-cuda-mlir device array over memory at ``address`` (made without a GPU)."""
    dt = np.dtype(dtype)
    if strides is None:
        strides = tuple(int(s) for s in np.empty(shape, dt).strides)
    return DA.DeviceNDArray(shape, strides, dt, gpu_data=memory(address, max(1, int(np.prod(shape))) * 64))


@pytest.fixture
def no_device_cc(monkeypatch):
    """numba-cuda-mlir's compiler told the device is sm_90 (it asks the device even with cc=)."""
    import numba_cuda_mlir.tools as tools
    monkeypatch.setattr(tools, "_cached_cc", (9, 0))


def test_its_arrays_pointers_and_streams_give_their_address():
    ptr = memory(0x7F00_1000, 256)
    arr = DA.DeviceNDArray((16,), (4,), np.dtype(np.float32), gpu_data=ptr)
    assert MLIR.pointer_getter(DA.DeviceNDArray)(arr) == MLIR.pointer_getter(D.MemoryPointer)(ptr) == 0x7F00_1000
    assert _host.pointer_getter(DA.DeviceNDArray) is MLIR.pointer_getter(DA.DeviceNDArray)
    assert device_pointer(arr) == device_pointer(ptr) == 0x7F00_1000
    owned = D.OwnedPointer(weakref.proxy(ptr))
    assert device_pointer(owned) == 0x7F00_1000
    assert _EXTRACTORS[DA.DeviceNDArray] is MLIR.pointer_getter(DA.DeviceNDArray)  # what the C path reads
    assert int(stream_handle(D.Stream(cu.CUstream(0x1234)))) == 0x1234
    assert MLIR.pointer_getter(np.ndarray) is None


def test_its_driver_errors_give_their_code():
    assert MLIR.error_code(D.CudaAPIError(901, "invalidated")) == 901
    assert _host.error_code(D.CudaAPIError(900, "unsupported")) == 900


def test_its_types_read_as_nbjit_passes_them():
    d = MLIR.describe_type
    assert d(types.float32[::1]) == ("array", np.dtype(np.float32), 1, "C", False)
    assert d(types.Array(types.int16, 3, "F", readonly=True)) == ("array", np.dtype(np.int16), 3, "F", True)
    assert d(types.complex64) == ("scalar", np.dtype(np.complex64))
    assert d(types.UniTuple(types.float32, 2)) is None
    args, ret = MLIR.kernel_types("void(float32[::1], int64)")
    assert args == (types.float32[::1], types.int64) and MLIR.returns_nothing(ret)
    assert not MLIR.returns_nothing(MLIR.kernel_types("float32(float32)")[1])


def test_a_view_of_nbjit_memory_is_its_array_keeping_the_owner(monkeypatch):
    """DeviceGlobal.as_array under this host: its from_cuda_array_interface, the owner held by
    a keeper (it reads owner.dtype: a Module would look for a kernel called "dtype")."""
    seen = {}

    def made(desc, owner=None, sync=True):
        seen.update(desc=desc, owner=owner, sync=sync)
        return "its array"

    monkeypatch.setattr(MLIR.module("cuda"), "from_cuda_array_interface", made)
    owner = object()
    assert MLIR.array_view(0x1000, (4, 2), np.dtype("f4"), owner) == "its array"
    assert seen["desc"] == {"shape": (4, 2), "typestr": "<f4", "data": (0x1000, False), "strides": None,
                            "version": 2}
    assert seen["owner"].obj is owner and not hasattr(seen["owner"], "dtype") and seen["sync"] is False


try:
    from nbjit.gpu import _launcher as _launch
except ImportError:
    _launch = None


@pytest.mark.skipif(_launch is None, reason="nbjit's C launch extension is not built")
def test_the_c_launcher_packs_its_arrays():
    """An nvcc kernel's pointers from numba-cuda-mlir arrays: in C, the same bytes as the
    Python rules (these arrays missed the C path before: 12.8 us a launch against 4.6)."""
    k = inspect_ptx((DATA / "nvcc/kernels_sm90.ptx").read_text()).entry("k_basic")  # (y, x, a, n)
    p = ArgPacker(k.signature, k.name)
    c = c_launcher(k, p)
    y, x = array(0x1000, (16,), np.float32), array(0x2000, (16,), np.float32)
    args = (y, x, np.float32(2.0), np.int32(16))
    want = p.pack(args)
    assert c.pack_fast(args) == want and struct.unpack_from("<QQ", want) == (0x1000, 0x2000)


def test_its_compiler_writes_what_nbjit_reads(no_device_cc):
    """numba-cuda-mlir's PTX for a kernel of every kind of argument: its name is read as
    its types, and each argument's fields are its PTX parameters (test_mlir_abi.py's
    written-out PTX is this one's)."""
    sig = (types.int64, types.int32, types.float64, types.boolean, types.complex64, types.complex128,
           types.float32, types.uint8, types.float64[:, ::1], types.float64[::1, :], types.float32[:, :, :],
           types.uint8[::1])

    def k(a, b, c, d, e, f, g, h, x2c, x2f, x3a, u8):
        x2c[0, 0] = a + b + c + d
        x2f[0, 1] = e.real + f.imag + h
        x3a[0, 0, 0] = g
        u8[0] = 1

    ptx = MLIR.compile_ptx(k, sig, (9, 0), **MLIR.ptx_options({}))
    e = inspect_ptx(ptx).entries[0]
    assert e.name.endswith(MIXED[len("_Z1k"):]) and is_mlir_name(e.name)  # (its name: the qualified name's)
    args = from_numba_types(sig, MLIR.describe_type, MLIR.abi)
    assert from_mangled(e.name) == from_mangled(MIXED) == args
    assert [f for a in args for f in fields(a)] == [p.size for p in e.params] == \
        [8, 4, 8, 1, 8, 16, 4, 1] + [8] * 28
    assert len(MIXED_PARAMS) == len(e.params)


def test_from_numba_without_a_gpu(fake_device, no_device_cc):
    """A numba-cuda-mlir kernel through from_numba, loaded by the stand-in driver: its
    parameters, its memref arrays packed by hand, and what it refuses naming the argument."""
    from numba_cuda_mlir import cuda

    @cuda.jit
    def axpy(y, x, a, z):
        i = cuda.grid(1)
        if i < y.size:
            y[i] = a * x[i, 0] + y[i] + z.real

    k = nbjit.from_numba(axpy, "void(float32[::1], float32[:, :], float32, complex64)")
    assert [(p.type, p.size) for p in k.params] == [("numba_array", 40), ("numba_array", 56), ("f32", 4), ("c8", 8)]
    assert all(p.abi.model == "mlir" for p in k.params[:2])
    y, x = array(0x1000, (16,), np.float32), array(0x2000, (4, 3), np.float32, strides=(24, 4))
    raw = k._s.packer.pack((y, x, 2.0, 1 + 2j))
    assert struct.unpack_from("<5q", raw, 0) == (0x1000, 0x1000, 0, 16, 1)
    assert struct.unpack_from("<7q", raw, 40) == (0x2000, 0x2000, 0, 4, 3, 6, 1)
    assert struct.unpack_from("<f", raw, 96) == (2.0,) and struct.unpack_from("<ff", raw, 100) == (1.0, 2.0)
    with pytest.raises(NbjitArgumentError, match=r"parameter 0 \(y, .*a float64 array was passed"):
        k._s.packer.pack((array(0x1000, (16,), np.float64), x, 2.0, 1j))

    @cuda.jit
    def tup(t, out):
        out[0] = t[0]

    with pytest.raises(NumbaAbiError, match=r"kernel 'tup': argument 0 is UniTuple\(int32 x 2\): nbjit passes"):
        nbjit.from_numba(tup, (types.UniTuple(types.int32, 2), types.int32[::1]))

    @cuda.jit(device=True)
    def dev(v):
        return v + 1

    with pytest.raises(NbjitLoadError, match="device function"):
        nbjit.from_numba(dev, (types.int32,))

    @cuda.jit(debug=True, opt=False)
    def dbg(v):
        v[0] = 1

    with pytest.raises(NbjitLoadError, match="debug=True"):
        nbjit.from_numba(dbg, (types.int32[::1],))


def test_nbjit_never_imports_numba_cuda_for_it():
    """With numba-cuda-mlir imported (numba-cuda installed or not): inspecting, compiling for
    a named architecture, the packing rules for its arrays, its kernels' ABI, graphs and
    Triton kernels' types: no ``numba`` module is ever imported."""
    code = f'''
import sys, numpy as np
from numba_cuda_mlir import cuda
from numba_cuda_mlir.numba_cuda.cudadrv import devicearray as DA, driver as D
from cuda.bindings import driver as cu
import nbjit
from nbjit.gpu.host import current_host
from nbjit.launch.arguments import ArgPacker
from nbjit.launch.arrays import device_pointer
from nbjit.params import numba_abi
info = nbjit.inspect_ptx(open({str(DATA / "nvcc/kernels_sm90.ptx")!r}).read())
k = info.entry("k_basic")
arr = DA.DeviceNDArray((4,), (4,), np.float32, gpu_data=D.MemoryPointer(None, cu.CUdeviceptr(0x1000), 16))
ArgPacker(k.signature, "k_basic").pack((arr, arr, 1.0, 4))
m = nbjit.compile('extern "C" __global__ void f(float* p) {{ p[0] = 1.0f; }}', arch="sm_90")
h = current_host()
args = numba_abi.from_numba_types(h.kernel_types("void(float32[::1], complex64)")[0], h.describe_type, h.abi)
nbjit.capture, nbjit.TritonKernel, nbjit.load_bundle, nbjit.from_numba
print(h.name, device_pointer(arr) == 0x1000, args[0].model, type(m).__name__)
print(sorted(n for n in sys.modules if n == "numba" or n.startswith("numba.")))
'''
    env = {k: v for k, v in os.environ.items() if k != "NBJIT_HOST"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.stdout.splitlines() == ["numba-cuda-mlir True mlir Module", "[]"], r.stdout + r.stderr


def unpickle_in_a_worker(shipped: bytes) -> tuple:
    """A spawned worker (it inherits NBJIT_HOST): the kernel unpickled and described, then
    used (it loads on first use where there is a GPU); which host serves there, and the numba
    modules imported."""
    from nbjit.gpu.host import current_host
    k = pickle.loads(shipped)
    described = [p.ctype for p in k.params], k.module.kernels
    try:
        used = f"loaded on device {k.module.device}"
    except NbjitLoadError as e:
        used = str(e)
    numba = sorted(n for n in sys.modules if n == "numba" or n.startswith("numba."))
    return current_host().name, described, used, numba


def test_its_kernel_pickles_to_a_spawned_worker_without_numba_cuda(monkeypatch):
    """A kernel compiled on the client (no GPU needed for a named architecture) travels to a
    spawned worker process (as Dask's and multiprocessing's do) as data: there it is described
    from its image, loads on first use in numba-cuda-mlir's context (or says there is no GPU),
    and no numba module is imported, numba-cuda installed or not."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    src = 'extern "C" __global__ void poly(float* y, const float* x, float a, long long n) { y[n] = a * x[n]; }'
    k = nbjit.compile(src, arch="sm_90", lazy=True)["poly"]
    monkeypatch.setenv("NBJIT_HOST", "numba-cuda-mlir")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        host, described, used, numba = pool.submit(unpickle_in_a_worker, pickle.dumps(k)).result(timeout=300)
    assert host == "numba-cuda-mlir" and numba == []
    assert described == (["float*", "const float*", "float", "long long"], ("poly",))
    assert used.startswith("loaded on device") or "no usable CUDA GPU" in used, used


def test_both_imported_numba_cuda_serves_and_it_says_so():
    pytest.importorskip("numba.cuda")
    code = ("import warnings, numba.cuda, numba_cuda_mlir\nfrom nbjit.gpu.host import current_host\n"
            "with warnings.catch_warnings(record=True) as w:\n    warnings.simplefilter('always')\n"
            "    h = current_host()\nprint(h.name)\nprint(w[0].message if w else '')")
    env = {k: v for k, v in os.environ.items() if k != "NBJIT_HOST"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    name, said = r.stdout.splitlines()
    assert name == "numba-cuda", r.stderr
    assert said.startswith("both numba-cuda and numba-cuda-mlir are imported: nbjit serves numba-cuda") and \
        "set NBJIT_HOST=numba-cuda-mlir or call nbjit.use_host('numba-cuda-mlir')" in said
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env={**env, "NBJIT_HOST": "numba-cuda-mlir"})
    assert r.stdout.splitlines() == ["numba-cuda-mlir", ""], r.stdout + r.stderr


# ---------------------------------------------------------------- on a GPU

N = 1000
AXPY = r'''extern "C" __global__ void axpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}'''


@pytest.fixture(scope="module")
def mcuda():
    from numba_cuda_mlir import cuda
    return cuda


@pytest.mark.gpu
def test_its_arrays_and_streams_launch_on_the_c_path(mcuda):
    k = nbjit.compile(AXPY, name="mlir_axpy.cu")["axpy"]
    s = mcuda.stream()
    x = mcuda.to_device(np.arange(N, dtype=np.float32), stream=s)
    y = mcuda.to_device(np.zeros(N, np.float32), stream=s)
    cfg = k[(N + 255) // 256, 256, s]
    cfg(y, x, np.float32(1.0), np.int32(N))  # the first sight of the dtype teaches the C path
    cfg.fallbacks = 0
    for _ in range(4):
        cfg(y, x, np.float32(1.0), np.int32(N))
    s.synchronize()
    np.testing.assert_array_equal(y.copy_to_host(), 5 * np.arange(N, dtype=np.float32))
    assert cfg.path == expected_path() and (cfg.path != "c" or cfg.fallbacks == 0)


@pytest.mark.gpu
def test_its_kernels_through_from_numba_beside_its_own_dispatch(mcuda):
    @mcuda.jit
    def scale(v, w, a, z):
        i, j = mcuda.grid(2)
        if i < v.shape[0] and j < v.shape[1]:
            v[i, j] = a * v[i, j] + w[j, i] + z.imag

    sig = (types.Array(types.float64, 2, "A"), types.Array(types.float64, 2, "F"), types.float64, types.complex128)
    k = nbjit.from_numba(scale, sig)
    rng = np.random.default_rng(1)
    V = rng.random((40, 30))
    W = np.asfortranarray(rng.random((30, 40)))
    whole = np.zeros((40, 60))
    whole[:, ::2] = V
    s = mcuda.stream()
    for launch in (lambda v, w: scale[(3, 2), (16, 16), s](v, w, 2.0, 1.5 + 0.25j),
                   lambda v, w: k[(3, 2), (16, 16), s](v, w, 2.0, 1.5 + 0.25j)):
        base = mcuda.to_device(whole)
        launch(base[:, ::2], mcuda.to_device(W))  # every other column: not contiguous
        s.synchronize()
        got = base.copy_to_host()
        np.testing.assert_allclose(got[:, ::2], 2 * V + W.T + 0.25)
        assert not got[:, 1::2].any()
    rec = np.dtype([("x", np.float32), ("y", np.int32)])

    @mcuda.jit
    def rec_kernel(r):
        i = mcuda.grid(1)
        if i < r.shape[0]:
            r[i].x = r[i].x * 2 + r[i].y

    from numba_cuda_mlir.numba_cuda.np.numpy_support import from_dtype
    R = np.zeros(10, rec)
    R["x"], R["y"] = np.arange(10), np.arange(10) * 3
    d = mcuda.to_device(R)
    nbjit.from_numba(rec_kernel, (types.Array(from_dtype(rec), 1, "C"),))[1, 32](d)
    mcuda.synchronize()
    np.testing.assert_allclose(d.copy_to_host()["x"], R["x"] * 2 + R["y"])


@pytest.mark.gpu
def test_a_graph_of_its_kernel_and_an_nbjit_kernel(mcuda):
    @mcuda.jit
    def twice(w, x):
        i = mcuda.grid(1)
        if i < w.shape[0]:
            w[i] = 2 * x[i]

    axpy = nbjit.compile(AXPY, name="mlir_graph_axpy.cu")["axpy"]
    s = mcuda.stream()
    x = mcuda.to_device(np.arange(N, dtype=np.float32))
    w = mcuda.device_array(N, np.float32)
    y = mcuda.to_device(np.zeros(N, np.float32))
    twice[4, 256, s](w, x)  # compiled before the capture
    axpy[4, 256, s](y, w, 0.0, N)
    s.synchronize()
    with nbjit.capture(s) as g:
        twice[4, 256, s](w, x)
        axpy[4, 256, s](y, w, 0.5, N)  # y += x
    for _ in range(10):
        g.launch(s)
    s.synchronize()
    np.testing.assert_allclose(y.copy_to_host(), 10 * np.arange(N, dtype=np.float32))


@pytest.mark.gpu
def test_its_kernel_pickles_and_globals_are_the_hosts_arrays(mcuda):
    @mcuda.jit
    def add_one(a):
        i = mcuda.grid(1)
        if i < a.size:
            a[i] += 1

    k = nbjit.from_numba(add_one, "void(float32[::1])")
    k2 = pickle.loads(pickle.dumps(k))
    assert k2.params[0].abi.model == "mlir"
    a = mcuda.to_device(np.zeros(64, np.float32))
    k2[1, 64](a)
    mcuda.synchronize()
    np.testing.assert_array_equal(a.copy_to_host(), 1.0)
    g = nbjit.load(DATA / "nvcc/kernels_sm90.ptx").get_global("g_arr").as_array(np.float32)
    assert isinstance(g, current_host().module("devicearray").DeviceNDArray) and g.shape == (16,)
    if isinstance(current_host(), NumbaCudaMlir):
        assert isinstance(g, DA.DeviceNDArray)
