"""Pack Python values into a kernel's parameter buffer, by its KernelSignature.

Pure Python (no driver calls), so every conversion rule and its error is tested on a CPU.
The fast path packs the whole buffer with one precompiled ``struct.Struct``: pointer and
64-bit parameters go through a converter (arrays -> addresses), scalars go straight to
``struct``, which range-checks them. Anything ``struct`` rejects is re-run through the
precise per-parameter rules, which either accept it (numpy scalars that need
reinterpreting) or raise an ``NbjitArgumentError`` naming the kernel and parameter.
"""
from __future__ import annotations

import ctypes
import math
import struct
from typing import Any, Callable

import numpy as np

from .errors import NbjitArgumentError
from .signature import KernelSignature, Param

__all__ = ["ArgPacker", "device_pointer", "parse_signature", "declare"]

_INT_FORMAT = {("u", 1): "B", ("u", 2): "H", ("u", 4): "I", ("u", 8): "Q",
               ("s", 1): "b", ("s", 2): "h", ("s", 4): "i", ("s", 8): "q"}
_FLOAT_FORMAT = {"f16": "e", "f32": "f", "f64": "d"}

# ------------------------------------------------------------------ device pointers

_EXTRACTORS: dict[type, Callable[[Any], int]] = {}


class _NotAPointer(ValueError):
    pass


def _numba_array(a) -> int:
    return int(a.gpu_data.device_pointer)


def _numba_pointer(p) -> int:
    return int(p.device_pointer)


def _cai(a) -> int:
    return a.__cuda_array_interface__["data"][0]


def _torch(t) -> int:
    if not t.is_cuda:
        raise _NotAPointer("a PyTorch tensor on the CPU: move it to the GPU first (tensor.cuda())")
    return t.data_ptr()


def _cupy(a) -> int:
    return a.data.ptr


def _host_array(a) -> int:
    raise _NotAPointer(f"a host {type(a).__name__} (memory on the CPU): copy it to the device first, "
                       "e.g. numba.cuda.to_device(array)")


def _extractor(t: type) -> Callable[[Any], int] | None:
    """How to get a device address out of an object of type ``t`` (decided once per type)."""
    try:
        from numba.cuda.cudadrv.devicearray import DeviceNDArrayBase
        from numba.cuda.cudadrv.driver import MemoryPointer, OwnedPointer
        if issubclass(t, DeviceNDArrayBase):
            return _numba_array
        if issubclass(t, (MemoryPointer, OwnedPointer)):
            return _numba_pointer
    except ImportError:  # numba-cuda missing: the generic protocol still works
        pass
    mod = t.__module__.split(".")[0]
    if mod == "torch" and hasattr(t, "data_ptr"):
        return _torch
    if mod == "cupy" and t.__name__ == "ndarray":
        return _cupy
    if hasattr(t, "__cuda_array_interface__"):
        return _cai
    if issubclass(t, np.ndarray) or hasattr(t, "__array_interface__") or hasattr(t, "__array__"):
        return _host_array
    return None


def device_pointer(obj: Any) -> int:
    """The device address an argument stands for: Numba device arrays and pointers, anything
    with ``__cuda_array_interface__`` (CuPy, PyTorch), plain integers and ``None`` (NULL).

    Raises ``NbjitArgumentError`` for host arrays and other objects.
    """
    t = type(obj)
    if t is int:
        return _address(obj)
    f = _EXTRACTORS.get(t)
    if f is None:
        if obj is None:
            return 0
        if isinstance(obj, (int, np.integer)) and not isinstance(obj, bool):
            return _address(int(obj))
        f = _extractor(t)
        if f is None:
            raise NbjitArgumentError(f"{t.__name__} is not a device array or pointer (expected a Numba device "
                                     "array, an object with __cuda_array_interface__, an int address or None)")
        _EXTRACTORS[t] = f
    try:
        return f(obj)
    except _NotAPointer as e:
        raise NbjitArgumentError(str(e)) from None


def to_u64(v, _get=_EXTRACTORS.get):
    """Fast path for a 64-bit parameter: ints pass (struct range-checks them), device
    arrays become addresses; anything else goes to the precise rules."""
    t = type(v)
    if t is int:
        return v
    f = _get(t)
    if f is not None:
        return f(v)
    return device_pointer(v)


def _address(v: int) -> int:
    if not 0 <= v < 1 << 64:
        raise NbjitArgumentError(f"address {v} is not a 64-bit unsigned value")
    return v


# ------------------------------------------------------------------ per-parameter rules


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer, np.bool_)) and not isinstance(v, float)


def _is_float(v) -> bool:
    return isinstance(v, (float, np.floating))


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


class _Rule:
    """Converts one argument to what the buffer's struct format takes for it."""

    def __init__(self, p: Param):
        self.p = p
        t, size = p.type, p.size
        self.fast: Callable | None = None  # None: struct takes the value as it is
        if p.pointer:
            self.fmt, self.fast, self.slow = "Q", to_u64, self.pointer
        elif p.count is not None or t == "b128":
            self.fmt, self.slow = f"{size}s", self.blob
            self.fast = self.blob
        elif t == "unknown":
            self.fmt, self.fast, self.slow = f"{size}s", self.unknown, self.unknown
        elif t in _FLOAT_FORMAT:
            self.fmt, self.slow = _FLOAT_FORMAT[t], self.floating
        elif t == "bf16":
            self.fmt, self.fast, self.slow = "H", self.bf16, self.bf16
        elif t == "pred":
            self.fmt, self.fast, self.slow = "B", self.pred, self.pred
        else:  # u*, s*, b*
            kind = "u" if t[0] in "ub" else "s"
            self.fmt = _INT_FORMAT[(kind, size)]
            self.slow = self.integer
            if size == 8:  # a 64-bit integer may just as well be a pointer (nvcc writes T* as .u64)
                self.fast = to_u64 if kind == "u" else self.wide
            elif t[0] == "b":
                self.fast = self.integer

    # each returns the packed-ready value or raises ValueError with the reason
    def pointer(self, v):
        try:
            return device_pointer(v)
        except NbjitArgumentError as e:
            raise ValueError(str(e)) from None

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

    def bf16(self, v):
        if isinstance(v, np.generic) and v.dtype.itemsize == 2 and v.dtype.kind not in "fiub":
            return int.from_bytes(v.tobytes(), "little")  # ml_dtypes.bfloat16 and the like
        return _float_to_bf16(self.floating(v))

    def pred(self, v):
        if not isinstance(v, (bool, np.bool_, int, np.integer)) or isinstance(v, float):
            raise ValueError(f"{type(v).__name__} is not a boolean")
        return 1 if v else 0

    def blob(self, v):
        try:
            b = _raw_bytes(v, self.p.size)
        except ValueError:
            b = None
            n = len(bytes(v)) if isinstance(v, (bytes, bytearray, memoryview)) else None
            raise ValueError(f"{type(v).__name__} of {n if n is not None else 'another size'} bytes; the "
                             f"parameter is a {self.p.size}-byte aggregate (.b8[{self.p.size}]): pass exactly "
                             f"{self.p.size} bytes") from None
        if b is None:
            raise ValueError(f"{type(v).__name__} cannot fill a {self.p.size}-byte aggregate: pass bytes, a "
                             "ctypes.Structure or a numpy structured scalar of exactly that size"
                             + (" (for __half / __nv_bfloat16 pass np.float16 or the raw bytes)"
                                if self.p.size == 2 and _is_float(v) else ""))
        return b

    def unknown(self, v):
        """A cubin parameter: only its size is known."""
        size = self.p.size
        if isinstance(v, (np.generic, bytes, bytearray, memoryview, ctypes._SimpleCData, ctypes.Structure)):
            return self.blob(v)
        if size == 8:
            if type(v) is int or isinstance(v, int):
                if not -(1 << 63) <= v < 1 << 64:
                    raise ValueError(f"{v} does not fit in 8 bytes")
                return (v & ((1 << 64) - 1)).to_bytes(8, "little")
            if isinstance(v, float):
                return struct.pack("<d", v)
            return self.pointer(v).to_bytes(8, "little")
        if isinstance(v, int) and size in (1, 2, 4):
            bits = size * 8
            if not -(1 << (bits - 1)) <= v < 1 << bits:
                raise ValueError(f"{v} does not fit in {size} bytes")
            return (v & ((1 << bits) - 1)).to_bytes(size, "little")
        if isinstance(v, float) and size == 4:
            return struct.pack("<f", v)
        if isinstance(v, float):
            raise ValueError(f"a Python float is ambiguous for a {size}-byte parameter of unknown type: pass a "
                             "numpy scalar (np.float16, ...) or declare the signature with get_kernel(name, "
                             "signature=...)")
        raise ValueError(f"{type(v).__name__} cannot fill a {size}-byte parameter")


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
        if self.struct.size != sig.size:
            raise ValueError(f"kernel {kernel!r}: parameter layout packs to {self.struct.size} bytes, "
                             f"the signature says {sig.size}")
        self.n = len(self.rules)
        self.fast = tuple((i, r.fast) for i, r in enumerate(self.rules) if r.fast is not None)

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
                out.append(r.slow(v))
            except ValueError as e:
                p = r.p
                raise NbjitArgumentError(
                    f"kernel {self.kernel!r}, parameter {i} ({p.name}, {_kind(p)}): {e}") from None
        return out

    def pack_into(self, buf, args: tuple) -> None:
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
    if p.count is not None:
        return f".{p.type}[{p.count}]"
    return f".{p.type}"


# ------------------------------------------------------------------ declared signatures

_DECLARED = {
    "ptr": ("u64", True), "pointer": ("u64", True), "void*": ("u64", True),
    "i8": ("s8", False), "u8": ("u8", False), "i16": ("s16", False), "u16": ("u16", False),
    "i32": ("s32", False), "u32": ("u32", False), "i64": ("s64", False), "u64": ("u64", False),
    "int8": ("s8", False), "uint8": ("u8", False), "int16": ("s16", False), "uint16": ("u16", False),
    "int32": ("s32", False), "uint32": ("u32", False), "int64": ("s64", False), "uint64": ("u64", False),
    "f16": ("f16", False), "bf16": ("bf16", False), "f32": ("f32", False), "f64": ("f64", False),
    "float16": ("f16", False), "bfloat16": ("bf16", False), "float32": ("f32", False),
    "float64": ("f64", False), "half": ("f16", False), "float": ("f32", False), "double": ("f64", False),
    "int": ("s32", False), "bool": ("u8", False),
}


def parse_signature(text: str, kernel: str = "<kernel>") -> list[tuple[str, int | None]]:
    """``"ptr, ptr, f32, i32, bytes24"`` -> [(ptx type, byte count for ``bytesN``)].

    Names: ptr, i8..i64, u8..u64, f16, bf16, f32, f64 (and int32, float32, ... aliases),
    ``bytesN`` for an N-byte aggregate (a struct passed by value).
    """
    out = []
    for i, tok in enumerate(t.strip().lower() for t in text.split(",")):
        if tok.startswith("bytes") and tok[5:].isdigit() and int(tok[5:]) > 0:
            out.append(("b8", int(tok[5:])))
        elif tok in _DECLARED:
            out.append((tok, None))
        else:
            raise NbjitArgumentError(f"signature for {kernel!r}: parameter {i} {tok!r} is not a type (use ptr, "
                                     "i8..i64, u8..u64, f16, bf16, f32, f64 or bytesN)")
    return out


def declare(sig: KernelSignature, text: str, kernel: str) -> KernelSignature:
    """``sig`` (from a cubin: sizes and offsets only) with the types a user declared."""
    from .signature import SCALAR_TYPES

    decl = parse_signature(text, kernel)
    if len(decl) != len(sig.params):
        raise NbjitArgumentError(f"signature for {kernel!r} declares {len(decl)} parameters, the kernel has "
                                 f"{len(sig.params)}: {kernel}{sig}")
    params = []
    for i, ((tok, count), p) in enumerate(zip(decl, sig.params)):
        if count is not None:
            typ, pointer, size = "b8", False, count
        else:
            typ, pointer = _DECLARED[tok]
            size = SCALAR_TYPES[typ]
        if size != p.size:
            raise NbjitArgumentError(f"signature for {kernel!r}: parameter {i} declared {tok} ({size} bytes), "
                                     f"but the kernel's parameter {i} takes {p.size} bytes")
        params.append(Param(p.name, typ, size, p.align, p.offset, count, pointer or p.pointer, p.space,
                            p.pointee_align))
    return KernelSignature(tuple(params), sig.size)
