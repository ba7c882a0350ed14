"""Pack Python values into a kernel's parameter buffer, by its KernelSignature.

Pure Python (no driver calls), so every conversion rule and its error is tested on a CPU.
The fast path packs the whole buffer with one precompiled ``struct.Struct``: pointer and
64-bit parameters go through a converter (arrays -> addresses: ``arrays.py``), scalars go
straight to ``struct``, which range-checks them. Anything ``struct`` rejects is re-run
through the precise per-parameter rules, which either accept it (numpy scalars that need
reinterpreting) or raise an ``NbjitArgumentError`` naming the kernel and parameter. The
rules few kernels need (Numba arrays, complex numbers, aggregates by value, parameters of
unknown type, tensor maps, ``bf16``, ``.pred``) are made only for a parameter that needs one."""
from __future__ import annotations

import ctypes
import math
import struct
import sys
from typing import Any, Callable

import numpy as np

from nbjit.errors import NbjitArgumentError
from nbjit.launch.arrays import (
    _EXTRACTORS, array_element, array_layout, describe_element, device_pointer, element_matches, handle_value, to_u64)
from nbjit.params.signature import KernelSignature, Param


def _tensor_map_param(size: int, align: int | None, ctype: str | None) -> bool:
    """Whether a 128-byte parameter is a tensor map (the tma module is imported only then)."""
    from nbjit.launch.tma import is_tensor_map_param
    return is_tensor_map_param(size, align, ctype)


def _is_tensor_map(v) -> bool:
    """Whether ``v`` is an ``nbjit.TensorMap`` (none exists before the tma module is imported)."""
    tma = sys.modules.get("nbjit.launch.tma")
    return tma is not None and isinstance(v, tma.TensorMap)

__all__ = ["ArgPacker"]

_PLAIN = (int, type(None))  # what a 64-bit parameter takes most often: no handle to look for

_INT_FORMAT = {("u", 1): "B", ("u", 2): "H", ("u", 4): "I", ("u", 8): "Q",
               ("s", 1): "b", ("s", 2): "h", ("s", 4): "i", ("s", 8): "q"}
_FLOAT_FORMAT = {"f16": "e", "f32": "f", "f64": "d"}
_RARE = frozenset({"c8", "c16", "unknown", "b128", "bf16", "pred"})  # types whose converters are made below

# ------------------------------------------------------------------ device pointers


# ------------------------------------------------------------------ array element types


# ------------------------------------------------------------------ per-parameter rules


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer, np.bool_)) and not isinstance(v, float)


def _is_float(v) -> bool:
    return isinstance(v, (float, np.floating))


# PTX types the C launch path packs itself, and its code for each (see _launch.c)
_C_CODES = {"s64": "q", "u32": "I", "b32": "I", "s32": "i", "u16": "H", "b16": "H", "s16": "h", "u8": "B",
            "b8": "B", "s8": "b", "f32": "f", "f64": "d"}


class _Rule:
    """Converts one argument to what the buffer's struct format takes for it; ``code`` says
    how the C launch path packs it (the same rule, in C)."""

    def __init__(self, p: Param):
        self.p = p
        t, size = p.type, p.size
        self.fast: Callable | None = None  # None: struct takes the value as it is
        self.want = p.element
        # dtypes (and dtype-less array types) already found to fit: shared with the C path,
        # which compares by identity; only ever appended to, and capped
        self.accepted: list = []
        # (tensor maps are 128 bytes: the tma module is imported only for such a parameter)
        self.tensor_map = not p.pointer and size == 128 and _tensor_map_param(size, p.align, p.ctype)
        if p.pointer and t not in ("numba_array", "c8", "c16"):
            if self.want[0] != "void":
                self.fmt, self.fast, self.slow = "Q", self.typed_fast, self.typed
            else:
                self.fmt, self.fast, self.slow = "Q", to_u64, self.pointer
        elif t in _FLOAT_FORMAT and p.count is None and not self.tensor_map:
            self.fmt, self.slow = _FLOAT_FORMAT[t], self.floating
        elif t == "numba_array" or t in _RARE or self.tensor_map or p.count is not None:
            # the rules few kernels need (below): each a converter made once
            if t == "numba_array":
                self.fmt, conv = f"{size}s", numba_array(self, _EXTRACTORS, device_pointer)
            elif t in ("c8", "c16"):
                self.fmt, conv = f"{size}s", complex_number(self)
            elif self.tensor_map:
                self.fmt, conv = f"{size}s", tensor_map_value(self)
            elif p.count is not None or t == "b128":
                self.fmt, conv = f"{size}s", blob(self)
            elif t == "unknown":
                self.fmt, conv = f"{size}s", unknown(self)
            elif t == "bf16":
                self.fmt, conv = "H", bf16(self)
            else:  # .pred
                self.fmt, conv = "B", pred(self)
            self.fast = self.slow = conv
        else:  # u*, s*, b*
            kind = "u" if t[0] in "ub" else "s"
            self.fmt = _INT_FORMAT[(kind, size)]
            self.slow = self.integer
            if size == 8:  # a 64-bit integer may just as well be a pointer (nvcc writes T* as .u64)
                self.fast = to_u64 if kind == "u" else self.wide
            elif t[0] == "b":
                self.fast = self.integer

    @property
    def code(self) -> tuple:
        """``(code,)`` for the C path, or ``("A", accepted dtypes)`` for a typed pointer;
        ``"X"``: only these Python rules."""
        p = self.p
        if p.type == "numba_array":
            a = p.abi
            if a.dtype is None:  # a record array read from a name: the item size comes from the array
                return ("X",)
            if a.model == "mlir":  # a memref (one of bytes, for records: only the Python rules)
                return ("X",) if a.dtype.kind in "VSU" else ("M", self.accepted, a.ndim, a.dtype.itemsize, a.layout)
            return ("N", self.accepted, a.ndim, a.dtype.itemsize, a.layout)
        if p.count is not None:
            return ("X",)
        if p.pointer and self.want[0] != "void":
            return ("A", self.accepted)
        if p.pointer or (p.size == 8 and p.type in ("u64", "b64", "unknown")):
            return ("P",)
        if p.type == "unknown" and p.size in (1, 2, 4):
            return (str(p.size),)
        return (_C_CODES.get(p.type, "X"),)

    # each returns the packed-ready value or raises ValueError with the reason
    def pointer(self, v):
        if type(v) not in _PLAIN:
            h = handle_value(v, self.p)
            if h is not None:
                return h
        try:
            return device_pointer(v)
        except NbjitArgumentError as e:
            raise ValueError(str(e)) from None

    def typed_fast(self, v):
        """A typed pointer, fast: an int address, or an array whose dtype was seen to fit."""
        t = type(v)
        if t is int:
            return v
        f = _EXTRACTORS.get(t)
        if f is not None:
            d = getattr(v, "dtype", t)
            for a in self.accepted:
                if a is d:
                    return f(v)
        raise ValueError("not seen yet")  # the precise rule decides

    def typed(self, v):
        """A typed pointer: the address, once the array's element type fits the pointee."""
        addr = self.pointer(v)
        if v is None or isinstance(v, (int, np.integer)):
            return addr  # a plain address carries no type: the caller's responsibility
        got = array_element(v)
        if got is not None and not element_matches(self.want, got):
            p = self.p
            raise ValueError(
                f"a {got[2]} array was passed; the parameter is {p.ctype} and takes "
                f"{describe_element(self.want)} arrays (to reinterpret the memory on purpose, pass "
                f"arr.view(<dtype>))")
        # remembered by its dtype (what typed_fast compares); an array whose element type came
        # from elsewhere (its interface or DLPack, no .dtype) is checked every time
        key = getattr(v, "dtype", None) if got is not None else type(v)
        if key is not None and len(self.accepted) < 8 and not any(a is key for a in self.accepted):
            try:
                hash(key)
                self.accepted.append(key)
            except TypeError:
                pass
        return addr


    def wide(self, v):
        if type(v) is int:
            return v if v >= 0 or self.p.type[0] == "s" else self.integer(v)
        return self.pointer(v) if not _is_int(v) else self.integer(v)

    def integer(self, v):
        bits = self.p.size * 8
        if isinstance(v, bool) or isinstance(v, np.bool_):
            return int(v)
        if _is_float(v):
            raise ValueError(f"{v!r} is a float; the parameter is an integer (.{self.p.type})")
        if not _is_int(v):
            if self.p.size == 8 and self.p.type[0] != "s":
                return self.pointer(v)
            raise ValueError(f"{type(v).__name__} is not an integer (.{self.p.type} takes int or a numpy integer)")
        n = int(v)
        if self.p.type[0] == "b":  # untyped bits: either sign
            if not -(1 << (bits - 1)) <= n < 1 << bits:
                raise ValueError(f"{n} does not fit in {bits} bits")
            return n & ((1 << bits) - 1)
        if self.p.type[0] == "u":
            if isinstance(v, np.signedinteger) and v.dtype.itemsize * 8 == bits:
                return n & ((1 << bits) - 1)  # a typed signed value: send its bits
            if n < 0:
                raise ValueError(
                    f"{n} is negative; the parameter is .{self.p.type} (nvcc writes C 'int' as .u32: pass "
                    f"np.int{bits}({n}) to send a signed value's bits)")
            if n >= 1 << bits:
                raise ValueError(f"{n} does not fit in .{self.p.type} (at most {(1 << bits) - 1})")
            return n
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        if not lo <= n <= hi:
            raise ValueError(f"{n} does not fit in .{self.p.type} ({lo} to {hi})")
        return n

    def floating(self, v):
        if isinstance(v, (bool, np.bool_)) or not (_is_float(v) or _is_int(v)):
            raise ValueError(f"{type(v).__name__} is not a number (.{self.p.type} takes a float)")
        x = float(v)
        if self.p.type != "f64" and math.isfinite(x):
            try:
                struct.pack("<" + _FLOAT_FORMAT[self.p.type], x)
            except OverflowError:
                raise ValueError(f"{x!r} overflows .{self.p.type}") from None
        return x


class ArgPacker:
    """Packs arguments for one kernel signature into its parameter buffer."""

    def __init__(self, sig: KernelSignature, kernel: str):
        self.sig = sig
        self.kernel = kernel
        self.rules = [_Rule(p) for p in sig.params]
        fmt = "<"
        pos = 0
        for p, r in zip(sig.params, self.rules):
            if p.offset > pos:
                fmt += f"{p.offset - pos}x"
            fmt += r.fmt
            pos = p.offset + p.size
        if sig.size > pos:
            fmt += f"{sig.size - pos}x"
        self.struct = struct.Struct(fmt)
        if self.struct.size != sig.size or any(b.offset < a.offset + a.size for a, b in zip(sig.params,
                                                                                        sig.params[1:])):
            raise NbjitArgumentError(f"kernel {kernel!r}: parameters {sig} do not fit one after another in its "
                                     f"{sig.size}-byte parameter buffer (overlapping, or past its end)")
        self.n = len(self.rules)
        self.fast = tuple((i, r.fast) for i, r in enumerate(self.rules) if r.fast is not None)

    @property
    def c_layout(self) -> tuple:
        """Per parameter, ``(offset, *code)``: what the C launcher packs by (gpu/_launcher.c)."""
        return tuple((p.offset, *r.code) for p, r in zip(self.sig.params, self.rules))

    def signature_text(self) -> str:
        return f"{self.kernel}{self.sig}"

    def count_error(self, got: int) -> NbjitArgumentError:
        return NbjitArgumentError(f"kernel {self.kernel!r} takes {self.n} argument{'s' * (self.n != 1)}, got {got}:"
                                  f" {self.signature_text()}")

    def values(self, args: tuple) -> list:
        """Arguments converted for ``self.struct``: the fast path, then the precise one."""
        vals = list(args)
        try:
            for i, f in self.fast:
                vals[i] = f(vals[i])
            return vals
        except (NbjitArgumentError, ValueError, TypeError, AttributeError):
            return self.precise(args)

    def precise(self, args: tuple) -> list:
        out = []
        for i, (r, v) in enumerate(zip(self.rules, args)):
            try:
                if not r.tensor_map and _is_tensor_map(v):
                    raise ValueError("a tensor map fits only a 128-byte, 64-byte-aligned parameter passed by value "
                                     "(const __grid_constant__ CUtensorMap); this one is not (declare the kernel's "
                                     "signature where its image does not say)")
                out.append(r.slow(v))
            except ValueError as e:
                p = r.p
                raise NbjitArgumentError(
                    f"kernel {self.kernel!r}, parameter {i} ({p.name}, {_kind(p)}): {e}") from None
        return out

    def pack_into(self, buf: bytearray, args: tuple) -> None:
        """Write ``args`` into ``buf`` (the caller checked the count)."""
        try:
            self.struct.pack_into(buf, 0, *self.values(args))
        except (struct.error, OverflowError, TypeError):
            self.struct.pack_into(buf, 0, *self.precise(args))

    def pack(self, args: tuple) -> bytes:
        """The packed parameter buffer for ``args``."""
        if len(args) != self.n:
            raise self.count_error(len(args))
        buf = bytearray(self.struct.size)
        self.pack_into(buf, args)
        return bytes(buf)


def _kind(p: Param) -> str:
    if p.pointer:
        return "pointer"
    if p.type == "unknown":
        return f"{p.size} bytes, type unknown"
    if p.type == "numba_array":
        return "a Numba array"
    if p.count is not None:
        return f".{p.type}[{p.count}]"
    return f".{p.type}"


Converter = Callable[[Any], Any]


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


# ------------------------------------------------------------------ rules (one per parameter)


def numba_array(rule, extractors: dict, device_pointer: Callable[[Any], int]) -> Converter:
    """A Numba array argument: its fields (meminfo, parent, nitems, itemsize, data, shape,
    strides; for numba-cuda-mlir's kernels a memref: data twice, offset 0, shape, strides in
    items), after checking dtype, ndim and layout against the kernel's signature.
    ``extractors`` and ``device_pointer``: ``args``'s (how the C path finds the address)."""
    a = rule.p.abi
    accepted = rule.accepted

    def convert(v):
        ptr, shape, strides, dt = array_layout(v)
        if len(shape) != a.ndim:
            raise ValueError(f"a {len(shape)}-d array was passed; the parameter is {a.text}")
        if a.dtype is not None and dt != a.dtype:
            raise ValueError(f"a {dt} array was passed; the parameter is {a.text} (to reinterpret the memory on "
                             "purpose, pass arr.view(<dtype>))")
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
    from nbjit.launch import tma

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


