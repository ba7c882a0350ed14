"""nbjit kernels as PyTorch operators: ``nbjit.torch.op`` registers one ``torch.library``
custom op per kernel, which ``torch.compile(fullgraph=True)``, its CUDA-graph mode
(``mode="reduce-overhead"``), ``torch.library.opcheck`` and autograd take like torch's own.

The op's schema comes from the kernel's signature: a pointer (or a ``@cuda.jit`` kernel's
array) is a ``Tensor``, an integer an ``int``, a float a ``float``. The declarations say what
the signature cannot:

* ``outputs={"out": rule}``: parameters the op allocates and returns. ``rule``: the name of an
  input tensor (an output like it: shape and dtype), or a function of the op's inputs, by name,
  giving a shape or ``(shape, dtype)``; a shape alone takes the parameter's element type.
* ``inplace=("y",)``: pointer parameters the kernel writes (the schema's ``Tensor(a!)``, which
  functionalisation needs).
* ``reads=("x",)``: pointer parameters without ``const`` that the kernel only reads. A pointer
  input without ``const`` left out of all three is refused: were the kernel to write through it,
  compiled graphs would be silently wrong.
* ``fill={"n": fn}``: parameters computed from the op's inputs (``lambda x: x.numel()``).

``grid``, ``block`` (and ``shared``): ints, tuples, or functions of the op's arguments by name
(inputs, outputs, fills). The CUDA implementation launches through nbjit's launcher on torch's
current stream of the first input tensor's device; read-only tensors are made contiguous, a
non-contiguous tensor written in place is refused. The fake implementation (tracing,
``torch.compile``) makes the outputs from their rules; the CUDA implementation checks every
tensor's dtype against the kernel's signature, so a mistake is nbjit's error naming the op,
the parameter and the rule. One GPU: the kernel's (a tensor on another device is refused).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import torch

from nbjit.errors import NbjitArgumentError, NbjitOpError
from nbjit.launch.arrays import array_element, describe_element, element_matches
from nbjit.frameworks.declarations import declare, label, parameters
from nbjit.launch.entry import EntryArg
from nbjit.launch.kernel import Kernel
from nbjit.loading.triton import TritonKernel

__all__ = ["TorchOp", "op"]

_LIBRARIES: dict[str, torch.library.Library] = {}  # namespace -> its library (ops live while it does)
_OPS: dict[str, TorchOp] = {}  # "ns::name" -> the op's declaration


def op(kernel: Kernel | TritonKernel, *, name: str, grid: Any, block: Any = None, shared: Any = 0,
       outputs: Mapping[str, Any] | None = None, inplace: Sequence[str] = (), reads: Sequence[str] = (),
       fill: Mapping[str, Callable] | None = None, names: Sequence[str] | None = None,
       backward: Callable | None = None) -> Callable:
    """Register ``kernel`` as the PyTorch operator ``name`` ("namespace::op") and return it
    (``torch.ops.namespace.op``: call it with the op's inputs, the kernel's parameters but the
    outputs and fills, in the kernel's order).

    ``names``: the kernel's parameter names where its image has none worth using (PTX and
    Triton kernels name them ``<kernel>_param_<i>``). ``backward(inputs, outputs, grads) ->
    {input name: gradient}``: autograd's rule (it may launch other nbjit ops); ``inputs`` maps
    the op's inputs by name, ``outputs`` and ``grads`` are tuples in the outputs' order.
    Triton kernels take ``grid`` alone (their block is their ``num_warps``).

    Raises
    ------
    NbjitOpError: a declaration that does not fit the kernel, naming the op and the parameter.
    """
    spec = TorchOp(kernel, name, grid=grid, block=block, shared=shared, outputs=outputs or {}, inplace=inplace,
                   reads=reads, fill=fill or {}, names=names, backward=backward)
    namespace, opname = name.split("::")
    lib = _LIBRARIES.get(namespace)
    if lib is None:
        lib = _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    try:
        lib.define(opname + spec.schema)
    except RuntimeError as e:
        raise NbjitOpError(f"op {name!r}: torch refused its schema {spec.schema}: {e}") from None
    lib.impl(opname, spec.run, "CUDA")
    torch.library.register_fake(name, spec.fake, lib=lib)
    if backward is not None:
        torch.library.register_autograd(name, spec.backward, setup_context=spec.setup_context, lib=lib)
    _OPS[name] = spec
    return getattr(getattr(torch.ops, namespace), opname)


class _ByName:
    """A function of the op's arguments called with those it names (its parameters; all of them
    where it takes ``**kwargs``), or a constant (an int, a tuple)."""

    def __init__(self, value: Any, known: Sequence[str], what: str):
        self.value, self.names, self.every = value, None, False
        if callable(value):
            params = inspect.signature(value).parameters.values()
            self.every = any(p.kind is p.VAR_KEYWORD for p in params)
            self.names = tuple(p.name for p in params if p.kind is not p.VAR_KEYWORD)
            unknown = [n for n in self.names if n not in known]
            if unknown:
                raise NbjitOpError(f"{what} takes {', '.join(unknown)}, which the op does not have (it has "
                                   f"{', '.join(known)})")

    def __call__(self, values: dict) -> Any:
        if self.names is None:
            return self.value
        if self.every:
            return self.value(**values)
        return self.value(*[values[n] for n in self.names])


class TorchOp:
    """One kernel as a PyTorch operator: its schema, and the implementations ``op`` registers
    (``run`` for CUDA tensors, ``fake`` for tracing, ``setup_context`` / ``backward``)."""

    def __init__(self, kernel, name: str, *, grid, block, shared, outputs: Mapping, inplace: Sequence[str],
                 reads: Sequence[str], fill: Mapping, names: Sequence[str] | None, backward: Callable | None):
        if name.count("::") != 1 or not all(part.isidentifier() for part in name.split("::")):
            raise NbjitOpError(f"op {name!r}: name it 'namespace::op_name' (two identifiers)")
        where = f"op {name!r}"
        self.name, self.kernel, self.triton = name, kernel, isinstance(kernel, TritonKernel)
        self.params = parameters(kernel, where, names)
        d = declare(where, label(kernel), self.params, tuple(outputs), inplace, reads, tuple(fill))
        self.input_names, self.output_names, self.inplace = d.inputs, d.outputs, d.inplace
        if not any(self.params[n].takes_array for n in self.input_names):
            raise NbjitOpError(f"{where}: none of its inputs is a tensor, which tells the device and stream to run "
                               "on: make one of the kernel's arrays an input (inplace= or an input read)")
        if backward is not None and self.inplace:
            raise NbjitOpError(f"{where}: backward= with inplace=({', '.join(map(repr, self.inplace))}): torch's "
                               "autograd takes a formula for functional ops only: make the written tensors outputs")
        self.fills = {n: _ByName(f, self.input_names, f"{where}: fill {n!r}") for n, f in fill.items()}
        self.dtypes = {n: _dtypes(a) for n, a in self.params.items() if a.takes_array}
        self.rules = {n: _OutputRule(where, self.params[n], rule, self.input_names, self.params)
                      for n, rule in outputs.items()}
        known = self.input_names + self.output_names + tuple(self.fills)
        self.grid = _ByName(grid, known, f"{where}: grid")
        if self.triton and (block is not None or shared):
            raise NbjitOpError(f"{where}: a Triton kernel's block is its num_warps and its shared memory its own: "
                               "give grid alone")
        if not self.triton and block is None:
            raise NbjitOpError(f"{where}: give block= (an int, a tuple, or a function of the op's arguments)")
        self.block = _ByName(block, known, f"{where}: block")
        self.shared = _ByName(shared, known, f"{where}: shared")
        self.user_backward = backward
        self.schema = self._schema()

    # ------------------------------------------------------------ declaration
    def _schema(self) -> str:
        """The op's schema: ``(Tensor(a!) y, Tensor x, float a) -> Tensor``."""
        parts, alias = [], iter("abcdefghijklmnopqrstuvwxyz")
        for n in self.input_names:
            a = self.params[n]
            ty = "Tensor" if a.takes_array else "float" if a.kind == "float" else "int"
            if n in self.inplace:
                ty = f"Tensor({next(alias)}!)"
            parts.append(f"{ty} {n}")
        outs = len(self.output_names)
        result = "()" if outs == 0 else "Tensor" if outs == 1 else "(" + ", ".join(["Tensor"] * outs) + ")"
        return f"({', '.join(parts)}) -> {result}"

    # ------------------------------------------------------------ implementations
    def _arguments(self, inputs: tuple, check: bool) -> tuple[dict, torch.Tensor]:
        """The op's arguments by name, its inputs, its outputs (made by their rules) and its
        fills; and its first input tensor (the device). ``check``: tensors' dtypes and
        dimensions checked against the kernel's parameters (the CUDA implementation's)."""
        values = dict(zip(self.input_names, inputs))
        first = None
        for n in self.input_names:
            v = values[n]
            if isinstance(v, torch.Tensor):
                first = v if first is None else first
                a = self.params[n]
                if check:
                    self._check(a, v, "")
                dense = _dense(a, v)
                if dense is not v:
                    if n in self.inplace:
                        raise NbjitArgumentError(f"op {self.name!r}: {a.where}: a tensor of strides "
                                                 f"{tuple(v.stride())} cannot be written in place by a kernel that "
                                                 f"takes {a.ctype or a.text}: pass a contiguous tensor")
                    values[n] = dense
        if first is None:
            raise NbjitArgumentError(f"op {self.name!r}: no tensor among its inputs tells the device to run on")
        for n, rule in self.rules.items():
            values[n] = out = rule.make(values, first)
            if check:
                self._check(self.params[n], out, f" (made by the output rule of {n!r})")
        for n, f in self.fills.items():
            values[n] = f(values)
        return values, first

    def _check(self, a: EntryArg, t: torch.Tensor, made: str) -> None:
        """NbjitArgumentError, naming the op and the parameter, where tensor ``t`` cannot be
        passed for ``a`` (a dtype looked up in the parameter's set: on every call)."""
        allowed = self.dtypes[a.name]
        if (allowed is not None and t.dtype not in allowed) or (a.ndim is not None and t.dim() != a.ndim):
            _refuse_tensor(f"op {self.name!r}", a, t, made)

    def _result(self, values: dict):
        outs = self.output_names
        if not outs:
            return None
        return values[outs[0]] if len(outs) == 1 else tuple(values[n] for n in outs)

    def fake(self, *inputs):
        """The fake (meta) implementation: the outputs as their rules make them. Dtypes are
        left to ``run``, so that a compiled graph given a wrong one raises nbjit's error from the
        launch, not torch's tracing wrapper's."""
        return self._result(self._arguments(inputs, check=False)[0])

    def run(self, *inputs):
        """The CUDA implementation: the kernel launched on torch's current stream."""
        values, first = self._arguments(inputs, check=True)
        args = [values[n] for n in self.params]
        grid = self.grid(values)
        stream = torch._C._cuda_getCurrentRawStream(first.device.index)  # (what Inductor's own launches use)
        if self.triton:
            self.kernel[grid](*args, stream=stream)
        else:
            self.kernel[grid, self.block(values), stream, self.shared(values)](*args)
        return self._result(values)

    def setup_context(self, ctx, inputs: tuple, output) -> None:
        """What autograd keeps for ``backward``: the inputs and the outputs."""
        outs = () if output is None else (output,) if isinstance(output, torch.Tensor) else tuple(output)
        tensors = [(i, v) for i, v in enumerate(inputs) if isinstance(v, torch.Tensor)]
        ctx.save_for_backward(*[v for _, v in tensors], *outs)
        ctx.layout = ([i for i, _ in tensors], len(outs), [None if isinstance(v, torch.Tensor) else v for v in inputs])

    def backward(self, ctx, *grads):
        """Autograd's rule: the user's ``backward``, its gradients in the op's inputs' order."""
        at, n_outs, plain = ctx.layout
        saved = ctx.saved_tensors
        inputs = list(plain)
        for i, v in zip(at, saved):
            inputs[i] = v
        named = dict(zip(self.input_names, inputs))
        got = self.user_backward(named, tuple(saved[len(at):len(at) + n_outs]), grads) or {}
        unknown = [n for n in got if n not in named]
        if unknown:
            raise NbjitOpError(f"op {self.name!r}: backward gave gradients for {', '.join(unknown)}, which are not "
                               f"its inputs ({', '.join(self.input_names)})")
        return tuple(got.get(n) for n in self.input_names)


def _dense(a: EntryArg, t: torch.Tensor) -> torch.Tensor:
    """``t`` laid out as parameter ``a`` takes it: C-contiguous for a pointer or a C-layout
    ``@cuda.jit`` array, Fortran-contiguous for an F-layout one (a copy where it is not); any
    strides for layout "A"."""
    if a.kind == "pointer" or (a.kind == "array" and a.layout == "C"):
        return t if t.is_contiguous() else t.contiguous()
    if a.kind == "array" and a.layout == "F":
        order = tuple(range(t.dim() - 1, -1, -1))
        flipped = t.permute(order)
        return t if flipped.is_contiguous() else flipped.contiguous().permute(order)
    return t


class _OutputRule:
    """How an output is made: like an input tensor, or a shape (and dtype) from the inputs;
    its dtype checked against the kernel's parameter."""

    def __init__(self, where: str, a: EntryArg, rule: Any, inputs: Sequence[str], params: Mapping[str, EntryArg]):
        self.where, self.a = f"{where}: output rule of {a.name!r}", a
        if isinstance(rule, str):
            if rule not in inputs or not params[rule].takes_array:
                raise NbjitOpError(f"{self.where}: {rule!r} is not one of the op's input tensors "
                                   f"({', '.join(n for n in inputs if params[n].takes_array)})")
            other = params[rule]
            if other.element_dtype and a.element_dtype and other.element_dtype != a.element_dtype:
                raise NbjitOpError(f"{self.where}: like {rule!r} ({other.ctype or other.text}) gives "
                                   f"{other.element_dtype} tensors; {a.where} is {a.ctype or a.text}")
            self.like, self.fn = rule, None
        elif callable(rule):
            self.like, self.fn = None, _ByName(rule, inputs, self.where)
        else:
            raise NbjitOpError(f"{self.where}: give the name of an input tensor, or a function of the inputs "
                               f"giving a shape or (shape, dtype), not {type(rule).__name__}")

    def make(self, values: dict, first: torch.Tensor) -> torch.Tensor:
        if self.like is not None:
            out = torch.empty_like(values[self.like], memory_format=torch.contiguous_format)
        else:
            got = self.fn(values)
            shape, dtype = got if isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], torch.dtype) \
                else (got, None)
            dtype = dtype or self._dtype()
            try:
                out = first.new_empty(tuple(shape) if not isinstance(shape, int) else (shape,), dtype=dtype)
            except (TypeError, RuntimeError) as e:
                raise NbjitOpError(f"{self.where}: it gave {got!r}, not a shape or (shape, dtype): {e}") from None
        return out

    def _dtype(self) -> torch.dtype:
        """The parameter's element type as a torch dtype (a rule that gives a shape alone)."""
        name = self.a.element_dtype
        if name is None:
            raise NbjitOpError(f"{self.where}: {self.a.where} is {self.a.ctype or self.a.text}, which has no element "
                               "type: the rule must give (shape, dtype)")
        return getattr(torch, name)


_DTYPES = (torch.bool, torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64,
           torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
           torch.complex128)


def _dtypes(a: EntryArg) -> frozenset | None:
    """The torch dtypes a tensor for ``a`` may hold (None: any, an untyped pointer's)."""
    if a.element_dtype is None:
        return None
    out = set()
    for d in _DTYPES:
        got = array_element(SimpleNamespace(dtype=d))  # (it reads the dtype alone)
        if got is not None and (got[2] == a.element_dtype if a.kind == "array" else element_matches(a.element, got)):
            out.add(d)
    return frozenset(out)


def _refuse_tensor(where: str, a: EntryArg, t: torch.Tensor, made: str) -> None:
    """NbjitArgumentError saying why tensor ``t`` cannot be passed for ``a`` (its dtype, its ndim)."""
    got = array_element(t)
    if a.kind == "array":
        if a.ndim is not None and t.dim() != a.ndim:
            raise NbjitArgumentError(f"{where}: {a.where}: a {t.dim()}-d tensor{made}; the parameter is {a.text}")
        if a.element_dtype is not None and got is not None and got[2] != a.element_dtype:
            raise NbjitArgumentError(f"{where}: {a.where}: a {got[2]} tensor{made}; the parameter is {a.text}")
    elif a.element[0] != "void" and got is not None and not element_matches(a.element, got):
        raise NbjitArgumentError(f"{where}: {a.where}: a {got[2]} tensor{made}; the parameter is {a.ctype} and "
                                 f"takes {describe_element(a.element)} arrays")
