"""nbjit kernels inside ``jax.jit``: ``nbjit.jax.call`` launches any nbjit kernel as an XLA FFI
call, through one handler in nbjit's C extension registered once with
``jax.ffi.register_ffi_target`` (no C++ build per kernel).

The kernel, its grid and block, and where each of its parameters' arguments comes from (an
input array, an output buffer, a scalar) travel as the FFI call's attributes; the handler
packs them by the kernel's signature as a Python launch does (``launch/entry.py``'s C entry)
and launches on XLA's stream. The handler declares itself compatible with XLA's command
buffers (CUDA graphs). The kernel's address is this process's: a jitted function that holds
it can run here, not be serialized for another process.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from nbjit.errors import NbjitArgumentError, NbjitOpError
from nbjit.frameworks.declarations import Declared, declare, label, parameters
from nbjit.gpu import extension
from nbjit.launch.arrays import array_element, describe_element, element_matches
from nbjit.launch.entry import CEntry, EntryArg
from nbjit.launch.kernel import Kernel
from nbjit.loading.triton import TritonKernel

__all__ = ["TARGET", "call"]

TARGET = "nbjit_launch"  # the FFI target's name
_REGISTERED: set[str] = set()  # platforms the handler is registered for
# the C entries jitted code holds the address of, with their kernels (which keep the module loaded):
# alive while the process is, since a cached executable may launch them at any later call
_ENTRIES: dict[int, tuple[CEntry, Any]] = {}


def call(kernel: Kernel | TritonKernel, *args: Any, grid: int | tuple, block: int | tuple | None = None,
         shared: int = 0, outputs: Mapping[str, Any] | None = None, inplace: Sequence[str] = (),
         reads: Sequence[str] = (), names: Sequence[str] | None = None, vmap_method: str | None = None):
    """Launch ``kernel`` from JAX code (``jax.jit`` included) and return its outputs.

    ``args``: the kernel's parameters in its order but the outputs: arrays for pointers and
    ``@cuda.jit`` arrays, Python or numpy numbers for scalars (fixed when the function is
    traced). ``outputs={"out": jax.ShapeDtypeStruct(shape, dtype)}``: parameters the call
    allocates (or the name of an input array: like it). ``inplace=("y",)``: arrays the kernel
    writes, returned updated (their buffers aliased). ``reads=``: pointers without ``const``
    that the kernel only reads (one left undeclared is refused). ``names``: the kernel's
    parameter names where its image has none worth using. Returns the outputs, then the
    in-place arrays: one array alone, a tuple for several, None for none. A Triton kernel takes
    ``grid`` alone: its block is its ``num_warps``, its shared memory its own.

    ``vmap_method``: "sequential" lets ``jax.vmap`` map the call one batch element at a time
    (the grid and the scalars were fixed for one); None refuses ``vmap``, as JAX says.

    Raises
    ------
    NbjitOpError: the declarations do not fit the kernel (naming the parameter).
    NbjitArgumentError: an argument does not fit its parameter (naming it).
    """
    where = f"nbjit.jax.call of {label(kernel)!r}"
    if vmap_method not in (None, "sequential"):
        raise NbjitOpError(f"{where}: vmap_method={vmap_method!r}: the call's grid and scalars are fixed for one "
                           "unbatched call, so a batched call would cover its first element only: give "
                           "'sequential' (one call per element) or None (vmap refused)")
    outputs = dict(outputs or {})
    params = parameters(kernel, where, names)
    d = declare(where, label(kernel), params, tuple(outputs), inplace, reads)
    if len(args) != len(d.inputs):
        raise NbjitArgumentError(f"{where}: {len(args)} arguments for its {len(d.inputs)} inputs "
                                 f"({', '.join(d.inputs)})")
    values = dict(zip(d.inputs, args))
    plan, results, scalars = _plan(where, d, values, outputs)
    arrays = [n for n in d.inputs if params[n].takes_array]  # (the call's operands, in order)
    aliases = {arrays.index(n): len(outputs) + j for j, n in enumerate(d.inplace)}
    if isinstance(kernel, TritonKernel):
        if kernel.compiled_refusal:
            raise NbjitOpError(f"{where}: a Triton kernel that cannot be launched from compiled code: "
                               f"{kernel.compiled_refusal}")
        if block is not None or shared:
            raise NbjitOpError(f"{where}: a Triton kernel's block is its num_warps and its shared memory its own: "
                               "give grid alone")
        block, shared = tuple(kernel.meta.block), kernel.meta.shared
    elif block is None:
        raise NbjitOpError(f"{where}: give block= (an int or a tuple)")
    dims = [*_three(grid, "grid", where), *_three(block, "block", where), _count(shared, "shared", where, 0)]
    entry = kernel.c_entry
    _ENTRIES[entry.kernel] = (entry, kernel)
    _register(_platform(where))
    ints = [v for kind, v in scalars if kind == "int"] or [0]
    floats = [v for kind, v in scalars if kind == "float"] or [0.0]
    f = jax.ffi.ffi_call(TARGET, results, input_output_aliases=aliases, vmap_method=vmap_method)
    out = f(*[values[n] for n in arrays], kernel=np.uint64(entry.kernel), dims=np.array(dims, np.int64),
            plan=np.array(plan, np.int64), ints=np.array(ints, np.int64), floats=np.array(floats, np.float64))
    out = tuple(out) if isinstance(out, (list, tuple)) else (out,)
    return None if not results else out[0] if len(results) == 1 else out


def _plan(where: str, d: Declared, values: dict, outputs: dict) -> tuple[list[int], list, list]:
    """Per parameter, where its argument comes from (the handler's ``plan``); the results'
    shapes and dtypes (outputs, then the in-place arrays); the scalars, in order."""
    plan: list[int] = []
    results, scalars, buffer = [], [], 0
    results_of = {n: _result(where, d.params[n], rule, values, d.params) for n, rule in outputs.items()}
    for n in d.inplace:
        results_of[n] = jax.ShapeDtypeStruct(values[n].shape, values[n].dtype)
    order = list(d.outputs) + list(d.inplace)
    results = [results_of[n] for n in order]
    for n, a in d.params.items():
        if n in results_of:  # (an in-place array: its result, which XLA aliases to the operand)
            plan += [1, order.index(n)]
            if n in d.inplace:
                _check_array(where, a, values[n])
                buffer += 1
        elif a.takes_array:
            _check_array(where, a, values[n])
            plan += [0, buffer]
            buffer += 1
        else:
            kind = "float" if a.kind == "float" else "int"
            scalars.append((kind, _scalar(where, a, values[n], kind)))
            plan += [2 if kind == "int" else 3, sum(1 for k, _ in scalars if k == kind) - 1]
    return plan, results, scalars


def _result(where: str, a: EntryArg, rule: Any, values: dict, params: dict):
    """An output's shape and dtype: a ``jax.ShapeDtypeStruct`` (or anything with ``shape`` and
    ``dtype``), or the name of an input array (like it); its dtype checked against ``a``."""
    if isinstance(rule, str):
        if rule not in values or not params[rule].takes_array:
            raise NbjitOpError(f"{where}: output rule of {a.name!r}: {rule!r} is not one of its input arrays")
        rule = values[rule]
    if not (hasattr(rule, "shape") and hasattr(rule, "dtype")):
        raise NbjitOpError(f"{where}: output rule of {a.name!r}: give a jax.ShapeDtypeStruct or the name of an input "
                           f"array, not {type(rule).__name__}")
    out = jax.ShapeDtypeStruct(tuple(rule.shape), rule.dtype)
    _check_array(where, a, out, f" (the output rule of {a.name!r})")
    return out


def _check_array(where: str, a: EntryArg, v: Any, made: str = "") -> None:
    """NbjitArgumentError where array ``v`` (its dtype, its ndim) cannot be passed for ``a``."""
    if not (hasattr(v, "shape") and hasattr(v, "dtype")):
        raise NbjitArgumentError(f"{where}: {a.where}: {type(v).__name__} is not an array")
    got = array_element(v)
    if a.kind == "array" and a.ndim is not None and len(v.shape) != a.ndim:
        raise NbjitArgumentError(f"{where}: {a.where}: a {len(v.shape)}-d array{made}; the parameter is {a.text}")
    if a.element_dtype is None or got is None:
        return
    if (a.kind == "array" and got[2] != a.element_dtype) or (a.kind != "array" and not element_matches(a.element, got)):
        takes = a.text if a.kind == "array" else f"{a.ctype} and takes {describe_element(a.element)} arrays"
        raise NbjitArgumentError(f"{where}: {a.where}: a {got[2]} array{made}; the parameter is {takes}")


def _scalar(where: str, a: EntryArg, v: Any, kind: str):
    """A scalar argument as the handler's int64 or double (ranges: the C entry checks them)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise NbjitArgumentError(f"{where}: {a.where}: {type(v).__name__} is not a number fixed at tracing (a "
                                 "traced value cannot be a kernel's scalar: pass a Python or numpy number)")
    if kind == "int":
        if not isinstance(v, (int, np.integer)):
            raise NbjitArgumentError(f"{where}: {a.where}: a float ({v!r}) was passed; the parameter is an integer "
                                     f"(.{a.type})")
        n = int(v)
        if (1 << 63) <= n < (1 << 64) and a.type in ("u64", "b64"):
            return n - (1 << 64)  # (a .u64's bits, as the C entry reads them)
        if not -(1 << 63) <= n < (1 << 63):
            raise NbjitArgumentError(f"{where}: {a.where}: {n} does not fit in .{a.type}")
        return n
    return float(v)


def _count(v: Any, what: str, where: str, least: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
        raise NbjitArgumentError(f"{where}: {what} must be an int >= {least}, got {v!r}")
    return int(v)


def _three(v: int | tuple, what: str, where: str) -> list[int]:
    """A grid or block as three ints."""
    parts = list(v) if isinstance(v, tuple) else [v]
    if not 1 <= len(parts) <= 3:
        raise NbjitArgumentError(f"{where}: {what} must be an int or a tuple of 1 to 3 ints, got {v!r}")
    return [_count(p, what, where) for p in parts] + [1] * (3 - len(parts))


def _platform(where: str) -> str:
    """The XLA platform the call runs on: JAX's CUDA backend (a kernel given host memory would
    fault, so any other is refused)."""
    backend = jax.default_backend()
    if backend != "gpu":
        raise NbjitArgumentError(f"{where}: JAX runs on {backend}, and a CUDA kernel needs its arrays on a CUDA "
                                 "device (install jax[cuda13] or jax[cuda12])")
    return "CUDA"


def _register(platform: str) -> None:
    """The handler registered with XLA for ``platform`` ("CUDA"), once."""
    if platform in _REGISTERED:
        return
    ext = extension.extension()
    if ext is None:
        raise NbjitOpError("nbjit.jax.call needs nbjit's C extension, and this process runs without it "
                           "(NBJIT_PURE_PYTHON is set, or nbjit was built without a C compiler)")
    jax.ffi.register_ffi_target(TARGET, ext.xla_handler(), platform=platform)
    _REGISTERED.add(platform)
