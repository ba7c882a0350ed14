"""Numba's own kernels through nbjit's launcher (marker `gpu`): the same @cuda.jit kernel
launched by Numba and by nbjit gives the same result as numpy, for 1-D/2-D/3-D arrays in C
and F order, non-contiguous views, record arrays and complex numbers; Numba PTX from a file
is typed from its mangled name; what cannot be passed is refused. The host's @cuda.jit and
types (``cuda``, ``nb_types``): numba-cuda's, or numba-cuda-mlir's under
NBJIT_HOST=numba-cuda-mlir (its kernels take arrays as memrefs)."""
from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch") if importlib.util.find_spec("torch") else None  # before Numba's context

import nbjit  # noqa: E402
from nbjit import NbjitArgumentError, NbjitLoadError  # noqa: E402
from conftest import expected_path  # noqa: E402

pytestmark = pytest.mark.gpu


def both(cuda, kernel, sig, grid, block, make_args, check):
    """Run ``kernel`` by Numba and by nbjit on fresh arguments; both must pass ``check``."""
    a = make_args()
    kernel[grid, block](*a)
    cuda.synchronize()
    check(*a)
    k = nbjit.from_numba(kernel, sig)
    b = make_args()
    k[grid, block](*b)
    cuda.synchronize()
    check(*b)
    return k, b


def test_1d_c_arrays_and_scalars(cuda, nb_types):
    types = nb_types

    @cuda.jit
    def axpy(y, x, a, n):
        i = cuda.grid(1)
        if i < n:
            y[i] = a * x[i] + y[i]

    n = 1000
    x = np.arange(n, dtype=np.float32)

    def make():
        return cuda.to_device(np.ones(n, np.float32)), cuda.to_device(x), np.float32(2.0), np.int32(n)

    def check(y, *_):
        np.testing.assert_allclose(y.copy_to_host(), 2 * x + 1)

    sig = (types.float32[::1], types.float32[::1], types.float32, types.int32)
    k, args = both(cuda, axpy, sig, 4, 256, make, check)
    assert "array(float32, 1d, C)" in repr(k)
    cfg = k[4, 256]
    cfg(*args)  # the C path once the dtype was seen
    cfg.fallbacks = 0
    for _ in range(3):
        cfg(*args)
    cuda.synchronize()
    assert cfg.path == expected_path() and cfg.fallbacks == 0
    with pytest.raises(NbjitArgumentError, match="float64 array was passed") as e:
        cfg(cuda.device_array(n, np.float64), args[1], 1.0, n)
    # (numba-cuda names it module.qualname, numba-cuda-mlir by its qualified name)
    assert re.match(rf"kernel '({re.escape(axpy.__module__)}\.)?{re.escape(axpy.__qualname__)}'", str(e.value)), \
        str(e.value)[:200]
    with pytest.raises(NbjitArgumentError, match="host numpy array"):
        cfg(np.zeros(n, np.float32), args[1], 1.0, n)


@pytest.mark.parametrize("order", ["C", "F"])
def test_2d_and_3d_in_either_order(cuda, nb_types, order):
    types = nb_types

    @cuda.jit
    def add2(out, a, b):
        i, j = cuda.grid(2)
        if i < out.shape[0] and j < out.shape[1]:
            out[i, j] = a[i, j] + 2 * b[i, j]

    @cuda.jit
    def scale3(v, s):
        i, j, k = cuda.grid(3)
        if i < v.shape[0] and j < v.shape[1] and k < v.shape[2]:
            v[i, j, k] = v[i, j, k] * s + i - j + k

    rng = np.random.default_rng(0)
    A = np.asarray(rng.random((37, 45)), order=order)
    B = np.asarray(rng.random((37, 45)), order=order)

    def make2():
        return (cuda.to_device(np.zeros((37, 45), order=order)), cuda.to_device(A), cuda.to_device(B))

    def check2(out, *_):
        np.testing.assert_allclose(out.copy_to_host(), A + 2 * B)

    t2 = types.Array(types.float64, 2, order)
    both(cuda, add2, (t2, t2, t2), (3, 3), (16, 16), make2, check2)
    V = np.asarray(rng.random((5, 6, 7)).astype(np.float32), order=order)
    ii, jj, kk = np.indices(V.shape)

    def make3():
        return cuda.to_device(V), np.float32(3.0)

    def check3(v, _):
        np.testing.assert_allclose(v.copy_to_host(), V * 3 + ii - jj + kk, rtol=1e-6)

    both(cuda, scale3, (types.Array(types.float32, 3, order), types.float32), (1, 1, 1), (8, 8, 8), make3, check3)


def test_non_contiguous_view_record_and_complex(cuda, nb_types):
    from nbjit.gpu.host import current_host
    types, from_dtype = nb_types, current_host().module("numpy_support").from_dtype

    @cuda.jit
    def inc(v):
        i = cuda.grid(1)
        if i < v.shape[0]:
            v[i] += 1

    base = np.arange(20, dtype=np.int64)
    whole = []

    def make_view():
        whole.append(cuda.to_device(base))
        return (whole[-1][::3],)

    def check_view(v):
        want = base.copy()
        want[::3] += 1
        np.testing.assert_array_equal(whole[-1].copy_to_host(), want)

    k, _ = both(cuda, inc, (types.Array(types.int64, 1, "A"),), 1, 32, make_view, check_view)
    with pytest.raises(NbjitArgumentError, match="not C-contiguous"):
        nbjit.from_numba(inc, (types.int64[::1],))[1, 32](whole[-1][::3])

    rec = np.dtype([("x", np.float32), ("y", np.int32)])

    @cuda.jit
    def rec_kernel(r, z, out):
        i = cuda.grid(1)
        if i < r.shape[0]:
            r[i].x = r[i].x * 2 + r[i].y
            out[i] = z * (i + 1)

    R = np.zeros(10, rec)
    R["x"], R["y"] = np.arange(10), np.arange(10) * 3

    def make_rec():
        return cuda.to_device(R), np.complex64(1 - 2j), cuda.to_device(np.zeros(10, np.complex64))

    def check_rec(r, z, out):
        got = r.copy_to_host()
        np.testing.assert_allclose(got["x"], R["x"] * 2 + R["y"])
        np.testing.assert_allclose(out.copy_to_host(), (1 - 2j) * (np.arange(10) + 1))

    sig = (types.Array(from_dtype(rec), 1, "C"), types.complex64, types.complex64[::1])
    both(cuda, rec_kernel, sig, 1, 32, make_rec, check_rec)


def test_numba_ptx_from_a_file(cuda, nb_types, tmp_path):
    """Numba PTX written elsewhere (pip's NVVM writes ISA 9.5: newer than a 13.0 driver)
    loads with nbjit.load and is typed from Numba's mangled name (numba-cuda's or
    numba-cuda-mlir's)."""
    types = nb_types

    def saxpy(y, x, a):
        i = cuda.grid(1)
        if i < y.shape[0]:
            y[i] = a * x[i] + y[i]

    ptx, _ = cuda.compile_ptx(saxpy, (types.float32[::1], types.float32[::1], types.float32), cc=(9, 0))
    f = tmp_path / "saxpy.ptx"
    f.write_text(ptx)
    m = nbjit.load(f)
    (name,) = m.kernels
    k = m[name]
    assert [p.type for p in k.params] == ["numba_array", "numba_array", "f32"]
    n = 500
    y = cuda.to_device(np.ones(n, np.float32))
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    k[2, 256](y, x, 0.5)
    cuda.synchronize()
    np.testing.assert_allclose(y.copy_to_host(), 0.5 * np.arange(n) + 1)


def test_what_is_refused(cuda, nb_types):
    types = nb_types

    @cuda.jit(debug=True, opt=False)
    def dbg(x):
        x[0] = 1

    with pytest.raises(NbjitLoadError, match="debug=True"):
        nbjit.from_numba(dbg, (types.int32[::1],))

    @cuda.jit(device=True)
    def dev(x):
        return x + 1

    with pytest.raises(NbjitLoadError, match="device function"):
        nbjit.from_numba(dev, (types.int32,))

    @cuda.jit
    def tup(t, out):
        out[0] = t[0]

    with pytest.raises(NbjitLoadError, match="not tuples"):
        nbjit.from_numba(tup, (types.UniTuple(types.int32, 2), types.int32[::1]))


@pytest.mark.parametrize("rel", ["numba/axpy_plain.ptx", "numba/axpy_lineinfo.ptx"])
def test_committed_numba_ptx_isa_95(cuda, rel):
    """PTX from pip's NVVM 13.5 (ISA 9.5, newer than a CUDA 13.0 driver takes), written by
    tests/data/make_fixtures.py: typed from its mangled name, launched with Numba arrays."""
    from conftest import DATA
    m = nbjit.load(DATA / rel)
    assert nbjit.inspect_ptx((DATA / rel).read_text()).version == (9, 5)
    k = m[m.kernels[0]]
    assert [p.ctype for p in k.params] == ["array(float32, 1d, C)", "array(float32, 1d, C)", "float32", "int32"]
    n = 300
    y = cuda.to_device(np.ones(n, np.float32))
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    k[2, 256](y, x, np.float32(3), n)
    cuda.synchronize()
    np.testing.assert_allclose(y.copy_to_host(), 3 * np.arange(n) + 1)
