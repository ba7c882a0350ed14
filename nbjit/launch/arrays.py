"""Device arrays as kernel arguments: the device address an argument stands for (Numba's
arrays and pointers, ``__cuda_array_interface__`` (CuPy, PyTorch), DLPack on a CUDA device
(JAX), ints and None) and the element type of an array, checked against a typed pointer."""
from __future__ import annotations

import ctypes
import struct
from typing import Any, Callable

import numpy as np

from nbjit.errors import NbjitArgumentError
from nbjit.gpu import host as _host

__all__ = ["device_pointer", "register_handle", "handle_value", "to_u64", "array_element", "element_matches",
           "describe_element", "dlpack_reader", "dlpack_array"]

_EXTRACTORS: dict[type, Callable[[Any], int]] = {}


class _NotAPointer(ValueError):
    pass


_HANDLES: dict[type, Callable[[Any, Any], int]] = {}


def register_handle(t: type, f: Callable[[Any, Any], int]) -> None:
    """Let objects of type ``t`` (nbjit's own handles: graph conditions) fill a 64-bit
    parameter: ``f(obj, param)`` gives the value and notes which parameter took it, or raises
    an nbjit error where the object may not be passed now. The Python rules take them (the C
    path hands them over, as anything it does not know)."""
    _HANDLES[t] = f


def handle_value(v: Any, param: Any) -> int | None:
    """The value of an nbjit handle ``v`` given to ``param``; None where ``v`` is no handle."""
    f = _HANDLES.get(type(v))
    return None if f is None else f(v, param)


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
    a CUDA device; ``_NotAPointer`` saying where its memory is otherwise (``dlpack_reader``'s
    reader, which replaces this on first use)."""
    global _dl_tensor
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


_NP_KIND = {"f": "f", "i": "i", "u": "i", "b": "b", "c": "c"}


_KIND_NAMES = {"f": "float", "i": "int", "b": "bool", "bf": "bfloat16", "c": "complex"}


def array_layout(v) -> tuple[int, tuple[int, ...], tuple[int, ...], np.dtype]:
    """``(address, shape, strides in bytes, numpy dtype)`` of a device array: anything with
    ``__cuda_array_interface__`` (Numba, CuPy, PyTorch) or DLPack on a CUDA device; ValueError
    saying what it is otherwise."""
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
        if not (hasattr(v, "__dlpack__") and hasattr(v, "__dlpack_device__")):
            raise ValueError(f"{type(v).__name__} is not a device array (pass a Numba device array or an object "
                             "with __cuda_array_interface__ or __dlpack__)") from None
        ptr, shape, strides, dt = dlpack_array(v)  # (its ValueError says what it is instead)
    return ptr, shape, tuple(int(x) for x in strides) if strides is not None else c_strides(shape, dt.itemsize), dt


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The strides, in bytes, of a C-contiguous array (what an array interface's ``strides: None`` means)."""
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


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
    return dtype_element(d)


def dtype_element(d: np.dtype) -> tuple[str, int, str]:
    """``array_element`` of an array of numpy dtype ``d``."""
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


def _dl_head(a, not_a_pointer: type[ValueError]) -> tuple[tuple, int]:
    """The DLTensor of an object offering DLPack on a CUDA device, read in place (``_DL_HEAD``'s
    fields) and where it lies; ``not_a_pointer`` saying where its memory is otherwise."""
    global _capsule_pointer
    try:
        dev, _ = a.__dlpack_device__()
    except Exception as e:
        raise not_a_pointer(f"{type(a).__name__}.__dlpack_device__() failed: {e}") from None
    if dev not in (_DL_CUDA, _DL_CUDA_MANAGED):
        raise not_a_pointer(f"a {type(a).__name__} in {_DL_DEVICES.get(int(dev), f'DLPack device type {dev}')} "
                            "(its __dlpack_device__): pass one on the GPU")
    try:
        capsule = a.__dlpack__()
    except Exception as e:  # (PyTorch's RuntimeError for a tensor that requires grad, BufferError, ...)
        raise not_a_pointer(f"{type(a).__name__}.__dlpack__() failed: {str(e)[:200]}") from None
    if _capsule_pointer is None:
        f = ctypes.pythonapi.PyCapsule_GetPointer
        f.restype, f.argtypes = ctypes.c_void_p, (ctypes.py_object, ctypes.c_char_p)
        _capsule_pointer = f
    try:
        at = _capsule_pointer(capsule, b"dltensor")
    except ValueError:
        raise not_a_pointer(f"{type(a).__name__}.__dlpack__() gave no DLPack tensor capsule") from None
    return _DL_HEAD.unpack(ctypes.string_at(at, _DL_HEAD.size)), capsule


def dlpack_reader(not_a_pointer: type[ValueError]) -> Callable[[Any], tuple[int, str, int, str]]:
    """``_dl_tensor``: ``read(a)`` -> ``(address, element kind, item size, dtype name)``
    of an object offering DLPack, on a CUDA device; ``not_a_pointer`` (``_NotAPointer``)
    saying where its memory is otherwise."""
    def read(a) -> tuple[int, str, int, str]:
        (data, _, _, _, code, bits, lanes, _, _, offset), _capsule = _dl_head(a, not_a_pointer)
        size = bits * lanes // 8
        name = f"{_DL_NAMES.get(code, f'dlpack type {code} of ')}{bits}" + (f"x{lanes}" if lanes != 1 else "")
        return data + offset, ("V" if lanes != 1 else _DL_KINDS.get(code, "V")), size, name
    return read


_DL_NUMPY = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}  # DLDataTypeCode -> numpy kind (bfloat16: none)


def dlpack_array(a) -> tuple[int, tuple[int, ...], tuple[int, ...] | None, np.dtype]:
    """``(address, shape, strides in bytes or None where C-contiguous, numpy dtype)`` of an
    object offering DLPack on a CUDA device (what a Numba array argument is packed from);
    ValueError saying what it is otherwise (not on the GPU, an element type numpy has not)."""
    (data, _, _, ndim, code, bits, lanes, shape_at, strides_at, offset), capsule = _dl_head(a, ValueError)
    kind = _DL_NUMPY.get(code)
    if kind is None or lanes != 1:
        raise ValueError(f"its DLPack element type ({_DL_NAMES.get(code, f'code {code}')}{bits}"
                         f"{f'x{lanes}' if lanes != 1 else ''}) is none of numpy's")
    try:
        dt = np.dtype(f"{kind}{bits // 8}") if kind != "b" else np.dtype(bool)
    except TypeError:  # (4-bit, 24-bit, ... integers)
        raise ValueError(f"its DLPack element type ({_DL_NAMES[code]}{bits}) is none of numpy's") from None
    shape = tuple(ctypes.cast(shape_at, ctypes.POINTER(ctypes.c_int64))[i] for i in range(ndim))
    strides = tuple(ctypes.cast(strides_at, ctypes.POINTER(ctypes.c_int64))[i] * dt.itemsize
                    for i in range(ndim)) if strides_at else None  # (in items; none: C-contiguous)
    del capsule  # (read while the capsule lived: its producer frees the DLTensor with it)
    return data + offset, shape, strides, dt
