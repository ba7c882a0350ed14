"""Numba's kernel ABI (nbjit.params.numba_abi): mangled names and Numba types read into arguments,
the arguments' parameter layout, and the packing of Numba arrays (hand-computed bytes; the C
and Python rules agree). PTX comes from Numba's own compiler (no GPU needed)."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DevArray  # noqa: E402
from nbjit import NbjitArgumentError, inspect_ptx
from nbjit.launch.arguments import ArgPacker
from test_cdecl import nested_args
from nbjit.params.numba_abi import (
    NumbaAbiError, NumbaArray, fields, from_mangled, from_numba_types, is_numba_name, signature)

numba_cuda = pytest.importorskip("numba.cuda")
from numba import cuda, types  # noqa: E402
from numba.np.numpy_support import from_dtype  # noqa: E402

from nbjit.gpu.host import HOSTS  # noqa: E402

DESCRIBE = HOSTS[0].describe_type  # numba-cuda's types read as nbjit passes them (whichever host serves)

REC = np.dtype([("x", np.float32), ("y", np.int32)])


def body(n: int):
    """A kernel of ``n`` arguments that does nothing (Numba types it by the signature)."""
    ns: dict = {}
    exec(f"def k({', '.join(f'a{i}' for i in range(n))}):\n    pass\n", ns)
    return ns["k"]


def compiled(sig) -> tuple:
    """(kernel name, its PTX entry) of a kernel taking ``sig``, as Numba's compiler makes it."""
    try:
        from numba.cuda.cudadrv.nvvm import NVVM
        NVVM()
    except Exception as e:  # no libNVVM in this environment
        pytest.skip(f"Numba cannot compile here: {e}")
    ptx, _ = cuda.compile_ptx(body(len(sig)), sig, cc=(9, 0))
    e = inspect_ptx(ptx).entries[0]
    return e.name, e


SIGS = [
    (types.float32[::1],),
    (types.float64[:, :], types.Array(types.complex64, 3, "F")),
    (types.Array(types.int8, 1, "A"), types.Array(types.uint16, 2, "C"), types.Array(types.int64, 3, "A")),
    (types.Array(types.boolean, 1, "C"), types.Array(types.uint32, 2, "F"), types.Array(types.complex128, 1, "A")),
    (types.int8, types.uint8, types.int16, types.uint16, types.int32, types.uint32, types.int64, types.uint64),
    (types.float16, types.float32, types.float64, types.boolean, types.complex64, types.complex128),
    (types.Array(types.float32, 2, "C", readonly=True),),
]


@pytest.mark.parametrize("sig", SIGS, ids=lambda s: ",".join(str(t) for t in s))
def test_mangled_names_read_like_numba_types(sig):
    name, entry = compiled(sig)
    assert is_numba_name(name)
    args = from_mangled(name)
    assert args == from_numba_types(sig, DESCRIBE)
    assert [f for a in args for f in fields(a)] == [p.size for p in entry.params]  # Numba's own layout


def test_records_are_arrays_of_unknown_items_from_a_name():
    name, entry = compiled((types.Array(from_dtype(REC), 1, "A"),))
    assert from_mangled(name) == (NumbaArray(None, 1, "A"),)
    assert from_numba_types((types.Array(from_dtype(REC), 1, "A"),), DESCRIBE) == (NumbaArray(REC, 1, "A"),)


def test_what_cannot_be_passed_is_refused():
    with pytest.raises(NumbaAbiError, match="not tuples"):
        from_numba_types((types.UniTuple(types.float32, 2),), DESCRIBE)
    name, _ = compiled((types.UniTuple(types.int32, 2),))
    with pytest.raises(NumbaAbiError, match="argument 0"):
        from_mangled(name)
    assert not is_numba_name("_Z4fillIdEvPT_S0_m") and not is_numba_name("k_basic")


def test_signature_one_argument_per_python_argument():
    sig = (types.float32[::1], types.float64[:, :], types.int16, types.complex64)
    name, entry = compiled(sig)
    info = signature(name, entry, from_numba_types(sig, DESCRIBE), "numba types")
    assert [p.type for p in info.params] == ["numba_array", "numba_array", "s16", "c8"]
    assert [p.size for p in info.params] == [56, 72, 2, 8]
    assert info.launch_offsets == tuple(p.offset for p in entry.params) and len(info.launch_offsets) == 19
    assert str(info.signature).startswith("(array(float32, 1d, C) arg0, array(float64, 2d, A) arg1, int16 arg2")
    with pytest.raises(NumbaAbiError, match="make parameters of"):
        signature(name, entry, from_numba_types(sig[:3], DESCRIBE), "numba types")


def packer_for(sig):
    name, entry = compiled(sig)
    info = signature(name, entry, from_numba_types(sig, DESCRIBE), "numba types")
    return info, ArgPacker(info.signature, name)


def test_packing_by_hand():
    info, p = packer_for((types.float64[:, :], types.int16, types.complex64))
    a = DevArray(0x1000, (3, 4), "f8", strides=(64, 16))  # every other column of a (3, 8) array
    raw = p.pack((a, np.int16(-2), 1.5 - 2j))
    want = struct.pack("<qqqqQqqqq", 0, 0, 12, 8, 0x1000, 3, 4, 64, 16)
    assert raw[:72] == want
    assert struct.unpack_from("<h", raw, info.params[1].offset)[0] == -2
    assert struct.unpack_from("<ff", raw, info.params[2].offset) == (1.5, -2.0)


def test_the_precise_rules_teach_the_c_path_the_array_type():
    """The C launcher finds an array's address by its type in the extractor table; packing a
    Numba-kernel array by the precise rules must put its type there (else a process that
    launches only @cuda.jit kernels through nbjit never left the Python rules)."""
    from nbjit.launch.arrays import _EXTRACTORS

    class OtherDevArray(DevArray):
        pass

    _, p = packer_for((types.float32[::1],))
    assert OtherDevArray not in _EXTRACTORS
    p.pack((OtherDevArray(0x40, (4,), "f4"),))
    assert _EXTRACTORS[OtherDevArray](OtherDevArray(0x80, (4,), "f4")) == 0x80


@pytest.mark.parametrize("arg,msg", [
    (np.zeros(4, np.float32), "host numpy array: Numba copies"),
    (DevArray(0x10, (4,), "f8"), "float64 array was passed; the parameter is array(float32, 1d, C)"),
    (DevArray(0x10, (4, 1), "f4"), "2-d array was passed"),
    (DevArray(0x10, (4,), "f4", strides=(8,)), "not C-contiguous"),
    ("x", "not a device array"),
])
def test_array_errors(arg, msg):
    import re
    _, p = packer_for((types.float32[::1],))
    with pytest.raises(NbjitArgumentError, match=re.escape(msg)):
        p.pack((arg,))


def test_fortran_and_any_layouts():
    _, p = packer_for((types.Array(types.float32, 2, "F"), types.Array(types.float32, 2, "A")))
    f = DevArray(0x10, (3, 4), "f4", strides=(4, 12))
    c = DevArray(0x20, (3, 4), "f4")
    assert len(p.pack((f, c))) > 0 and len(p.pack((f, f))) > 0
    with pytest.raises(NbjitArgumentError, match="not Fortran-contiguous"):
        p.pack((c, c))


def test_record_arrays():
    _, p = packer_for((types.Array(from_dtype(REC), 1, "C"),))
    raw = p.pack((DevArray(0x40, (5,), REC),))
    assert struct.unpack_from("<qqqqQqq", raw) == (0, 0, 5, 8, 0x40, 5, 8)
    with pytest.raises(NbjitArgumentError, match="array was passed"):
        p.pack((DevArray(0x40, (5,), "f8"),))


# ---------------------------------------------------------------- the C rules agree

try:
    from nbjit.gpu import _launcher as _launch
except ImportError:
    _launch = None


def c_launcher(info, p):
    from nbjit.launch.arrays import _EXTRACTORS
    from nbjit.launch.launchers import LauncherSpec, _numbers
    return _launch.Launcher(LauncherSpec(0, (1, 1, 1), (1, 1, 1), 0, 0, p.c_layout, info.param_size, _EXTRACTORS,
                                         _numbers(), p.pack, lambda e: None, info.launch_offsets))


shapes = st.lists(st.integers(0, 5), min_size=1, max_size=3)


@pytest.mark.skipif(_launch is None, reason="nbjit's C launch extension is not built")
@settings(max_examples=300, deadline=None)
@given(shape=shapes, dtype=st.sampled_from(["f4", "f8", "i4", "c8"]), step=st.sampled_from([1, 2]),
       layout=st.sampled_from(["C", "F", "A"]), fortran=st.booleans())
def test_c_and_python_agree_on_numba_arrays(shape, dtype, step, layout, fortran):
    from nbjit.launch.arrays import device_pointer
    nd = len(shape)
    sig = (types.Array(types.float32, nd, layout),)
    info, p = packer_for(sig)
    c = c_launcher(info, p)
    item = np.dtype(dtype).itemsize
    strides, s = [], item * step
    dims = range(nd) if fortran else range(nd - 1, -1, -1)
    strides = [0] * nd
    for d in dims:
        strides[d] = s
        s *= shape[d]
    a = DevArray(0x1000, shape, dtype, strides=strides)
    device_pointer(a)  # registers DevArray's extractor, as a first launch does
    for _ in range(2):  # before and after the Python rules accepted the dtype
        fast = c.pack_fast((a,))
        try:
            want = p.pack((a,))
        except NbjitArgumentError:
            want = None
        if fast is not None:
            assert fast == want, (shape, dtype, step, layout, fortran)
    if dtype == "f4" and want is not None:
        assert c.pack_fast((a,)) == want  # the everyday case stays in C


def test_a_numba_cubin_is_typed_by_its_name_too():
    """A cubin made from Numba's PTX (here by nvJitLink) keeps the mangled name: the same
    arguments, laid out by the cubin's own parameter records."""
    from nbjit.toolchain.nvjitlink import assemble_ptx, nvjitlink_version
    from nbjit.read.cubin import inspect_cubin
    sig = (types.float32[::1], types.Array(types.float64, 2, "F"), types.int32)
    try:
        from numba.cuda.cudadrv.nvvm import NVVM
        NVVM()
    except Exception as e:  # no libNVVM here
        pytest.skip(f"Numba cannot compile here: {e}")
    ptx, _ = cuda.compile_ptx(body(3), sig, cc=(9, 0))
    ptx_version = inspect_ptx(ptx).version
    if nvjitlink_version() is None or nvjitlink_version() < (ptx_version[0] + 4, ptx_version[1]):
        pytest.skip("no nvJitLink new enough for this PTX")
    cub = inspect_cubin(assemble_ptx(ptx, "sm_90").data)
    e = cub.entries[0]
    info = signature(e.name, e, from_mangled(e.name), "numba mangled name")
    assert [p.type for p in info.params] == ["numba_array", "numba_array", "s32"]
    assert len(info.launch_offsets) == 7 + 9 + 1


def test_messages_call_a_numba_kernel_by_its_python_name():
    from conftest import DATA
    from nbjit.params.numba_abi import readable_name
    real = next(e.name for e in inspect_ptx((DATA / "numba/axpy_plain.ptx").read_text()).entries)
    assert real.startswith("_ZN13numba_kernels4axpyB2v1") and readable_name(real) == "numba_kernels.axpy"
    assert readable_name("not_a_mangled_name") == "not_a_mangled_name"
    from numba.core import itanium_mangler
    local = itanium_mangler.mangle("pkg.mod.test_x.<locals>.axpy", [types.float32[::1], types.float32],
                                   abi_tags=("v1",))
    assert readable_name(local) == "pkg.mod.test_x.<locals>.axpy"


A1 = "5ArrayIfLi1E1C7mutable7alignedE"


@pytest.mark.parametrize("arg,msg", [
    ("5ArrayIf1x1C7mutable7alignedE", r"argument 0: array ndim 'x' is not a whole number from 0 to 64"),
    ("5ArrayIfLi" + "1" * 13 + "E1C7mutable7alignedE", r"array ndim '\(int\)1111111111111' is not a whole"),
    ("5ArrayIfLi65E1C7mutable7alignedE", r"array ndim '\(int\)65' is not a whole number from 0 to 64"),
    ("5ArrayIfLin1E1C7mutable7alignedE", r"array ndim '\(int\)n1'"),
    ("5ArrayIfLi1E1Z7mutable7alignedE", r"argument 0: array layout 'Z' is not one of C, F, A"),
    ("5ArrayIfLi1EE", r"argument 0: unexpected array type Array<float, \(int\)1> \(Numba writes Array<dtype"),
])
def test_bad_numba_array_types_in_a_name_are_refused(arg, msg):
    """A hand-made name: each bad part is a NumbaAbiError naming kernel, argument and what
    Numba writes (before: ValueError, a MemoryError from ndim=10**12 and layout Z taken)."""
    name = "_ZN1m1kB2v1E" + arg + A1
    with pytest.raises(NumbaAbiError, match=msg) as e:
        from_mangled(name)
    assert name[:40] in str(e.value)


def test_numba_names_in_range_are_read():
    name = "_ZN1m1kB2v1E5ArrayIfLi64E1F8readonly7alignedE5ArrayIdLi0E1A7mutable7alignedE"
    assert from_mangled(name) == (NumbaArray(np.dtype("float32"), 64, "F", True),
                                  NumbaArray(np.dtype("float64"), 0, "A"))


def test_a_numba_name_standing_for_megabytes_is_refused():
    """16 levels of nested substitutions double the demangled text per level (megabytes from
    a 200-byte name): refused by its size, never written out (tests/test_cdecl.py times it)."""
    from nbjit.params.numba_abi import readable_name
    name = "_ZN1m1kB2v1E" + nested_args(16, first=1)
    with pytest.raises(NumbaAbiError, match="demangled form is at most 65536 characters"):
        from_mangled(name)
    assert readable_name(name) == "m.k"  # (its Python name is read without the demangler)


@pytest.mark.parametrize("name", [
    "_ZN13numba_kernels10scale_rowsB2v1B92cw51cXTLSUwv1sDUaKthoaNgoKmjgOR3W3CwAkMXLaJtQYkOIgxJU0gCqOkEJoHkbttqdVhoqlsp"
    "QGNFHSgJ5BnXagIAE5ArrayIfLi2E1A7mutable7alignedE5ArrayIfLi1E1C7mutable7alignedE",
    "_ZN8__main__4main12_3clocals_3e10axpy_numbaB2v1B92cw51cXTLSUwv1sDUaKthqaNgoKmjgOR3W3CwAkMXLaJtQYkOIgxJU0gCqOkEJoH"
    "kbttqdVhoqlspQGNFHSgJ5BnXagIAE5ArrayIfLi1E1C7mutable7alignedE5ArrayIfLi1E1C7mutable7alignedEfi",
    "_Z4axpy5ArrayIfLi1E1C7mutable7alignedEf5ArrayIfLi1E1C7mutable7alignedE",
])
def test_the_python_name_reads_as_the_demangler_reads_it(name):
    """A kernel's Python name is read from the start of its mangled name (no demangler: ~12 ms
    of a bundle's first @cuda.jit kernel), as the demangler's tree names it."""
    import re
    from nbjit.params.cdecl import mangled_tree
    from nbjit.params.numba_abi import _source_name, readable_name
    tree = mangled_tree(name)
    want = re.sub(r"\[abi:[^\]]*\]", "", str(tree.name)).replace("::", ".").replace("_3clocals_3e", "<locals>")
    assert _source_name(name) == readable_name(name) == want
    assert _source_name("_Z99x") is None and _source_name("_ZN3abc") is None and _source_name("_ZN1aX") is None
    assert _source_name("_ZN" + "9" * 5000 + "x") is None  # (no int() of thousands of digits)


def test_device_ltoir_needs_no_gpu():
    """numba.cuda.compile(..., output="ltoir", cc=(9, 0)) runs without a GPU: a Python
    function as a C function under the name given, its C types; a dispatcher's options apply."""
    import math

    from numba import cuda

    from nbjit.params.numba_abi import NumbaAbiError, device_ltoir

    def op(a, b):
        return a + math.sin(b) * 2

    host = HOSTS[0]  # numba-cuda (its types are the ones given)
    data, returns, params = device_ltoir(op, "float32(float32, float32)", "my_op", (9, 0), host)
    assert data[:4] == b"\xed\x43\x4e\x7f" and (returns, params) == ("float", ("float", "float"))
    assert device_ltoir(op, "(int32, int64)", "op", (9, 0), host)[1:] == ("double", ("int", "long long"))  # inferred
    at = device_ltoir(lambda p, i: p[i], "float64(CPointer(float64), uint32)", "at", (9, 0), host)
    assert at[1:] == ("double", ("double*", "unsigned int"))
    fast = device_ltoir(cuda.jit(device=True, fastmath=True)(op), "float32(float32, float32)", "my_op", (9, 0), host)
    assert fast[0] != data  # fastmath=True reached Numba
    with pytest.raises(NumbaAbiError, match=r"array\(float32, 1d, C\) has no C ABI"):
        device_ltoir(op, "float32(float32[::1], float32)", "op", (9, 0), host)


class DLPackOnly:
    """An array offering only DLPack, said to be on a CUDA device (its memory is numpy's: packed,
    never launched), as a library without __cuda_array_interface__ gives one."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA


def test_a_dlpack_array_packs_as_numba_passes_it():
    """Shape and strides (in bytes) from the DLTensor, its dtype checked; C, F and strided."""
    info, p = packer_for((types.float32[:, :], types.float32[:, ::1], types.float32[::1, :]))
    base = np.zeros((3, 8), np.float32)
    ptr = base.ctypes.data
    raw = p.pack((DLPackOnly(base[:, ::2]), DLPackOnly(base), DLPackOnly(np.asfortranarray(base))))
    assert struct.unpack_from("<qqqqQqqqq", raw, 0) == (0, 0, 12, 4, ptr, 3, 4, 32, 8)
    assert struct.unpack_from("<qqqqQqqqq", raw, info.params[1].offset)[2:] == (24, 4, ptr, 3, 8, 32, 4)
    assert struct.unpack_from("<qqqq", raw, info.params[2].offset + 40) == (3, 8, 4, 12)  # (Fortran strides)
    if _launch is not None:
        c = c_launcher(info, p)
        args = (DLPackOnly(base[:, ::2]), DLPackOnly(base), DLPackOnly(np.asfortranarray(base)))
        fast = c.pack_fast(args)
        assert fast is None or fast == p.pack(args)
    with pytest.raises(NbjitArgumentError, match="a float64 array was passed; the parameter is array"):
        p.pack((DLPackOnly(np.zeros((3, 4))), DLPackOnly(base), DLPackOnly(np.asfortranarray(base))))
    with pytest.raises(NbjitArgumentError, match="not C-contiguous"):
        p.pack((DLPackOnly(base), DLPackOnly(base[:, ::2]), DLPackOnly(np.asfortranarray(base))))


class StrideMethod:
    """A PyTorch-like array: ``shape``, no ``strides`` attribute but ``stride()`` in items, and
    ``__cuda_array_interface__`` for the Python rules."""

    def __init__(self, ptr, shape, strides_in_items):
        self.ptr, self.shape, self._st, self.dtype = ptr, tuple(shape), tuple(strides_in_items), np.dtype("f4")

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": "<f4", "data": (self.ptr, False), "version": 3,
                "strides": tuple(4 * s for s in self._st)}

    def stride(self):
        return self._st


@pytest.mark.skipif(_launch is None, reason="nbjit's C launch extension is not built")
def test_the_c_path_reads_pytorchs_strides_in_items():
    """A tensor's stride() (in items) packs in C as the Python rules pack its array interface
    (strides in bytes): PyTorch tensors stay on the C path."""
    from nbjit.launch.arrays import device_pointer
    info, p = packer_for((types.float32[:, :], types.float32[:, ::1]))
    c = c_launcher(info, p)
    view, whole = StrideMethod(0x1000, (3, 4), (8, 2)), StrideMethod(0x2000, (3, 8), (8, 1))
    device_pointer(view)
    want = p.pack((view, whole))  # (the Python rules accept its dtype, and teach the C path)
    assert c.pack_fast((view, whole)) == want
    assert struct.unpack_from("<qqqqQqqqq", want) == (0, 0, 12, 4, 0x1000, 3, 4, 32, 8)
    assert c.pack_fast((whole, view)) is None  # (not C-contiguous: the Python rules say so)
