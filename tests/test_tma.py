"""Tensor maps without a GPU: the driver's rules checked before it is called (each breach
names the rule and the axis), the arguments handed to cuTensorMapEncodeTiled, and which
parameters take a tensor map. Encoding and TMA copies are tested on the GPU (test_gpu_tma.py)."""
from __future__ import annotations

import numpy as np
import pytest

import nbjit
from nbjit import NbjitArgumentError
from nbjit.launch import arguments as args
from nbjit.params import declarations
from nbjit.params import signature
from nbjit.params import cdecl
from nbjit.launch.tma import plan_for_array
from nbjit.launch.tma import TensorMap, plan_tiled

from conftest import DATA  # noqa: E402

A = 0x7F0000000000  # a device address, 256-aligned


def test_a_plan_in_the_drivers_order():
    p = plan_tiled(A, (100, 72), None, np.float32, (32, 16), swizzle="64B", l2_promotion="128B", oob_fill="nan")
    assert (p.data_type, p.rank, p.dims, p.strides, p.box, p.element_strides) == \
        ("FLOAT32", 2, (72, 100), (288,), (16, 32), (1, 1))
    assert (p.interleave, p.swizzle, p.l2_promotion, p.oob_fill) == ("NONE", "64B", "L2_128B", "NAN_REQUEST_ZERO_FMA")
    p3 = plan_tiled(A, (4, 8, 16), (1024, 128, 2), np.uint16, (2, 4, 8), element_strides=(1, 2, 1))
    assert p3.dims == (16, 8, 4) and p3.strides == (128, 1024) and p3.element_strides == (1, 2, 1)
    assert p3.data_type == "UINT16"
    assert plan_tiled(A, (64,), None, np.int8, (16,)).data_type == "UINT8"


@pytest.mark.parametrize("kw, match", [
    (dict(shape=(2, 2, 2, 2, 2, 2), box=(1,) * 6), "6 dimensions; a tensor map has 1 to 5"),
    (dict(dtype=np.complex64), "arrays of complex64 cannot be described"),
    (dict(address=A + 8), "not 16-byte aligned"),
    (dict(shape=(100, 70)), r"axis 0 has a stride of 280 bytes; .* multiples of 16 .* pad rows"),
    (dict(strides=(288, 8)), r"the last axis \(axis 1\) must be contiguous"),
    (dict(shape=(0, 72)), "axis 0 has 0 elements"),
    (dict(box=(32, 300)), r"box\[1\] = 300; a box side is 1 to 256"),
    (dict(box=(32, 6)), "6 x 4 = 24 bytes; without interleave it must be a multiple of 16"),
    (dict(box=(32,)), "box must be 2 integers"),
    (dict(element_strides=(1, 9)), r"element_strides\[1\] = 9"),
    (dict(swizzle="32B", box=(32, 16)), "swizzle '32B' takes a box whose last axis spans at most 32 bytes; it "
                                        "spans 64"),
    (dict(swizzle="16B"), "swizzle must be one of"),
    (dict(interleave="32B"), "interleave '32B' needs an array of 3 or more dimensions"),
    (dict(dtype=np.int32, oob_fill="nan"), "oob_fill 'nan' is for floating-point arrays"),
    (dict(l2_promotion="512B"), "l2_promotion must be one of"),
    (dict(swizzle=["64B"]), r"swizzle must be one of 'none', '32B', '64B', '128B' \(or None\), got \['64B'\]"),
    (dict(interleave={"16B": 1}), r"interleave must be one of .*, got \{'16B': 1\}"),
    (dict(l2_promotion=bytearray(b"64B")), "l2_promotion must be one of"),
    (dict(oob_fill=set()), r"oob_fill must be one of 'zero', 'nan' \(or None\), got set\(\)"),
])
def test_each_rule_breach_names_rule_and_axis(kw, match):
    a = dict(address=A, shape=(100, 72), strides=None, dtype=np.float32, box=(32, 32))
    a.update(kw)
    opts = {k: a.pop(k) for k in ("element_strides", "swizzle", "interleave", "oob_fill", "l2_promotion") if k in a}
    with pytest.raises(NbjitArgumentError, match=match):
        plan_tiled(a["address"], a["shape"], a["strides"], a["dtype"], a["box"], **opts)


def test_interleaved_rules():
    shape, box = (4, 16, 64), (1, 4, 16)  # 16 uint16 = 32 bytes innermost
    with pytest.raises(NbjitArgumentError, match="interleave '32B' needs swizzle '32B'"):
        plan_tiled(A, shape, None, np.uint16, box, interleave="32B")
    with pytest.raises(NbjitArgumentError, match="not 32-byte aligned"):
        plan_tiled(A + 16, shape, None, np.uint16, box, interleave="32B", swizzle="32B")
    p = plan_tiled(A, shape, None, np.uint16, box, interleave="32B", swizzle="32B")
    assert p.interleave == "32B" and p.swizzle == "32B"


def test_the_binding_takes_the_arguments_as_built():
    """cuda.bindings converts cuTensorMapEncodeTiled's arguments before it loads the driver,
    so a wrong Python type shows here without a GPU (its size lists refuse plain ints)."""
    cu = pytest.importorskip("cuda.bindings.driver")
    from nbjit.gpu.driver import tensor_map_call
    for p in (plan_tiled(A, (100, 72), None, np.float32, (32, 16), swizzle="64B", oob_fill="nan"),
              plan_tiled(A, (4, 8, 16), (1024, 128, 2), np.uint16, (2, 4, 8), element_strides=(1, 2, 1))):
        call = tensor_map_call(cu, p)
        assert [int(x) for x in call[3]] == list(p.dims) and [int(x) for x in call[5]] == list(p.box)
        try:
            cu.cuTensorMapEncodeTiled(*call)
        except TypeError as e:
            pytest.fail(f"the binding refused the arguments: {e}")
        except Exception:  # no driver on this machine: the arguments were converted first
            pass


class FakeDeviceArray:
    """An object with __cuda_array_interface__ (as CuPy's and torch's), no GPU behind it."""

    def __init__(self, shape, dtype, ptr=A, strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": np.dtype(dtype).str, "data": (ptr, False),
                                         "strides": strides, "version": 3}


def test_plan_read_from_the_array_interface():
    p = plan_for_array(FakeDeviceArray((50, 136), np.uint16), (16, 64), oob_fill="zero")
    assert p.dims == (136, 50) and p.strides == (272,) and p.box == (64, 16) and p.address == A
    with pytest.raises(NbjitArgumentError, match="ndarray is not a device array"):
        plan_for_array(np.zeros((4, 4), np.float32), (4, 4))


def _interface(**change):
    cai = {"shape": (100, 72), "typestr": "<f4", "data": (A, False), "strides": None, "version": 3}
    cai.update(change)
    return {k: v for k, v in cai.items() if v is not _DROP}


_DROP = object()


class Exported:
    """A plain object carrying an array interface dict, as it is given."""

    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


@pytest.mark.parametrize("cai, match", [
    ([("shape", (4,))], "__cuda_array_interface__ must be a dict, not list"),
    (_interface(data=(None, False)), "the array's address None is not a device address \\(a whole number"),
    (_interface(data=(-A, False)), f"the array's address {-A} is not a device address"),
    (_interface(data=(2 ** 80, False)), "the array's address 1208925819614629174706176 is not"),
    (_interface(data=(0, False)), "the array's address 0 is not"),
    (_interface(data=(float(A), False)), f"the array's address {float(A)} is not"),
    (_interface(data=(A,)), "'data' must be \\(address, read-only flag\\)"),
    (_interface(data=A), "'data' must be \\(address, read-only flag\\)"),
    (_interface(data=(A, "no")), "the flag is 'no', not True or False"),
    (_interface(shape=_DROP), "'shape' is missing"),
    (_interface(typestr=_DROP), "'typestr' is missing"),
    (_interface(data=_DROP), "'data' is missing"),
    (_interface(version=_DROP), "'version' is missing"),
    (_interface(version=4), "'version' is 4; nbjit reads versions 0 to 3"),
    (_interface(version="3"), "'version' is '3'"),
    (_interface(version=True), "'version' is True"),
    (_interface(mask=object()), "'mask' is set: a masked array cannot be described"),
    (_interface(shape="ab"), "'shape' must be a tuple of whole numbers, got 'ab'"),
    (_interface(shape=100), "'shape' must be a tuple"),
    (_interface(shape=(100.5, 72)), "the shape must be integers, got \\(100.5, 72\\)"),
    (_interface(shape=(100.0, 72)), "the shape must be integers"),
    (_interface(shape=(True, 72)), "the shape must be integers"),
    (_interface(shape=(2,) * 100, strides=None), "the shape has more than 64 entries"),
    (_interface(strides=()), "strides \\(bytes, one per axis\\) must be 2 integers .* got 0"),
    (_interface(strides=(288, 4, 4)), "must be 2 integers .* got 3"),
    (_interface(strides=(288.0, 4)), "strides .* must be 2 integers"),
    (_interface(strides="288"), "'strides' must be None or a tuple"),
    (_interface(typestr="zz"), "'typestr' is 'zz', not a type string such as '<f4'"),
    (_interface(typestr="f4"), "'typestr' is 'f4', not a type string"),
    (_interface(typestr=4), "'typestr' is 4"),
    (_interface(typestr="<q9"), "'<q9' is not a numpy dtype"),
    (_interface(typestr="<f4" * 1000), "not a type string"),
    (_interface(typestr=">f4"), "the elements are >f4 \\(big-endian\\), not in the GPU's byte order"),
    (_interface(typestr="<c8"), "arrays of complex64 cannot be described"),
    (_interface(typestr="|O8"), "arrays of object cannot be described"),
])
def test_a_malformed_array_interface_is_an_argument_error_before_the_driver(cai, match):
    with pytest.raises(NbjitArgumentError, match=match):
        plan_for_array(Exported(cai), (32, 32))


@pytest.mark.parametrize("box, element_strides, match", [
    ((32.5, 32), None, "box must be 2 integers, got \\(32.5, 32\\)"),
    ((32.0, 32), None, "box must be 2 integers"),
    (("32", 32), None, "box must be 2 integers"),
    ((32, 32), (1, 1.5), "element_strides must be 2 integers"),
    (32.0, None, "box must be 2 integers"),
])
def test_a_fractional_box_is_refused_not_truncated(box, element_strides, match):
    with pytest.raises(NbjitArgumentError, match=match):
        plan_for_array(Exported(_interface()), box, element_strides=element_strides)


def test_plan_tiled_checks_what_it_is_given():
    for address in (-A, 2 ** 80, 0, float(A), None):
        with pytest.raises(NbjitArgumentError, match="is not a device address"):
            plan_tiled(address, (100, 72), None, np.float32, (32, 32))
    with pytest.raises(NbjitArgumentError, match="must be 2 integers"):
        plan_tiled(A, (100, 72), (288, 4, 4), np.float32, (32, 32))
    with pytest.raises(NbjitArgumentError, match="is not a numpy dtype"):
        plan_tiled(A, (100, 72), None, "nonsense", (32, 32))
    with pytest.raises(NbjitArgumentError, match="big-endian"):
        plan_tiled(A, (100, 72), None, ">f4", (32, 32))


@pytest.mark.parametrize("typestr, data_type", [
    ("|u1", "UINT8"), ("|i1", "UINT8"), ("|b1", "UINT8"), ("<u2", "UINT16"), ("<i2", "UINT16"),
    ("<u4", "UINT32"), ("<i4", "INT32"), ("<u8", "UINT64"), ("<i8", "INT64"), ("<f2", "FLOAT16"),
    ("<f4", "FLOAT32"), ("<f8", "FLOAT64"), ("=f4", "FLOAT32"), (">u1", "UINT8")])
def test_every_supported_typestr(typestr, data_type):
    size = np.dtype(typestr).itemsize
    for version in range(4):
        for readonly in (False, True, np.bool_(True)):
            cai = _interface(typestr=typestr, version=version, data=(np.uint64(A), readonly), shape=[64, 128],
                             strides=[128 * size, size], mask=None)
            p = plan_for_array(Exported(cai), (16, 64 // size))
            assert (p.data_type, p.address, p.dims, p.strides) == (data_type, A, (128, 64), (128 * size,))


def _tma_kernel_signatures():
    """The TMA fixture source compiled by NVRTC, as PTX and as a cubin: both typed."""
    src = (DATA / "src/tma.cu").read_text()
    exprs = ["tma_tile<float, 32, 32>"]
    ptx = nbjit.compile_image(src, name_expressions=exprs, arch="sm_90", output="ptx")
    cub = nbjit.compile_image(src, name_expressions=exprs, arch="sm_90", output="cubin")
    real = cub.lowered_names[exprs[0]]
    pe = nbjit.inspect_ptx(ptx.data).entry(real)
    ce = nbjit.inspect_cubin(cub.data).entries[0]
    return real, pe, ce


def test_ptx_and_cubin_agree_though_the_cubin_pads_before_a_64_aligned_parameter():
    real, pe, ce = _tma_kernel_signatures()
    assert [(p.offset, p.size) for p in pe.params] == [(0, 128), (128, 8), (136, 4)]
    assert [(p.offset, p.size) for p in ce.params] == [(48, 128), (176, 8), (184, 4)]  # constant-bank placement
    info = signature.merge(real, [("ptx", pe), ("cubin", ce)], [("mangled name", cdecl.demangle(real))])
    assert [p.ctype for p in info.params] == ["CUtensorMap_st", "float*", "int"]
    bad = signature.KernelInfo(real, signature.KernelSignature(ce.params[:2], 184))
    with pytest.raises(signature.SignatureConflict, match="lays out its parameters"):
        signature.merge(real, [("ptx", pe), ("cubin", bad)])


def test_only_a_tensor_map_parameter_takes_a_tensor_map():
    real, pe, ce = _tma_kernel_signatures()
    plan = plan_tiled(A, (100, 72), None, np.float32, (32, 32))
    tm = TensorMap(bytes(range(128)), plan)
    assert "float32[100, 72] in boxes of [32, 32]" in repr(tm)
    for entry in (pe, ce):
        info = signature.merge(real, [("layout", entry)], [("mangled name", cdecl.demangle(real))])
        pk = args.ArgPacker(info.signature, real)
        assert [r.tensor_map for r in pk.rules] == [True, False, False]
        buf = pk.pack((tm, 0x1000, 7))
        off = info.params[0].offset
        assert buf[off:off + 128] == bytes(range(128))
        with pytest.raises(NbjitArgumentError, match="parameter 0 .*int is not a tensor map.*nbjit.tensor_map"):
            pk.pack((0x1000, 0x1000, 7))
        with pytest.raises(NbjitArgumentError, match="parameter 1 .*a tensor map fits only a 128-byte"):
            pk.pack((tm, tm, 7))
    # a cubin of unknown types: a declared CUtensorMap, and only where 128 bytes are
    decl = declarations.parse_signature("const __grid_constant__ CUtensorMap, float*, int")
    bare = [signature.replace(p, ctype=None, pointee=None, pointer=False, type="unknown") for p in ce.params]
    ki = signature.KernelInfo(real, signature.KernelSignature(tuple(bare), ce.param_size))
    info = signature.merge(real, [("cubin", ki)], [("declared", decl)])
    assert args.ArgPacker(info.signature, real).rules[0].tensor_map
    with pytest.raises(signature.SignatureConflict, match="a tensor map \\(128 bytes\\), but the parameter takes 8"):
        signature.merge(real, [("cubin", ki)],
                        [("declared", declarations.parse_signature("CUtensorMap, CUtensorMap, int"))])
