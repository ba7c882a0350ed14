"""Launchers: a kernel with its launch configuration (what ``kernel[grid, block, ...]``
gives); calling one launches. The C launcher (nbjit's extension: the arguments packed on the
C stack), the Python launchers (no extension, several GPUs to check, or a launch with
attributes where the C launcher has no cuLaunchKernelEx) and their per-thread parameter
buffers, ``BoundLaunch`` (``Kernel.bind``: arguments packed once), and what follows a launch
the driver refused."""
from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING, Callable

import numpy as np

from nbjit.errors import NbjitArgumentError, NbjitLaunchError
from nbjit.gpu import driver as _driver
from nbjit.gpu import extension
from nbjit.gpu.driver import stream_handle
from nbjit.gpu.host import current_host
from nbjit.launch.arrays import _EXTRACTORS, device_pointer
from nbjit.launch.nvtx import RangedLauncher
from nbjit.records import record

if TYPE_CHECKING:
    from nbjit.launch.config import LaunchConfig
    from nbjit.launch.kernel import Kernel
    from nbjit.params.signature import KernelInfo

__all__ = ["BoundLaunch", "LauncherSpec", "ParamBuffer", "launcher_type", "several_gpus", "with_tail"]

_EXTENSION = extension.extension()  # nbjit's C extension where it is used (decided there), or None
_MULTI: list = [None]  # several GPUs visible? decided when the first kernel is made (several_gpus)


def several_gpus() -> bool:
    """Whether several GPUs are visible (then every launch checks its device): asked of the
    driver once, when the first kernel is made; with one GPU the launch path checks none."""
    if _MULTI[0] is None:
        _MULTI[0] = _driver.multi_gpu()
    return _MULTI[0]


class ParamBuffer:
    """A parameter buffer of ``size`` bytes and the void*[] array pointing into it at
    ``offsets``, at fixed addresses: ``data`` (the bytes), ``base`` (their address),
    ``address`` (the array's, 0 where there are no parameters). ``of(info)``: a kernel's."""

    __slots__ = ("data", "view", "ptrs", "base", "address")

    def __init__(self, size: int, offsets):
        self.data = bytearray(max(1, size))  # struct.pack_into is fastest into a bytearray
        self.view = (ctypes.c_char * len(self.data)).from_buffer(self.data)  # pins it in place
        self.base = ctypes.addressof(self.view)
        n = len(offsets)
        self.ptrs = (ctypes.c_void_p * max(1, n))(*[self.base + off for off in offsets])
        self.address = ctypes.addressof(self.ptrs) if n else 0

    @classmethod
    def of(cls, info: KernelInfo) -> "ParamBuffer":
        return cls(info.param_size, _param_offsets(info))


def _param_offsets(info: KernelInfo) -> tuple[int, ...]:
    """Where each of the kernel's own parameters starts (what cuLaunchKernel is handed)."""
    return info.launch_offsets if info.launch_offsets is not None else tuple(p.offset for p in info.params)


def _buffer(s) -> ParamBuffer:
    """This thread's parameter buffer of a kernel's state (``kernel._State``)."""
    try:
        return s.tls.buf
    except AttributeError:
        s.tls.buf = ParamBuffer.of(s.info)
        return s.tls.buf


class BoundLaunch:
    """A launch with its arguments packed once (see ``Kernel.bind``); call it to launch.
    Holds the arguments, so the memory they point to stays alive."""

    __slots__ = ("launcher", "args", "_data", "_ptrs", "_address", "_cfg", "_launch")

    def __init__(self, launcher, args: tuple):
        s = launcher._s
        if len(args) != s.packer.n:
            raise s.packer.count_error(len(args))
        if launcher.multi:
            _check_devices(launcher, args)
        self.launcher = launcher
        self.args = args
        buf = ParamBuffer.of(s.info)
        s.packer.pack_into(buf.data, args)
        self._data, self._ptrs, self._address = buf.data, buf.ptrs, buf.address
        if launcher.config.extended:  # launch attributes (a programmatic dependent launch)
            self._cfg = ()
            self._launch = launcher.launch_at
        else:
            self._cfg = launcher._cfg
            self._launch = launcher._launch

    def __call__(self) -> None:
        """Launch again with the packed arguments."""
        err = self._launch(*self._cfg, self._address)
        if err:
            self.launcher._failed(err, self._address)

    launch = __call__


def _on_current_device(launcher):
    """With several GPUs, launching under another device than the kernel's: the same
    kernel of the module's copy in the current context (loaded on first use)."""
    s = launcher._s
    key = _driver.current_context_key()
    if key == s.ctx_key:
        return None
    if key == 0:  # no device chosen in this thread: the kernel's
        if adopt_context(s):
            return None
    twin = launcher.kernel.module.on_current_device()[s.name]
    other = twin[launcher.grid, launcher.block, launcher._stream_obj, launcher.shared]
    return other.launcher if isinstance(other, RangedLauncher) else other  # (the caller's launch is the range)


def _check_devices(launcher, args: tuple) -> None:
    """With several GPUs: every array must live on the kernel's device."""
    s = launcher._s
    for i in s.pointer_params:
        a = args[i]
        if a is None or isinstance(a, int):
            continue
        try:
            ctx = _driver.pointer_context(device_pointer(a))
        except NbjitArgumentError:
            continue  # the packer reports it with the parameter's name
        if ctx is None or ctx == s.ctx_key:
            continue
        dev = _driver.context_device(ctx)
        if dev is not None and dev != s.device:
            raise NbjitArgumentError(f"kernel {s.label!r}, parameter {i}: the array lives on device {dev}, the "
                                     f"kernel on device {s.device}")


class _Launcher:
    """A kernel with its launch configuration (what ``kernel[grid, block, ...]`` and
    ``kernel.configure`` return); calling it launches. ``launch_at(address)`` launches the
    parameters packed at an address (``BoundLaunch``), ``_failed`` is what follows a launch
    the driver refused."""

    path = "python"

    def _setup(self, kernel: Kernel, cfg: LaunchConfig, tail: int, count_error) -> None:
        _driver.check_not_forked()
        s = kernel._loaded()
        self.kernel = kernel
        self._s = s
        self.config = cfg  # holds the stream object: alive while the launcher is cached
        self.tail = tail
        self.nargs = s.n - tail
        self.count_error = count_error or s.packer.count_error
        self.multi = _MULTI[0]  # (several GPUs: a Python launcher checks devices on each launch)
        self.grid, self.block, self.shared = cfg.grid, cfg.block, cfg.shared
        self._stream_obj = cfg.stream
        self.stream = stream_handle(cfg.stream)
        backend = _driver.backend()
        self._launch = backend.launch
        self._cfg = (backend.handle(s.func), *cfg.grid, *cfg.block, cfg.shared, backend.handle(self.stream))

    def _pack(self, args: tuple) -> bytes:
        """The precise rules for the whole buffer (what the C path hands over)."""
        if len(args) != self.nargs:
            raise self.count_error(len(args))
        return self._s.packer.pack(args + (0,) * self.tail if self.tail else args)

    def launch_at(self, address: int) -> int:
        """The launch with the parameters packed at ``address``; the CUresult."""
        return self._launch(*self._cfg, address)

    def _failed(self, err, address: int) -> None:
        """A launch of the parameters at ``address`` returned ``err``: launched again, once,
        where that may now succeed (see ``_raise``), else the error raised. (The C
        launcher runs the same rule with ``_raise``.)"""
        if self._raise(err):
            err = self.launch_at(address)
            if err:
                raise self.error(err)

    def _raise(self, err) -> bool:
        """True where a launch that failed with ``err`` may go again (for want of a context in
        this thread: ``may_relaunch``), else the error raised."""
        if may_relaunch(self._s, err):
            return True
        raise self.error(err)

    def error(self, err) -> NbjitLaunchError:
        """The error a launch that failed with ``err`` raises (``launch_error``)."""
        return launch_error(self, err)


class _PyLauncher(_Launcher):
    """The launch path in Python (no C extension, or several GPUs to check)."""

    fallbacks = 0

    def __init__(self, kernel, cfg, tail: int = 0, count_error=None):
        self._setup(kernel, cfg, tail, count_error)

    def __call__(self, *args) -> None:
        if self.multi:
            other = _on_current_device(self)
            if other is not None:  # a plain launcher of the twin kernel: pass the tail too
                if len(args) != self.nargs:
                    raise self.count_error(len(args))
                return other(*args, *(0,) * self.tail)
        address = self._packed(args).address
        err = self._launch(*self._cfg, address)
        if err:
            self._failed(err, address)

    def _packed(self, args: tuple) -> ParamBuffer:
        """This thread's parameter buffer with ``args`` packed (count and devices checked)."""
        s = self._s
        if len(args) != self.nargs:
            raise self.count_error(len(args))
        if self.tail:
            args = args + (0,) * self.tail
        if self.multi:
            _check_devices(self, args)
        buf = _buffer(s)
        s.packer.pack_into(buf.data, args)
        return buf

class _ExtendedLauncher(_PyLauncher):
    """Launches that carry attributes (cooperative, a cluster shape set at launch,
    programmatic dependent) go through cuLaunchKernelEx with the same packing rules."""

    path = "python (cuLaunchKernelEx)"

    def __call__(self, *args) -> None:
        address = self._packed(args).address
        err = self.launch_at(address)
        if err:
            self._failed(err, address)

    def launch_at(self, address: int) -> int:
        c = self.config
        return _driver.launch_ex(self._s.func, c.grid, c.block, c.shared, self.stream, address,
                                       cooperative=c.cooperative, cluster=c.cluster, pdl=c.pdl)


@record
class LauncherSpec:
    """What nbjit's C ``Launcher`` is made from (``gpu/_launcher.c`` reads these by name)."""

    func: int  # the CUfunction's address
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int  # dynamic shared memory, bytes
    stream: int  # the CUstream's address
    layout: tuple  # per parameter (offset, code, ...): see gpu/_launcher.c
    size: int  # the parameter buffer's size
    extractors: dict  # type -> how to find a device array's address
    numbers: dict  # numpy scalar type -> kind and size ("f4")
    fallback: Callable[[tuple], bytes]  # the precise rules: the whole buffer, or an error
    on_error: Callable[[int], bool]  # a failed launch: True to launch again once, else raises
    param_offsets: tuple[int, ...] | None = None  # where the kernel's parameters are not the arguments
    attributes: bytes = b""  # cuLaunchKernelEx's attributes (72 bytes each); none: cuLaunchKernel
    entry: object = None  # a C entry point's facts (launch/entry.py: EntryFacts), None for other launchers


if _EXTENSION is not None:  # (else the Python launcher serves)
    class _CLauncher(_EXTENSION.Launcher, _Launcher):
        """The launch path in C: packs on the C stack with the same rules as the Python path,
        handing anything unusual to the precise Python rules (``fallbacks`` counts those
        calls)."""

        path = "c"

        def __init__(self, kernel: Kernel, cfg: LaunchConfig, tail: int = 0, count_error=None):
            self._setup(kernel, cfg, tail, count_error)
            s = self._s
            layout = with_tail(s.layout, tail)
            if cfg.extended:
                self._attrs = _driver.launch_attributes(cooperative=cfg.cooperative, cluster=cfg.cluster, pdl=cfg.pdl)
            else:
                self._attrs = b""
            c = self._cfg
            super().__init__(LauncherSpec(c[0], c[1:4], c[4:7], c[7], c[8], layout, s.sig.size, _EXTRACTORS,
                                          _numbers(), self._pack if tail else s.packer.pack, self._raise,
                                          s.param_offsets, self._attrs))

        def launch_at(self, address: int) -> int:
            return self._launch(*self._cfg, address, self._attrs)
else:
    _CLauncher = None  # type: ignore[assignment,misc]


def with_tail(layout: tuple, tail: int) -> tuple:
    """A kernel's C layout with its last ``tail`` parameters not passed and left zero ('Z')."""
    n = len(layout) - tail
    return layout[:n] + tuple((off, "Z") for off, *_ in layout[n:])


def launcher_type(config: LaunchConfig) -> type:
    """The C launcher where nbjit's extension is built and set up and one GPU is visible (for
    a launch with attributes, where it has cuLaunchKernelEx), else a Python one."""
    if not _MULTI[0] and _CLauncher is not None:
        backend = _driver.backend()
        if backend.name == "c" and (backend.extended or not config.extended):
            return _CLauncher
    return _ExtendedLauncher if config.extended else _PyLauncher


@functools.lru_cache(maxsize=None)
def _numbers() -> dict:
    """numpy scalar types the C path converts itself, as kind and size: "f4", "i8", "u2"."""
    types = (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
             np.uint32, np.uint64)
    return {t: f"{np.dtype(t).kind}{np.dtype(t).itemsize}" for t in types}


def adopt_context(s) -> bool:
    """In a thread with no current CUDA context, make the context of the kernel's state ``s``
    current; True where that is now the current one."""
    if _driver.current_context_key() != 0:
        return False
    current_host().make_current(s.device)
    return _driver.current_context_key() == s.ctx_key


_INVALID_CONTEXT = 201  # CUDA_ERROR_INVALID_CONTEXT: what a launch in a thread with no context gets


def may_relaunch(s, err) -> bool:
    """Whether a launch of the kernel's state ``s`` that failed for want of a context in this
    thread (one that made no CUDA call before) can go again: the kernel's context made
    current, as Numba's first call in a thread makes one current."""
    return int(err) == _INVALID_CONTEXT and adopt_context(s)


def launch_error(launcher, err) -> NbjitLaunchError:
    """``_Launcher.error``: a launch of ``launcher`` failed with ``err``."""
    why = _driver.FORK_MESSAGE if _driver.forked() else _driver.error_text(err) + _shape_problem(launcher, err)
    e = NbjitLaunchError(
        f"launch of kernel {launcher._s.label!r} failed (grid {launcher.grid}, block {launcher.block}, "
        f"{launcher.shared} bytes dynamic shared memory): {why}")
    e.code = int(err)  # the CUresult, as numba's CudaAPIError has it (a capture reads it)
    return e


def _shape_problem(launcher, err) -> str:
    """For an invalid-value refusal, which CUDA limit the grid or block exceeds, if one
    does (the kernel's own limit asked of the driver only now, on the way to an error)."""
    if int(err) != 1:  # CUDA_ERROR_INVALID_VALUE
        return ""
    (gx, gy, gz), (bx, by, bz) = launcher.grid, launcher.block
    threads = bx * by * bz
    try:
        most = _driver.function_attributes(launcher._s.func)["max_threads_per_block"]
    except Exception:  # no answer: the other limits may still tell
        most = 1024
    if threads > most:
        return f": a block of {threads} threads, and this kernel runs at most {most} per block"
    for axis, v, limit in (("x", bx, 1024), ("y", by, 1024), ("z", bz, 64)):
        if v > limit:
            return f": block {axis} is {v}, and CUDA allows at most {limit}"
    for axis, v, limit in (("x", gx, 2 ** 31 - 1), ("y", gy, 65535), ("z", gz, 65535)):
        if v > limit:
            return f": grid {axis} is {v}, and CUDA allows at most {limit}"
    return ""
