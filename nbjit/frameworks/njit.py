"""nbjit kernels launched from ``@numba.njit`` code, through Numba core's extension API.

A kernel (compiled, loaded, from a bundle, ``from_numba``, a Triton kernel) is a value of a
Numba type per kernel signature: passed in, or closed over, and launched with the Python
syntax, ``k[grid, block, stream, shared](args...)`` (Triton's: ``k[grid, stream](args...)``).
Arguments are typed when the njit function is: a ``DeviceView`` for a typed pointer must hold
its element type, one for a ``@cuda.jit`` kernel's array its dtype and dimensions; a mistake
is a ``TypingError`` naming the kernel and the parameter. The launch is one call of nbjit's C
entry point (launch/entry.py), which packs by the signature as a Python launch does and calls
``cuLaunchKernel``: no Python object, no GIL (``nogil=True`` functions launch from threads).
Its errors are raised as the ``NbjitArgumentError`` / ``NbjitLaunchError`` a Python launch
raises, with the same message.

``cache=True``: a kernel passed as an argument is looked up when the function is called, so
the cached code holds no kernel address. A kernel closed over is compiled in as its address
in this process; Numba then refuses to cache that function ("dynamic globals"), and the
kernel stays loaded as long as the process (the compiled code may launch it any time).

Numba loads this module through its ``numba_extensions`` entry point (pyproject.toml) before
it compiles anything; nothing else imports it.
"""
from __future__ import annotations

import abc
import functools
import operator
import sys
import weakref
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.errors import TypingError
from numba.core.extending import (
    NativeValue, intrinsic, lower_builtin, make_attribute_wrapper, models, overload, overload_attribute,
    overload_method, register_jitable, register_model, typeof_impl, unbox)
from numba.core.imputils import lower_constant
from numba.core.typing.templates import AbstractTemplate, infer_global, signature

from nbjit.errors import NbjitArgumentError, NbjitLaunchError
from nbjit.gpu import extension

if TYPE_CHECKING:
    from nbjit.launch.entry import EntryArg
    from nbjit.launch.views import StreamHandle

__all__ = ["KernelType", "LaunchType", "StreamType", "ViewType", "init"]

MESSAGE_BYTES = 1024  # the buffer the C entry point writes an error's message into


def init() -> None:
    """Numba's ``numba_extensions`` entry point: importing this module registered everything."""


# ------------------------------------------------------------------ typeof of nbjit's values
#
# Numba imports this module at its first compile in every process, whether or not the code it
# compiles touches nbjit; nbjit's stages (the driver, PTX reading, the launch path) are imported
# when njit code first meets one of nbjit's values, not then.

_VALUE_CLASSES = (("nbjit.launch.kernel", "Kernel"), ("nbjit.loading.triton", "TritonKernel"),
                  ("nbjit.launch.views", "DeviceView"), ("nbjit.launch.views", "StreamHandle"))


class _NbjitValue(abc.ABC):  # noqa: B024 (an ABC for its __subclasshook__ alone)
    """The classes of nbjit's values njit code takes (those of ``_VALUE_CLASSES`` and their
    subclasses), named rather than imported: a value's class has its module imported already."""

    @classmethod
    def __subclasshook__(cls, c):
        for module, name in _VALUE_CLASSES:
            known = getattr(sys.modules.get(module), name, None)  # (None while another thread imports it)
            if known is not None and issubclass(c, known):
                return True
        return NotImplemented


@typeof_impl.register(_NbjitValue)
def _typeof_first(val, c):
    """The first of nbjit's values njit code meets: typeof of nbjit's classes registered, and the value typed."""
    from nbjit.launch.kernel import Kernel  # (deferred: see above)
    from nbjit.launch.views import DeviceView, StreamHandle
    from nbjit.loading.triton import TritonKernel
    typeof_impl.register(DeviceView, _typeof_view)
    typeof_impl.register(StreamHandle, _typeof_stream)
    typeof_impl.register(Kernel, _typeof_kernel)
    typeof_impl.register(TritonKernel, _typeof_triton)
    return typeof_impl(val, c)


# ------------------------------------------------------------------ device views and streams


class ViewType(types.Type):
    """A ``DeviceView`` in njit code: data (an address), shape, strides in bytes; its dtype
    and number of dimensions are the type's."""

    def __init__(self, dtype: np.dtype, ndim: int):
        self.dtype = np.dtype(dtype)
        self.ndim = ndim
        super().__init__(name=f"nbjit.DeviceView({self.dtype}, {ndim}d)")

    @property
    def key(self):
        return self.dtype, self.ndim


@register_model(ViewType)
class _ViewModel(models.StructModel):
    def __init__(self, dmm, fe_type):
        dims = types.UniTuple(types.intp, fe_type.ndim)
        super().__init__(dmm, fe_type, [("data", types.intp), ("shape", dims), ("strides", dims)])


for _field in ("data", "shape", "strides"):
    make_attribute_wrapper(ViewType, _field, _field)


def _typeof_view(val, c):
    return _view_type(val.dtype, val.ndim)


@functools.lru_cache(maxsize=256)
def _view_type(dtype: np.dtype, ndim: int) -> ViewType:
    """(typeof runs on every call of an njit function: one type per dtype and ndim, made once)"""
    return ViewType(dtype, ndim)


def _unbox_fields(typ, obj, c, fields):
    """A struct of Numba type ``typ`` from a Python object's attributes ``fields`` (name, type)."""
    out = cgutils.create_struct_proxy(typ)(c.context, c.builder)
    failed = cgutils.false_bit
    for name, ty in fields:
        attr = c.pyapi.object_getattr_string(obj, name)
        native = c.unbox(ty, attr)
        c.pyapi.decref(attr)
        setattr(out, name, native.value)
        failed = c.builder.or_(failed, native.is_error)
    return NativeValue(out._getvalue(), is_error=failed)


@unbox(ViewType)
def _unbox_view(typ, obj, c):
    dims = types.UniTuple(types.intp, typ.ndim)
    return _unbox_fields(typ, obj, c, (("data", types.intp), ("shape", dims), ("strides", dims)))


@overload_attribute(ViewType, "ndim")
def _view_ndim(v):
    n = v.ndim
    return lambda v: n


@overload_attribute(ViewType, "size")
def _view_size(v):
    def size(v):
        n = 1
        for x in v.shape:
            n *= x
        return n
    return size


@overload(len)
def _view_len(v):
    if isinstance(v, ViewType) and v.ndim > 0:
        return lambda v: v.shape[0]


def _build_view(context, builder, typ, data, shape, strides):
    out = cgutils.create_struct_proxy(typ)(context, builder)
    out.data, out.shape, out.strides = data, shape, strides
    return out._getvalue()


def _rows_impl(context, builder, sig, args):
    """view_rows(v, start, count, step): rows start, start + step, ... (count of them)."""
    typ = sig.return_type
    v = cgutils.create_struct_proxy(typ)(context, builder, value=args[0])
    start, count, step = args[1:]
    shape = cgutils.unpack_tuple(builder, v.shape)
    strides = cgutils.unpack_tuple(builder, v.strides)
    data = builder.add(v.data, builder.mul(start, strides[0]))
    shape[0], strides[0] = count, builder.mul(step, strides[0])
    dims = types.UniTuple(types.intp, typ.ndim)
    return _build_view(context, builder, typ, data, context.make_tuple(builder, dims, shape),
                       context.make_tuple(builder, dims, strides))


def _row_impl(context, builder, sig, args):
    """view_row(v, i): row i, a view of one dimension less."""
    typ, src = sig.return_type, sig.args[0]
    v = cgutils.create_struct_proxy(src)(context, builder, value=args[0])
    shape = cgutils.unpack_tuple(builder, v.shape)
    strides = cgutils.unpack_tuple(builder, v.strides)
    data = builder.add(v.data, builder.mul(args[1], strides[0]))
    dims = types.UniTuple(types.intp, typ.ndim)
    return _build_view(context, builder, typ, data, context.make_tuple(builder, dims, shape[1:]),
                       context.make_tuple(builder, dims, strides[1:]))


@intrinsic
def _view_rows(typingctx, v, start, count, step):
    """A view of rows start, start + step, ... of ``v`` (count of them)."""
    return signature(v, v, types.intp, types.intp, types.intp), _rows_impl


@intrinsic
def _view_row(typingctx, v, i):
    """Row ``i`` of ``v``: a view of one dimension less."""
    return signature(ViewType(v.dtype, v.ndim - 1), v, types.intp), _row_impl


@overload(operator.getitem)
def _view_getitem(v, index):
    if not isinstance(v, ViewType):
        return None
    if v.ndim == 0:
        raise TypingError("a 0-d device view has no rows to index")
    if isinstance(index, types.SliceType):
        def rows(v, index):
            start, stop, step = index.indices(v.shape[0])
            return _view_rows(v, start, len(range(start, stop, step)), step)
        return rows
    if isinstance(index, types.Integer):
        def row(v, index):
            n = v.shape[0]
            i = index + n if index < 0 else index
            if i < 0 or i >= n:
                raise IndexError("row index out of range of a device view")
            return _view_row(v, i)
        return row
    raise TypingError(f"a device view takes a row index or a slice of rows, not {index}")


class StreamType(types.Type):
    """A ``StreamHandle`` in njit code: the CUstream's address."""

    def __init__(self):
        super().__init__(name="nbjit.StreamHandle")


_STREAM = StreamType()


@register_model(StreamType)
class _StreamModel(models.StructModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, [("handle", types.intp)])


make_attribute_wrapper(StreamType, "handle", "handle")


def _typeof_stream(val, c):
    return _STREAM


_DRIVER_ASKED = [False]  # whether the C entry point has been handed the driver's functions (once)


def _stream_handle(stream: StreamHandle) -> int:
    """A stream handle's address, for njit code (which may synchronize it: the driver's
    cuStreamSynchronize handed to the C entry point first, where there is a driver)."""
    if not _DRIVER_ASKED[0]:
        _DRIVER_ASKED[0] = True
        from nbjit.gpu import driver  # (deferred: see typeof above)
        try:
            driver.entry_points()
        except Exception:  # no driver or no C extension: synchronize() then says which entry point is missing
            pass
    return stream.handle


@unbox(StreamType)
def _unbox_stream(typ, obj, c):
    out = cgutils.create_struct_proxy(typ)(c.context, c.builder)
    handle = _call_python(c, _stream_handle, obj)
    native = c.unbox(types.intp, handle)
    c.pyapi.decref(handle)
    out.handle = native.value
    return NativeValue(out._getvalue(), is_error=native.is_error)


def _call_python(c, fn, *objs):
    """``fn(*objs)`` from unboxing code (a new reference; NULL with the error set)."""
    f = c.pyapi.unserialize(c.pyapi.serialize_object(fn))
    out = c.pyapi.call_function_objargs(f, list(objs))
    c.pyapi.decref(f)
    return out


@overload_method(StreamType, "synchronize")
def _stream_synchronize(s):
    def synchronize(s):
        _check(_synchronize(s.handle))
    return synchronize


# ------------------------------------------------------------------ the C entry point, by name


def _c_functions() -> bool:
    """Whether nbjit's C entry point is there: its functions made known to LLVM by name (the
    compiled code, cached too, finds them in every process that imported this module)."""
    ext = extension.extension()
    if ext is None:
        return False
    for name, address in ext.entry_points().items():
        llvm.add_symbol(f"nbjit_{name}", address)
    return True


_HAVE_C = _c_functions()
_I8P = ir.IntType(8).as_pointer()
_I64 = ir.IntType(64)
_I32 = ir.IntType(32)


def _call_c(builder, name: str, ret, args: list):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, f"nbjit_{name}"), args)


def _message_buffer(builder):
    return builder.bitcast(cgutils.alloca_once(builder, ir.ArrayType(ir.IntType(8), MESSAGE_BYTES)), _I8P)


@intrinsic
def _synchronize(typingctx, handle):
    """nbjit_synchronize(stream): (status, the message's buffer)."""
    ret = types.Tuple((types.int32, types.voidptr))

    def codegen(context, builder, sig, args):
        msg = _message_buffer(builder)
        status = _call_c(builder, "synchronize", _I32,
                         [builder.inttoptr(args[0], _I8P), msg, ir.Constant(_I64, MESSAGE_BYTES)])
        return context.make_tuple(builder, ret, (status, msg))
    return signature(ret, types.intp), codegen


@intrinsic
def _byte_at(typingctx, buf, i):
    """The byte at ``buf + i``."""
    def codegen(context, builder, sig, args):
        return builder.zext(builder.load(builder.gep(args[0], [args[1]])), _I64)
    return signature(types.int64, types.voidptr, types.intp), codegen


@register_jitable
def _text(buf):
    """The NUL-terminated ASCII message at ``buf`` as a str."""
    out = ""
    i = 0
    while True:
        b = _byte_at(buf, i)
        if b == 0:
            return out
        out += chr(b)
        i += 1


@register_jitable
def _check(result):
    """A C entry point's (status, message): raised as the error a Python launch raises."""
    status, buf = result
    if status == 1:
        raise NbjitArgumentError(_text(buf))
    if status != 0:
        raise NbjitLaunchError(_text(buf))


# ------------------------------------------------------------------ kernels


class KernelType(types.Type):
    """A kernel in njit code: its name, its arguments (``EntryArg``: what each takes) and how
    it is configured: ``("kernel",)``, ``k[grid, block, stream, shared]``; ``("triton",
    block, shared, why_not)``, ``k[grid, stream]`` (``why_not``: what keeps it from njit code)."""

    def __init__(self, label: str, args: tuple[EntryArg, ...], signature_text: str, form: tuple):
        from nbjit.launch.entry import arguments_digest  # (deferred: see typeof above)
        self.label, self.args, self.signature_text, self.form = label, args, signature_text, form
        self.digest = arguments_digest(args)  # (what the kernel handed in at run time must match)
        super().__init__(name=f"nbjit.Kernel({signature_text})")

    @property
    def key(self):
        return self.label, self.args, self.signature_text, self.form


register_model(KernelType)(models.OpaqueModel)

_TYPES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # kernel -> its KernelType (typeof: per call)


def _typeof_kernel(val, c):
    t = _TYPES.get(val)
    if t is None:
        from nbjit.launch.entry import entry_args  # (deferred: see typeof above)
        s = val._s
        label = s.label if s is not None else val.name
        info = val.info
        t = _TYPES[val] = KernelType(label, entry_args(info, label), f"{label}{info.signature}", ("kernel",))
    return t


def _typeof_triton(val, c):
    t = _TYPES.get(val)
    if t is None:
        from nbjit.launch.entry import entry_args  # (deferred: see typeof above)
        m, info = val.meta, val.kernel.info
        t = _TYPES[val] = KernelType(val.name, entry_args(info, val.name, m.scratch_params),
                                     f"{val.name}{info.signature}", ("triton", tuple(m.block), m.shared,
                                                                     val.compiled_refusal))
    return t


def _entry_address(k, digest: int) -> int:
    """The address of a kernel's C entry (loaded into the current context first where it
    waits), whose arguments must be those the njit code was typed for (their ``digest``)."""
    entry = k.c_entry
    if entry.digest != digest:
        raise NbjitLaunchError(f"kernel {entry.label!r}: its loaded image takes other arguments than the njit code "
                               "was compiled for (typed from the image before it loaded): call the njit function "
                               "again with the kernel, which types it anew")
    return entry.kernel


@unbox(KernelType)
def _unbox_kernel(typ, obj, c):
    digest = c.pyapi.long_from_longlong(ir.Constant(_I64, typ.digest))
    addr = _call_python(c, _entry_address, obj, digest)
    c.pyapi.decref(digest)
    failed = cgutils.is_null(c.builder, addr)
    out = cgutils.alloca_once_value(c.builder, ir.Constant(_I8P, None))
    with c.builder.if_then(c.builder.not_(failed), likely=True):
        c.builder.store(c.pyapi.long_as_voidptr(addr), out)
        c.pyapi.decref(addr)
    return NativeValue(c.builder.load(out), is_error=failed)


_PINNED: dict[int, object] = {}  # kernels compiled into njit code as constants: loaded while the process lives


@lower_constant(KernelType)
def _constant_kernel(context, builder, ty, pyval):
    address = _entry_address(pyval, ty.digest)
    _PINNED[id(pyval)] = pyval
    return context.add_dynamic_addr(builder, address, info=f"nbjit kernel {ty.label}")


class LaunchType(types.Callable):
    """``kernel[grid, block, ...]`` in njit code: call it with the kernel's arguments.
    ``items``: the configuration's Numba types (grid, block, stream, shared; Triton's grid and
    stream)."""

    def __init__(self, kernel: KernelType, items: tuple):
        self.kernel, self.items = kernel, items
        super().__init__(name=f"nbjit.Launch({kernel.signature_text}, {items})")

    @property
    def key(self):
        return self.kernel, self.items

    def get_call_type(self, context, args, kws):
        if kws:
            raise TypingError(f"kernel {self.kernel.label!r}: a launch takes its arguments by position, not "
                              f"{', '.join(kws)}=")
        check_arguments(self.kernel, args)
        return signature(types.none, *args, recvr=self)

    def get_call_signatures(self):
        return [], True

    def get_impl_key(self, sig):
        return type(self)

    @property
    def forms(self) -> int:
        """How the grid (bits 0-2) and block (bits 3-5) were written: the C entry's ``forms``."""
        def form(ty):
            return 4 if isinstance(ty, types.Integer) else _count(ty)
        block = form(self.items[1]) if self.kernel.form[0] == "kernel" else 0
        return form(self.items[0]) | block << 3


@register_model(LaunchType)
class _LaunchModel(models.StructModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, [("entry", types.voidptr), ("dims", types.UniTuple(types.int64, 7)),
                                        ("stream", types.intp)])


def _count(ty) -> int:
    """How many values a grid or block of Numba type ``ty`` has (0: it is not one)."""
    if isinstance(ty, types.Integer):
        return 1
    if isinstance(ty, types.BaseTuple) and 1 <= len(ty.types) <= 3 and all(isinstance(t, types.Integer)
                                                                           for t in ty.types):
        return len(ty.types)
    return 0


def _config_items(k: KernelType, index) -> tuple:
    """The configuration's Numba types, checked: ``k[grid, block, stream, shared]`` (Triton's
    ``k[grid, stream]``)."""
    triton = k.form[0] == "triton"
    if triton:  # k[grid] (an int or a tuple: Python's meaning), or k[grid, stream_handle]
        tail = index.types[-1] if isinstance(index, types.BaseTuple) and len(index.types) == 2 else None
        items = (index.types[0], tail) if isinstance(tail, (StreamType, types.NoneType)) else (index,)
    else:
        items = tuple(index.types) if isinstance(index, types.BaseTuple) else (index,)
    names = ("grid", "stream") if triton else ("grid", "block", "stream", "shared")
    usage = (f"Triton kernel {k.label!r}: launch as kernel[grid] or kernel[grid, stream_handle]" if triton else
             f"kernel {k.label!r}: launch as kernel[grid, block], kernel[grid, block, stream] or kernel[grid, block, "
             "stream, shared_bytes]")
    if not (1 if triton else 2) <= len(items) <= len(names):
        raise TypingError(f"{usage}, got [{index}]")
    for name, ty in zip(names, items):
        if name in ("grid", "block") and not _count(ty):
            raise TypingError(f"{usage}: {name} must be an int or a tuple of 1 to 3 ints, got {ty}")
        if name == "stream" and not isinstance(ty, (StreamType, types.Integer, types.NoneType)):
            raise TypingError(f"{usage}: the stream must be an nbjit.StreamHandle, an int handle or None, got {ty}")
        if name == "shared" and not isinstance(ty, types.Integer):
            raise TypingError(f"{usage}: dynamic shared memory must be a byte count (an int), got {ty}")
    return items


@infer_global(operator.getitem)
class _Configure(AbstractTemplate):
    def generic(self, args, kws):
        if len(args) == 2 and isinstance(args[0], KernelType):
            return signature(LaunchType(args[0], _config_items(args[0], args[1])), *args)
        return None


def check_arguments(k: KernelType, args: tuple) -> None:
    """TypingError where the Numba types ``args`` cannot be passed to kernel ``k``, naming the
    parameter (the checks a Python launch makes on values, made here on types)."""
    what = "Triton kernel" if k.form[0] == "triton" else "kernel"
    if k.form[0] == "triton" and k.form[3]:
        raise TypingError(f"Triton kernel {k.label!r} cannot be launched from njit code: {k.form[3]}; launch it "
                          "from Python")
    if not _HAVE_C:
        raise TypingError(f"{what} {k.label!r}: launching from njit code needs nbjit's C extension, and this "
                          "process runs without it (NBJIT_PURE_PYTHON is set, or nbjit was built without a C compiler)")
    n = len(k.args)
    if len(args) != n:
        raise TypingError(f"kernel {k.label!r} takes {n} argument{'s' * (n != 1)}, got {len(args)}: "
                          f"{k.signature_text}")
    for a, ty in zip(k.args, args):
        problem = _argument_problem(a, ty)
        if problem:
            raise TypingError(f"kernel {k.label!r}, {a.where}: {problem}")


def _argument_problem(a: EntryArg, ty) -> str | None:
    """What keeps a value of Numba type ``ty`` from parameter ``a``, or None."""
    if a.kind == "bytes":
        return (f"it takes its own bytes ({a.ctype or '.' + a.type}), which njit code cannot make: launch this kernel "
                "from Python, or from C through kernel.c_entry")
    if a.kind == "array":
        if not isinstance(ty, ViewType):
            return f"{ty} is not a device view (the parameter is {a.text}: pass nbjit.device_view(array))"
        if ty.ndim != a.ndim:
            return f"a {ty.ndim}-d device view was passed; the parameter is {a.text}"
        if a.dtype is not None and ty.dtype != np.dtype(a.dtype):
            return f"a {ty.dtype} device view was passed; the parameter is {a.text}"
        return None
    if a.kind == "pointer":
        if isinstance(ty, ViewType):
            from nbjit.launch.arrays import describe_element, dtype_element, element_matches  # (deferred: typeof)
            got = dtype_element(ty.dtype)
            if a.element[0] != "void" and not element_matches(a.element, got):
                return (f"a {got[2]} device view was passed; the parameter is {a.ctype} and takes "
                        f"{describe_element(a.element)} arrays (to reinterpret the memory on purpose, pass "
                        "nbjit.DeviceView(v.data, v.shape, v.strides, <dtype>))")
            return None
        if isinstance(ty, (types.Integer, types.NoneType)) or (isinstance(ty, types.Boolean) and a.type != "ptr"):
            return None
        return f"{ty} is not a device address (pass a device view, an integer address or None)"
    if isinstance(ty, types.Float) and a.kind == "int":
        return (f"a float ({ty}) was passed; the parameter is an integer (.{a.type})" if a.type != "unknown" else
                f"a float for a {a.size}-byte parameter of unknown type: declare the kernel's signature "
                "(get_kernel(name, signature=...))")
    if a.kind == "int" and isinstance(ty, (types.Integer, types.Boolean)):
        return None
    if a.kind == "float" and isinstance(ty, (types.Integer, types.Float)):
        return None
    return f"{ty} is not a number (.{a.type} takes {'an integer' if a.kind == 'int' else 'a float'})"


@lower_builtin(operator.getitem, KernelType, types.Any)
def _lower_configure(context, builder, sig, args):
    launch_type = sig.return_type
    k, items = launch_type.kernel, launch_type.items
    values = cgutils.unpack_tuple(builder, args[1]) if len(items) > 1 else [args[1]]
    dims = []
    for ty, v in ((items[0], values[0]),) + (((items[1], values[1]),) if k.form[0] == "kernel" else ()):
        parts = cgutils.unpack_tuple(builder, v) if isinstance(ty, types.BaseTuple) else [v]
        parts_types = ty.types if isinstance(ty, types.BaseTuple) else (ty,)
        dims += [context.cast(builder, p, t, types.int64) for p, t in zip(parts, parts_types)]
        dims += [ir.Constant(_I64, 1)] * (3 - len(parts))
    if k.form[0] == "triton":
        dims += [ir.Constant(_I64, b) for b in k.form[1]] + [ir.Constant(_I64, k.form[2])]
        stream_at = 1
    else:
        dims.append(context.cast(builder, values[3], items[3], types.int64) if len(items) > 3 else
                    ir.Constant(_I64, 0))
        stream_at = 2
    out = cgutils.create_struct_proxy(launch_type)(context, builder)
    out.entry = args[0]
    out.dims = context.make_tuple(builder, types.UniTuple(types.int64, 7), dims)
    out.stream = _stream_value(context, builder, items, values, stream_at)
    return out._getvalue()


def _stream_value(context, builder, items, values, at):
    """The stream handle of the configuration (0: none given, or None)."""
    if len(items) <= at or isinstance(items[at], types.NoneType):
        return ir.Constant(_I64, 0)
    if isinstance(items[at], StreamType):
        return cgutils.create_struct_proxy(items[at])(context, builder, value=values[at]).handle
    return context.cast(builder, values[at], items[at], types.int64)


@lower_builtin(LaunchType, LaunchType, types.VarArg(types.Any))
def _lower_launch(context, builder, sig, args):
    launch_type = sig.args[0]
    k = launch_type.kernel
    launch = cgutils.create_struct_proxy(launch_type)(context, builder, value=args[0])
    n = len(k.args)
    slots = cgutils.alloca_once(builder, _I8P, size=max(n, 1))
    for i, (a, ty, v) in enumerate(zip(k.args, sig.args[1:], args[1:])):
        slot = _argument_slot(context, builder, k, a, ty, v)
        builder.store(builder.bitcast(slot, _I8P), builder.gep(slots, [ir.Constant(_I32, i)]))
    dims = cgutils.alloca_once(builder, ir.ArrayType(_I64, 7))
    for i, d in enumerate(cgutils.unpack_tuple(builder, launch.dims)):
        builder.store(d, builder.gep(dims, [ir.Constant(_I32, 0), ir.Constant(_I32, i)]))
    msg = _message_buffer(builder)
    status = _call_c(builder, "launch", _I32, [
        launch.entry, builder.bitcast(dims, _I64.as_pointer()), ir.Constant(_I32, launch_type.forms),
        builder.inttoptr(launch.stream, _I8P), slots, ir.Constant(_I64, n), msg, ir.Constant(_I64, MESSAGE_BYTES)])
    with builder.if_then(builder.icmp_signed("!=", status, ir.Constant(_I32, 0)), likely=False):
        result = types.Tuple((types.int32, types.voidptr))
        _call_jitted(context, builder, _check, (result,), [context.make_tuple(builder, result, (status, msg))])
    return context.get_dummy_value()


def _call_jitted(context, builder, fn, argtypes: tuple, args: list):
    """A call of the jitted function ``fn`` (``register_jitable``) from lowering code, as njit
    code calls it: an error it raises with a message made at run time reaches the caller."""
    fnty = context.typing_context.resolve_value_type(fn)
    sig = fnty.get_call_type(context.typing_context, argtypes, {})
    return context.get_function(fnty, sig)(builder, args)


def _argument_slot(context, builder, k: KernelType, a: EntryArg, ty, v):
    """Memory holding argument ``v`` (Numba type ``ty``) in the form its class takes (launch/entry.py)."""
    if a.kind == "array":
        view = cgutils.create_struct_proxy(ty)(context, builder, value=v)
        parts = [view.data, ir.Constant(_I64, ty.ndim)] + cgutils.unpack_tuple(builder, view.shape) + \
            cgutils.unpack_tuple(builder, view.strides)
        slot = cgutils.alloca_once(builder, ir.ArrayType(_I64, len(parts)))
        for i, x in enumerate(parts):
            builder.store(x, builder.gep(slot, [ir.Constant(_I32, 0), ir.Constant(_I32, i)]))
        return slot
    if a.kind == "float":
        return cgutils.alloca_once_value(builder, context.cast(builder, v, ty, types.float64))
    if isinstance(ty, ViewType):
        x = cgutils.create_struct_proxy(ty)(context, builder, value=v).data
    elif isinstance(ty, types.NoneType):
        x = ir.Constant(_I64, 0)
    elif isinstance(ty, types.Boolean):
        x = builder.zext(v, _I64)
    else:
        x = _integer(context, builder, k, a, ty, v)
    return cgutils.alloca_once_value(builder, x)


def _integer(context, builder, k: KernelType, a: EntryArg, ty, v):
    """An integer argument as the C entry's int64 (uint64 for 64-bit unsigned parameters), with
    what the C entry cannot tell from those bits checked here: a negative value for a 64-bit
    unsigned parameter, a uint64 above 2**63 - 1 for any other."""
    bits = a.size * 8
    wide_unsigned = a.type in ("u64", "ptr")
    if ty.signed and a.type[0] == "u" and ty.bitwidth == bits < 64:  # a typed signed value: its bits
        return builder.zext(builder.trunc(v, ir.IntType(bits)), _I64)
    x = context.cast(builder, v, ty, types.int64 if ty.signed else types.uint64)
    prefix = f"kernel {k.label!r}, {a.where}: "
    if ty.signed and wide_unsigned:
        if a.type == "ptr":
            pieces = (prefix + "address ", " is not a 64-bit unsigned value", "")
        else:
            pieces = (prefix, f" is negative; the parameter is .{a.type} (nvcc writes C 'int' as .u32: pass np.int64(",
                      ") to send a signed value's bits)")
    elif not ty.signed and ty.bitwidth == 64 and not wide_unsigned and not (a.size == 8 and a.type[0] in "bu"):
        pieces = (prefix, _too_big(a), "")
    else:
        return x
    with builder.if_then(builder.icmp_signed("<", x, ir.Constant(_I64, 0)), likely=False):
        text = [context.get_constant_generic(builder, types.unicode_type, p) for p in pieces]
        _call_jitted(context, builder, _refuse, (types.unicode_type, ty, types.unicode_type, types.unicode_type),
                     [text[0], v, text[1], text[2]])
    return x


def _too_big(a: EntryArg) -> str:
    """What the Python rules say of a value too big for parameter ``a`` (after the value)."""
    bits = a.size * 8
    if a.type == "unknown":
        return f" does not fit in {a.size} bytes"
    if a.type[0] == "s":
        return f" does not fit in .{a.type} ({-(1 << bits - 1)} to {(1 << bits - 1) - 1})"
    if a.type[0] == "u":
        return f" does not fit in .{a.type} (at most {(1 << bits) - 1})"
    return f" does not fit in {bits} bits"  # (b8, b16, b32)


@register_jitable
def _refuse(before, value, after, twice):
    """Raise the argument error ``before value after [value twice]`` (njit: a value only known at run time)."""
    if twice:
        raise NbjitArgumentError(before + str(value) + after + str(value) + twice)
    raise NbjitArgumentError(before + str(value) + after)
