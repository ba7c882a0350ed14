"""The C entry point's ABI (nbjit.launch.entry; nbjit_pack and nbjit_launch in gpu/_launcher.c),
on a CPU: arguments in their classes' forms pack into the bytes the Python rules pack, and every
refusal carries the Python rules' message, word for word."""
from __future__ import annotations

import ctypes

import pytest

import nbjit
from nbjit import NbjitArgumentError, NbjitLaunchError
from nbjit.launch.arguments import ArgPacker
from nbjit.launch.config import LaunchConfig
from nbjit.launch.entry import entry_args, entry_facts, entry_launcher
from nbjit.gpu import extension

pytestmark = pytest.mark.skipif(extension.extension() is None, reason="nbjit's C extension is not built")

SRC = r"""
extern "C" __global__ void k(float *y, const float *x, float a, double b, int n, unsigned m, unsigned char c,
                             long long q, unsigned long long u, short h) {}
"""
LIMITS = (0, 1024, 232448, 1024)  # context, static shared, the opt-in limit, threads per block
C = ctypes
PACK = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_void_p), C.c_int64, C.c_void_p, C.c_char_p, C.c_int64)
LAUNCH = C.CFUNCTYPE(C.c_int, C.c_void_p, C.POINTER(C.c_int64), C.c_int, C.c_void_p, C.POINTER(C.c_void_p),
                     C.c_int64, C.c_char_p, C.c_int64)


@pytest.fixture(scope="module")
def info():
    return nbjit.compile(SRC, arch="sm_90", lazy=True)["k"].info


def entry(info, label="k", tail=0):
    packer = ArgPacker(info.signature, label)
    return entry_launcher(info, packer, packer.c_layout, 0, entry_facts(info, label, LIMITS, tail), tail)


def forms(info, values) -> list:
    """Python values in their classes' C forms (entry_args says which)."""
    out = []
    for a, v in zip(entry_args(info, "k"), values):
        if a.kind == "float":
            out.append(C.c_double(v))
        elif a.type in ("u64", "ptr"):
            out.append(C.c_uint64(v))
        else:
            out.append(C.c_int64(v))
    return out


def c_pack(launcher, info, cvalues, n=None):
    pack = PACK(extension.extension().entry_points()["pack"])
    args = (C.c_void_p * max(1, len(cvalues)))(*[C.addressof(v) for v in cvalues])
    buf = (C.c_char * info.param_size)()
    msg = C.create_string_buffer(1024)
    status = pack(id(launcher), args, len(cvalues) if n is None else n, buf, msg, 1024)
    return status, bytes(buf), msg.value.decode()


GOOD = [0x7F0000001000, 0x7F0000002000, 2.5, -1.25, -7, 4_000_000_000, 255, -(2 ** 40), 2 ** 64 - 1, -3]


def test_the_arguments_classes(info):
    assert [(a.kind, a.type) for a in entry_args(info, "k")] == [
        ("pointer", "ptr"), ("pointer", "ptr"), ("float", "f32"), ("float", "f64"), ("int", "s32"), ("int", "u32"),
        ("int", "u8"), ("int", "s64"), ("pointer", "u64"), ("int", "s16")]


def test_packs_what_the_python_rules_pack(info):
    launcher = entry(info)
    status, data, msg = c_pack(launcher, info, forms(info, GOOD))
    assert status == 0, msg
    assert data == ArgPacker(info.signature, "k").pack(tuple(GOOD))


@pytest.mark.parametrize("index, value", [(4, 2 ** 40), (4, -(2 ** 31) - 1), (5, -1), (5, 2 ** 32), (6, 256),
                                          (9, 40_000), (2, 1e39), (2, -3.5e38)])
def test_refusals_say_what_the_python_rules_say(info, index, value):
    bad = list(GOOD)
    bad[index] = value
    with pytest.raises(NbjitArgumentError) as py:
        ArgPacker(info.signature, "k").pack(tuple(bad))
    status, _, msg = c_pack(entry(info), info, forms(info, bad))
    assert status == 1 and msg == str(py.value)


def test_a_wrong_count_and_a_null_argument(info):
    launcher = entry(info)
    with pytest.raises(NbjitArgumentError) as py:
        ArgPacker(info.signature, "k").pack(tuple(GOOD[:3]))
    status, _, msg = c_pack(launcher, info, forms(info, GOOD[:3]))
    assert status == 1 and msg == str(py.value)
    pack = PACK(extension.extension().entry_points()["pack"])
    values = forms(info, GOOD)  # (alive while args points to them)
    args = (C.c_void_p * 10)(*[C.addressof(v) for v in values])
    args[3] = None
    msg = C.create_string_buffer(200)
    assert pack(id(launcher), args, 10, (C.c_char * 128)(), msg, 200) == 1
    assert msg.value.decode() == "kernel 'k', parameter 3 (b, .f64): no value (its args[] entry is NULL)"


def test_a_message_is_cut_to_its_buffer(info):
    pack = PACK(extension.extension().entry_points()["pack"])
    msg = C.create_string_buffer(b"\xff" * 16)
    launcher = entry(info)
    assert pack(id(launcher), (C.c_void_p * 1)(), 0, (C.c_char * 128)(), msg, 16) == 1
    assert msg.raw[15] == 0 and msg.value.decode() == "kernel 'k' take"


@pytest.mark.parametrize("grid, block, shared", [(0, 32, 0), ((4, 0), 32, 0), (1, (2 ** 32,), 0), (1, 32, -1),
                                                 (1, (32, 1, 1), 300_000)])
def test_the_launch_configuration_is_checked_as_in_python(info, grid, block, shared):
    """Checked before anything reaches the driver (here there is none)."""
    with pytest.raises(NbjitLaunchError) as py:
        LaunchConfig.make(grid, block, None, shared, kernel="k")
        raise NbjitLaunchError(f"kernel 'k': {shared} bytes of dynamic shared memory plus {LIMITS[1]} static exceed "
                               f"the {LIMITS[2]} bytes a block can have on this device")
    g = (grid,) if isinstance(grid, int) else grid
    b = (block,) if isinstance(block, int) else block
    dims = (C.c_int64 * 7)(*(g + (1,) * (3 - len(g))), *(b + (1,) * (3 - len(b))), shared)
    written = (4 if isinstance(grid, int) else len(g)) | (4 if isinstance(block, int) else len(b)) << 3
    values = forms(info, GOOD)  # (alive while args points to them)
    args = (C.c_void_p * 10)(*[C.addressof(v) for v in values])
    msg = C.create_string_buffer(1024)
    launch = LAUNCH(extension.extension().entry_points()["launch"])
    launcher = entry(info)
    assert launch(id(launcher), dims, written, None, args, 10, msg, 1024) == 2
    assert msg.value.decode() == str(py.value)


def test_without_the_driver_nothing_launches(info):
    dims = (C.c_int64 * 7)(1, 1, 1, 32, 1, 1, 0)
    values = forms(info, GOOD)  # (alive while args points to them)
    args = (C.c_void_p * 10)(*[C.addressof(v) for v in values])
    msg = C.create_string_buffer(1024)
    launch = LAUNCH(extension.extension().entry_points()["launch"])
    launcher = entry(info)
    status = launch(id(launcher), dims, 0, None, args, 10, msg, 1024)
    assert status == 2 and "launch entry points are not set" in msg.value.decode(), msg.value
    assert launch(None, dims, 0, None, args, 10, msg, 1024) == 2
    assert msg.value.decode().startswith("nbjit: not a kernel's C entry")


def test_a_tail_left_zero(info):
    """Triton's scratch pointers: the last parameters are not passed and stay zero."""
    launcher = entry(info, tail=2)
    status, data, msg = c_pack(launcher, info, forms(info, GOOD[:8]))
    assert status == 0, msg
    assert data == ArgPacker(info.signature, "k").pack(tuple(GOOD[:8]) + (0, 0))


def test_array_parameters_take_views():
    numba_abi = pytest.importorskip("test_numba_abi")
    from numba import types
    from conftest import DevArray
    from nbjit.launch.arrays import device_pointer
    info, packer = numba_abi.packer_for((types.float32[:, ::1], types.int32))
    launcher = entry_launcher(info, packer, packer.c_layout, 0, entry_facts(info, packer.kernel, LIMITS))
    for shape, strides in (((3, 4), (16, 4)), ((3, 4), (32, 4)), ((2, 2), (8, 8))):
        a = DevArray(0x1000, shape, "f4", strides=strides)
        device_pointer(a)
        view = (C.c_int64 * 6)(0x1000, 2, *shape, *strides)
        status, data, msg = c_pack(launcher, info, [view, C.c_int64(5)])
        try:
            want = packer.pack((a, 5))
        except NbjitArgumentError as e:
            assert status == 1 and msg == str(e)
        else:
            assert status == 0 and data == want
    status, _, msg = c_pack(launcher, info, [(C.c_int64 * 4)(0x1000, 1, 4, 4), C.c_int64(5)])
    assert status == 1 and msg.endswith("a 1-d array was passed; the parameter is array(float32, 2d, C)")


def test_memref_parameters_take_views_in_bytes():
    """numba-cuda-mlir's kernels take memrefs (strides in items): a view's byte strides are
    divided, and strides that are not whole items are refused with the Python rules' words."""
    mlir_abi = pytest.importorskip("test_mlir_abi")
    from conftest import DevArray
    from nbjit.launch.arrays import device_pointer
    from nbjit.params.numba_abi import NumbaArray
    info, packer = mlir_abi.packer_for((NumbaArray(mlir_abi.F32, 2, "A", model="mlir"),))
    launcher = entry_launcher(info, packer, packer.c_layout, 0, entry_facts(info, packer.kernel, LIMITS))
    for strides in ((32, 8), (30, 4)):
        a = DevArray(0x2000, (3, 4), "f4", strides=strides)
        device_pointer(a)
        status, data, msg = c_pack(launcher, info, [(C.c_int64 * 6)(0x2000, 2, 3, 4, *strides)])
        try:
            want = packer.pack((a,))
        except NbjitArgumentError as e:
            assert status == 1 and msg == str(e)
        else:
            assert status == 0 and data == want


def test_floats_round_as_struct_packs_them(info):
    """A double just above the largest float rounds down to it (struct.pack's rule); one that
    rounds to infinity is refused."""
    launcher = entry(info)
    for a in (3.4028234663852886e38 + 5e30, -3.4028234663852886e38 - 5e30, float("inf"), float("nan")):
        values = list(GOOD)
        values[2] = a
        status, data, msg = c_pack(launcher, info, forms(info, values))
        assert status == 0, msg
        assert data == ArgPacker(info.signature, "k").pack(tuple(values))


@pytest.mark.parametrize("value", [2 ** 32 - 1, -(2 ** 31), 2 ** 32, -(2 ** 31) - 1])
def test_parameters_of_unknown_type_take_either_sign(value):
    """A cubin's parameters (sizes only): a 4-byte one takes the bits of any 32-bit integer."""
    from conftest import DATA
    info = nbjit.load(DATA / "nvcc/kernels_sm_90.cubin", lazy=True)["k_basic"].info
    assert [p.type for p in info.params] == ["unknown"] * 4
    packer = ArgPacker(info.signature, "k_basic")
    launcher = entry_launcher(info, packer, packer.c_layout, 0, entry_facts(info, "k_basic", LIMITS))
    values = [0x1000, 0x2000, 7, value]
    cvalues = [C.c_int64(v) for v in values]
    status, data, msg = c_pack(launcher, info, cvalues)
    try:
        want = packer.pack(tuple(values))
    except NbjitArgumentError as e:
        assert status == 1 and msg == str(e)
    else:
        assert status == 0 and data == want
