"""The launches packed in Python: the Python launchers (where nbjit's C extension is not used,
where several GPUs are visible, and for a launch with attributes where the C launcher has no
cuLaunchKernelEx), the per-thread parameter buffers they pack into, the device checks of
several GPUs, and ``BoundLaunch`` (``Kernel.bind``: arguments packed once). Apart from
``kernel`` so that a bundle's first kernel, launched in C on one GPU, loads none of it (issue
26): ``kernel`` imports it where one of these is first made, handing over its launcher base
(this imports no ``kernel``)."""
from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING

from nbjit import _driver, _driver_extra
from nbjit.args import device_pointer
from nbjit.errors import NbjitArgumentError

if TYPE_CHECKING:
    from nbjit.signature import KernelInfo

__all__ = ["BoundLaunch"]


class _Buffer:
    """A parameter buffer and the void*[] array pointing into it, at fixed addresses."""

    __slots__ = ("data", "view", "ptrs", "address")

    def __init__(self, info: KernelInfo):
        self.data = bytearray(max(1, info.param_size))  # struct.pack_into is fastest into a bytearray
        self.view = (ctypes.c_char * len(self.data)).from_buffer(self.data)  # pins it in place
        base = ctypes.addressof(self.view)
        offsets = _param_offsets(info)
        n = len(offsets)
        self.ptrs = (ctypes.c_void_p * max(1, n))(*[base + off for off in offsets])
        self.address = ctypes.addressof(self.ptrs) if n else 0


def _param_offsets(info: KernelInfo) -> tuple[int, ...]:
    """Where each of the kernel's own parameters starts (what cuLaunchKernel is handed)."""
    return info.launch_offsets if info.launch_offsets is not None else tuple(p.offset for p in info.params)


def _buffer(s) -> _Buffer:
    """This thread's parameter buffer of a kernel's state (``kernel._State``)."""
    try:
        return s.tls.buf
    except AttributeError:
        s.tls.buf = _Buffer(s.info)
        return s.tls.buf


@functools.lru_cache(maxsize=None)
def launcher_types(base: type) -> tuple[type, type]:
    """The Python launchers on ``kernel``'s launcher base: ``_PyLauncher``, and
    ``_ExtendedLauncher`` for launches with attributes."""

    class _PyLauncher(base):
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

        def _packed(self, args: tuple) -> _Buffer:
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
            return _driver_extra.launch_ex(self._s.func, c.grid, c.block, c.shared, self.stream, address,
                                           cooperative=c.cooperative, cluster=c.cluster, pdl=c.pdl)

    return _PyLauncher, _ExtendedLauncher


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
        buf = _Buffer(s.info)
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


BoundLaunch.__module__ = "nbjit.kernel"  # (where users find it; pickles name it so)


def _on_current_device(launcher):
    """With several GPUs, launching under another device than the kernel's: the same
    kernel of the module's copy in the current context (loaded on first use)."""
    s = launcher._s
    key = _driver.current_context_key()
    if key == s.ctx_key:
        return None
    if key == 0:  # no device chosen in this thread: the kernel's
        from nbjit._kernel_extra import adopt_context
        if adopt_context(s):
            return None
    twin = launcher.kernel.module.on_current_device()[s.name]
    return twin[launcher.grid, launcher.block, launcher._stream_obj, launcher.shared]


def _check_devices(launcher, args: tuple) -> None:
    """With several GPUs: every array must live on the kernel's device."""
    s = launcher._s
    for i in s.pointer_params:
        a = args[i]
        if a is None or isinstance(a, int):
            continue
        try:
            ctx = _driver_extra.pointer_context(device_pointer(a))
        except NbjitArgumentError:
            continue  # the packer reports it with the parameter's name
        if ctx is None or ctx == s.ctx_key:
            continue
        dev = _driver_extra.context_device(ctx)
        if dev is not None and dev != s.device:
            raise NbjitArgumentError(f"kernel {s.label!r}, parameter {i}: the array lives on device {dev}, the "
                                     f"kernel on device {s.device}")
