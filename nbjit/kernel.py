"""Kernel: a loaded function plus its signature; ``kernel[grid, block, stream, shared](*args)``.

The launch hot path: one cached dictionary look-up for the launch configuration, the
argument converters that are needed (pointers), one ``struct.pack_into`` into this
thread's parameter buffer, and ``cuLaunchKernel``.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _driver
from .args import _EXTRACTORS, ArgPacker, device_pointer
from .errors import NbjitArgumentError, NbjitLaunchError
from .signature import KernelInfo, KernelSignature, Param

__all__ = ["Kernel", "KernelAttributes", "BoundLaunch"]

_MAX_CONFIGS = 256
# Several GPUs visible? Decided when the first kernel is made; with one GPU the launch
# path skips every device check.
_MULTI: list = [None]


@dataclass(frozen=True)
class KernelAttributes:
    """What the driver says about a loaded kernel."""

    registers: int
    shared: int  # static shared memory, bytes
    const: int
    local: int
    max_threads_per_block: int
    ptx_version: int  # e.g. 90 for PTX ISA 9.0 (the virtual arch for cubins)
    binary_version: int  # e.g. 90 for SASS sm_90
    max_dynamic_shared: int


class _Buffer:
    """A parameter buffer and the void*[] array pointing into it, at fixed addresses."""

    __slots__ = ("data", "view", "ptrs", "address")

    def __init__(self, sig: KernelSignature):
        self.data = bytearray(max(1, sig.size))  # struct.pack_into is fastest into a bytearray
        self.view = (ctypes.c_char * len(self.data)).from_buffer(self.data)  # pins it in place
        base = ctypes.addressof(self.view)
        n = len(sig.params)
        self.ptrs = (ctypes.c_void_p * max(1, n))(*[base + p.offset for p in sig.params])
        self.address = ctypes.addressof(self.ptrs) if n else 0


class _State:
    """Per (module, kernel name): the function handle and everything derived from the
    signature. Holds no reference back to the module (no cycles: unloading stays prompt)."""

    def __init__(self, name: str, func, info: KernelInfo, ctx_key: int, device: int):
        self.name = name
        self.func = func
        self.info = info
        self.sig = info.signature
        self.packer = ArgPacker(info.signature, name)
        self.n = self.packer.n
        self.layout = tuple((p.offset, *_code(p, r)) for p, r in zip(info.params, self.packer.rules))
        self.ctx_key = ctx_key
        self.device = device
        self.tls = threading.local()
        self.configs: dict = {}
        self.optin = 0  # dynamic shared bytes this function has been opted in to
        self.attrs: KernelAttributes | None = None
        self.pointer_params = tuple(i for i, p in enumerate(info.params) if p.pointer or p.size == 8)
        self.lock = threading.Lock()
        if _MULTI[0] is None:
            _MULTI[0] = _driver.device_count() > 1

    def buffer(self) -> _Buffer:
        try:
            return self.tls.buf
        except AttributeError:
            self.tls.buf = _Buffer(self.sig)
            return self.tls.buf


_CODES = {"s64": "q", "u32": "I", "b32": "I", "s32": "i", "u16": "H", "b16": "H", "s16": "h", "u8": "B",
          "b8": "B", "s8": "b", "f32": "f", "f64": "d"}


def _code(p: Param, rule) -> tuple:
    """How the C launch path packs a parameter: ``(code,)``, or ``("A", accepted dtypes)``
    for a typed pointer ('X': only the Python rules)."""
    if p.count is not None:
        return ("X",)
    if p.pointer and rule.want[0] != "void":
        return ("A", rule.accepted)
    if p.pointer or (p.size == 8 and p.type in ("u64", "b64", "unknown")):
        return ("P",)
    if p.type == "unknown" and p.size in (1, 2, 4):
        return (str(p.size),)
    return (_CODES.get(p.type, "X"),)


def _dims(v, what: str, kernel: str) -> tuple[int, int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        t = (v,)
    elif isinstance(v, (tuple, list)) and 1 <= len(v) <= 3:
        t = tuple(v)
    else:
        raise NbjitLaunchError(f"kernel {kernel!r}: {what} must be an int or a tuple of 1 to 3 ints, got {v!r}")
    try:
        t = tuple(int(x) for x in t)
    except (TypeError, ValueError):
        raise NbjitLaunchError(f"kernel {kernel!r}: {what} must hold ints, got {v!r}") from None
    if any(x < 1 for x in t):
        raise NbjitLaunchError(f"kernel {kernel!r}: {what} values must be >= 1 (got {v!r})")
    return (t + (1, 1))[:3]  # type: ignore[return-value]


def stream_handle(stream: Any):
    """A CUstream for a Numba stream, an int handle, an object with ``__cuda_stream__`` or
    ``cuda_stream`` (PyTorch), or None/0 (the default stream)."""
    if stream is None or (isinstance(stream, int) and stream == 0):
        return _driver.stream_object(0)
    h = getattr(stream, "handle", None)
    if h is not None and type(h).__name__ == "CUstream":
        return h
    if isinstance(h, ctypes.c_void_p):  # numba-cuda's ctypes bindings (CUDA 12)
        return _driver.stream_object(h.value or 0)
    if isinstance(stream, int):
        return _driver.stream_object(stream)
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        v = proto() if callable(proto) else proto
        return _driver.stream_object(int(v[1]))
    cs = getattr(stream, "cuda_stream", None)
    if isinstance(cs, int):
        return _driver.stream_object(cs)
    raise NbjitLaunchError(f"{type(stream).__name__} is not a stream (pass a Numba stream, an int handle, an object "
                           "with __cuda_stream__, or None)")


class _PyIndexing:
    """``kernel[config]`` in Python (where nbjit's C extension is not built)."""

    __slots__ = ("_configs",)

    def __getitem__(self, config):
        try:
            return self._configs[config]
        except (KeyError, TypeError):  # TypeError: an unhashable config (lists)
            return self._configure_cached(config)


def _indexing_base() -> type:
    """The C look-up of ``kernel[config]`` (``_launch.KernelBase``) where it is built."""
    if os.environ.get("NBJIT_PURE_PYTHON", "") not in ("", "0"):
        return _PyIndexing
    try:
        from ._launch import KernelBase
        return KernelBase
    except ImportError:
        return _PyIndexing


class Kernel(_indexing_base()):  # type: ignore[misc]
    """A kernel of a loaded module.

    Launch it as Numba does: ``kernel[grid, block](*args)``, ``kernel[grid, block,
    stream](*args)``, ``kernel[grid, block, stream, dynamic_shared_bytes](*args)``; or with
    ``kernel.launch(...)`` for cooperative launches and clusters; or ``kernel.bind(...)``
    to pack the arguments once and relaunch.
    """

    __slots__ = ("module", "_s", "__weakref__")

    def __init__(self, module, state: _State):
        self.module = module  # keeps the module (and so the function) loaded
        self._s = state
        self._configs = state.configs

    # ------------------------------------------------------------ description
    @property
    def name(self) -> str:
        return self._s.name

    @property
    def info(self) -> KernelInfo:
        return self._s.info

    @property
    def params(self) -> tuple[Param, ...]:
        return self._s.info.params

    @property
    def signature(self) -> KernelSignature:
        return self._s.sig

    @property
    def handle(self):
        """The CUfunction."""
        return self._s.func

    @property
    def attributes(self) -> KernelAttributes:
        s = self._s
        if s.attrs is None:
            s.attrs = KernelAttributes(**_driver.function_attributes(s.func))
        return s.attrs

    def max_active_blocks_per_sm(self, block: int | tuple, dynamic_shared: int = 0) -> int:
        """How many blocks of this size can be resident on one SM at once."""
        b = _dims(block, "block", self.name)
        return _driver.max_active_blocks(self._s.func, b[0] * b[1] * b[2], dynamic_shared)

    def suggested_block_size(self, dynamic_shared: int = 0) -> tuple[int, int]:
        """(minimum grid size for full occupancy, block size) from the occupancy calculator."""
        return _driver.potential_block_size(self._s.func, dynamic_shared)

    def __repr__(self) -> str:
        return f"<nbjit.Kernel {self.name}{self._s.sig}>"

    # ------------------------------------------------------------ launching
    def _configure_cached(self, config) -> "_Config":
        """``kernel[config]`` where it is not configured yet (the look-up is the base class's)."""
        s = self._s
        launcher = self._configure(config)
        try:
            if len(s.configs) >= _MAX_CONFIGS:
                s.configs.clear()
            s.configs[config] = launcher
        except TypeError:
            pass
        return launcher

    def _configure(self, config) -> "_Config":
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise NbjitLaunchError(f"kernel {self.name!r}: launch as kernel[grid, block], kernel[grid, block, stream] "
                                   f"or kernel[grid, block, stream, shared_bytes], got [{config!r}]")
        stream = config[2] if len(config) > 2 else None
        shared = config[3] if len(config) > 3 else 0
        return self._config(config[0], config[1], stream, shared)

    def _config(self, grid, block, stream, shared, tail: int = 0, count_error=None) -> "_Config":
        """A launch configuration, validated (and the function opted in to its shared memory).
        ``tail``: that many trailing parameters are not passed and stay zero (Triton's NULL
        scratch pointers); ``count_error(got)`` then makes the wrong-count error."""
        return _launcher_type()(self, _dims(grid, "grid", self.name), _dims(block, "block", self.name),
                                stream, self._shared(shared), tail, count_error)

    def _shared(self, nbytes) -> int:
        """Validate dynamic shared memory and opt the function in above the default limit."""
        s = self._s
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise NbjitLaunchError(f"kernel {self.name!r}: dynamic shared memory must be a byte count >= 0, "
                                   f"got {nbytes!r}")
        if nbytes <= s.optin:
            return nbytes
        dev = _driver.device_info(s.device)
        static = self.attributes.shared
        if static + nbytes > dev.max_shared_optin:
            raise NbjitLaunchError(
                f"kernel {self.name!r}: {nbytes} bytes of dynamic shared memory plus {static} static exceed the "
                f"{dev.max_shared_optin} bytes a block can have on this device")
        if static + nbytes > dev.max_shared_default:
            with s.lock:
                if nbytes > s.optin:
                    _driver.set_max_dynamic_shared(s.func, nbytes)
                    s.optin = nbytes
        return nbytes

    def launch(self, grid: int | tuple, block: int | tuple, *args: Any, stream: Any = None, shared_mem: int = 0,
               cooperative: bool = False, cluster: tuple | None = None) -> None:
        """Launch with keywords; ``cooperative=True`` for grid-wide synchronisation,
        ``cluster=(x, y, z)`` for thread-block clusters (by default the kernel's own
        ``.reqnctapercluster`` / ``__cluster_dims__``, which needs nothing at launch)."""
        launcher = self._config(grid, block, stream, shared_mem)
        if not cooperative and cluster is None:
            launcher(*args)
            return
        s = self._s
        if cluster is not None:
            cluster = _dims(cluster, "cluster", self.name)
        launcher.check_cluster(cluster)
        if len(args) != s.packer.n:
            raise s.packer.count_error(len(args))
        buf = s.buffer()
        s.packer.pack_into(buf.data, args)
        if cooperative:
            blocks = launcher.grid[0] * launcher.grid[1] * launcher.grid[2]
            per_sm = self.max_active_blocks_per_sm(launcher.block, launcher.shared)
            most = per_sm * _driver.device_info(s.device).sm_count
            if blocks > most:
                raise NbjitLaunchError(f"kernel {self.name!r}: a cooperative launch of {blocks} blocks exceeds the "
                                       f"{most} that can be resident at once ({per_sm} per SM)")
        err = _driver.launch_ex(s.func, launcher.grid, launcher.block, launcher.shared, launcher.stream,
                                buf.address, cooperative=cooperative, cluster=cluster)
        if err:
            raise launcher.error(err)

    def bind(self, grid: int | tuple, block: int | tuple, *args: Any, stream: Any = None,
             shared_mem: int = 0) -> "BoundLaunch":
        """Pack ``args`` once; the returned object relaunches with them at the lowest cost."""
        return BoundLaunch(self._config(grid, block, stream, shared_mem), args)


class _Config:
    """A kernel with its launch configuration (what ``kernel[grid, block, ...]`` returns);
    calling it launches."""

    def _setup(self, kernel: Kernel, grid, block, stream, shared: int, tail: int, count_error) -> None:
        self.kernel = kernel
        self._s = kernel._s
        self.tail = tail
        self.nargs = kernel._s.n - tail
        self.count_error = count_error or kernel._s.packer.count_error
        self.grid, self.block, self.shared = grid, block, shared
        self._stream_obj = stream  # kept alive while the configuration is cached
        self.stream = stream_handle(stream)
        self._launch, handle = _driver.launcher()
        self._cfg = (handle(kernel._s.func), *grid, *block, shared, handle(self.stream))
        self.check_cluster(None)

    def check_cluster(self, cluster) -> None:
        shape = cluster or self._s.info.directives.cluster
        if shape and any(g % c for g, c in zip(self.grid, shape)):
            raise NbjitLaunchError(f"kernel {self._s.name!r}: grid {self.grid} is not a multiple of its cluster "
                                   f"shape {tuple(shape)}")

    def _pack(self, args: tuple) -> bytes:
        """The precise rules for the whole buffer (what the C path hands over)."""
        if len(args) != self.nargs:
            raise self.count_error(len(args))
        return self._s.packer.pack(args + (0,) * self.tail if self.tail else args)

    def error(self, err) -> NbjitLaunchError:
        return NbjitLaunchError(
            f"launch of kernel {self._s.name!r} failed (grid {self.grid}, block {self.block}, "
            f"{self.shared} bytes dynamic shared memory): {_driver.error_text(err)}")

    def _raise(self, err) -> None:
        raise self.error(err)


class _PyLauncher(_Config):
    """The launch path in Python (no C extension, or several GPUs to check)."""

    path = "python"
    fallbacks = 0

    def __init__(self, kernel: Kernel, grid, block, stream, shared: int, tail: int = 0, count_error=None):
        self._setup(kernel, grid, block, stream, shared, tail, count_error)

    def __call__(self, *args) -> None:
        s = self._s
        if len(args) != self.nargs:
            raise self.count_error(len(args))
        if self.tail:
            args = args + (0,) * self.tail
        if _MULTI[0]:
            other = _on_current_device(self)
            if other is not None:
                return other(*args)
            _check_devices(self, args)
        buf = s.buffer()
        s.packer.pack_into(buf.data, args)
        err = self._launch(*self._cfg, buf.address)
        if err:
            raise self.error(err)


_LAUNCHER_TYPES: list = []


def _launcher_type():
    """The C launcher where nbjit's extension is built and one GPU is visible, else Python."""
    if not _LAUNCHER_TYPES:
        kind = _PyLauncher
        if _driver.launcher()[1] is int:  # the C extension is built and set up
            from . import _launch

            class _CLauncher(_launch.Launcher, _Config):
                """The launch path in C: packs on the C stack with the same rules as the
                Python path, handing anything unusual to the precise Python rules (``fallbacks``
                counts those calls)."""

                path = "c"

                def __init__(self, kernel: Kernel, grid, block, stream, shared: int, tail: int = 0,
                             count_error=None):
                    self._setup(kernel, grid, block, stream, shared, tail, count_error)
                    s = self._s
                    layout = s.layout[:self.nargs] + tuple((off, "Z") for off, *_ in s.layout[self.nargs:])
                    super().__init__(*self._cfg, layout, s.sig.size, _EXTRACTORS, _numbers(),
                                     self._pack if tail else s.packer.pack, self._raise)

            kind = _CLauncher
        _LAUNCHER_TYPES.append(kind)
    return _PyLauncher if _MULTI[0] else _LAUNCHER_TYPES[0]


@functools.lru_cache(maxsize=None)
def _numbers() -> dict:
    """numpy scalar types the C path converts itself, as kind and size: "f4", "i8", "u2"."""
    types = (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
             np.uint32, np.uint64)
    return {t: f"{np.dtype(t).kind}{np.dtype(t).itemsize}" for t in types}


class BoundLaunch:
    """A launch with its arguments packed once (see ``Kernel.bind``); call it to launch.
    Holds the arguments, so the memory they point to stays alive."""

    __slots__ = ("launcher", "args", "_data", "_ptrs", "_address", "_cfg", "_launch")

    def __init__(self, launcher: _Config, args: tuple):
        s = launcher._s
        if len(args) != s.packer.n:
            raise s.packer.count_error(len(args))
        if _MULTI[0]:
            _check_devices(launcher, args)
        self.launcher = launcher
        self.args = args
        buf = _Buffer(s.sig)
        s.packer.pack_into(buf.data, args)
        self._data, self._ptrs, self._address = buf.data, buf.ptrs, buf.address
        self._cfg = launcher._cfg
        self._launch = launcher._launch

    def __call__(self) -> None:
        err = self._launch(*self._cfg, self._address)
        if err:
            raise self.launcher.error(err)

    launch = __call__


def _on_current_device(launcher: _Config):
    """With several GPUs, launching under another device than the kernel's: the same
    kernel of the module's copy in the current context (loaded on first use)."""
    s = launcher._s
    if _driver.current_context_key() == s.ctx_key:
        return None
    twin = launcher.kernel.module.on_current_device()[s.name]
    return twin[launcher.grid, launcher.block, launcher._stream_obj, launcher.shared]


def _check_devices(launcher: _Config, args: tuple) -> None:
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
            raise NbjitArgumentError(f"kernel {s.name!r}, parameter {i}: the array lives on device {dev}, the "
                                     f"kernel on device {s.device}")
