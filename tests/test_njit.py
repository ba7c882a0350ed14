"""nbjit kernels, device views and stream handles in @numba.njit code (nbjit.frameworks.njit), on
a CPU: typing (mistakes are TypingErrors naming the parameter), views selecting rows as in
Python, and the launch compiled to one call of the C entry point. Launches: test_gpu_njit.py."""
from __future__ import annotations

import numpy as np
import pytest

import nbjit
from nbjit import DeviceView, StreamHandle

numba = pytest.importorskip("numba", reason="launching from @njit needs Numba core (numba)")
from numba.core.errors import TypingError  # noqa: E402

SRC = r"""
struct triple { int a, b, c; };
extern "C" __global__ void saxpy(float *y, const float *x, float a, int n) {}
extern "C" __global__ void by_value(triple p, int *out) {}
extern "C" __global__ void bits(unsigned u, unsigned long long w) {}
"""


@pytest.fixture(scope="module")
def mod():
    return nbjit.compile(SRC, arch="sm_90", lazy=True)


def view(dtype=np.float32, shape=(100,), data=0x7F0000000000):
    itemsize = np.dtype(dtype).itemsize
    strides, s = [], itemsize
    for n in reversed(shape):
        strides.append(s)
        s *= n
    return DeviceView(data, shape, tuple(reversed(strides)), dtype)


@numba.njit
def launch4(k, y, x, a, n):
    k[(n + 255) // 256, 256](y, x, a, n)


def typing_error(fn, *args) -> str:
    with pytest.raises(TypingError) as e:
        fn(*args)
    return str(e.value)


def test_the_launch_compiles_to_one_call_of_the_c_entry(mod):
    numba.core.entrypoints.init_all()  # (what Numba runs before it compiles: nbjit's types registered)
    k = mod["saxpy"]
    sig = (numba.typeof(k), numba.typeof(view()), numba.typeof(view()), numba.float64, numba.int64)
    launch4.compile(sig)
    ir = launch4.inspect_llvm(sig)
    assert ir.count("call i32 @nbjit_launch(") == 1
    assert "loads on first use" in repr(k)  # typed and compiled from the image: nothing loaded


@pytest.mark.parametrize("args, message", [
    ((view(np.float64), view(), 1.0, 4), r"parameter 0 \(y, pointer\): a float64 device view was passed; the "
                                         r"parameter is float\* and takes float32 arrays"),
    ((view(), view(np.int32), 1.0, 4), r"parameter 1 \(x, pointer\): a int32 device view was passed"),
    ((1.5, view(), 1.0, 4), r"parameter 0 \(y, pointer\): float64 is not a device address"),
    ((view(), view(), view(), 4), r"parameter 2 \(a, .f32\): nbjit.DeviceView\(float32, 1d\) is not a number"),
    ((view(), view(), 1.0, 4.5), None),  # (a float grid: no launch configuration of that kind)
])
def test_typing_errors_name_the_kernel_and_the_parameter(mod, args, message):
    text = typing_error(launch4, mod["saxpy"], *args)
    if message is not None:
        assert "kernel 'saxpy', " in text
        assert __import__("re").search(message, text), text
    else:
        assert "grid must be an int or a tuple of 1 to 3 ints, got float64" in text


def test_the_count_and_the_configuration_are_typed(mod):
    @numba.njit
    def three(k, y):
        k[1, 32](y, y, 1.0)

    assert "kernel 'saxpy' takes 4 arguments, got 3: saxpy(float* y, const float* x, float a, int n)" in \
        typing_error(three, mod["saxpy"], view())

    @numba.njit
    def one_item(k, y):
        k[1](y, y, 1.0, 4)

    assert "launch as kernel[grid, block]" in typing_error(one_item, mod["saxpy"], view())

    @numba.njit
    def by_keyword(k, y):
        k[1, 32](y, y, 1.0, n=4)

    assert "takes its arguments by position" in typing_error(by_keyword, mod["saxpy"], view())


def test_a_parameter_passed_by_its_bytes_is_refused(mod):
    @numba.njit
    def go(k, out):
        k[1, 1](1, out)

    text = typing_error(go, mod["by_value"], view(np.int32))
    assert "parameter 0 (p, 12 bytes, type unknown): it takes its own bytes (triple)" in text


def test_unsigned_parameters_take_integers_and_bools(mod):
    @numba.njit
    def go(k, u, w):
        k[1, 1](u, w)

    numba.core.entrypoints.init_all()
    sig = (numba.typeof(mod["bits"]), numba.int32, numba.uint64)
    go.compile(sig)
    go.compile((numba.typeof(mod["bits"]), numba.boolean, numba.int64))
    assert "a float (float64) was passed; the parameter is an integer (.u32)" in \
        typing_error(go, mod["bits"], 1.5, 2)


@numba.njit
def fields(v):
    return v.data, v.shape, v.strides


def test_views_select_rows_as_in_python():
    v = view(np.float64, (10, 3))

    @numba.njit
    def pick(v):
        return fields(v[2:9:3]), fields(v[-1]), fields(v[::-2]), v.ndim, v.size, len(v)

    rows, last, back, ndim, size, n = pick(v)
    for got, want in ((rows, v[2:9:3]), (last, v[-1]), (back, v[::-2])):
        assert got == (want.data, want.shape, want.strides)
    assert (ndim, size, n) == (2, 30, 10)

    @numba.njit
    def outside(v, i):
        return v[i].data

    with pytest.raises(IndexError):
        outside(v, 10)
    with pytest.raises(IndexError):
        v[10]

    @numba.njit
    def by_float(v):
        return v[1.5]

    assert "a device view takes a row index or a slice of rows" in typing_error(by_float, v)


def test_device_view_takes_device_arrays_and_refuses_host_ones():
    from conftest import DevArray
    a = DevArray(0x1000, (4, 5), "f4", strides=(40, 4))
    v = nbjit.device_view(a)
    assert (v.data, v.shape, v.strides, v.dtype, v.owner) == (0x1000, (4, 5), (40, 4), np.float32, a)
    assert nbjit.device_view(v) is v
    with pytest.raises(nbjit.NbjitArgumentError, match="device_view: a host numpy array"):
        nbjit.device_view(np.zeros(3))
    with pytest.raises(nbjit.NbjitArgumentError, match="one stride per extent"):
        DeviceView(0, (3,), (), np.float32)


def test_stream_handles():
    assert StreamHandle(None).handle == 0 and StreamHandle(0x1234).handle == 0x1234
    assert StreamHandle(StreamHandle(5)).handle == 5
    with pytest.raises(nbjit.NbjitLaunchError, match="a stream handle is an address"):
        StreamHandle(-1)

    @numba.njit
    def handle(s):
        return s.handle

    assert handle(StreamHandle(0x1234)) == 0x1234


def test_errors_come_back_as_nbjit_errors_with_the_python_messages(mod, cpu_entry):
    k = mod["saxpy"]
    y = view()

    @numba.njit
    def go(k, y, n, block):
        k[1, block](y, y, 1.0, n)

    with pytest.raises(nbjit.NbjitArgumentError) as py:
        nbjit.launch.arguments.ArgPacker(k.info.signature, "saxpy").pack((0, 0, 1.0, 2 ** 40))
    with pytest.raises(nbjit.NbjitArgumentError) as njit_err:
        go(k, y, 2 ** 40, 32)
    assert str(njit_err.value) == str(py.value)
    with pytest.raises(nbjit.NbjitLaunchError, match=r"kernel 'saxpy': block values must be from 1 to 2\*\*32 - 1 "
                                                     r"\(got 0\)"):
        go(k, y, 4, 0)
    with pytest.raises(nbjit.NbjitLaunchError, match="the driver's launch entry points are not set"):
        go(k, y, 4, 32)


def test_integers_the_c_entry_cannot_tell_are_checked_in_njit(mod, cpu_entry):
    @numba.njit
    def go(k, u, w):
        k[1, 1](u, w)

    with pytest.raises(nbjit.NbjitArgumentError, match=r"parameter 1 \(w, .u64\): -1 is negative"):
        go(mod["bits"], 1, -1)
    with pytest.raises(nbjit.NbjitArgumentError, match=r"parameter 0 \(u, .u32\): 18446744073709551615 does not "
                                                       r"fit in .u32 \(at most 4294967295\)"):
        go(mod["bits"], np.uint64(2 ** 64 - 1), 1)
    with pytest.raises(nbjit.NbjitLaunchError, match="entry points are not set"):
        go(mod["bits"], np.int32(-1), np.uint64(2 ** 64 - 1))  # (a typed int32's bits; any uint64)


def test_a_kernel_unlike_its_typing_is_refused(mod, cpu_entry):
    """The kernel handed in at run time must take what the njit code was typed for."""
    @numba.njit
    def go(k, y):
        k[1, 32](y, y, 1.0, 4)

    k = mod["saxpy"]
    with pytest.raises(nbjit.NbjitLaunchError, match="entry points are not set"):
        go(k, view())
    from dataclasses import replace
    cpu_entry["saxpy"] = replace(cpu_entry["saxpy"], digest=cpu_entry["saxpy"].digest ^ 1)
    with pytest.raises(nbjit.NbjitLaunchError, match="its loaded image takes other arguments than the njit code"):
        go(k, view())


def test_a_uint64_too_big_for_a_parameter_of_unknown_type(cpu_entry):
    """A cubin's 4-byte parameter of unknown type refuses a uint64 above 2**63 - 1 as the Python
    rules refuse it (in bytes, not as an unsigned type)."""
    from conftest import DATA
    k = nbjit.load(DATA / "nvcc/kernels_sm_90.cubin", lazy=True)["k_basic"]

    @numba.njit
    def go(k, n):
        k[1, 32](0, 0, 1, n)

    with pytest.raises(nbjit.NbjitArgumentError) as py:
        nbjit.launch.arguments.ArgPacker(k.info.signature, "k_basic").pack((0, 0, 1, 2 ** 63))
    with pytest.raises(nbjit.NbjitArgumentError) as njit_err:
        go(k, np.uint64(2 ** 63))
    assert str(njit_err.value) == str(py.value)


FRESH_PROCESS = r'''
import sys
import numba
numba.njit(lambda x: x + 1)(1)  # Numba's first compile loads nbjit's extension
assert "nbjit.frameworks.njit" in sys.modules, "the numba_extensions entry point was not loaded"
stages = [m for m in ("nbjit.gpu.driver", "nbjit.read.ptx", "nbjit.launch.entry", "nbjit.loading.triton")
          if m in sys.modules]
assert not stages, stages
import nbjit
k = nbjit.compile(SRC, arch="sm_90", lazy=True)["saxpy"]

@numba.njit
def closed_over(y):
    k[1, 32](y, y, 2.0)  # (one argument short)

try:
    closed_over(1)
except numba.core.errors.TypingError as e:
    assert "kernel 'saxpy' takes 4 arguments, got 3" in str(e), str(e)
else:
    raise AssertionError("no TypingError")
print("ok")
'''


def test_numba_loads_the_extension_without_nbjits_stages():
    """Numba loads nbjit's extension at its first compile in every process: that imports none
    of nbjit's stages (the driver, PTX reading, the launch path) until njit code meets one of
    nbjit's values, and a kernel met first as a closed-over global is typed as one passed in."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", f"SRC = {SRC!r}\n" + FRESH_PROCESS], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
