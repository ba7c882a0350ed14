"""numba-cuda-mlir's kernel ABI (nbjit.params.numba_abi, model "mlir"): its names read, an array
passed as MLIR's memref descriptor (3 + 2*ndim fields, strides in items), a complex number as
one parameter; packed by the Python rules and the C rules alike. No Numba needed: the
kernels' parameter lists are written as numba-cuda-mlir's compiler writes them (its PTX for
these names, tests/test_mlir.py compiles them where it is installed), so this runs in every
environment, the CI leg without numba-cuda included."""
from __future__ import annotations

import re
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DevArray  # noqa: E402
from nbjit import NbjitArgumentError, inspect_ptx
from nbjit.launch.arguments import ArgPacker
from nbjit.launch.arrays import device_pointer
from nbjit.params.numba_abi import (
    NumbaAbiError, NumbaArray, NumbaScalar, fields, from_mangled, from_numba_types, is_mlir_name, is_numba_name,
    readable_name, signature)

F32 = np.dtype(np.float32)

# numba-cuda-mlir 0.6.0's names (cuda.compile_ptx for these signatures, cc=(9, 0))
AXPY = "_Z4axpyf5ArrayIfLi1E1C7mutable7alignedE5ArrayIfLi1E1C7mutable7alignedE"  # (float32, f32[::1], f32[::1])
MIXED = ("_Z1kxidb9complex6410complex128fh5ArrayIdLi2E1C7mutable7alignedE5ArrayIdLi2E1F7mutable7alignedE"
         "5ArrayIfLi3E1A7mutable7alignedE5ArrayIhLi1E1C7mutable7alignedE")
NESTED = "_ZN5outer12_3clocals_3e5innerE5ArrayIfLi1E1C7mutable7alignedE9complex64"  # outer.<locals>.inner
RECORDS = ("_Z1k5ArrayI6RecordILi324EELi1E1C7mutable7alignedE5ArrayIfLi0E1C7mutable7alignedE"
           "5ArrayIfLi1E1C8readonly7alignedE")
# and numba-cuda's, for contrast (ABI tags)
NUMBA = ("_ZN13numba_kernels4axpyB2v1B92cw51cXTLSUwv1sDUaKthqaNgoKmjgOR3W3CwAkMXLaJtQYkOIgxJU0gCqOkEJoHkbttqdVhoq"
         "lspQGNFHSgJ5BnXagIAE5ArrayIfLi1E1C7mutable7alignedE5ArrayIfLi1E1C7mutable7alignedEfi")

# numba-cuda-mlir 0.6.0's parameter list for MIXED (int64, int32, float64, bool, complex64,
# complex128, float32, uint8, then 7 + 7 + 9 + 5 memref fields)
MIXED_PARAMS = [".u64", ".u32", ".f64", ".u8", ".align 4 .b8 {}[8]", ".align 8 .b8 {}[16]", ".f32", ".u8"] + \
    [".u64"] * 28


def entry(name: str, params: list[str]):
    """The PTX entry ``name`` with ``params`` (each a PTX parameter type, ``{}`` standing for
    the parameter's name where it is an array), read by nbjit's PTX reader."""
    decl = []
    for i, p in enumerate(params):
        pname = f"{name}_param_{i}"
        decl.append(f".param {p.format(pname)}" if "{}" in p else f".param {p} {pname}")
    ptx = (".version 9.0\n.target sm_90\n.address_size 64\n\n"
           f".visible .entry {name}(\n\t" + ",\n\t".join(decl) + "\n)\n{\n\tret;\n}\n")
    return inspect_ptx(ptx).entries[0]


def test_names_read_as_numba_cuda_mlir_passes_them():
    assert is_mlir_name(AXPY) and is_mlir_name(MIXED) and is_mlir_name(NESTED) and is_mlir_name(RECORDS)
    assert not is_mlir_name(NUMBA) and is_numba_name(NUMBA) and not is_numba_name(AXPY)
    assert not is_mlir_name("_Z4fillIdEvPT_S0_m") and not is_mlir_name("k_basic")
    assert not is_mlir_name("_Z1k5ArrayIfLi1E1C7mutable7alignedEE")  # (not a demangleable name: no)
    a = NumbaArray(F32, 1, "C", model="mlir")
    assert from_mangled(AXPY) == (NumbaScalar(F32, "mlir"), a, a)
    assert all(x.model == "numba" for x in from_mangled(NUMBA))
    got = from_mangled(MIXED)
    assert [x.dtype.str for x in got[:8]] == ["<i8", "<i4", "<f8", "|b1", "<c8", "<c16", "<f4", "|u1"]
    f8, u1 = np.dtype("f8"), np.dtype("u1")
    assert got[8:] == (NumbaArray(f8, 2, "C", model="mlir"), NumbaArray(f8, 2, "F", model="mlir"),
                       NumbaArray(F32, 3, "A", model="mlir"), NumbaArray(u1, 1, "C", model="mlir"))
    assert from_mangled(RECORDS) == (NumbaArray(None, 1, "C", model="mlir"), NumbaArray(F32, 0, "C", model="mlir"),
                                     NumbaArray(F32, 1, "C", True, "mlir"))
    assert readable_name(AXPY) == "axpy" and readable_name(NESTED) == "outer.<locals>.inner"


def test_fields_of_a_memref_and_a_complex_number():
    """3 + 2*ndim 8-byte fields for an array (numba-cuda: 5 + 2*ndim); a complex number is one
    parameter of its whole size (numba-cuda: two of half)."""
    assert fields(NumbaArray(F32, 2, "A", model="mlir")) == [8] * 7
    assert fields(NumbaArray(F32, 2, "A")) == [8] * 9
    assert fields(NumbaArray(F32, 0, "C", model="mlir")) == [8] * 3
    assert fields(NumbaScalar(np.dtype("c8"), "mlir")) == [8] and fields(NumbaScalar(np.dtype("c8"))) == [4, 4]
    assert fields(NumbaScalar(np.dtype("c16"), "mlir")) == [16]
    e = entry(MIXED, MIXED_PARAMS)
    assert [f for a in from_mangled(MIXED) for f in fields(a)] == [p.size for p in e.params]


def test_a_model_is_one_of_two():
    with pytest.raises(ValueError, match="model 'llvm'"):
        from_numba_types((), lambda t: None, "llvm")


def test_signature_one_argument_per_python_argument():
    e = entry(MIXED, MIXED_PARAMS)
    info = signature(MIXED, e, from_mangled(MIXED), "numba mangled name")
    assert [p.type for p in info.params] == ["s64", "s32", "f64", "u8", "c8", "c16", "f32", "u8"] + ["numba_array"] * 4
    assert [p.size for p in info.params][4:] == [8, 16, 4, 1, 56, 56, 72, 40]
    assert len(info.launch_offsets) == 36 and info.launch_offsets == tuple(p.offset for p in e.params)
    with pytest.raises(NumbaAbiError, match="make parameters of"):  # numba-cuda's layout does not fit its PTX
        signature(MIXED, e, tuple(NumbaArray(x.dtype, x.ndim, x.layout) if isinstance(x, NumbaArray) else x
                                  for x in from_mangled(MIXED)), "numba types")


def packer_for(args: tuple, name: str = "_Z1k") -> tuple:
    """(KernelInfo, ArgPacker) of a numba-cuda-mlir kernel taking ``args``, its PTX parameters
    written as its compiler writes them."""
    params = []
    for a in args:
        if isinstance(a, NumbaArray):
            params += [".u64"] * len(fields(a))
        elif a.dtype.kind == "c":
            params.append(f".align {a.dtype.itemsize // 2} .b8 {{}}[{a.dtype.itemsize}]")
        else:
            params.append({"f4": ".f32", "f8": ".f64", "i4": ".u32", "i8": ".u64", "b1": ".u8"}[a.dtype.str[1:]])
    info = signature(name, entry(name, params), args, "numba types")
    return info, ArgPacker(info.signature, name)


def test_packing_by_hand():
    """data twice, offset 0, shape, strides in items; a complex number's two floats in one
    parameter."""
    args = (NumbaArray(np.dtype("f8"), 2, "A", model="mlir"), NumbaScalar(np.dtype("c8"), "mlir"),
            NumbaArray(F32, 0, "C", model="mlir"), NumbaScalar(np.dtype("i4"), "mlir"))
    info, p = packer_for(args)
    a = DevArray(0x1000, (3, 4), "f8", strides=(64, 16))  # every other column of a (3, 8) array
    raw = p.pack((a, 1.5 - 2j, DevArray(0x2000, (), "f4"), -7))
    assert struct.unpack_from("<7q", raw, 0) == (0x1000, 0x1000, 0, 3, 4, 8, 2)
    assert struct.unpack_from("<ff", raw, info.params[1].offset) == (1.5, -2.0)
    assert struct.unpack_from("<3q", raw, info.params[2].offset) == (0x2000, 0x2000, 0)
    assert struct.unpack_from("<i", raw, info.params[3].offset) == (-7,)


def test_records_are_memrefs_of_bytes():
    """A record array's memref counts its offset and strides in bytes (numba-cuda-mlir's
    ArrayModel makes it a memref of i8; its shape stays the records')."""
    rec = np.dtype([("x", np.float32), ("y", np.int64)], align=True)
    _, p = packer_for((NumbaArray(rec, 1, "A", model="mlir"),))
    assert struct.unpack("<5q", p.pack((DevArray(0x40, (5,), rec, strides=(32,)),))) == (0x40, 0x40, 0, 5, 32)
    assert p.rules[0].code == ("X",)  # (the C path packs items, not bytes: records stay with the Python rules)


@pytest.mark.parametrize("arg,msg", [
    (np.zeros(4, np.float32), "host numpy array: Numba copies"),
    (DevArray(0x10, (4,), "f8"), "float64 array was passed; the parameter is array(float32, 1d, A)"),
    (DevArray(0x10, (4, 1), "f4"), "2-d array was passed"),
    (DevArray(0x10, (4,), "f4", strides=(6,)), "its strides (6,) are not whole multiples of its 4-byte items"),
    ("x", "not a device array"),
])
def test_array_errors_name_the_argument(arg, msg):
    _, p = packer_for((NumbaArray(F32, 1, "A", model="mlir"),), "_Z4axpy")
    with pytest.raises(NbjitArgumentError, match=r"kernel '_Z4axpy', parameter 0 \(arg0, .*" + re.escape(msg)):
        p.pack((arg,))


def test_contiguous_layouts_are_checked():
    _, p = packer_for((NumbaArray(F32, 2, "C", model="mlir"), NumbaArray(F32, 2, "F", model="mlir")))
    c, f = DevArray(0x20, (3, 4), "f4"), DevArray(0x10, (3, 4), "f4", strides=(4, 12))
    raw = p.pack((c, f))
    assert struct.unpack_from("<14q", raw) == (0x20, 0x20, 0, 3, 4, 4, 1, 0x10, 0x10, 0, 3, 4, 1, 3)
    with pytest.raises(NbjitArgumentError, match="not C-contiguous"):
        p.pack((f, f))
    with pytest.raises(NbjitArgumentError, match="not Fortran-contiguous"):
        p.pack((c, c))


# ---------------------------------------------------------------- the C rules agree

try:
    from nbjit.gpu import _launcher as _launch
except ImportError:
    _launch = None


def c_launcher(info, p):
    """A C launcher for ``info`` (never launched: no entry point) packing by ``p``'s rules."""
    from nbjit.launch import launchers
    from nbjit.launch.arrays import _EXTRACTORS
    layout = p.c_layout
    offsets = getattr(info, "launch_offsets", None)
    spec = getattr(launchers, "LauncherSpec", None)  # (the one spec the C Launcher takes, where it takes one)
    if spec is not None:
        return _launch.Launcher(spec(0, (1, 1, 1), (1, 1, 1), 0, 0, layout, info.param_size, _EXTRACTORS,
                                     launchers._numbers(), p.pack, lambda e: None, offsets))
    return _launch.Launcher(0, 1, 1, 1, 1, 1, 1, 0, 0, layout, info.param_size, _EXTRACTORS, launchers._numbers(),
                            p.pack, lambda e: None, offsets)


@pytest.mark.skipif(_launch is None, reason="nbjit's C launch extension is not built")
def test_the_c_path_takes_memrefs():
    info, p = packer_for((NumbaArray(F32, 1, "C", model="mlir"), NumbaArray(F32, 2, "A", model="mlir")))
    assert [r.code[0] for r in p.rules] == ["M", "M"]
    c = c_launcher(info, p)
    x, y = DevArray(0x100, (8,), "f4"), DevArray(0x200, (4, 2), "f4", strides=(32, 8))
    device_pointer(x)  # registers DevArray's extractor, as a first launch does
    want = p.pack((x, y))  # the Python rules accept float32 (and teach the C path)
    assert c.pack_fast((x, y)) == want
    assert struct.unpack_from("<5q", want) == (0x100, 0x100, 0, 8, 1)


shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3)


@pytest.mark.skipif(_launch is None, reason="nbjit's C launch extension is not built")
@settings(max_examples=300, deadline=None)
@given(shape=shapes, dtype=st.sampled_from(["f4", "f8", "i4", "c8"]), step=st.sampled_from([1, 2]),
       layout=st.sampled_from(["C", "F", "A"]), fortran=st.booleans(), odd=st.booleans())
def test_c_and_python_agree_on_memrefs(shape, dtype, step, layout, fortran, odd):
    """Every array either packs to the same bytes on both paths or the C path hands it to
    the Python rules (strides that are not whole items included)."""
    nd = len(shape)
    info, p = packer_for((NumbaArray(F32, nd, layout, model="mlir"),))
    c = c_launcher(info, p)
    item = np.dtype(dtype).itemsize
    s = item * step + (2 if odd and nd else 0)
    strides = [0] * nd
    for d in (range(nd) if fortran else range(nd - 1, -1, -1)):
        strides[d] = s
        s *= shape[d]
    a = DevArray(0x1000, shape, dtype, strides=strides)
    device_pointer(a)
    for _ in range(2):  # before and after the Python rules accepted the dtype
        fast = c.pack_fast((a,))
        try:
            want = p.pack((a,))
        except NbjitArgumentError:
            want = None
        if fast is not None:
            assert fast == want, (shape, dtype, step, layout, fortran, odd)
    if dtype == "f4" and want is not None:
        assert c.pack_fast((a,)) == want  # the everyday case stays in C
