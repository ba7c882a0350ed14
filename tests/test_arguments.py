"""Argument packing (nbjit.launch.arguments): every conversion rule and its error, on a CPU; and the C
launch path's fast rules agreeing byte for byte with the Python ones."""
from __future__ import annotations

import ctypes
import dataclasses
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbjit import NbjitArgumentError, inspect_ptx
from nbjit.launch.arguments import ArgPacker
from nbjit.launch.arrays import device_pointer
from nbjit.params.declarations import declare, parse_signature
from nbjit.read.cubin import inspect_cubin

from conftest import DATA  # noqa: E402
KERNELS = inspect_ptx((DATA / "nvcc/kernels_sm90.ptx").read_text())
TRAPS = inspect_ptx((DATA / "hand/traps.ptx").read_text())


def packer(info, name):
    k = info.entry(name)
    return ArgPacker(k.signature, name)


class FakeCAI:
    """Anything with __cuda_array_interface__ (what CuPy and PyTorch offer)."""

    def __init__(self, ptr):
        self.ptr = ptr

    @property
    def __cuda_array_interface__(self):
        return {"data": (self.ptr, False), "shape": (4,), "typestr": "<f4", "version": 3}


def test_pointers_ints_none_and_cai():
    p = packer(KERNELS, "k_basic")
    raw = p.pack((FakeCAI(0x1000), 0x2000, 2.5, 7))
    assert struct.unpack("<QQfI", raw) == (0x1000, 0x2000, 2.5, 7)
    assert struct.unpack("<QQfI", p.pack((None, np.uint64(5), np.float32(1.5), np.int32(3)))) == (0, 5, 1.5, 3)
    assert device_pointer(None) == 0 and device_pointer(123) == 123


@pytest.mark.parametrize("args,msg", [
    ((np.zeros(4, np.float32), 0, 1.0, 1), "parameter 0 .*copy it to the device"),
    (("nope", 0, 1.0, 1), "parameter 0 .*not a device array"),
    ((0, -1, 1.0, 1), "parameter 1 .*"),
    ((0, 0, "x", 1), "parameter 2 .*not a number"),
    ((0, 0, 1e300, 1), "parameter 2 .*overflows"),
    ((0, 0, 1.0, -1), "parameter 3 .*negative.*np.int32"),
    ((0, 0, 1.0, 2 ** 32), "parameter 3 .*does not fit"),
    ((0, 0, 1.0, 1.5), "parameter 3 .*float.*integer"),
    ((0, 0, 1.0, np.float32(3)), "parameter 3 .*float"),
])
def test_errors_name_the_parameter(args, msg):
    with pytest.raises(NbjitArgumentError, match=msg) as e:
        packer(KERNELS, "k_basic").pack(args)
    assert "k_basic" in str(e.value)


def test_count_error_shows_signature():
    with pytest.raises(NbjitArgumentError, match=r"takes 4 arguments, got 2: k_basic\(u64 param_0"):
        packer(KERNELS, "k_basic").pack((0, 0))


def test_numpy_signed_into_unsigned_sends_bits():
    raw = packer(KERNELS, "k_basic").pack((0, 0, 1.0, np.int32(-1)))
    assert raw[-4:] == b"\xff\xff\xff\xff"


class S24(ctypes.Structure):
    _fields_ = [("d", ctypes.c_double), ("i", ctypes.c_int), ("f", ctypes.c_float), ("l", ctypes.c_longlong)]


def test_struct_parameter_forms():
    p = packer(KERNELS, "k_struct")
    want = bytes(S24(1.5, 2, 0.25, 10))
    dt = np.dtype([("d", "<f8"), ("i", "<i4"), ("f", "<f4"), ("l", "<i8")])
    for v in (S24(1.5, 2, 0.25, 10), np.array((1.5, 2, 0.25, 10), dt)[()], want, bytearray(want)):
        assert p.pack((v, 0))[:24] == want
    with pytest.raises(NbjitArgumentError, match="parameter 0 .*exactly 24"):
        p.pack((b"\0" * 20, 0))
    with pytest.raises(NbjitArgumentError, match="parameter 0 .*cannot fill a 24-byte"):
        p.pack((1.0, 0))


def test_half_and_bf16_as_b8_pairs():
    p = packer(KERNELS, "k_small")
    raw = p.pack((np.float16(1.5), b"\x00\x40", True, 3, np.int16(-4), 0))
    assert raw[:2] == np.float16(1.5).tobytes() and raw[2:4] == b"\x00\x40"
    assert raw[4] == 1 and raw[5] == 3 and raw[6:8] == b"\xfc\xff"
    with pytest.raises(NbjitArgumentError, match="np.float16"):
        p.pack((1.5, b"\0\0", True, 3, 4, 0))


def test_every_ptx_type():
    p = packer(TRAPS, "k_all")
    args = (0, 0, 0, None, 255, -128, 65535, -32768, 2 ** 32 - 1, -(2 ** 31), 2 ** 64 - 1, -(2 ** 63), 1.5,
            2.5, 3.5, -1, -1, -1, b"\1" * 12, b"\2" * 40, b"\3" * 24, b"\4" * 16)
    raw = p.pack(args)
    sig = TRAPS.entry("k_all").signature
    off = {q.name: q.offset for q in sig}
    assert raw[off["p_u8"]] == 255 and raw[off["p_s8"]] == 0x80
    assert struct.unpack_from("<e", raw, off["p_f16"])[0] == 1.5
    assert struct.unpack_from("<d", raw, off["p_f64"])[0] == 3.5
    assert raw[off["p_b32"]: off["p_b32"] + 4] == b"\xff" * 4  # untyped bits take either sign
    assert raw[off["p_big"]: off["p_big"] + 40] == b"\2" * 40 and len(raw) == sig.size == 192
    with pytest.raises(NbjitArgumentError, match="p_s8.*does not fit"):
        p.pack(args[:5] + (128,) + args[6:])


def test_bf16_and_pred_rules():
    from nbjit.launch.arguments import _float_to_bf16
    assert _float_to_bf16(1.0) == 0x3F80 and _float_to_bf16(-2.0) == 0xC000
    assert _float_to_bf16(1.00390625) == 0x3F80  # ties to even


def test_cubin_unknown_types():
    info = inspect_cubin((DATA / "nvcc/kernels_sm_90.cubin").read_bytes())
    p = packer(info, "k_basic")
    raw = p.pack((FakeCAI(0x10), 0x20, np.float32(2.0), 5))
    assert struct.unpack("<QQfI", raw) == (0x10, 0x20, 2.0, 5)
    assert struct.unpack("<QQfi", p.pack((0, 0, 2.0, -5)))[2:] == (2.0, -5)  # a Python float is f32 at 4 bytes
    with pytest.raises(NbjitArgumentError, match="4 bytes, type unknown"):
        p.pack((0, 0, "x", 1))


def test_declared_signature():
    info = inspect_cubin((DATA / "nvcc/kernels_sm_90.cubin").read_bytes())
    k = info.entry("k_basic")
    sig = declare(k.signature, "ptr, ptr, f32, i32", "k_basic")
    assert [q.type for q in sig] == ["u64", "u64", "f32", "s32"]
    assert [q.pointer for q in sig] == [True, True, False, False]
    assert ArgPacker(sig, "k_basic").pack((0, 0, 1.0, -3))[-4:] == struct.pack("<i", -3)
    with pytest.raises(NbjitArgumentError, match=r"parameter 2 .*declared type is double, 8 bytes, but the "
                                                 r"parameter takes 4"):
        declare(k.signature, "ptr, ptr, f64, i32", "k_basic")
    with pytest.raises(NbjitArgumentError, match="declaration has 3 parameters, the kernel 4"):
        declare(k.signature, "ptr, ptr, f32", "k_basic")
    with pytest.raises(NbjitArgumentError, match="'flt' is not a type"):
        parse_signature("ptr, flt")
    assert [c.text for c in parse_signature("bytes24, float32, f32*, const double* x, unsigned")] == \
        ["bytes24", "float", "float*", "const double*", "unsigned int"]
    typed = declare(k.signature, "float* y, const float* x, float a, int n", "k_basic")
    assert str(typed) == "(float* y, const float* x, float a, int n)"
    assert [q.pointee for q in typed] == ["float", "float", None, None]


def test_torch_cpu_tensor_is_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(NbjitArgumentError, match="CPU"):
        device_pointer(torch.zeros(3))


# ---------------------------------------------------------------- the C fast rules

try:
    from nbjit.gpu import _launcher as _launch
except ImportError:  # the optional extension is not built here
    _launch = None

needs_c = pytest.mark.skipif(_launch is None, reason="nbjit's C launch extension is not built")


def c_launcher(info, name):
    return c_launcher_for(info.entry(name))


def c_launcher_for(k, tail=0):
    """A C launcher for KernelInfo ``k`` (never launched: no entry point) and its packer; the
    last ``tail`` parameters are not passed (left zero)."""
    from nbjit.launch.arrays import _EXTRACTORS
    from nbjit.launch.launchers import LauncherSpec, _numbers
    p = ArgPacker(k.signature, k.name)
    n = len(k.params) - tail
    layout = tuple((q.offset, *r.code) for q, r in zip(k.params[:n], p.rules)) + \
        tuple((q.offset, "Z") for q in k.params[n:])
    return _launch.Launcher(LauncherSpec(0, (1, 1, 1), (1, 1, 1), 0, 0, layout, k.signature.size, _EXTRACTORS,
                                         _numbers(), p.pack, lambda e: None)), p


def assert_agree(c, p, args) -> None:
    """Whatever the C rules pack, the Python rules pack identically (or C declines)."""
    fast = c.pack_fast(args)
    try:
        want = p.pack(args)
    except NbjitArgumentError:
        want = None
    if fast is not None:
        assert fast == want, (args, fast, want)


scalar = st.one_of(st.integers(-(2 ** 65), 2 ** 65), st.floats(allow_nan=False), st.booleans(),
                   st.sampled_from([np.int32(-1), np.uint32(7), np.int8(-3), np.float32(1.5), np.float64(2.5),
                                    np.int64(2 ** 40), np.float16(0.5), None, "s"]))


@needs_c
@settings(max_examples=500, deadline=None)
@given(args=st.tuples(scalar, scalar, scalar, scalar))
def test_c_rules_agree_with_python(args):
    """Whatever the C rules pack, the Python rules pack identically; what C declines,
    the Python rules decide (and C then calls them)."""
    assert_agree(*c_launcher(KERNELS, "k_basic"), args)


@needs_c
@settings(max_examples=300, deadline=None)
@given(args=st.tuples(*([scalar] * 12)))
def test_c_rules_agree_on_every_width(args):
    assert_agree(*c_launcher(KERNELS, "k_widths"), args[:11])


@needs_c
def test_c_rules_extract_device_arrays():
    from nbjit.launch.arrays import _EXTRACTORS
    c, p = c_launcher(KERNELS, "k_basic")
    a = FakeCAI(0x1234)
    assert c.pack_fast((a, 0, 1.0, 1)) is None or type(a) in _EXTRACTORS  # first sight: Python decides
    device_pointer(a)  # registers the type's extractor
    assert c.pack_fast((a, a, 1.0, 1)) == p.pack((a, a, 1.0, 1))


# ---------------------------------------------------------------- typed pointers: dtype checks

from nbjit.params.declarations import source_declarations  # noqa: E402
from nbjit.params.signature import merge  # noqa: E402

SOURCE = source_declarations((DATA / "src/kernels.cu").read_text())
CUBIN = inspect_cubin((DATA / "nvcc/kernels_sm_90.cubin").read_bytes())


def typed(name, ctypes=None, info=KERNELS):
    return merge(name, [("ptx", info.entry(name))], [("source", ctypes or SOURCE[name])])


class FakeArray:
    """A device array with a dtype, like Numba's and CuPy's (an address, no memory)."""

    def __init__(self, ptr, dtype):
        self.ptr, self.dtype = ptr, np.dtype(dtype)

    @property
    def __cuda_array_interface__(self):
        return {"data": (self.ptr, False), "shape": (4,), "typestr": self.dtype.str, "version": 3}


def typed_packer(name="k_basic", ctypes=None):
    k = typed(name, ctypes)
    return ArgPacker(k.signature, name)


def test_wrong_dtype_is_refused_naming_kernel_parameter_and_types():
    p = typed_packer()
    with pytest.raises(NbjitArgumentError, match=r"kernel 'k_basic', parameter 0 \(y, pointer\): a float64 array "
                                                 r"was passed; the parameter is float\* and takes float32 arrays "
                                                 r"\(to reinterpret .*arr.view"):
        p.pack((FakeArray(0x100, "f8"), FakeArray(0x200, "f4"), 1.0, 4))
    with pytest.raises(NbjitArgumentError, match=r"parameter 1 \(x, pointer\): a int32 array .*const float\*"):
        p.pack((FakeArray(0x100, "f4"), FakeArray(0x200, "i4"), 1.0, 4))
    raw = p.pack((FakeArray(0x100, "f4"), FakeArray(0x200, "f4"), 1.0, -4))
    assert struct.unpack("<QQfi", raw) == (0x100, 0x200, 1.0, -4)  # int n: a signed int, from the source


@pytest.mark.parametrize("pointee,ok,bad", [
    ("float", ["f4"], ["f8", "f2", "i4", "c8"]),
    ("unsigned int", ["u4", "i4"], ["f4", "u8", "i2"]),  # either signedness
    ("char", ["i1", "u1", "?"], ["i2"]),
    ("bool", ["?", "u1", "i1"], ["i4", "f4"]),
    ("float2", ["c8", "i8", [("x", "f4"), ("y", "f4")]], ["f4", "c16"]),  # vectors: item size
    ("thrust::complex<double>", ["c16"], ["f8", "c8", "V16"]),
    ("void", ["f8", "i1", "c16"], []),
    ("Pair", ["f8", "u1"], []),  # a struct nbjit cannot size: anything
])
def test_element_rules(pointee, ok, bad):
    from nbjit.params.cdecl import CParam
    p = typed_packer("k_globals", [CParam(pointee, True)])
    for dt in ok:
        assert p.pack((FakeArray(0x40, dt),)) == struct.pack("<Q", 0x40), dt
    for dt in bad:
        with pytest.raises(NbjitArgumentError, match="array was passed"):
            p.pack((FakeArray(0x40, dt),))


def test_plain_addresses_and_views_are_the_way_around_the_check():
    p = typed_packer()
    assert p.pack((0x100, None, 1.0, 1))[:16] == struct.pack("<QQ", 0x100, 0)
    a = FakeArray(0x100, "f8")
    a.dtype = np.dtype("f4")  # what arr.view(np.float32) gives
    assert p.pack((a, a, 1.0, 1))[:8] == struct.pack("<Q", 0x100)


def test_a_cubin_typed_by_its_mangled_name_checks_dtypes():
    from nbjit.params.cdecl import demangle
    name = "_Z6k_tmplIfEvPT_S0_i"
    k = merge(name, [("cubin", CUBIN.entry(name))], [("mangled name", demangle(name))])
    p = ArgPacker(k.signature, name)
    assert p.pack((FakeArray(0x10, "f4"), 1.5, 3)) == struct.pack("<Qfi", 0x10, 1.5, 3)
    with pytest.raises(NbjitArgumentError, match="float64 array"):
        p.pack((FakeArray(0x10, "f8"), 1.5, 3))


def test_torch_dtypes():
    torch = pytest.importorskip("torch")
    from nbjit.launch.arrays import array_element
    assert array_element(torch.zeros(2, dtype=torch.bfloat16)) == ("bf", 2, "bfloat16")
    assert array_element(torch.zeros(2, dtype=torch.int16))[:2] == ("i", 2)


@needs_c
def test_c_path_checks_dtypes_like_python():
    from nbjit.launch.arrays import _EXTRACTORS
    k = typed("k_basic")
    c, p = c_launcher_for(k)
    good, bad = FakeArray(0x100, "f4"), FakeArray(0x200, "f8")
    device_pointer(good)  # registers FakeArray's extractor
    assert type(good) in _EXTRACTORS
    assert c.pack_fast((good, good, 1.0, 3)) is None  # float32 not seen yet: the Python rule decides...
    want = p.pack((good, good, 1.0, 3))  # ...and remembers it fits
    assert c.pack_fast((good, good, 1.0, 3)) == want
    assert c.pack_fast((bad, good, 1.0, 3)) is None  # declined: Python raises
    with pytest.raises(NbjitArgumentError, match="float64"):
        p.pack((bad, good, 1.0, 3))
    assert c.pack_fast((0x10, None, 1.0, -3)) == struct.pack("<QQfi", 0x10, 0, 1.0, -3)


arrays = st.sampled_from([FakeArray(0x1000, d) for d in ("f4", "f8", "i4", "u4", "f2", "c8", "?")])


@needs_c
@settings(max_examples=400, deadline=None)
@given(args=st.tuples(st.one_of(arrays, scalar), st.one_of(arrays, scalar), scalar, scalar))
def test_c_and_python_agree_on_typed_pointers(args):
    c, p = c_launcher_for(typed("k_basic"))
    for _ in range(2):  # before and after the Python rules have accepted a dtype
        assert_agree(c, p, args)


@needs_c
@settings(max_examples=400, deadline=None)
@given(args=st.tuples(*([scalar] * 11)))
def test_c_and_python_agree_on_unknown_types(args):
    """Cubin parameters of unknown type (sizes 1, 2, 4, 8): same bytes or a decline."""
    assert_agree(*c_launcher_for(CUBIN.entry("k_widths")), args)


@needs_c
def test_unknown_types_take_the_c_path():
    c, p = c_launcher_for(CUBIN.entry("k_basic"))
    for args in [(0x10, 0x20, 2.0, 5), (0x10, 0x20, np.float32(2.0), np.int32(-5)), (0x10, 0x20, 1.5, 2 ** 32 - 1)]:
        assert c.pack_fast(args) == p.pack(args), args


@needs_c
def test_c_launcher_leaves_trailing_z_parameters_zero():
    """Triton's NULL scratch pointers: not passed, packed as zeros."""
    from nbjit.launch.arrays import _EXTRACTORS
    from nbjit.launch.launchers import LauncherSpec, _numbers
    z, p = c_launcher_for(typed("k_basic"), tail=2)
    assert z.pack_fast((0x10, 0x20)) == struct.pack("<QQfi", 0x10, 0x20, 0.0, 0)
    assert z.pack_fast((0x10, 0x20, 1.0, 1)) is None  # the count is the passed parameters'
    with pytest.raises(ValueError, match="'Z' parameters must come last"):
        _launch.Launcher(LauncherSpec(0, (1, 1, 1), (1, 1, 1), 0, 0, ((0, "Z"), (8, "P")), 16, _EXTRACTORS,
                                      _numbers(), p.pack, lambda e: None))


@needs_c
def test_c_launcher_spec_is_checked_by_name():
    """The C Launcher is made from one spec: what is missing or malformed is named."""
    import types

    from nbjit.launch.arrays import _EXTRACTORS
    from nbjit.launch.launchers import LauncherSpec, _numbers
    k = typed("k_basic")
    p = ArgPacker(k.signature, k.name)
    layout = p.c_layout
    spec = LauncherSpec(0x10, (4, 1, 1), (256, 1, 1), 0, 0, layout, k.signature.size, _EXTRACTORS, _numbers(),
                        p.pack, lambda e: None)
    c = _launch.Launcher(spec)
    assert c.pack_fast((0x10, 0x20, 1.0, 3)) == p.pack((0x10, 0x20, 1.0, 3))
    partial = types.SimpleNamespace(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
                                       if f.name != "on_error"})
    with pytest.raises(TypeError, match="a launcher spec needs the attribute on_error"):
        _launch.Launcher(partial)
    for field, bad, msg in (("grid", (4, 1), "grid must be a tuple of 3 ints"),
                            ("block", (1 << 32, 1, 1), "does not fit"),
                            ("size", 1 << 20, "parameter buffer size out of range"),
                            ("layout", [(0, "P")], "layout must be a tuple"),
                            ("layout", ((0, "PP"),), "bad layout entry"),
                            ("layout", ((64, "P"),), "bad layout entry"),
                            ("param_offsets", (0, 99), "parameter offset out of range"),
                            ("numbers", [], "extractors and numbers must be dicts"),
                            ("fallback", None, "fallback and on_error must be callable"),
                            ("attributes", b"x" * 71, "up to 4 blocks of 72 bytes")):
        with pytest.raises((TypeError, ValueError, OverflowError), match=msg):
            _launch.Launcher(dataclasses.replace(spec, **{field: bad}))
    with pytest.raises(TypeError, match="one spec"):
        _launch.Launcher(spec, stream=0)


@pytest.mark.parametrize("base", ["c", "python"])
def test_kernel_indexing_bases(base):
    """kernel[config] looks in _configs, and calls _configure_cached on a miss or an
    unhashable config, in C and in Python alike."""
    from nbjit.launch.kernel import _PyIndexing
    if base == "c" and _launch is None:
        pytest.skip("nbjit's C launch extension is not built")
    Base = _launch.KernelBase if base == "c" else _PyIndexing

    class K(Base):
        __slots__ = ("made",)

        def __init__(self):
            self._configs = {}
            self.made = []

        def _configure_cached(self, config):
            self.made.append(config)
            try:
                self._configs[config] = ("launcher", config)
            except TypeError:
                pass
            return ("launcher", config)

    k = K()
    assert k[4, 256] == ("launcher", (4, 256)) and k[4, 256] == ("launcher", (4, 256))
    assert k.made == [(4, 256)]
    assert k[[4], 256] == ("launcher", ([4], 256)) and len(k.made) == 2  # unhashable: configured each time


# ------------------------------------------------------------------ DLPack


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLPackTensor:
    """A producer of DLPack capsules as the standard lays them out (DLManagedTensor, capsule
    name "dltensor"): the tensor a CUDA library would hand over, at a made-up address."""

    def __init__(self, data, device_type=2, code=2, bits=32, lanes=1, offset=0, shape=(16,)):
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._managed = _DLManaged(_DLTensor(data, device_type, 0, len(shape), code, bits, lanes,
                                             ctypes.cast(self._shape, ctypes.c_void_p), None, offset), None, None)
        self.device_type = device_type
        self.calls = 0

    def __dlpack__(self, stream=None):
        self.calls += 1
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
        return new(ctypes.addressof(self._managed), b"dltensor", None)

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __array__(self):  # (as JAX arrays have: DLPack must come first)
        raise AssertionError("nbjit must not copy a DLPack tensor to the host")


def test_dlpack_tensors_pass_for_pointers():
    from nbjit.launch.arrays import array_element
    t = DLPackTensor(0x7F0000001000, offset=256)
    assert device_pointer(t) == 0x7F0000001100 and t.calls == 1
    assert array_element(t) == ("f", 4, "float32")
    assert array_element(DLPackTensor(0x1000, code=4, bits=16)) == ("bf", 2, "bfloat16")
    assert array_element(DLPackTensor(0x1000, code=1, bits=8)) == ("i", 1, "uint8")
    assert device_pointer(DLPackTensor(0x2000, device_type=13)) == 0x2000  # managed memory


def test_dlpack_tensor_types_are_checked_against_the_pointee():
    k = typed("k_basic")  # y: float*, x: const float*
    p = ArgPacker(k.signature, k.name)
    good = DLPackTensor(0x7F0000001000)
    assert p.pack((good, good, 1.0, 4))[:8] == struct.pack("<Q", 0x7F0000001000)
    with pytest.raises(NbjitArgumentError, match="int32"):
        p.pack((DLPackTensor(0x1000, code=0, bits=32), good, 1.0, 4))


def test_a_dlpack_tensor_off_the_gpu_is_refused_saying_where_it_is():
    with pytest.raises(NbjitArgumentError, match="the CPU.*pass one on the GPU"):
        device_pointer(DLPackTensor(0x1000, device_type=1))
    with pytest.raises(NbjitArgumentError, match="pinned host memory"):
        device_pointer(DLPackTensor(0x1000, device_type=3))


class JaxLike(DLPackTensor):
    """As a JAX array is: __cuda_array_interface__ on the GPU, a property that raises
    AttributeError for an array on the CPU, and DLPack either way."""

    @property
    def __cuda_array_interface__(self):
        if self.device_type != 2:
            raise AttributeError("__cuda_array_interface__ is only defined for GPU buffers.")
        return {"data": (0x7F0000002000, True), "shape": (16,), "typestr": "<f4", "version": 3}


def test_an_array_whose_interface_raises_is_refused_saying_where_it_is():
    """An array type taken once for its __cuda_array_interface__ whose property raises for
    one instance (JAX's on the CPU) gets nbjit's error saying where its memory is, never the
    property's AttributeError; an interface that fails otherwise is named."""
    assert device_pointer(JaxLike(0x1000)) == 0x7F0000002000
    with pytest.raises(NbjitArgumentError, match="the CPU.*pass one on the GPU"):
        device_pointer(JaxLike(0x1000, device_type=1))
    k = typed("k_basic")
    p = ArgPacker(k.signature, k.name)
    with pytest.raises(NbjitArgumentError, match="the CPU"):
        p.pack((JaxLike(0x1000, device_type=1), JaxLike(0x1000), 1.0, 4))

    class Broken:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("no context")
    with pytest.raises(NbjitArgumentError, match=r"Broken.__cuda_array_interface__ failed: no context"):
        device_pointer(Broken())


def test_nbjit_handles_fill_64_bit_parameters_through_the_python_rules():
    """An nbjit handle (a graph condition) gives its value and learns which parameter took it;
    the C rules leave it to these."""
    from nbjit.launch.arrays import _HANDLES, register_handle

    class Handle:
        pass

    seen = []
    register_handle(Handle, lambda v, param: seen.append(param.offset) or 0x51)
    try:
        raw = packer(KERNELS, "k_basic").pack((0, Handle(), 1.0, 1))  # (its second parameter: .u64 at byte 8)
        assert struct.unpack("<QQfI", raw)[1] == 0x51 and seen == [8]
    finally:
        del _HANDLES[Handle]
