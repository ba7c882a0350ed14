"""The packing rules few kernels need, and declared signatures (``args.py`` hands over here,
and this imports no ``args``): Numba arrays and complex numbers (``from_numba``'s kernels),
aggregates passed by value, parameters of unknown type (a cubin's, only sized), tensor maps,
``bf16`` and ``.pred``; and ``parse_signature`` / ``declare``. Each rule is made once per
kernel parameter, as a converter ``f(value)`` that returns what the parameter's struct format
takes or raises ``ValueError`` with the reason (``args._Rule``'s ``fast`` and ``slow``)."""
from __future__ import annotations

import ctypes
import math
import struct
from typing import Any, Callable

import numpy as np

from nbjit._csource import parse_ctype
from nbjit.cdecl import _VECTORS, CParam, scalar_facts
from nbjit.errors import NbjitArgumentError
from nbjit.signature import KernelInfo, KernelSignature, SignatureConflict, merge

__all__ = ["parse_signature", "declare"]

Converter = Callable[[Any], Any]


def _is_float(v) -> bool:
    return isinstance(v, (float, np.floating))


def _c_strides(shape: tuple, itemsize: int) -> tuple:
    out, s = [], itemsize
    for n in reversed(shape):
        out.append(s)
        s *= n
    return tuple(reversed(out))


def _contiguous(shape: tuple, strides: tuple, itemsize: int, order: str) -> bool:
    """C (or Fortran) contiguity as numpy judges it: dimensions of extent 1 do not count."""
    if 0 in shape:
        return True
    expect = itemsize
    dims = range(len(shape) - 1, -1, -1) if order == "C" else range(len(shape))
    for d in dims:
        if shape[d] != 1 and strides[d] != expect:
            return False
        expect *= shape[d]
    return True


def _float_to_bf16(x: float) -> int:
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    if math.isnan(x):
        return 0x7FC0
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even


def _raw_bytes(v, size: int) -> bytes | None:
    """Bytes of a value that carries its own binary layout, if it has exactly ``size``."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
    elif isinstance(v, (ctypes.Structure, ctypes.Union, ctypes.Array, ctypes._SimpleCData)):
        b = bytes(memoryview(v).cast("B")) if ctypes.sizeof(v) else b""
    elif isinstance(v, np.generic) or (isinstance(v, np.ndarray) and v.ndim == 0):
        b = np.asarray(v).tobytes()
    else:
        return None
    if len(b) != size:
        raise ValueError(f"it holds {len(b)} bytes, the parameter takes exactly {size}")
    return b


# ------------------------------------------------------------------ DLPack

# DLPack (objects that offer only ``__dlpack__``: JAX arrays, others): the capsule's DLTensor
# read in place. The capsule is left unconsumed (its name stays "dltensor"), so its producer's
# destructor frees what it made when the capsule goes; the memory is the array's, which the
# caller holds as the argument.
_DL_CUDA, _DL_CUDA_MANAGED = 2, 13  # kDLCUDA, kDLCUDAManaged
_DL_DEVICES = {1: "the CPU", 3: "pinned host memory", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 10: "ROCm",
               14: "oneAPI"}
_DL_KINDS = {0: "i", 1: "i", 2: "f", 4: "bf", 5: "c", 6: "b"}  # DLDataTypeCode -> element kind
_DL_NAMES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}
_DL_HEAD = struct.Struct("<QiiiBBHQQQ")  # data, device type and id, ndim, dtype code/bits/lanes, shape, strides, offset
_capsule_pointer = None


def dlpack_reader(not_a_pointer: type[ValueError]) -> Callable[[Any], tuple[int, str, int, str]]:
    """``args._dl_tensor``: ``read(a)`` -> ``(address, element kind, item size, dtype name)``
    of an object offering DLPack, on a CUDA device; ``not_a_pointer`` (``args._NotAPointer``)
    saying where its memory is otherwise."""
    def read(a) -> tuple[int, str, int, str]:
        global _capsule_pointer
        try:
            dev, _ = a.__dlpack_device__()
        except Exception as e:
            raise not_a_pointer(f"{type(a).__name__}.__dlpack_device__() failed: {e}") from None
        if dev not in (_DL_CUDA, _DL_CUDA_MANAGED):
            raise not_a_pointer(f"a {type(a).__name__} in {_DL_DEVICES.get(int(dev), f'DLPack device type {dev}')} "
                                "(its __dlpack_device__): pass one on the GPU")
        capsule = a.__dlpack__()
        if _capsule_pointer is None:
            f = ctypes.pythonapi.PyCapsule_GetPointer
            f.restype, f.argtypes = ctypes.c_void_p, (ctypes.py_object, ctypes.c_char_p)
            _capsule_pointer = f
        try:
            at = _capsule_pointer(capsule, b"dltensor")
        except ValueError:
            raise not_a_pointer(f"{type(a).__name__}.__dlpack__() gave no DLPack tensor capsule") from None
        data, _, _, _, code, bits, lanes, _, _, offset = _DL_HEAD.unpack(ctypes.string_at(at, _DL_HEAD.size))
        size = bits * lanes // 8
        name = f"{_DL_NAMES.get(code, f'dlpack type {code} of ')}{bits}" + (f"x{lanes}" if lanes != 1 else "")
        return data + offset, ("V" if lanes != 1 else _DL_KINDS.get(code, "V")), size, name
    return read


# ------------------------------------------------------------------ rules (one per parameter)


def numba_array(rule, extractors: dict, device_pointer: Callable[[Any], int]) -> Converter:
    """A Numba array argument: its fields (meminfo, parent, nitems, itemsize, data, shape,
    strides; for numba-cuda-mlir's kernels a memref: data twice, offset 0, shape, strides in
    items), after checking dtype, ndim and layout against the kernel's signature.
    ``extractors`` and ``device_pointer``: ``args``'s (how the C path finds the address)."""
    a = rule.p.abi
    accepted = rule.accepted

    def convert(v):
        if isinstance(v, np.ndarray):
            raise ValueError("a host numpy array: Numba copies host arrays to the device (and back) for you; "
                             "nbjit does not: pass numba.cuda.to_device(arr) and copy the result back")
        try:
            cai = v.__cuda_array_interface__
            shape = tuple(int(x) for x in cai["shape"])
            own = getattr(v, "dtype", None)  # Numba's and CuPy's arrays keep the whole dtype (records too)
            dt = own if isinstance(own, np.dtype) else \
                np.dtype(cai["descr"]) if cai.get("descr") and np.dtype(cai["typestr"]).kind == "V" \
                else np.dtype(cai["typestr"])
            ptr = int(cai["data"][0] or 0)
            strides = cai.get("strides")
        except (AttributeError, KeyError, TypeError, ValueError):
            raise ValueError(f"{type(v).__name__} is not a device array (pass a Numba device array or an object with "
                             "__cuda_array_interface__)") from None
        if len(shape) != a.ndim:
            raise ValueError(f"a {len(shape)}-d array was passed; the parameter is {a.text}")
        if a.dtype is not None and dt != a.dtype:
            raise ValueError(f"a {dt} array was passed; the parameter is {a.text} (to reinterpret the memory on "
                             "purpose, pass arr.view(<dtype>))")
        strides = tuple(int(x) for x in strides) if strides is not None else _c_strides(shape, dt.itemsize)
        if a.layout in ("C", "F") and not _contiguous(shape, strides, dt.itemsize, a.layout):
            order = "C" if a.layout == "C" else "Fortran"
            raise ValueError(f"the array is not {order}-contiguous (strides {strides}); the parameter is {a.text}: "
                             "pass a contiguous copy, or compile the kernel for layout 'A'")
        nitems = 1
        for n in shape:
            nitems *= n
        if type(v) not in extractors:  # how the C path gets the address: known from now on
            device_pointer(v)
        key = getattr(v, "dtype", None)
        if key is not None and len(accepted) < 8 and not any(x is key for x in accepted):
            try:
                hash(key)
                accepted.append(key)
            except TypeError:
                pass
        nd = a.ndim
        if a.model == "mlir":
            unit = 1 if dt.kind in "VSU" else dt.itemsize  # (records, character sequences: a memref of bytes)
            if any(s % unit for s in strides):
                raise ValueError(f"its strides {strides} are not whole multiples of its {unit}-byte items; the "
                                 f"parameter is {a.text}, which numba-cuda-mlir's kernels take in items")
            return struct.pack(f"<QQq{nd}q{nd}q", ptr, ptr, 0, *shape, *(s // unit for s in strides))
        return struct.pack(f"<qqqqQ{nd}q{nd}q", 0, 0, nitems, dt.itemsize, ptr, *shape, *strides)
    return convert


def complex_number(rule) -> Converter:
    """A complex scalar: its real and imaginary parts, as Numba passes them."""
    p = rule.p
    fmt = "<ff" if p.size == 8 else "<dd"

    def convert(v):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, complex, np.number)):
            raise ValueError(f"{type(v).__name__} is not a number (the parameter is {p.ctype})")
        z = complex(v)
        return struct.pack(fmt, z.real, z.imag)
    return convert


def bf16(rule) -> Converter:
    """A bfloat16: a number, rounded to nearest even, or a 2-byte numpy scalar's bits."""
    floating = rule.floating

    def convert(v):
        if isinstance(v, np.generic) and v.dtype.itemsize == 2 and v.dtype.kind not in "fiub":
            return int.from_bytes(v.tobytes(), "little")  # ml_dtypes.bfloat16 and the like
        return _float_to_bf16(floating(v))
    return convert


def pred(rule) -> Converter:
    """A ``.pred``: a boolean (or an integer), as 0 or 1."""
    def convert(v):
        if not isinstance(v, (bool, np.bool_, int, np.integer)) or isinstance(v, float):
            raise ValueError(f"{type(v).__name__} is not a boolean")
        return 1 if v else 0
    return convert


def blob(rule) -> Converter:
    """An aggregate passed by value: exactly its size in bytes (bytes, a ctypes structure, a
    numpy structured scalar)."""
    size = rule.p.size

    def convert(v):
        try:
            b = _raw_bytes(v, size)
        except ValueError:
            b = None
            n = len(bytes(v)) if isinstance(v, (bytes, bytearray, memoryview)) else None
            raise ValueError(f"{type(v).__name__} of {n if n is not None else 'another size'} bytes; the "
                             f"parameter is a {size}-byte aggregate (.b8[{size}]): pass exactly "
                             f"{size} bytes") from None
        if b is None:
            raise ValueError(f"{type(v).__name__} cannot fill a {size}-byte aggregate: pass bytes, a "
                             "ctypes.Structure or a numpy structured scalar of exactly that size"
                             + (" (for __half / __nv_bfloat16 pass np.float16 or the raw bytes)"
                                if size == 2 and _is_float(v) else ""))
        return b
    return convert


def tensor_map_value(rule) -> Converter:
    """A ``const __grid_constant__ CUtensorMap``: an ``nbjit.TensorMap`` (or its 128 bytes)."""
    from nbjit import tma

    def convert(v):
        if isinstance(v, tma.TensorMap):
            return v.data
        if isinstance(v, (bytes, bytearray, memoryview)) and len(v) == tma.SIZE:
            return bytes(v)
        raise ValueError(f"{type(v).__name__} is not a tensor map: this parameter takes one, made with "
                         "nbjit.tensor_map(array, box)")
    return convert


def unknown(rule) -> Converter:
    """A cubin parameter: only its size is known."""
    size = rule.p.size
    as_blob, pointer = blob(rule), rule.pointer

    def convert(v):
        if isinstance(v, (np.generic, bytes, bytearray, memoryview, ctypes._SimpleCData, ctypes.Structure)):
            return as_blob(v)
        if size == 8:
            if type(v) is int or isinstance(v, int):
                if not -(1 << 63) <= v < 1 << 64:
                    raise ValueError(f"{v} does not fit in 8 bytes")
                return (v & ((1 << 64) - 1)).to_bytes(8, "little")
            if isinstance(v, float):
                return struct.pack("<d", v)
            return pointer(v).to_bytes(8, "little")
        if isinstance(v, int) and size in (1, 2, 4):
            bits = size * 8
            if not -(1 << (bits - 1)) <= v < 1 << bits:
                raise ValueError(f"{v} does not fit in {size} bytes")
            return (v & ((1 << bits) - 1)).to_bytes(size, "little")
        if isinstance(v, float) and size == 4:
            try:
                return struct.pack("<f", v)
            except OverflowError:
                raise ValueError(f"{v!r} overflows a 4-byte float") from None
        if isinstance(v, float):
            raise ValueError(f"a Python float is ambiguous for a {size}-byte parameter of unknown type: pass a "
                             "numpy scalar (np.float16, ...) or declare the signature with get_kernel(name, "
                             "signature=...)")
        raise ValueError(f"{type(v).__name__} cannot fill a {size}-byte parameter")
    return convert


# ------------------------------------------------------------------ declared signatures

# short names -> C types
_DECLARED = {
    "ptr": "void*", "pointer": "void*",
    "i8": "signed char", "u8": "unsigned char", "i16": "short", "u16": "unsigned short",
    "i32": "int", "u32": "unsigned int", "i64": "long", "u64": "unsigned long",
    "int8": "signed char", "uint8": "unsigned char", "int16": "short", "uint16": "unsigned short",
    "int32": "int", "uint32": "unsigned int", "int64": "long", "uint64": "unsigned long",
    "f16": "__half", "bf16": "__nv_bfloat16", "f32": "float", "f64": "double",
    "float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double",
}
_VECTOR_TYPES = frozenset(_VECTORS)


def signature_text(signature: Any, kernel: str) -> str:
    """A declared signature given as a list or tuple of C types, as the text
    ``parse_signature`` reads; ``NbjitArgumentError`` for anything else that is not text."""
    if isinstance(signature, str):  # (a str subclass: numpy's)
        return str(signature)
    if isinstance(signature, (list, tuple)) and signature and \
            all(isinstance(t, str) and "," not in t for t in signature):
        return ", ".join(map(str, signature))
    what = "an empty list" if isinstance(signature, (list, tuple)) and not signature else repr(signature)[:80]
    raise NbjitArgumentError(f"signature for {kernel!r}: C types as text (\"float*, const float*, float, int\") or a "
                             f"list of them, one type each, not {what}")


def parse_signature(text: str, kernel: str = "<kernel>") -> list:
    """``args.parse_signature``: a ``cdecl.CParam`` per item of a declared signature."""
    out = []
    for i, raw in enumerate(t.strip() for t in text.split(",")):
        tok = raw.lower()
        stars = len(tok) - len(tok.rstrip("*"))
        short = tok.rstrip("*").strip()
        if short.startswith("bytes") and short[5:].isdigit() and int(short[5:]) > 0 and not stars:
            out.append(CParam(f"bytes{int(short[5:])}"))
            continue
        if not stars and short.split()[-1:] == ["cutensormap"]:  # const __grid_constant__ CUtensorMap
            out.append(CParam("CUtensorMap"))
            continue
        if short in _DECLARED and (stars == 0 or short not in ("ptr", "pointer")):
            base = _DECLARED[short]
            out.append(CParam("void", True) if base == "void*" else CParam(base, stars > 0))
            continue
        c = parse_ctype(raw, named=True) if raw and not raw[0].isdigit() else None
        if c is None or not (c.pointer or scalar_facts(c.base) or c.base in _VECTOR_TYPES):
            raise NbjitArgumentError(f"signature for {kernel!r}: parameter {i} {raw!r} is not a type (use C types "
                                     "such as float*, const double*, int, or ptr, i8..i64, u8..u64, f16, bf16, "
                                     "f32, f64, bytesN, CUtensorMap)")
        out.append(c)
    return out


def declare(sig: KernelSignature, text: str, kernel: str) -> KernelSignature:
    """``sig`` with the types a user declared (checked against its sizes)."""
    try:
        declared = [("declared", parse_signature(text, kernel))]
        return merge(kernel, [("image", KernelInfo(kernel, sig))], declared).signature
    except SignatureConflict as e:
        raise NbjitArgumentError(f"signature {text!r}: {e}") from None
