"""The C entry point: a kernel launched from compiled code with no Python in the way (``@njit``
functions, ctypes, cffi, a Numba ``cfunc``, C or C++), by the C launcher's own packing rules.

``kernel.c_entry`` gives a ``CEntry``: the addresses of three C functions and ``kernel``, the
address to pass them for this kernel (valid while the ``CEntry`` or the kernel lives)::

    int nbjit_launch(const void *kernel, const int64_t dims[7], int forms, void *stream,
                     void *const *args, int64_t nargs, char *message, int64_t message_size);
    int nbjit_pack(const void *kernel, void *const *args, int64_t nargs, void *buffer,
                   char *message, int64_t message_size);
    int nbjit_synchronize(void *stream, char *message, int64_t message_size);

``dims``: grid x, y, z, block x, y, z, dynamic shared memory bytes. ``forms``: how the caller
wrote the grid (bits 0-2) and the block (bits 3-5), for messages: 0 a tuple of three, 1-3 a
tuple of that many, 4 one int.
``args``: as ``cuLaunchKernel`` takes them, one ``void*`` per argument, each pointing to the
argument in its class's form (``CEntry.arguments`` names the class of each):

    ``pointer``  a ``uint64_t`` device address
    ``int``      an ``int64_t`` (a ``uint64_t`` for a ``.u64`` parameter), checked against the
                 parameter's type as a Python launch checks it
    ``float``    a ``double`` (one that fits a ``float`` for an ``f32`` parameter)
    ``array``    a view: ``int64_t data, ndim, shape[ndim], strides[ndim]`` (strides in bytes),
                 for the array parameters of ``@cuda.jit`` kernels (``from_numba``)
    ``bytes``    the parameter's own bytes (structs by value, ``f16``, ``bf16``, tensor maps)

The status is 0, 1 (an argument error: ``NbjitArgumentError``) or 2 (a launch error:
``NbjitLaunchError``), with the message a Python launch would raise written into ``message``
(a buffer the caller owns). No Python object is touched and the GIL is not needed: any thread
may launch. In a thread with no current CUDA context the kernel's is made current, as a Python
launch does. The launch takes the kernel's programmatic dependent launch setting (``pdl``) and
cluster shape as they were when the entry was made.
"""
from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np

from nbjit.errors import NbjitLaunchError
from nbjit.gpu import driver as _driver
from nbjit.gpu import extension
from nbjit.launch.arguments import ArgPacker, _kind
from nbjit.launch.arrays import _EXTRACTORS
from nbjit.launch.launchers import LauncherSpec, _numbers, with_tail
from nbjit.records import record

if TYPE_CHECKING:
    from nbjit.launch.kernel import Kernel
    from nbjit.params.signature import KernelInfo

__all__ = ["CEntry", "EntryArg", "EntryFacts", "arguments_digest", "entry_args", "entry_facts", "entry_launcher",
           "kernel_entry"]

# a parameter's code (ArgPacker's rules, gpu/_launcher.c) -> the class its argument takes
_CLASS = {"P": "pointer", "A": "pointer", "N": "array", "M": "array", "f": "float", "d": "float", "X": "bytes"}


@record
class EntryArg:
    """What one argument of the C entry point (and of a launch from ``@njit`` code) takes."""

    index: int
    name: str
    kind: str  # "pointer", "int", "float", "array" or "bytes" (the module's docstring: the C form)
    type: str  # the parameter's PTX type ("s32", "f32", "b64", "unknown"), "ptr" for a pointer
    size: int  # bytes in the parameter buffer
    element: tuple  # what an array passed for a typed pointer must hold (cdecl.element_of); ("void", None)
    ctype: str | None = None  # the parameter's C type, where a source gives it
    dtype: str | None = None  # an array parameter's numpy dtype (its .str)
    ndim: int | None = None
    layout: str | None = None  # "C", "F" or "A"
    text: str = ""  # an array parameter's type as messages write it
    where: str = ""  # "parameter i (name, kind)", as argument errors name it

    @property
    def takes_array(self) -> bool:
        """Whether an array goes here: a pointer parameter, or a ``@cuda.jit`` kernel's array."""
        return self.kind == "array" or (self.kind == "pointer" and self.type == "ptr")

    @property
    def const(self) -> bool:
        """Whether the source declares the pointer ``const`` (the kernel only reads through it)."""
        return self.ctype is not None and self.ctype.replace(" ", "").startswith("const")

    @property
    def element_dtype(self) -> str | None:
        """The numpy name of the dtype an array for it holds ("float32", "bfloat16"), None where
        any goes (an untyped pointer) or it takes no array."""
        if self.kind == "array":
            return np.dtype(self.dtype).name if self.dtype is not None else None
        if not self.takes_array or self.element[0] not in _DTYPE_OF_KIND:
            return None
        kind, size = self.element[:2]
        return _DTYPE_OF_KIND[kind].format(bits=size * 8)


_DTYPE_OF_KIND = {"f": "float{bits}", "i": "int{bits}", "b": "bool", "bf": "bfloat16", "c": "complex{bits}"}


def entry_args(info: KernelInfo, label: str, tail: int = 0, packer: ArgPacker | None = None) -> tuple[EntryArg, ...]:
    """The arguments a kernel's C entry takes (all its parameters but ``tail`` trailing ones
    that stay zero), by the launch rules' codes (``packer``'s where the kernel has one)."""
    packer = packer or ArgPacker(info.signature, label)
    out = []
    for i, (p, rule) in enumerate(zip(info.params[:len(info.params) - tail], packer.rules)):
        code = rule.code[0]
        a = p.abi if p.type == "numba_array" else None
        dtype = a.dtype.str if a is not None and a.dtype is not None else None
        out.append(EntryArg(
            index=i, name=p.name, kind=_CLASS.get(code, "int"), type="ptr" if p.pointer else p.type, size=p.size,
            element=tuple(p.element), ctype=p.ctype, dtype=dtype, ndim=a.ndim if a is not None else None,
            layout=a.layout if a is not None else None, text=a.text if a is not None else _kind(p),
            where=f"parameter {i} ({p.name}, {_kind(p)})"))
    return tuple(out)


@record
class EntryFacts:
    """What the C entry point's checks and messages need (``gpu/_launcher.c`` reads these by name)."""

    label: str  # repr() of the kernel's name
    signature: str  # name(parameters)
    prefix: tuple[str, ...]  # per parameter: "kernel 'k', parameter i (name, kind)"
    types: tuple[str, ...]  # per parameter: its PTX type, "ptr" for pointers
    texts: tuple[str, ...]  # per parameter: an array parameter's type as messages write it
    sizes: tuple[int, ...]  # per parameter: its bytes
    limits: tuple[int, int, int, int]  # context handle, static shared, shared opt-in limit, threads per block
    cluster: tuple[int, ...]  # the kernel's own cluster shape, () for none
    sticky: tuple[int, ...]  # CUresults that leave the process unable to use CUDA
    sticky_hint: str


def entry_facts(info: KernelInfo, label: str, limits: tuple[int, int, int, int], tail: int = 0,
                args: tuple[EntryArg, ...] | None = None) -> EntryFacts:
    """The facts of a kernel's C entry (``args``: its ``entry_args``, where made already): its
    messages rendered as the Python rules render them."""
    args = args if args is not None else entry_args(info, label, tail)
    rest = ("",) * (len(info.params) - len(args))  # (the trailing parameters nobody passes)
    return EntryFacts(
        label=repr(label), signature=f"{label}{info.signature}",
        prefix=tuple(f"kernel {label!r}, {a.where}" for a in args) + rest,
        types=tuple(a.type for a in args) + rest, texts=tuple(a.text for a in args) + rest,
        sizes=tuple(p.size for p in info.params), limits=limits,
        cluster=tuple(info.directives.cluster or ()), sticky=tuple(sorted(_driver.STICKY_ERRORS)),
        sticky_hint=_driver.STICKY_HINT)


@record
class CEntry:
    """A kernel's C entry point (``kernel.c_entry``): see this module's docstring for the ABI."""

    launch: int  # the address of nbjit_launch
    pack: int  # of nbjit_pack
    synchronize: int  # of nbjit_synchronize
    kernel: int  # what to pass as their `kernel` for this kernel
    param_size: int  # bytes of the kernel's parameter buffer (what nbjit_pack fills)
    arguments: tuple[EntryArg, ...]
    label: str  # the kernel's name as messages give it
    launcher: object  # the C launcher at `kernel` (kept alive with this entry)
    digest: int = 0  # arguments_digest(arguments): what compiled callers typed against, told in one int


def arguments_digest(arguments: tuple[EntryArg, ...]) -> int:
    """A digest of what a kernel's arguments take, the same in every process (compiled code
    checks the kernel it is handed against the one it was typed for by this int)."""
    return zlib.crc32(repr(arguments).encode())


def kernel_entry(kernel: Kernel, tail: int = 0) -> CEntry:
    """``Kernel.c_entry``: the kernel's C entry, made once per loaded kernel, launch setting
    (``pdl``) and ``tail`` (never freed while the kernel lives: compiled code may hold it)."""
    s = kernel._loaded()
    pdl = kernel._pdl(None)
    key = (tail, pdl)
    hit = s.entries.get(key)
    if hit is not None:
        return hit
    points = _driver.entry_points()
    attrs = _driver.launch_attributes(cooperative=False, cluster=None, pdl=True) if pdl else b""
    dev = _driver.device_info(s.device)
    fn = kernel.attributes
    if dev.max_shared_optin > dev.max_shared_default:  # opted in once: any size the device allows may come
        kernel._shared(dev.max_shared_optin - fn.shared)
    args = entry_args(s.info, s.label, tail, s.packer)
    facts = entry_facts(s.info, s.label, (s.ctx_key, fn.shared, dev.max_shared_optin, fn.max_threads_per_block), tail,
                        args)
    launcher = entry_launcher(s.info, s.packer, s.layout, _driver.as_int(s.func), facts, tail, attrs)
    with s.lock:
        entry = s.entries.setdefault(key, CEntry(points["launch"], points["pack"], points["synchronize"],
                                                 id(launcher), s.info.param_size, args, s.label, launcher,
                                                 arguments_digest(args)))
    return entry


def entry_launcher(info: KernelInfo, packer: ArgPacker, layout: tuple, func: int, facts: EntryFacts, tail: int = 0,
                   attributes: bytes = b""):
    """The C launcher behind a kernel's entry (its grid, block and stream come with each call):
    ``layout`` the kernel's C layout (``(offset, *rule.code)`` per parameter), ``func`` the
    CUfunction's address (0 where it only packs)."""
    def refuse(err):
        raise NbjitLaunchError(f"kernel {packer.kernel!r}: a C entry's launcher is not called from Python")
    spec = LauncherSpec(func, (1, 1, 1), (1, 1, 1), 0, 0, with_tail(layout, tail), info.signature.size, _EXTRACTORS,
                        _numbers(), packer.pack, refuse, info.launch_offsets, attributes, facts)
    return extension.extension().Launcher(spec)
