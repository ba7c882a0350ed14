"""Kernels launched from @numba.njit code and through the C entry point, on a real GPU (marker
`gpu`; numba core needed)."""
from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

import nbjit
from nbjit import NbjitArgumentError, NbjitLaunchError

pytestmark = pytest.mark.gpu
numba = pytest.importorskip("numba", reason="launching from @njit needs Numba core (numba)")
from conftest import DATA, HOST_CUDA  # noqa: E402

SAXPY = r"""
extern "C" __global__ void saxpy(float *y, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
extern "C" __global__ void fill(int *out, int v, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v;
}
extern "C" __global__ void args16(long long *out, int a0, int a1, int a2, int a3, int a4, int a5, int a6, int a7,
                                  int a8, int a9, int a10, int a11, int a12, int a13, int a14) {
    out[0] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 + a13 + a14;
}
"""


@pytest.fixture(scope="module")
def mod():
    return nbjit.compile(SAXPY)


@numba.njit
def saxpy_steps(k, y, x, a, n, steps, stream):
    for _ in range(steps):
        k[(n + 255) // 256, 256, stream](y, x, a, n)


def test_a_compiled_kernel_launches_from_njit(cuda, mod):
    n = 10_001
    x = np.arange(n, dtype=np.float32)
    dx, dy = cuda.to_device(x), cuda.to_device(np.ones(n, np.float32))
    s = cuda.stream()
    saxpy_steps(mod["saxpy"], nbjit.device_view(dy), nbjit.device_view(dx), 0.5, n, 3, nbjit.StreamHandle(s))
    s.synchronize()
    np.testing.assert_allclose(dy.copy_to_host(), 1 + 1.5 * x)


def test_views_slice_rows_in_njit(cuda, mod):
    @numba.njit
    def middle(k, out, v, n):
        k[1, 256](out[2:n - 2], v, n - 4)  # rows 2 .. n-3 of out

    out = cuda.to_device(np.zeros(16, np.int32))
    middle(mod["fill"], nbjit.device_view(out), 7, 16)
    cuda.synchronize()
    assert out.copy_to_host().tolist() == [0, 0] + [7] * 12 + [0, 0]


def test_a_numba_kernel_launches_from_njit_with_views(cuda):
    @cuda.jit
    def scale(a, f):
        i = cuda.grid(1)
        if i < a.shape[0]:
            a[i] *= f

    from nbjit.gpu.host import current_host
    t = current_host().module("types")
    k = nbjit.from_numba(scale, (t.float64[::1], t.float64))
    d = cuda.to_device(np.arange(10, dtype=np.float64))

    @numba.njit
    def go(k, v):
        k[1, 32](v[::1], 3.0)
        k[1, 32](v[5:], 2.0)

    go(k, nbjit.device_view(d))
    cuda.synchronize()
    want = np.arange(10.0) * 3
    want[5:] *= 2
    np.testing.assert_allclose(d.copy_to_host(), want)
    strided = nbjit.device_view(d)[::2]
    with pytest.raises(NbjitArgumentError) as njit_err:
        go(k, strided)
    with pytest.raises(NbjitArgumentError) as py_err:
        k[1, 32](d[::2], 3.0)
    assert str(njit_err.value) == str(py_err.value)


def test_errors_raise_what_a_python_launch_raises(cuda, mod):
    k = mod["fill"]
    out = cuda.to_device(np.zeros(4, np.int32))

    @numba.njit
    def go(k, out, v, n, block):
        k[1, block](out, v, n)

    v = nbjit.device_view(out)
    for args in ((v, 2 ** 40, 4, 32), (v, 1, -1, 32), (v, 1, 4, 2048)):
        py_args = (out,) + args[1:3]
        with pytest.raises((NbjitArgumentError, NbjitLaunchError)) as py_err:
            k[1, args[3]](*py_args)
        with pytest.raises(type(py_err.value)) as njit_err:
            go(k, *args)
        assert str(njit_err.value) == str(py_err.value)


def test_typing_errors_name_the_parameter(cuda, mod):
    out = nbjit.device_view(cuda.to_device(np.zeros(4, np.float64)))

    @numba.njit
    def go(k, out):
        k[1, 32](out, 1, 4)

    with pytest.raises(numba.core.errors.TypingError, match=r"parameter 0 \(out, pointer\): a float64 device view"):
        go(mod["fill"], out)


KERNEL = None  # closed over by closed_over() below


def test_a_kernel_closed_over_launches_and_is_not_cached(cuda, mod):
    global KERNEL
    KERNEL = mod["fill"]

    @numba.njit(cache=True)
    def closed_over(out, v):
        KERNEL[1, 32](out, v, 4)

    out = cuda.to_device(np.zeros(4, np.int32))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        closed_over(nbjit.device_view(out), 5)
    cuda.synchronize()
    assert out.copy_to_host().tolist() == [5] * 4
    assert any("dynamic globals" in str(w.message) for w in seen)


def test_njit_cache_holds_no_kernel_address(tmp_path):
    """A cached njit function that takes the kernel as an argument runs in a new process from
    the cache, with the kernel that process loaded."""
    script = tmp_path / "cached.py"
    script.write_text(textwrap.dedent(f"""
        import numpy as np, numba, nbjit
        {HOST_CUDA}
        mod = nbjit.compile({SAXPY!r})

        @numba.njit(cache=True)
        def go(k, out, v):
            k[1, 32](out, v, 4)

        out = cuda.to_device(np.zeros(4, np.int32))
        go(mod["fill"], nbjit.device_view(out), 9)
        cuda.synchronize()
        assert out.copy_to_host().tolist() == [9] * 4
        print("hits", sum(go.stats.cache_hits.values()))
    """))
    runs = [subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert runs[0].stdout.split()[-1] == "0" and runs[1].stdout.split()[-1] == "1"


def test_nogil_threads_launch_on_their_streams_while_python_runs(cuda, mod):
    @numba.njit(nogil=True)
    def many(k, out, n, stream):
        for i in range(n):
            k[1, 32, stream](out, i, 1)

    outs = [cuda.to_device(np.zeros(1, np.int32)) for _ in range(4)]
    streams = [cuda.stream() for _ in range(4)]
    k = mod["fill"]
    many(k, nbjit.device_view(outs[0]), 1, nbjit.StreamHandle(streams[0]))  # (compiled)
    ticks = [0]
    done = threading.Event()

    def python_loop():
        while not done.is_set():
            ticks[0] += 1

    watcher = threading.Thread(target=python_loop)
    watcher.start()
    workers = [threading.Thread(target=many, args=(k, nbjit.device_view(o), 20_000, nbjit.StreamHandle(s)))
               for o, s in zip(outs, streams)]
    before = ticks[0]
    for w in workers:
        w.start()
    time.sleep(0.05)
    during = ticks[0] - before
    for w in workers:
        w.join()
    done.set()
    watcher.join()
    for s in streams:
        s.synchronize()
    assert [o.copy_to_host()[0] for o in outs] == [19_999] * 4
    assert during > 0  # the Python thread ran while the launching threads did


def test_c_entry_through_ctypes_and_a_cfunc(cuda, mod):
    k = mod["saxpy"]
    e = k.c_entry
    assert [a.kind for a in e.arguments] == ["pointer", "pointer", "float", "int"]
    n = 1000
    x = np.arange(n, dtype=np.float32)
    dx, dy = cuda.to_device(x), cuda.to_device(np.zeros(n, np.float32))
    launch = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_int,
                              ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64, ctypes.c_char_p,
                              ctypes.c_int64)(e.launch)
    y_ptr, x_ptr = ctypes.c_uint64(nbjit.device_view(dy).data), ctypes.c_uint64(nbjit.device_view(dx).data)
    a, nn = ctypes.c_double(2.0), ctypes.c_int64(n)
    args = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in (y_ptr, x_ptr, a, nn)])
    dims = (ctypes.c_int64 * 7)(4, 1, 1, 256, 1, 1, 0)
    msg = ctypes.create_string_buffer(512)
    assert launch(e.kernel, dims, 0, None, args, 4, msg, 512) == 0, msg.value
    cuda.synchronize()
    np.testing.assert_allclose(dy.copy_to_host(), 2 * x)
    assert launch(e.kernel, dims, 0, None, args, 3, msg, 512) == 1
    assert msg.value.decode().startswith("kernel 'saxpy' takes 4 arguments, got 3")



def test_c_entry_from_a_cfunc(cuda, mod):
    e = mod["fill"].c_entry
    # the ABI with every pointer as a 64-bit integer (the same registers on x86-64 and AArch64)
    launch = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_uint64] * 2 + [ctypes.c_int] + [ctypes.c_uint64] * 2 +
                              [ctypes.c_int64, ctypes.c_uint64, ctypes.c_int64])(e.launch)
    kernel = e.kernel

    @numba.cfunc("int32(uint64, int32)")
    def fill4(out, v):
        values = np.empty(3, dtype=np.int64)
        values[0], values[1], values[2] = out, v, 4
        args = np.empty(3, dtype=np.uint64)
        for i in range(3):
            args[i] = values.ctypes.data + 8 * i
        dims = np.array([1, 1, 1, 32, 1, 1, 0], dtype=np.int64)
        msg = np.zeros(256, dtype=np.uint8)
        return launch(kernel, dims.ctypes.data, 0, 0, args.ctypes.data, 3, msg.ctypes.data, 256)

    out = cuda.to_device(np.zeros(4, np.int32))
    assert ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_uint64, ctypes.c_int32)(fill4.address)(
        nbjit.device_view(out).data, 6) == 0
    cuda.synchronize()
    assert out.copy_to_host().tolist() == [6] * 4


def test_a_triton_kernel_launches_from_njit(cuda):
    k = nbjit.load_triton(DATA / "triton" / "add_kernel")
    n = 5000
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    y = np.random.default_rng(1).random(n, dtype=np.float32)
    out = cuda.device_array(n, np.float32)

    @numba.njit
    def go(k, x, y, out, n):
        k[(n + 1023) // 1024](x, y, out, n, 0.5)

    go(k, *(nbjit.device_view(a) for a in (cuda.to_device(x), cuda.to_device(y), out)), n)
    cuda.synchronize()
    np.testing.assert_allclose(out.copy_to_host(), 0.5 * x + y, rtol=1e-6)
