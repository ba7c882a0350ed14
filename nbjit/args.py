"""Pack Python values into a kernel's parameter buffer, by its KernelSignature.

Pure Python (no driver calls), so every conversion rule and its error is tested on a CPU.
The fast path packs the whole buffer with one precompiled ``struct.Struct``: pointer and
64-bit parameters go through a converter (arrays -> addresses), scalars go straight to
``struct``, which range-checks them. Anything ``struct`` rejects is re-run through the
precise per-parameter rules, which either accept it (numpy scalars that need
reinterpreting) or raise an ``NbjitArgumentError`` naming the kernel and parameter.
"""
from __future__ import annotations

import sys
import math
import struct
from typing import Any, Callable

import numpy as np

from nbjit import _host
from nbjit.errors import NbjitArgumentError
from nbjit.signature import KernelSignature, Param




def _tensor_map_param(size: int, align: int | None, ctype: str | None) -> bool:
    """Whether a 128-byte parameter is a tensor map (the tma module is imported only then)."""
    from nbjit.tma import is_tensor_map_param
    return is_tensor_map_param(size, align, ctype)


def _is_tensor_map(v) -> bool:
    """Whether ``v`` is an ``nbjit.TensorMap`` (none exists before the tma module is imported)."""
    tma = sys.modules.get("nbjit.tma")
    return tma is not None and isinstance(v, tma.TensorMap)

__all__ = ["ArgPacker", "device_pointer", "parse_signature", "declare"]

_INT_FORMAT = {("u", 1): "B", ("u", 2): "H", ("u", 4): "I", ("u", 8): "Q",
               ("s", 1): "b", ("s", 2): "h", ("s", 4): "i", ("s", 8): "q"}
_FLOAT_FORMAT = {"f16": "e", "f32": "f", "f64": "d"}
_RARE = frozenset({"c8", "c16", "unknown", "b128", "bf16", "pred"})  # types whose rules are _args_extra's

# ------------------------------------------------------------------ device pointers

_EXTRACTORS: dict[type, Callable[[Any], int]] = {}


class _NotAPointer(ValueError):
    pass


def _cai(a) -> int:
    try:
        return a.__cuda_array_interface__["data"][0]
    except Exception as e:  # JAX: the property raises for an array on the CPU
        if hasattr(a, "__dlpack__") and hasattr(a, "__dlpack_device__"):
            return _dlpack(a)  # (where the memory is, said as DLPack's device says it)
        raise _NotAPointer(f"{type(a).__name__}.__cuda_array_interface__ failed: {e}") from None


def _torch(t) -> int:
    if not t.is_cuda:
        raise _NotAPointer("a PyTorch tensor on the CPU: move it to the GPU first (tensor.cuda())")
    return t.data_ptr()


def _cupy(a) -> int:
    return a.data.ptr


def _dl_tensor(a) -> tuple[int, str, int, str]:
    """``(address, element kind, item size, dtype name)`` of an object offering DLPack, on
    a CUDA device; ``_NotAPointer`` saying where its memory is otherwise (``_args_extra``'s
    reader, which replaces this on first use)."""
    global _dl_tensor
    from nbjit._args_extra import dlpack_reader
    _dl_tensor = dlpack_reader(_NotAPointer)
    return _dl_tensor(a)


def _dlpack(a) -> int:
    return _dl_tensor(a)[0]


def _host_array(a) -> int:
    raise _NotAPointer(f"a host {type(a).__name__} (memory on the CPU): copy it to the device first, "
                       "e.g. numba.cuda.to_device(array)")


def _extractor(t: type) -> Callable[[Any], int] | None:
    """How to get a device address out of an object of type ``t`` (decided once per type)."""
    f = _host.pointer_getter(t)  # Numba's device arrays and pointers
    if f is not None:
        return f
    mod = t.__module__.split(".")[0]
    if mod == "torch" and hasattr(t, "data_ptr"):
        return _torch
    if mod == "cupy" and t.__name__ == "ndarray":
        return _cupy
    if hasattr(t, "__cuda_array_interface__"):
        return _cai
    if issubclass(t, np.ndarray):
        return _host_array
    if hasattr(t, "__dlpack__") and hasattr(t, "__dlpack_device__"):  # (JAX arrays also have __array__)
        return _dlpack
    if hasattr(t, "__array_interface__") or hasattr(t, "__array__"):
        return _host_array
    return None


def device_pointer(obj: Any) -> int:
    """The device address an argument stands for: Numba device arrays and pointers, anything
    with ``__cuda_array_interface__`` (CuPy, PyTorch) or DLPack on a CUDA device
    (``__dlpack__``: JAX arrays), plain integers and ``None`` (NULL).

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
                                     "array, an object with __cuda_array_interface__ or __dlpack__, an int address "
                                     "or None)")
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


# ------------------------------------------------------------------ array element types

_NP_KIND = {"f": "f", "i": "i", "u": "i", "b": "b", "c": "c"}
_KIND_NAMES = {"f": "float", "i": "int", "b": "bool", "bf": "bfloat16", "c": "complex"}


def array_element(v) -> tuple[str, int, str] | None:
    """``(kind, item size, dtype name)`` of the elements of a device array (``kind`` as in
    ``cdecl.element_of``: "f", "i", "b", "bf", "c", or "V" for structured and other
    items), or None for what has no element type (integer addresses, ``MemoryPointer``)."""
    d = getattr(v, "dtype", None)
    if d is not None and type(d).__module__.split(".")[0] == "torch":
        name = str(d).rpartition(".")[2]
        if name == "bfloat16":
            return "bf", 2, name
        try:
            d = np.dtype(name)
        except TypeError:
            return "V", int(getattr(d, "itemsize", 0) or 0), name
    if not isinstance(d, np.dtype):
        try:
            d = np.dtype(v.__cuda_array_interface__["typestr"])
        except Exception:  # no array interface: DLPack's, else nothing to check
            if hasattr(v, "__dlpack__") and hasattr(v, "__dlpack_device__"):
                try:
                    return _dl_tensor(v)[1:]
                except Exception:  # (the pointer's own check says what is wrong)
                    return None
            return None
    if d.name == "bfloat16":  # ml_dtypes
        return "bf", 2, d.name
    return _NP_KIND.get(d.kind, "V"), d.itemsize, str(d)


def element_matches(want: tuple[str, int | None], got: tuple[str, int, str]) -> bool:
    """Whether an array of element ``got`` may be passed for a pointer to ``want``: kind and
    size agree; integers of either signedness match; bool and 1-byte integers match;
    vector and ``complex<T>`` pointees (kind "any") take any item of their size."""
    wk, ws = want
    gk, gs, _ = got
    if wk == "void":
        return True
    if wk == "any":
        return gs == ws
    if wk == "i":
        return gs == ws and (gk == "i" or (gk == "b" and ws == 1))
    if wk == "b":
        return gs == 1 and gk in ("b", "i")
    return gk == wk and gs == ws


def describe_element(want: tuple[str, int | None]) -> str:
    wk, ws = want
    if wk == "any":
        return f"items of {ws} bytes"
    if wk == "i":
        return f"int{ws * 8} or uint{ws * 8}" + (" (or bool)" if ws == 1 else "")
    if wk == "b":
        return "bool (or a 1-byte integer)"
    if wk == "bf":
        return "bfloat16"
    return f"{_KIND_NAMES[wk]}{ws * 8 if wk != 'c' else ws * 8}"






def _address(v: int) -> int:
    if not 0 <= v < 1 << 64:
        raise NbjitArgumentError(f"address {v} is not a 64-bit unsigned value")
    return v


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
            from nbjit import _args_extra as x  # (the rules few kernels need: each a converter made once)
            if t == "numba_array":
                self.fmt, conv = f"{size}s", x.numba_array(self, _EXTRACTORS, device_pointer)
            elif t in ("c8", "c16"):
                self.fmt, conv = f"{size}s", x.complex_number(self)
            elif self.tensor_map:
                self.fmt, conv = f"{size}s", x.tensor_map_value(self)
            elif p.count is not None or t == "b128":
                self.fmt, conv = f"{size}s", x.blob(self)
            elif t == "unknown":
                self.fmt, conv = f"{size}s", x.unknown(self)
            elif t == "bf16":
                self.fmt, conv = "H", x.bf16(self)
            else:  # .pred
                self.fmt, conv = "B", x.pred(self)
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
    if p.count is not None:
        return f".{p.type}[{p.count}]"
    return f".{p.type}"


# ------------------------------------------------------------------ declared signatures


def parse_signature(text: str, kernel: str = "<kernel>") -> list:
    """``"float*, const float*, float, int"`` or ``"ptr, ptr, f32, i32, bytes24"`` -> a
    ``cdecl.CParam`` per parameter.

    Each item is a C type (``float*``, ``const double*``, ``unsigned long long``,
    ``__half``, ``float2*``, a struct name), a short name (``ptr``, ``i8``..``i64``,
    ``u8``..``u64``, ``f16``, ``bf16``, ``f32``, ``f64`` and the ``int32``, ``float32``
    aliases; a short name with ``*`` is a typed pointer, ``f32*``), ``bytesN`` for an
    N-byte aggregate passed by value, or ``CUtensorMap`` for a TMA descriptor (it takes an
    ``nbjit.TensorMap``).
    """
    from nbjit._args_extra import parse_signature
    return parse_signature(text, kernel)


def declare(sig: KernelSignature, text: str, kernel: str) -> KernelSignature:
    """``sig`` with the types a user declared (checked against its sizes)."""
    from nbjit._args_extra import declare
    return declare(sig, text, kernel)
