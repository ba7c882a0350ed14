"""TMA tensor maps: the 128-byte descriptors (``CUtensorMap``) that Hopper kernels take by
value (``const __grid_constant__ CUtensorMap``) to copy tiles with ``cp.async.bulk.tensor``.

``plan_tiled`` checks an array and a tile against the driver's rules and gives the
arguments of ``cuTensorMapEncodeTiled`` as plain data (no GPU); ``tensor_map`` (``nbjit.tensor_map``)
has the driver encode them for a device array.
Sizes and tiles are given in the array's own axis order (numpy's: the last axis varies
fastest); the driver counts dimensions the other way round, innermost first.
"""
from __future__ import annotations

import itertools
import operator
import re
from typing import Any, Mapping

import numpy as np

from nbjit.errors import NbjitArgumentError
from nbjit.gpu import driver as _driver
from nbjit.launch.arrays import array_element
from nbjit.records import record

__all__ = ["TensorMap", "TensorMapPlan", "plan_tiled", "plan_from_interface", "whole_numbers",
           "is_tensor_map_param", "tensor_map"]

SIZE = 128  # bytes of a CUtensorMap
ALIGN = 64

# numpy dtype -> CUtensorMapDataType name (ints of either sign are copied as their bits)
_DTYPES = {
    "u1": "UINT8", "i1": "UINT8", "b1": "UINT8",
    "u2": "UINT16", "i2": "UINT16",
    "u4": "UINT32", "i4": "INT32",
    "u8": "UINT64", "i8": "INT64",
    "f2": "FLOAT16", "f4": "FLOAT32", "f8": "FLOAT64",
}
_INTERLEAVE = {"none": "NONE", "16B": "16B", "32B": "32B"}
_SWIZZLE = {"none": ("NONE", 0), "32B": ("32B", 32), "64B": ("64B", 64), "128B": ("128B", 128)}
_L2 = {"none": "NONE", "64B": "L2_64B", "128B": "L2_128B", "256B": "L2_256B"}
_OOB = {"zero": "NONE", "nan": "NAN_REQUEST_ZERO_FMA"}


@record
class TensorMapPlan:
    """The arguments of ``cuTensorMapEncodeTiled``, checked: enum names (without their
    ``CU_TENSOR_MAP_..._`` prefix) and the driver's dimension order (innermost first)."""

    data_type: str
    rank: int
    address: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]  # bytes, dimensions 1..rank-1
    box: tuple[int, ...]
    element_strides: tuple[int, ...]
    interleave: str
    swizzle: str
    l2_promotion: str
    oob_fill: str
    dtype: str  # the numpy dtype, for messages
    shape: tuple[int, ...]  # the array's, numpy order
    box_shape: tuple[int, ...]  # the tile, numpy order


def _option(value: Any, table: dict, what: str) -> str:
    key = "none" if value is None and "none" in table else "zero" if value is None else value
    if type(key) is not str or key not in table:  # (a list or dict is no key: never looked up)
        raise NbjitArgumentError(f"tensor map: {what} must be one of {', '.join(map(repr, table))} (or None), "
                                 f"got {_show(value)}")
    return key


_MAX_ITEMS = 64  # entries read from a shape, strides or box (the rest is an error)


def _show(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _whole(v: Any) -> int | None:
    """``v`` as an int where it is one (a Python or numpy integer, anything with
    ``__index__``), else None: a bool, a float (2.5 is not truncated to 2), a string."""
    if isinstance(v, (bool, np.bool_)):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def whole_numbers(v: Any, what: str, rank: int | None = None) -> tuple[int, ...]:
    """``v``, a sequence of whole numbers (``rank`` of them where given), as ints; anything
    else is an ``NbjitArgumentError`` naming ``what``."""
    try:
        items = list(itertools.islice(v, _MAX_ITEMS + 1))  # bounded: a tensor map has at most 5 axes
    except TypeError:  # not iterable
        items = None
    out = None if items is None else [_whole(x) for x in items]
    if out is None or None in out:
        raise NbjitArgumentError(f"tensor map: {what} must be {'' if rank is None else f'{rank} '}integers, "
                                 f"got {_show(v)}")
    if len(out) > _MAX_ITEMS:
        raise NbjitArgumentError(f"tensor map: {what} has more than {_MAX_ITEMS} entries; a tensor map has 1 to 5 "
                                 "dimensions")
    if rank is not None and len(out) != rank:
        raise NbjitArgumentError(f"tensor map: {what} must be {rank} integers (one per axis of the "
                                 f"{rank}-D array), got {len(out)}: {_show(v)}")
    return tuple(x for x in out if x is not None)


def _ints(v: Any, rank: int, what: str, default: int | None = None) -> tuple[int, ...]:
    if v is None and default is not None:
        return (default,) * rank
    if _whole(v) is not None:
        v = (v,)
    return whole_numbers(v, what, rank)


def as_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a numpy dtype in the machine's byte order (what the GPU reads); else
    an ``NbjitArgumentError``."""
    try:
        dt = np.dtype(dtype)
    except Exception:  # numpy raises TypeError, ValueError, SyntaxError for what it cannot read
        raise NbjitArgumentError(f"tensor map: {_show(dtype)} is not a numpy dtype") from None
    if not dt.isnative:
        raise NbjitArgumentError(f"tensor map: the elements are {dt.str} ({'big' if dt.byteorder == '>' else 'little'}"
                                 "-endian), not in the GPU's byte order: convert the array (e.g. "
                                 f"astype({dt.newbyteorder('=').str!r})) first")
    return dt


def plan_tiled(address: int, shape: tuple[int, ...], strides: tuple[int, ...] | None, dtype: Any,
               box: Any, *, element_strides: Any = None, interleave: str | None = None,
               swizzle: str | None = None, l2_promotion: str | None = None,
               oob_fill: str | None = None, data_type: str | None = None) -> TensorMapPlan:
    """Check an array (device ``address``, ``shape``, byte ``strides`` or None for C order,
    ``dtype``) and a tile (``box``, one size per axis) against ``cuTensorMapEncodeTiled``'s
    rules; each breach is an ``NbjitArgumentError`` naming the rule and the axis.
    ``data_type`` names the driver's element type where the dtype does not say it
    (``"BFLOAT16"``, ``"FLOAT32_FTZ"``: a Triton kernel's own)."""
    dt = as_dtype(dtype)
    shape = whole_numbers(shape, "the shape")
    rank = len(shape)
    key = dt.str[1:] if dt.kind != "b" else "b1"
    if dt.name == "bfloat16" or str(dt) == "bfloat16":
        key = "bf16"
    if data_type is None:
        data_type = "BFLOAT16" if key == "bf16" else _DTYPES.get(key)
    if data_type is None:
        raise NbjitArgumentError(f"tensor map: arrays of {dt} cannot be described (TMA copies 1-, 2-, 4- and "
                                 "8-byte integers, float16, bfloat16, float32 and float64)")
    il, sw, l2, oob = (_option(interleave, _INTERLEAVE, "interleave"), _option(swizzle, _SWIZZLE, "swizzle"),
                       _option(l2_promotion, _L2, "l2_promotion"), _option(oob_fill, _OOB, "oob_fill"))
    if not 1 <= rank <= 5:
        raise NbjitArgumentError(f"tensor map: the array has {rank} dimensions; a tensor map has 1 to 5")
    if il != "none" and rank < 3:
        raise NbjitArgumentError(f"tensor map: interleave {il!r} needs an array of 3 or more dimensions, this one "
                                 f"has {rank}")
    size = dt.itemsize
    base = 32 if il == "32B" else 16
    addr = _whole(address)
    if addr is None or not 0 < addr < 1 << 64:
        raise NbjitArgumentError(f"tensor map: the array's address {_show(address)} is not a device address (a "
                                 "whole number from 1 to 2**64 - 1)")
    address = addr
    if address % base:
        raise NbjitArgumentError(f"tensor map: the array's address {address:#x} is not {base}-byte aligned (the "
                                 f"driver needs {base}" + (" with interleave '32B'" if base == 32 else "") + ")")
    if strides is None:
        strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * size for i in range(rank))
    strides = whole_numbers(strides, "strides (bytes, one per axis)", rank)
    for ax, n in enumerate(shape):
        if not 1 <= n <= 1 << 32:
            raise NbjitArgumentError(f"tensor map: axis {ax} has {n} elements; each axis must have 1 to 2**32")
    if shape[-1] > 1 and strides[-1] != size:
        raise NbjitArgumentError(f"tensor map: the last axis (axis {rank - 1}) must be contiguous (stride {size} "
                                 f"bytes for {dt}), its stride is {strides[-1]} bytes")
    sbase = 32 if il == "32B" else 16
    for ax in range(rank - 1):
        s = strides[ax]
        if s <= 0 or s % sbase or s >= 1 << 40:
            raise NbjitArgumentError(f"tensor map: axis {ax} has a stride of {s} bytes; strides must be positive "
                                     f"multiples of {sbase} bytes below 2**40 (a {dt} row of {shape[-1]} elements is "
                                     f"{shape[-1] * size} bytes: pad rows to a multiple of {sbase})")
    box_shape = _ints(box, rank, "box")
    for ax, b in enumerate(box_shape):
        if not 1 <= b <= 256:
            raise NbjitArgumentError(f"tensor map: box[{ax}] = {b}; a box side is 1 to 256 elements")
    inner = box_shape[-1] * size
    if il == "none" and inner % 16:
        raise NbjitArgumentError(f"tensor map: the box's last axis is {box_shape[-1]} x {size} = {inner} bytes; "
                                 "without interleave it must be a multiple of 16 bytes")
    es = _ints(element_strides, rank, "element_strides", default=1)
    for ax, e in enumerate(es):
        if not 1 <= e <= 8:
            raise NbjitArgumentError(f"tensor map: element_strides[{ax}] = {e}; element strides are 1 to 8")
    sw_name, span = _SWIZZLE[sw]
    if il == "none" and span and inner > span:
        raise NbjitArgumentError(f"tensor map: swizzle {sw!r} takes a box whose last axis spans at most {span} "
                                 f"bytes; it spans {inner} ({box_shape[-1]} x {size})")
    if il == "32B" and sw != "32B":
        raise NbjitArgumentError(f"tensor map: interleave '32B' needs swizzle '32B', got {sw!r}")
    if oob == "nan" and dt.kind != "f" and key != "bf16" and "FLOAT" not in data_type:
        raise NbjitArgumentError(f"tensor map: oob_fill 'nan' is for floating-point arrays, not {dt}")
    return TensorMapPlan(data_type, rank, address, shape[::-1], strides[:-1][::-1], box_shape[::-1], es[::-1],
                         _INTERLEAVE[il], sw_name, _L2[l2], _OOB[oob], str(dt), shape, box_shape)


_TYPESTR = re.compile(r"[<>|=][a-zA-Z]\d{1,3}(?:\[\w{1,8}\])?")
_CAI_VERSIONS = range(0, 4)


def plan_from_interface(cai: Any, box: Any, *, dtype: Any = None, data_type: str | None = None,
                        **options: Any) -> TensorMapPlan:
    """``plan_tiled`` for the array a ``__cuda_array_interface__`` dict describes (versions 0
    to 3), each of its entries checked first: ``data`` (address, read-only flag), ``shape``,
    ``typestr``, ``strides``, ``version``, ``mask``. ``dtype``, ``data_type``: the element
    type where the array's own dtype says more than its typestr (bfloat16)."""
    def bad(key: str, why: str) -> NbjitArgumentError:
        return NbjitArgumentError(f"tensor map: the array's __cuda_array_interface__ {key!r} {why}")

    if not isinstance(cai, Mapping):
        raise NbjitArgumentError(f"tensor map: __cuda_array_interface__ must be a dict, not {type(cai).__name__}")
    for key in ("version", "shape", "typestr", "data"):
        if key not in cai:
            raise bad(key, "is missing (it must hold version, shape, typestr and data)")
    version = _whole(cai["version"])
    if version not in _CAI_VERSIONS:
        raise bad("version", f"is {_show(cai['version'])}; nbjit reads versions 0 to 3")
    if cai.get("mask") is not None:
        raise bad("mask", "is set: a masked array cannot be described by a tensor map")
    data = cai["data"]
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise bad("data", f"must be (address, read-only flag), got {_show(data)}")
    if not isinstance(data[1], (bool, np.bool_)):
        raise bad("data", f"must be (address, read-only flag): the flag is {_show(data[1])}, not True or False")
    shape = cai["shape"]
    if not isinstance(shape, (tuple, list)):
        raise bad("shape", f"must be a tuple of whole numbers, got {_show(shape)}")
    shape = whole_numbers(shape, "the shape")
    strides = cai.get("strides")
    if strides is not None:
        if not isinstance(strides, (tuple, list)):
            raise bad("strides", f"must be None or a tuple of whole numbers, got {_show(strides)}")
        strides = whole_numbers(strides, "strides (bytes, one per axis)", len(shape))
    typestr = cai["typestr"]
    if not isinstance(typestr, str) or not _TYPESTR.fullmatch(typestr):
        raise bad("typestr", f"is {_show(typestr)}, not a type string such as '<f4'")
    own = as_dtype(typestr)
    if dtype is not None and as_dtype(dtype).itemsize != own.itemsize:
        raise bad("typestr", f"is {typestr!r} ({own.itemsize} bytes), but the array's dtype is {dtype} "
                             f"({as_dtype(dtype).itemsize} bytes)")
    return plan_tiled(data[0], shape, strides, own if dtype is None else dtype, box, data_type=data_type,
                      **options)


class TensorMap:
    """A TMA descriptor (``CUtensorMap``, 128 bytes) for tiles of a device array, made by
    ``nbjit.tensor_map``. Pass it to a kernel's ``const __grid_constant__ CUtensorMap``
    parameter (and only there). It keeps the array alive; it describes that array's memory
    as it was when made."""

    __slots__ = ("data", "plan", "array")

    def __init__(self, data: bytes, plan: TensorMapPlan, array: Any = None):
        if len(data) != SIZE:
            raise NbjitArgumentError(f"a tensor map is {SIZE} bytes, not {len(data)}")
        self.data = bytes(data)
        self.plan = plan
        self.array = array

    def __bytes__(self) -> bytes:
        return self.data

    def __repr__(self) -> str:
        p = self.plan
        opts = [f"{k} {v}" for k, v in (("swizzle", p.swizzle), ("interleave", p.interleave),
                                       ("l2", p.l2_promotion), ("oob", p.oob_fill)) if v != "NONE"]
        return (f"<nbjit.TensorMap {p.dtype}{list(p.shape)} in boxes of {list(p.box_shape)}"
                + (f", {', '.join(opts)}" if opts else "") + ">")


def is_tensor_map_param(size: int, align: int | None, ctype: str | None) -> bool:
    """Whether a parameter takes a tensor map: a 128-byte value declared ``CUtensorMap``,
    or (where no C type says otherwise) aligned to 64 bytes, as ``__grid_constant__
    CUtensorMap`` parameters are in PTX."""
    if size != SIZE:
        return False
    if ctype is not None:
        return "CUtensorMap" in ctype
    return align == ALIGN


def tensor_map(array: Any, box: Any, *, element_strides: Any = None, interleave: str | None = None,
               swizzle: str | None = None, l2_promotion: str | None = None,
               oob_fill: str | None = None) -> TensorMap:
    """A tiled TMA tensor map over a device array (a Numba device array, or anything with
    ``__cuda_array_interface__``: CuPy, PyTorch), for a kernel's ``const __grid_constant__
    CUtensorMap`` parameter.

    Parameters
    ----------
    box: the tile, one size per axis in the array's order (e.g. ``(64, 32)``: 64 rows of 32).
    element_strides: the step along each axis inside the box (1 to 8; default 1).
    interleave: ``None``/``"none"``, ``"16B"`` or ``"32B"``.
    swizzle: ``None``/``"none"``, ``"32B"``, ``"64B"`` or ``"128B"`` (shared-memory bank swizzling).
    l2_promotion: ``None``/``"none"``, ``"64B"``, ``"128B"`` or ``"256B"``.
    oob_fill: ``None``/``"zero"`` (elements outside the array read as 0) or ``"nan"`` (floats).

    Raises
    ------
    NbjitArgumentError: the array or tile breaks a rule of the driver's (alignment, strides,
    box sizes, swizzle span, ...): the message says which, and for which axis.
    """
    from nbjit.launch.tma import TensorMap
    plan = plan_for_array(array, box, element_strides=element_strides, interleave=interleave, swizzle=swizzle,
                          l2_promotion=l2_promotion, oob_fill=oob_fill)
    return TensorMap(_driver.encode_tensor_map_tiled(plan), plan, array)


def plan_for_array(array: Any, box: Any, **options: Any) -> TensorMapPlan:
    """``tma.plan_from_interface`` for a device array (a Numba device array, or anything
    with ``__cuda_array_interface__``), its element type read as the packer reads it."""
    from nbjit.launch.tma import plan_from_interface
    try:
        cai = array.__cuda_array_interface__
    except AttributeError:
        cai = None
    except Exception as e:  # the exporter refused (torch: a dtype the interface has no typestr for)
        raise NbjitArgumentError(f"tensor map: {type(array).__name__}.__cuda_array_interface__ raised "
                                 f"{type(e).__name__}: {str(e)[:200]}") from None
    if cai is None:
        raise NbjitArgumentError(f"tensor map: {type(array).__name__} is not a device array (expected a Numba "
                                 "device array or an object with __cuda_array_interface__)")
    if (array_element(array) or ("",))[0] == "bf":  # typestr '<V2': the array's own dtype says bfloat16
        return plan_from_interface(cai, box, dtype="u2", data_type="BFLOAT16", **options)
    return plan_from_interface(cai, box, **options)
