"""A kernel's parameters as a framework's operator sees them (``nbjit.torch.op``,
``nbjit.jax.call``): named, and declared as outputs, written in place, only read or computed
(fills); the operator's inputs are the rest. Plain data: no framework is imported here."""
from __future__ import annotations

import dataclasses
import keyword
from collections.abc import Sequence

from nbjit.errors import NbjitOpError
from nbjit.launch.entry import EntryArg, entry_args
from nbjit.launch.kernel import Kernel
from nbjit.loading.triton import TritonKernel
from nbjit.params.numba_abi import is_mlir_name, is_numba_name, readable_name
from nbjit.records import record

__all__ = ["Declared", "declare", "label", "parameters"]


def label(kernel) -> str:
    """What messages call ``kernel``: a ``@cuda.jit`` kernel's Python name, else its own."""
    s = getattr(kernel, "_s", None)
    if s is not None:
        return s.label
    name = str(getattr(kernel, "name", kernel))  # (a kernel not loaded yet: its name read here)
    return readable_name(name) if is_numba_name(name) or is_mlir_name(name) else name


def parameters(kernel, where: str, names: Sequence[str] | None = None) -> dict[str, EntryArg]:
    """The parameters of ``kernel`` (an nbjit kernel or Triton kernel) by name; ``names``
    given, named so. ``where`` begins the messages ("op 'ns::scale'")."""
    if isinstance(kernel, TritonKernel):
        info, tail = kernel.kernel.info, kernel.meta.scratch_params
    elif isinstance(kernel, Kernel):
        info, tail = kernel.info, 0
    else:
        raise NbjitOpError(f"{where}: {type(kernel).__name__} is not an nbjit kernel (nbjit.compile, load, "
                           "load_bundle, from_numba or load_triton gives one)")
    args = entry_args(info, label(kernel), tail)
    if names is not None:
        if len(names) != len(args):
            raise NbjitOpError(f"{where}: names= gives {len(names)} names; kernel {label(kernel)} has {len(args)} "
                               "parameters")
        args = tuple(dataclasses.replace(a, name=n, where=a.where.replace(f"({a.name},", f"({n},", 1))
                     for a, n in zip(args, names))
    out: dict[str, EntryArg] = {}
    for a in args:
        if not a.name.isidentifier() or keyword.iskeyword(a.name) or a.name in out:
            raise NbjitOpError(f"{where}: kernel {label(kernel)}'s {a.where} has no name an op can use: give the "
                               "parameters' names with names=(...)")
        out[a.name] = a
    return out


@record
class Declared:
    """What an operator's declarations make of a kernel's parameters."""

    params: dict[str, EntryArg]
    inputs: tuple[str, ...]  # the operator's inputs, in the kernel's order
    outputs: tuple[str, ...]
    inplace: tuple[str, ...]
    fills: tuple[str, ...]


def declare(where: str, kernel_name: str, params: dict[str, EntryArg], outputs: Sequence[str],
            inplace: Sequence[str], reads: Sequence[str], fills: Sequence[str] = ()) -> Declared:
    """The declarations checked against the parameters: each names a parameter (outputs, in
    place and read-only ones a pointer or array), none twice; an input is no struct by value,
    and a pointer input without ``const`` is declared written in place or read.

    Raises NbjitOpError naming the parameter and what would be right."""
    groups = {"outputs": tuple(outputs), "inplace": tuple(inplace), "reads": tuple(reads), "fill": tuple(fills)}
    seen: dict[str, str] = {}
    for group, declared in groups.items():
        for n in declared:
            if n not in params:
                raise NbjitOpError(f"{where}: {group} names {n!r}, which kernel {kernel_name} does not have (its "
                                   f"parameters: {', '.join(params)})")
            if group != "fill" and not params[n].takes_array:
                raise NbjitOpError(f"{where}: {group} names {params[n].where}, which is not a pointer or an array")
            if n in seen:
                raise NbjitOpError(f"{where}: {n!r} is declared in both {seen[n]} and {group}")
            seen.setdefault(n, group)
    inputs = tuple(n for n in params if n not in groups["outputs"] and n not in groups["fill"])
    for n in inputs:
        a = params[n]
        if a.kind == "bytes":
            raise NbjitOpError(f"{where}: {a.where} takes its own bytes ({a.ctype or '.' + a.type}), which no op "
                               "input is: compute it with fill={" + repr(n) + ": ...} (bytes)")
        if a.takes_array and n not in groups["inplace"] and n not in groups["reads"] and not a.const:
            raise NbjitOpError(f"{where}: {a.where} is {a.ctype or a.text}, not const, so the kernel may write it: "
                               f"declare it inplace=({n!r},) if it does, reads=({n!r},) if it only reads")
    return Declared(params, inputs, groups["outputs"], groups["inplace"], groups["fill"])
