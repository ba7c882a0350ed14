"""Numba's kernel ABI: how a ``@cuda.jit`` kernel's arguments become PTX parameters, read
from Numba's mangled kernel names or from Numba types. Pure data: Numba's types are read by
the host (``_host.Host.describe_type``), never imported here.

numba-cuda (``_Kernel._prepare_args``, ``ArrayModel``; model ``"numba"``) passes
* an array as 5 + 2·ndim 8-byte fields: meminfo (0), parent (0), nitems, itemsize, data
  pointer, shape[ndim], strides[ndim] (in bytes);
* an integer, float or boolean as itself (float16 as its 16 bits);
* a complex number as two floats (real, imaginary).

numba-cuda-mlir (its ``ArrayModel`` is an MLIR memref; model ``"mlir"``) passes
* an array as MLIR's memref descriptor, 3 + 2·ndim 8-byte fields: the allocated and the
  aligned data pointer, an offset, sizes[ndim], strides[ndim], offset and strides counted in
  items (in bytes for records and character sequences, whose memref is one of bytes);
* a complex number as one parameter (two floats, aligned as one);
* the rest as numba-cuda does. Its names are Itanium names without numba-cuda's ABI tags
  (``_Z4axpyf5ArrayIfLi1E1C7mutable7alignedE...``, ``_ZN5outer12_3clocals_3e5innerE...``).

Tuples (flattened), records passed by value (a device pointer Numba makes) and other types
are not supported here: ``NumbaAbiError`` says so.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterable

import numpy as np

from nbjit.errors import NbjitLoadError
from nbjit.params.cdecl import MAX_DEMANGLED, mangled_tree, scalar_facts
from nbjit.params.signature import RESOURCES, KernelInfo, KernelSignature, Param
from nbjit.records import record

# patterns used on every call, compiled once at import
_ABI_TAG = re.compile(r"B\d+v\d+B\d+")

__all__ = ["NumbaArray", "NumbaScalar", "NumbaAbiError", "from_mangled", "from_numba_types", "is_numba_name",
           "is_mlir_name", "fields", "signature", "to_json", "from_json", "device_ltoir", "C_CONTIGUOUS",
           "F_CONTIGUOUS", "MODELS"]

C_CONTIGUOUS, F_CONTIGUOUS = "C", "F"
_LAYOUTS = ("C", "F", "A")
MAX_NDIM = 64  # NumPy's limit (NPY_MAXDIMS)
MODELS = ("numba", "mlir")  # numba-cuda's ABI, numba-cuda-mlir's


class NumbaAbiError(NbjitLoadError):
    """A Numba kernel whose arguments nbjit cannot pass (tuples, records by value, ...)."""


@record
class NumbaArray:
    """An array argument: element ``dtype`` (None where a name does not say, e.g. records),
    ``ndim``, ``layout`` ("C", "F" or "A": any strides), whether it is read-only, and the
    ``model`` of the compiler that passes it ("numba": numba-cuda's fields, "mlir": a memref);
    ``name`` the Python parameter's, where the kernel's function is known (``from_numba``)."""

    dtype: np.dtype | None
    ndim: int
    layout: str
    readonly: bool = False
    model: str = "numba"
    name: str | None = None

    @property
    def text(self) -> str:
        d = "?" if self.dtype is None else str(self.dtype)
        return f"{'readonly ' if self.readonly else ''}array({d}, {self.ndim}d, {self.layout})"


@record
class NumbaScalar:
    """A scalar argument of ``dtype`` (complex ones take two parameters under numba-cuda's
    ``model``, one under numba-cuda-mlir's); ``name`` the Python parameter's, where known."""

    dtype: np.dtype
    model: str = "numba"
    name: str | None = None

    @property
    def text(self) -> str:
        return str(self.dtype)


# Numba's own names for types C has no builtin for
_NAMED = {"complex64": "complex64", "complex128": "complex128", "float16": "float16", "_Float16": "float16"}


def is_numba_name(name: str) -> bool:
    """Whether a kernel name is numba-cuda's (``_ZN<module><name>B<abi>...E<args>``: ABI tags)."""
    return name.startswith("_ZN") and _ABI_TAG.search(name) is not None


def is_mlir_name(name: str) -> bool:
    """Whether a kernel name is numba-cuda-mlir's: an Itanium function name without
    numba-cuda's ABI tags, one of whose arguments is Numba's array type
    (``Array<float, 1, C, mutable, aligned>``; a kernel of scalars alone reads as C++ does,
    and is passed alike)."""
    if not name.startswith("_Z") or "7alignedE" not in name or "5ArrayI" not in name:
        return False
    tree = mangled_tree(name)
    return getattr(tree, "kind", None) == "func" and not _abi_tagged(tree) and \
        any(_is_array(node) for node in tree.arg_tys)


def _abi_tagged(tree) -> bool:
    """Whether a demangled function's name carries ABI tags (``axpy[abi:v1]``: numba-cuda's)."""
    return "[abi:" in str(tree.name)


def _is_array(node) -> bool:
    """Whether a demangled argument type is Numba's ``Array<dtype, ndim, layout, mutable|readonly,
    aligned>`` (the first two checked only by ``_array``, which says what is wrong)."""
    if node.kind != "qual_name" or str(node.value[0]) != "Array":
        return False
    args = node.value[1].value if len(node.value) > 1 and node.value[1].kind == "tpl_args" else ()
    return len(args) == 5 and str(args[3]) in ("mutable", "readonly") and str(args[4]) == "aligned"


_SOURCE_NAME = re.compile(r"(\d+)")


def _source_name(name: str) -> str | None:
    """The Python name a Numba-mangled kernel name starts with, read without the demangler
    (the names of its nested components, ``_ZN8__main__4axpyB...`` -> ``__main__.axpy``;
    ``_Z4axpy5ArrayI...`` -> ``axpy``), or None where the name is not of that form."""
    nested = name.startswith("_ZN")
    i, parts = (3 if nested else 2), []
    while i < len(name) and name[i].isdigit():
        n = _SOURCE_NAME.match(name, i)
        if len(n.group()) > 6:  # (no name component is a megabyte long)
            return None
        i = n.end() + int(n.group())
        if i > len(name):
            return None
        parts.append(name[n.end():i])
        if not nested:
            break
    if not parts or (nested and name[i:i + 1] not in ("B", "E")):
        return None
    return ".".join(parts).replace("_3clocals_3e", "<locals>")


def readable_name(name: str) -> str:
    """A Numba kernel's Python name from its mangled one (``__main__.axpy``), for messages;
    the mangled name where it cannot be read."""
    quick = _source_name(name) if name.startswith("_Z") and not name.startswith("_ZNK") else None
    if quick:
        return quick
    tree = mangled_tree(name)
    if getattr(tree, "kind", None) != "func":  # not a name the demangler reads
        return name
    text = re.sub(r"\[abi:[^\]]*\]", "", str(tree.name))
    return text.replace("::", ".").replace("_3clocals_3e", "<locals>") or name  # (Numba's escape of '<locals>')


def _dtype_of(node) -> np.dtype | None:
    """The numpy dtype of a C builtin (by cdecl's table) or of a Numba type name."""
    text = str(node)
    if node.kind == "builtin":
        facts = scalar_facts(text)
        if facts is not None and facts[0] != "b128":
            ptx, size, kind = facts
            return np.dtype("bool" if kind == "b" else f"{'f' if ptx[0] == 'f' else ptx[0].replace('s', 'i')}{size}")
    if text in _NAMED:
        return np.dtype(_NAMED[text])
    return None


def from_mangled(name: str) -> tuple:
    """The argument types a Numba-mangled kernel name encodes (``Array<float, 1, C, mutable,
    aligned>`` -> ``NumbaArray(float32, 1, "C")``), numba-cuda's or numba-cuda-mlir's (its
    model then "mlir"); NumbaAbiError for a type nbjit cannot pass."""
    tree = mangled_tree(name)
    if getattr(tree, "kind", None) != "func":
        raise NumbaAbiError(f"kernel {name[:80]!r}: not a Numba kernel name the demangler can read (an "
                            f"Itanium-mangled function name whose demangled form is at most {MAX_DEMANGLED} "
                            "characters)")
    model = "numba" if _abi_tagged(tree) else "mlir"
    out = []
    for i, node in enumerate(tree.arg_tys):
        if node.kind == "qual_name" and str(node.value[0]) == "Array":
            out.append(_array(name, i, node, model))
            continue
        dt = _dtype_of(node)
        if dt is None:
            raise NumbaAbiError(f"kernel {name[:80]!r}: argument {i} is {str(node)[:80]}: nbjit passes Numba arrays, "
                                "integers, floats, booleans and complex numbers (not tuples or records)")
        out.append(NumbaScalar(dt, model))
    return tuple(out)


def _array(name: str, i: int, node, model: str = "numba") -> NumbaArray:
    """Argument ``i``, an ``Array<dtype, ndim, layout, mutable|readonly, aligned>`` node."""
    where = f"kernel {name[:80]!r}: argument {i}"
    args = node.value[1].value if len(node.value) > 1 and node.value[1].kind == "tpl_args" else ()
    if len(args) < 4:
        raise NumbaAbiError(f"{where}: unexpected array type {str(node)[:80]} (Numba writes "
                            "Array<dtype, ndim, layout, mutable|readonly, aligned>)")
    nd = args[1]
    text = str(nd.value) if nd.kind == "literal" else ""
    if not (text.isascii() and text.isdigit() and len(text) <= 2 and int(text) <= MAX_NDIM):
        raise NumbaAbiError(f"{where}: array ndim {str(nd)[:40]!r} is not a whole number from 0 to {MAX_NDIM} "
                            "(Numba writes it as a literal, Li2E)")
    layout = str(args[2])
    if layout not in _LAYOUTS:
        raise NumbaAbiError(f"{where}: array layout {layout[:40]!r} is not one of {', '.join(_LAYOUTS)}")
    return NumbaArray(_dtype_of(args[0]), int(text), layout, str(args[3]) == "readonly", model)


def from_numba_types(argtypes: Iterable, describe: Callable[[Any], tuple | None], model: str = "numba",
                     names: Iterable[str] = ()) -> tuple:
    """The same, from Numba types (a dispatcher's signature), each read by ``describe``
    (the host's ``describe_type``: ``("array", dtype, ndim, layout, readonly)``,
    ``("scalar", dtype)`` or None), passed as ``model`` says (the host's ``abi``), named by
    ``names`` (the Python function's parameters) where given."""
    if model not in MODELS:
        raise ValueError(f"model {model!r} is not one of {MODELS}")
    out, names = [], list(names)
    for i, t in enumerate(argtypes):
        d, name = describe(t), names[i] if i < len(names) else None
        if d is not None and d[0] == "array":
            out.append(NumbaArray(*d[1:], model=model, name=name))
        elif d is not None:
            out.append(NumbaScalar(d[1], model, name))
        else:
            raise NumbaAbiError(f"argument {i} is {t}: nbjit passes Numba arrays, integers, floats, booleans and "
                                "complex numbers (not tuples, records by value or other types)")
    return tuple(out)


def to_json(args: Iterable) -> list[dict]:
    """Argument types as a bundle's manifest records them (``from_json`` reads them back)."""
    out = []
    for a in args:
        d = {"array": _dtype_json(a.dtype), "ndim": a.ndim, "layout": a.layout, "readonly": a.readonly} \
            if isinstance(a, NumbaArray) else {"scalar": _dtype_json(a.dtype)}
        d["model"] = a.model
        if a.name is not None:
            d["name"] = a.name
        out.append(d)
    return out


def from_json(data: Any) -> tuple:
    """``to_json``'s list as argument types; ValueError saying what is wrong with it."""
    if not isinstance(data, list):
        raise ValueError(f"a list of arguments, not {type(data).__name__}")
    out = []
    for i, d in enumerate(data):
        try:
            if not isinstance(d, dict) or d.get("model") not in MODELS:
                raise ValueError(f"not an argument of model {' or '.join(MODELS)}")
            name = d.get("name")
            if name is not None and not (isinstance(name, str) and name.isidentifier()):
                raise ValueError(f"name {str(name)[:40]!r} is not a Python parameter's name")
            if "array" in d:
                nd, layout, ro = d.get("ndim"), d.get("layout"), d.get("readonly")
                if type(nd) is not int or not 0 <= nd <= MAX_NDIM or layout not in _LAYOUTS or type(ro) is not bool:
                    raise ValueError(f"an array needs ndim 0 to {MAX_NDIM}, a layout of {_LAYOUTS} and readonly "
                                     "true or false")
                dt = None if d["array"] is None else _dtype_from_json(d["array"])
                if dt is not None and dt.kind not in _ARRAY_KINDS:
                    raise ValueError(f"an array of {dt} (nbjit passes numbers, booleans and records)")
                out.append(NumbaArray(dt, nd, layout, ro, d["model"], name))
            elif "scalar" in d and d["scalar"] is not None:
                dt = _dtype_from_json(d["scalar"])
                if dt.kind not in _SCALAR_KINDS or dt.shape:
                    raise ValueError(f"a scalar of {dt} (nbjit passes integers, floats, booleans and complex numbers)")
                out.append(NumbaScalar(dt, d["model"], name))
            else:
                raise ValueError("neither an array nor a scalar")
        except (TypeError, ValueError, KeyError, RecursionError) as e:
            raise ValueError(f"argument {i}: {str(e)[:200]}") from None
    return tuple(out)


def _dtype_json(dt: np.dtype | None) -> Any:
    """A dtype as JSON: its ``str`` ("<f4"); a record's names, formats, offsets and size; a
    sub-array's base and shape."""
    if dt is None:
        return None
    if dt.subdtype is not None:
        return {"base": _dtype_json(dt.subdtype[0]), "shape": list(dt.subdtype[1])}
    if dt.names:
        return {"names": list(dt.names), "formats": [_dtype_json(dt.fields[n][0]) for n in dt.names],
                "offsets": [dt.fields[n][1] for n in dt.names], "itemsize": dt.itemsize}
    return dt.str


_SCALAR_KINDS, _ARRAY_KINDS = "biufc", "biufcV"
_MAX_NESTING = 16  # records in records, sub-arrays: a manifest deeper than this is refused


def _dtype_from_json(d: Any, depth: int = 0) -> np.dtype:
    if depth > _MAX_NESTING:
        raise ValueError(f"a dtype nested more than {_MAX_NESTING} deep")
    if isinstance(d, str):
        dt = np.dtype(d)
        if dt.kind not in _ARRAY_KINDS:
            raise ValueError(f"{dt} is not a type of numbers, booleans or records")
        return dt
    if isinstance(d, dict) and "base" in d:
        return np.dtype((_dtype_from_json(d["base"], depth + 1), tuple(d["shape"])))
    if isinstance(d, dict) and "names" in d:
        return np.dtype({"names": d["names"], "formats": [_dtype_from_json(f, depth + 1) for f in d["formats"]],
                         "offsets": d["offsets"], "itemsize": d["itemsize"]})
    raise ValueError(f"{str(d)[:80]} is not a dtype")


def fields(arg) -> list[int]:
    """The byte sizes of the PTX parameters an argument becomes."""
    if isinstance(arg, NumbaArray):
        return [8] * ((3 if arg.model == "mlir" else 5) + 2 * arg.ndim)
    if arg.dtype.kind == "c" and arg.model != "mlir":
        return [arg.dtype.itemsize // 2] * 2
    return [arg.dtype.itemsize]


_PTX_SCALAR = {"b": "u8", "i": "s", "u": "u", "f": "f"}


def signature(name: str, image: KernelInfo, args, source: str) -> KernelInfo:
    """The kernel as its Python arguments: one parameter per Numba argument (an array spans
    its 5 + 2·ndim fields, or 3 + 2·ndim under numba-cuda-mlir), checked against the image's
    own parameter layout;
    ``launch_offsets`` keeps where each of the image's parameters starts."""
    sizes = [f for a in args for f in fields(a)]
    have = [p.size for p in image.params]
    if sizes != have:
        raise NumbaAbiError(f"kernel {name[:80]!r}: Numba's arguments ({', '.join(a.text for a in args)}) make "
                            f"parameters of {sizes} bytes; the image has {have}")
    out, i = [], 0
    for j, a in enumerate(args):
        n = len(fields(a))
        first, pname = image.params[i], a.name or f"arg{j}"
        origin = (("layout", "image"), ("type", source))
        if isinstance(a, NumbaArray):
            out.append(Param(pname, "numba_array", 8 * n, 8, first.offset, ctype=a.text, origin=origin, abi=a))
        elif a.dtype.kind == "c":
            out.append(Param(pname, f"c{a.dtype.itemsize}", a.dtype.itemsize, a.dtype.itemsize // 2,
                             first.offset, ctype=a.text, origin=origin))
        else:
            kind = a.dtype.kind
            typ = "u8" if kind == "b" else f"{_PTX_SCALAR[kind]}{a.dtype.itemsize * 8}"
            out.append(Param(pname, typ, a.dtype.itemsize, a.dtype.itemsize, first.offset, ctype=a.text,
                             origin=origin))
        i += n
    return KernelInfo(name, KernelSignature(tuple(out), image.param_size), image.directives, image.linkage,
                      launch_offsets=tuple(p.offset for p in image.params),
                      **{k: getattr(image, k) for k in RESOURCES})


# Numba types a C-ABI device function takes and returns, as C spells them
_C_SPELLING = {"boolean": "bool", "int8": "signed char", "uint8": "unsigned char", "int16": "short",
               "uint16": "unsigned short", "int32": "int", "uint32": "unsigned int", "int64": "long long",
               "uint64": "unsigned long long", "float32": "float", "float64": "double", "none": "void",
               "void*": "void*"}


def device_ltoir(func, signature, name: str, cc: tuple[int, int], host) -> tuple[bytes, str, tuple[str, ...]]:
    """A Python function (or ``@cuda.jit(device=True)`` dispatcher, whose ``fastmath``,
    ``lineinfo``, ``debug`` and ``opt`` apply) compiled by the Numba ``host`` (``_host.Host``)
    to LTO-IR for compute capability ``cc``, as the C function ``name``: (LTO-IR, C return
    type, C parameter types). ``signature``: ``"float32(float32, float32)"``, or the argument
    types alone (Numba infers the return type). No GPU needed.

    Raises
    ------
    NumbaAbiError: a type C cannot pass by value (arrays, tuples, records; pointers to those).
    Numba's own errors where it cannot compile the function (typing errors), unchanged.
    """
    py = getattr(func, "py_func", func)

    def spelled(t) -> str:
        p = host.pointee(t)
        if p is not None and str(p) in _C_SPELLING and str(p) not in ("none", "void*"):
            return _C_SPELLING[str(p)] + "*"
        if str(t) not in _C_SPELLING:
            raise NumbaAbiError(f"{getattr(py, '__qualname__', py)!r}: {t} has no C ABI: a device function linked "
                                "into C++ takes and returns integers, floats, booleans and pointers to them "
                                "(CPointer(float32)), not arrays, tuples or records")
        return _C_SPELLING[str(t)]

    args, ret = host.kernel_types(signature)
    for t in args:
        spelled(t)
    code, resty = host.compile_ltoir(func, args, ret, name, cc)
    return code, spelled(resty), tuple(spelled(t) for t in args)
