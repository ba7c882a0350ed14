"""Typed launches on a GPU (marker `gpu`): on every route (PTX, cubin and fatbin files,
``nbjit.compile`` cubin and PTX, Triton cubin and PTX) a wrong-dtype array is refused, and
every everyday argument form takes the C fast path (``launcher.path``/``fallbacks`` say so)."""
from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest

# PyTorch before Numba makes its context (see test_gpu_interop.py)
torch = pytest.importorskip("torch") if importlib.util.find_spec("torch") else None

import nbjit  # noqa: E402
from nbjit import NbjitArgumentError, NbjitWarning  # noqa: E402

pytestmark = pytest.mark.gpu
from conftest import DATA, expected_path  # noqa: E402
SCALE = "_Z6k_tmplIfEvPT_S0_i"  # k_tmpl<float>(float* out, float v, int n): out[i] = v * i
SRC = r'''
extern "C" __global__ void scale(float* __restrict__ out, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v * (float)i;
}
'''
N = 1000
GRID, BLOCK = (N + 127) // 128, 128


def route_kernel(route: str):
    if route == "ptx file":
        return nbjit.load(DATA / "nvcc/kernels_sm90.ptx")[SCALE]
    if route == "cubin file":
        return nbjit.load(DATA / "nvcc/kernels_sm_90.cubin")[SCALE]
    if route == "fatbin file":
        return nbjit.load(DATA / "nvcc/kernels_multi_lz4.fatbin")[SCALE]
    if route == "nbjit.compile":
        return nbjit.compile(SRC)["scale"]
    if route == "nbjit.compile ptx":
        return nbjit.compile(SRC, output="ptx")["scale"]
    raise AssertionError(route)


ROUTES = ["ptx file", "cubin file", "fatbin file", "nbjit.compile", "nbjit.compile ptx"]


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_is_typed(route):
    k = route_kernel(route)
    assert [p.ctype for p in k.params][:1] == ["float*"], k
    assert k.params[0].pointee == "float" and k.params[2].type == "s32"
    assert "float*" in repr(k)


@pytest.mark.parametrize("route", ROUTES)
def test_wrong_dtype_is_refused_on_every_route(cuda, route):
    k = route_kernel(route)
    wrong = cuda.device_array(N, np.float64)
    with pytest.raises(NbjitArgumentError, match=r"parameter 0 .*float64 array.*float\*.*float32"):
        k[GRID, BLOCK](wrong, np.float32(2), N)
    with pytest.raises(NbjitArgumentError, match="float64"):
        k.launch(GRID, BLOCK, wrong, 2.0, N)
    with pytest.raises(NbjitArgumentError, match="float64"):
        k.bind(GRID, BLOCK, wrong, 2.0, N)
    out = cuda.device_array(N, np.float32)
    k[GRID, BLOCK](wrong.view(np.float32), 2.0, N)  # a deliberate reinterpretation is allowed
    k[GRID, BLOCK](out, 2.0, N)
    np.testing.assert_allclose(out.copy_to_host(), 2.0 * np.arange(N, dtype=np.float32))


def forms(cuda):
    """(name, make arrays and a stream, synchronize): the argument forms users take."""
    out = []
    ns = cuda.stream()
    out.append(("numba arrays, numpy scalars, numba stream",
                lambda: (cuda.device_array(N, np.float32), np.float32(3.0), np.int32(N)), ns, ns.synchronize,
                lambda a: a.copy_to_host()))
    out.append(("numba arrays, python scalars, default stream",
                lambda: (cuda.device_array(N, np.float32), 3.0, N), None, cuda.synchronize,
                lambda a: a.copy_to_host()))
    keep = []

    def ints():
        a = cuda.device_array(N, np.float32)
        keep.append(a)
        return a.__cuda_array_interface__["data"][0], 3.0, N

    out.append(("int pointer", ints, 0, cuda.synchronize, lambda p: keep[-1].copy_to_host()))

    def memptr():
        a = cuda.device_array(N, np.float32)
        keep.append(a)
        return a.gpu_data, 3.0, N

    out.append(("numba MemoryPointer", memptr, ns, ns.synchronize, lambda p: keep[-1].copy_to_host()))
    if importlib.util.find_spec("cupy"):
        import cupy as cp
        cs = cp.cuda.Stream(non_blocking=True)
        out.append(("cupy arrays, int stream handle", lambda: (cp.zeros(N, cp.float32), np.float32(3.0), N),
                    cs.ptr, cs.synchronize, cp.asnumpy))
    if torch is not None:
        ts = torch.cuda.Stream()
        out.append(("torch tensors, torch stream", lambda: (torch.zeros(N, device="cuda"), 3.0, N), ts,
                    ts.synchronize, lambda t: t.cpu().numpy()))
    return out


@pytest.mark.parametrize("route", ROUTES)
def test_every_form_takes_the_fast_path(cuda, route):
    k = route_kernel(route)
    want = 3.0 * np.arange(N, dtype=np.float32)
    for name, make, stream, sync, host in forms(cuda):
        args = make()
        cfg = k[GRID, BLOCK, stream]
        cfg(*args)  # the first sight of a dtype goes through the Python rules, which remember it
        sync()
        cfg.fallbacks = 0
        args = make()
        for _ in range(3):
            k[GRID, BLOCK, stream](*args)  # re-indexed: the same configured launcher
        sync()
        np.testing.assert_allclose(host(args[0]), want, err_msg=f"{route}: {name}")
        assert cfg.path == expected_path(), (route, name)
        assert cfg.fallbacks == 0, (route, name)


def test_triton_routes_are_typed_and_fast(cuda, tmp_path):
    import shutil
    n = 5000
    x, y = np.arange(n, dtype=np.float32), np.ones(n, dtype=np.float32)
    src = DATA / "triton/add_kernel"
    for f in ("add_kernel.json", "add_kernel.ptx", "add_kernel.ttir"):  # no cubin: the PTX route
        shutil.copy(src / f, tmp_path / f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NbjitWarning)
        kernels = [nbjit.load_triton(src), nbjit.load_triton(tmp_path)]
    assert [tk.route for tk in kernels][0] == "cubin" and kernels[1].route != "cubin"
    for tk in kernels:
        assert str(tk.kernel.signature).startswith("(float* x_ptr, float* y_ptr, float* out_ptr, int n_elements")
        dx, dy, out = cuda.to_device(x), cuda.to_device(y), cuda.device_array(n, np.float32)
        s = cuda.stream()
        grid = ((n + 1023) // 1024,)
        tk[grid](dx, dy, out, n, np.float32(0.5), stream=s)
        launcher = tk[grid].by_stream[s]  # the kernel's launcher, leaving the NULL scratch pointers zero
        launcher.fallbacks = 0
        tk[grid](dx, dy, out, n, np.float32(0.5), stream=s)
        s.synchronize()
        np.testing.assert_allclose(out.copy_to_host(), 0.5 * x + y)
        assert launcher.path == expected_path() and launcher.fallbacks == 0
        with pytest.raises(NbjitArgumentError, match="x_ptr.*float64"):
            tk[grid](cuda.device_array(n, np.float64), dy, out, n, 0.5)
        with pytest.raises(NbjitArgumentError, match="Triton kernel 'add_kernel' takes 5 runtime arguments"):
            tk[grid](dx, dy, out, n, 0.5, 0, 0)


def test_untyped_cubin_kernels_still_take_the_fast_path(cuda):
    """An extern "C" kernel in a cubin file: sizes only, yet numpy and Python scalars go by C."""
    k = nbjit.load(DATA / "nvcc/kernels_sm_90.cubin")["k_basic"]
    assert k.params[2].type == "unknown"
    x = cuda.to_device(np.arange(N, dtype=np.float32))
    y = cuda.to_device(np.ones(N, dtype=np.float32))
    cfg = k[GRID, BLOCK]
    cfg(y, x, np.float32(2.0), np.int32(N))
    cfg(y, x, 1.0, N)
    cuda.synchronize()
    np.testing.assert_allclose(y.copy_to_host(), 3 * np.arange(N, dtype=np.float32) + 1)
    assert cfg.fallbacks == 0
