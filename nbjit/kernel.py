"""Kernel: a loaded function plus its signature; ``kernel[grid, block, stream, shared](*args)``.

The launch hot path: one cached dictionary look-up for the launch configuration, the
argument converters that are needed (pointers), one ``struct.pack_into`` into this
thread's parameter buffer, and ``cuLaunchKernel``. The Python launchers (no C extension, or
several GPUs) and ``BoundLaunch`` are ``_pylaunch``'s; what a kernel does off a package's first
launch is ``_kernel_extra``'s (each imported where it is first used).
"""
from __future__ import annotations

import functools
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from nbjit import _driver, _native
from nbjit._driver import stream_handle
from nbjit._defs import record
from nbjit.args import _EXTRACTORS, ArgPacker
from nbjit.errors import NbjitLaunchError
from nbjit.signature import KernelInfo, KernelSignature, Param

if TYPE_CHECKING:
    from nbjit._kernel_extra import KernelAttributes, tensor_map
    from nbjit._pylaunch import BoundLaunch
    from nbjit.arch import Arch

__all__ = ["Kernel", "KernelAttributes", "LaunchConfig", "BoundLaunch", "tensor_map"]


# public names made on first use, by the module that makes them
_LAZY = {"KernelAttributes": "_kernel_extra", "tensor_map": "_kernel_extra", "BoundLaunch": "_pylaunch"}


def __getattr__(name: str):
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f".{home}", __package__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


_MAX_CONFIGS = 256
# Several GPUs visible? Decided when the first kernel is made; with one GPU the launch
# path skips every device check.
_MULTI: list = [None]


class Launchers(dict):
    """Configured launchers by key: ``kernel[...]``'s (the config), ``kernel.launch()``'s (its
    keywords), and groups of them kept elsewhere (a Triton grid's, by stream). At most
    ``_MAX_CONFIGS`` each; all dropped together when there are more, or when ``kernel.pdl``
    changes (a group with the cache it came from). A dict, so that ``kernel[config]`` is one
    look-up (in C where nbjit's extension is built)."""

    __slots__ = ("_parent", "_token")

    def __init__(self, parent: "Launchers | None" = None):
        super().__init__()
        self._parent = parent
        self._token = object() if parent is not None else None

    def keep(self, key: Any, launcher: Any) -> None:
        """Keep ``launcher`` under ``key``; an unhashable key keeps nothing."""
        try:
            if len(self) >= _MAX_CONFIGS:
                self.clear()
            self[key] = launcher
        except TypeError:
            return
        parent = self._parent
        if parent is not None and parent.get(self._token) is not self:  # (dropped with it before)
            parent.keep(self._token, self)

    def group(self) -> "Launchers":
        """A cache for launchers of the same kernel configured elsewhere, emptied with this one."""
        return Launchers(self)

    def clear(self) -> None:
        """Drop every launcher, those of the groups made from this cache included."""
        for v in self.values():
            if type(v) is Launchers:
                v.clear()
        super().clear()


class _State:
    """Per (module, kernel name): the function handle and everything derived from the
    signature (a kernel's live part, made on its first use). Holds no reference back to the
    module (no cycles: unloading stays prompt)."""

    def __init__(self, name: str, func, info: KernelInfo, ctx_key: int, device: int, label: str | None = None):
        self.name = name
        self.label = label or name  # what messages call it (a @cuda.jit kernel's Python name)
        self.func = func
        self.info = info
        self.sig = info.signature
        self.packer = ArgPacker(info.signature, self.label)
        self.n = self.packer.n
        self.layout = tuple((p.offset, *r.code) for p, r in zip(info.params, self.packer.rules))
        # the kernel's own parameters where they are not the arguments (Numba kernels)
        self.param_offsets = info.launch_offsets
        self.ctx_key = ctx_key
        self.device = device
        self.recipe = (name, None, ())  # what makes it again elsewhere: (name, signature, extra layouts)
        self.tls = threading.local()
        self.launchers = Launchers()
        # programmatic dependent launch by default: where the kernel waits for the grid before it
        self.pdl = info.waits_for_grid
        self.pdl_chosen = False  # set by kernel.pdl = ...: a producer's default no longer applies
        self.optin = 0  # dynamic shared bytes this function has been opted in to
        self.attrs: KernelAttributes | None = None
        self.pointer_params = tuple(i for i, p in enumerate(info.params) if p.pointer or p.size == 8)
        self.lock = threading.Lock()
        if _MULTI[0] is None:
            _MULTI[0] = _driver.multi_gpu()


@record
class LaunchConfig:
    """How to launch: grid and block (3 ints each), stream, dynamic shared memory bytes,
    cluster shape, whether the launch is cooperative and whether it is a programmatic
    dependent launch (``pdl``: it may start before the grid before it on the stream ends;
    None: as the kernel's ``pdl`` says). ``LaunchConfig.make`` is the one validator, and
    ``Kernel.configure`` the one way from a configuration to a launcher, for every launch
    form (``kernel[...]``, ``launch``, ``bind``, Triton's grids)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    stream: Any = None
    shared: int = 0
    cluster: tuple[int, int, int] | None = None
    cooperative: bool = False
    pdl: bool | None = None

    @classmethod
    def make(cls, grid: Any, block: Any, stream: Any = None, shared: Any = 0, cluster: Any = None,
             cooperative: Any = False, pdl: Any = None, *, kernel: str = "<kernel>") -> "LaunchConfig":
        """A validated configuration; ``NbjitLaunchError`` names the kernel and the value."""
        if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
            raise NbjitLaunchError(f"kernel {kernel!r}: dynamic shared memory must be a byte count >= 0, "
                                   f"got {shared!r}")
        if not isinstance(cooperative, bool):
            raise NbjitLaunchError(f"kernel {kernel!r}: cooperative must be True or False, got {cooperative!r}")
        if pdl is not None and not isinstance(pdl, bool):
            raise NbjitLaunchError(f"kernel {kernel!r}: pdl must be True, False or None (the kernel's), got {pdl!r}")
        return cls(_dims(grid, "grid", kernel), _dims(block, "block", kernel), stream, shared,
                   None if cluster is None else _dims(cluster, "cluster", kernel), cooperative, pdl)

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def extended(self) -> bool:
        """Whether the launch needs cuLaunchKernelEx (launch attributes; ``pdl`` as configured)."""
        return self.cooperative or self.pdl or self.cluster is not None


def _dims(v, what: str, kernel: str) -> tuple[int, int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        t = (v,)
    elif isinstance(v, (tuple, list)) and 1 <= len(v) <= 3:
        t = tuple(v)
    else:
        raise NbjitLaunchError(f"kernel {kernel!r}: {what} must be an int or a tuple of 1 to 3 ints, got {v!r}")
    if any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) for x in t):
        raise NbjitLaunchError(f"kernel {kernel!r}: {what} must hold ints, got {v!r}")
    t = tuple(int(x) for x in t)
    if any(x < 1 or x >= 1 << 32 for x in t):
        raise NbjitLaunchError(f"kernel {kernel!r}: {what} values must be from 1 to 2**32 - 1 (got {v!r})")
    return (t + (1, 1))[:3]  # type: ignore[return-value]


class _PyIndexing:
    """``kernel[config]`` in Python (where nbjit's C extension is not built)."""

    __slots__ = ("_configs",)

    def __getitem__(self, config):
        try:
            hit = self._configs[config]
        except (KeyError, TypeError):  # TypeError: an unhashable config (lists)
            return self._configure_cached(config)
        return self._configure_cached(config) if _inexact(config) else hit


_NOT_INTS = (float, bool, complex)


def _inexact(config) -> bool:
    """Whether a config holds a float, bool or complex (equal to an int, 4.0 == 4, so it finds
    that int's cached configuration, where configuring it afresh refuses it). On every
    launch: plain ints cost one type test each."""
    for v in config if type(config) is tuple else (config,):
        if type(v) is int:
            continue
        if type(v) is tuple:
            for x in v:
                if type(x) is not int and isinstance(x, _NOT_INTS):
                    return True
        elif isinstance(v, _NOT_INTS):
            return True
    return False


_EXTENSION = _native.extension()  # nbjit's C extension where it is used (decided there), or None

class Kernel(_EXTENSION.KernelBase if _EXTENSION is not None else _PyIndexing):  # type: ignore[misc]
    """A kernel of a loaded module.

    Launch it as Numba does: ``kernel[grid, block](*args)``, ``kernel[grid, block,
    stream](*args)``, ``kernel[grid, block, stream, dynamic_shared_bytes](*args)``; or with
    ``kernel.launch(...)`` for cooperative launches and clusters; or ``kernel.bind(...)``
    to pack the arguments once and relaunch; or ``kernel.configure(LaunchConfig)`` for a
    launcher of any configuration.

    A kernel is its recipe (its module, name, declared signature) and a live part made on
    first use (``_s``: the function, its launchers). It pickles as the recipe; unpickled, or
    of a module loaded lazily, it loads on first use into the context current then, and
    describes itself (``name``, ``params``, ``info``) from the image before that.
    """

    __slots__ = ("module", "_s", "_recipe", "__weakref__")

    def __init__(self, module, recipe: tuple, state: _State | None = None):
        self.module = module  # keeps the module (and so the function) loaded
        self._recipe = recipe  # (name, signature, extra layouts): what makes it again elsewhere
        self._s = state  # None until first use
        self._configs = state.launchers if state is not None else {}

    def _loaded(self) -> _State:
        """The kernel's live state: made on first use (its module loaded into the current
        context then, if it was waiting for that)."""
        s = self._s
        if s is None:
            s = self.module._state(self._recipe)
            self._configs = s.launchers
            self._s = s
        return s

    def __reduce__(self):
        return (Kernel, (self.module, self._recipe))

    # ------------------------------------------------------------ description
    @property
    def name(self) -> str:
        """The kernel's (mangled) name."""
        return self._recipe[0]

    @property
    def info(self) -> KernelInfo:
        """The kernel's merged description: signature, directives, resources (a kernel whose
        module waits for first use describes itself from the image, loading nothing)."""
        s = self._s
        return self.module._offline_info(self._recipe) if s is None else s.info

    @property
    def params(self) -> tuple[Param, ...]:
        """The parameters, with C types where a source gives them."""
        return self.info.params

    @property
    def signature(self) -> KernelSignature:
        """The parameter list and the size of the parameter buffer."""
        return self.info.signature

    @property
    def handle(self):
        """The CUfunction."""
        return self._loaded().func

    @property
    def shared_optin(self) -> int:
        """Bytes of dynamic shared memory this kernel has been opted in to above the default
        48 KiB limit (0: it never needed to be)."""
        return self._loaded().optin

    @property
    def pdl(self) -> bool:
        """Whether ``kernel[grid, block, ...]`` launches it as a programmatic dependent launch
        (it may start while the kernel before it on the stream still runs, and must wait for
        it with ``griddepcontrol.wait``). True by default for kernels whose PTX runs
        ``griddepcontrol.wait``; settable. Devices before sm_90 launch plainly."""
        return self._loaded().pdl

    @pdl.setter
    def pdl(self, value: bool) -> None:
        from nbjit._kernel_extra import set_pdl
        set_pdl(self._loaded(), value, chosen=True)

    def default_pdl(self, value: bool) -> None:
        """Set ``pdl`` as a producer's default (Triton's ``launch_pdl``): a value the user set
        stays. Launchers configured before follow the new default."""
        from nbjit._kernel_extra import set_pdl
        set_pdl(self._loaded(), bool(value), chosen=False)

    def _pdl(self, requested: bool | None) -> bool:
        """Whether a launch is a programmatic dependent one: ``requested`` (the caller's
        word), else the kernel's ``pdl``. Asked explicitly where the device cannot, an error;
        by default there, a plain launch."""
        s = self._loaded()
        want = requested if requested is not None else s.pdl
        if not want:
            return False
        from nbjit._driver_extra import device_info
        cc = device_info(s.device).cc
        if cc >= (9, 0):
            return True
        if requested:
            raise NbjitLaunchError(f"kernel {s.label!r}: programmatic dependent launch (pdl=True) needs a device "
                                   f"of compute capability 9.0 or newer; device {s.device} is {cc[0]}.{cc[1]}")
        return False

    @property
    def attributes(self) -> KernelAttributes:
        """What the driver says about the loaded function (read once)."""
        from nbjit._kernel_extra import kernel_attributes
        return kernel_attributes(self)

    def sass(self, arch: "Arch | str | None" = None) -> str:
        """The kernel's SASS as ``nvdisasm`` prints it (nbjit-core's ``sass`` extra): of the
        module's cubin, or of the cubin its PTX or fatbin gives for ``arch`` (default: the
        current device's). Needs no GPU for a cubin or with ``arch`` given."""
        from nbjit._kernel_extra import sass
        return sass(self, arch)

    def max_active_blocks_per_sm(self, block: int | tuple, dynamic_shared: int = 0) -> int:
        """How many blocks of this size can be resident on one SM at once."""
        s = self._loaded()
        threads = LaunchConfig.make(1, block, kernel=s.label).threads
        from nbjit._kernel_extra import blocks_per_sm
        return blocks_per_sm(s, threads, dynamic_shared)

    def suggested_block_size(self, dynamic_shared: int = 0) -> tuple[int, int]:
        """(minimum grid size for full occupancy, block size) from the occupancy calculator."""
        from nbjit._kernel_extra import block_size
        return block_size(self._loaded(), dynamic_shared)

    def __repr__(self) -> str:
        s = self._s
        if s is None:
            return f"<nbjit.Kernel {self._recipe[0]}: loads on first use>"
        return f"<nbjit.Kernel {s.label}{s.sig}>"

    # ------------------------------------------------------------ launching
    def configure(self, config: LaunchConfig, *, tail: int = 0,
                  count_error: Callable[[int], Exception] | None = None) -> "_Launcher":
        """The launcher for ``config`` (call it with the kernel's arguments): the one way
        every launch form gets one. ``config.pdl`` None is the kernel's ``pdl``. Opts the
        function in to the dynamic shared memory asked for, and checks the grid against
        the cluster shape and a cooperative grid against what can be resident at once.
        ``tail``: that many trailing parameters are not passed and stay zero (Triton's NULL
        scratch pointers); ``count_error(got)`` then makes the wrong-count error.

        Raises
        ------
        NbjitLaunchError: naming the kernel and what the configuration asks beyond it.
        """
        s = self._loaded()
        pdl = self._pdl(config.pdl)
        if pdl is not config.pdl:
            config = replace(config, pdl=pdl)
        self._shared(config.shared)
        shape = config.cluster or s.info.directives.cluster
        if shape and any(g % c for g, c in zip(config.grid, shape)):
            raise NbjitLaunchError(f"kernel {s.label!r}: grid {config.grid} is not a multiple of its cluster "
                                   f"shape {tuple(shape)}")
        if config.cooperative:
            per_sm = self.max_active_blocks_per_sm(config.block, config.shared)
            from nbjit._driver_extra import device_info
            most = per_sm * device_info(s.device).sm_count
            if config.blocks > most:
                raise NbjitLaunchError(f"kernel {s.label!r}: a cooperative launch of {config.blocks} blocks exceeds "
                                       f"the {most} that can be resident at once ({per_sm} per SM)")
        return _launcher_type(config)(self, config, tail, count_error)

    def launcher_group(self) -> Launchers:
        """A cache for launchers of this kernel configured elsewhere (a Triton grid's, by
        stream): emptied whenever the kernel's own are (``pdl`` changes)."""
        return self._loaded().launchers.group()

    def _configure_cached(self, config) -> "_Launcher":
        """``kernel[config]`` where it is not configured yet (the look-up is the base class's)."""
        s = self._loaded()
        if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
            raise NbjitLaunchError(f"kernel {s.label!r}: launch as kernel[grid, block], kernel[grid, block, "
                                   f"stream] or kernel[grid, block, stream, shared_bytes], got [{config!r}]")
        launcher = self.configure(LaunchConfig.make(*config, kernel=s.label))
        s.launchers.keep(config, launcher)
        return launcher

    def _shared(self, nbytes: int) -> int:
        """Opt the function in to ``nbytes`` of dynamic shared memory above the default limit."""
        s = self._loaded()
        if nbytes <= s.optin:
            return nbytes
        from nbjit._driver_extra import device_info, set_max_dynamic_shared
        dev = device_info(s.device)
        static = self.attributes.shared
        if static + nbytes > dev.max_shared_optin:
            raise NbjitLaunchError(
                f"kernel {s.label!r}: {nbytes} bytes of dynamic shared memory plus {static} static exceed the "
                f"{dev.max_shared_optin} bytes a block can have on this device")
        if static + nbytes > dev.max_shared_default:
            with s.lock:
                if nbytes > s.optin:
                    set_max_dynamic_shared(s.func, nbytes)
                    s.optin = nbytes
        return nbytes

    def launch(self, grid: int | tuple, block: int | tuple, *args: Any, stream: Any = None, shared_mem: int = 0,
               cooperative: bool = False, cluster: tuple | None = None, pdl: bool | None = None) -> None:
        """Launch with keywords; ``cooperative=True`` for grid-wide synchronisation,
        ``cluster=(x, y, z)`` for thread-block clusters (by default the kernel's own
        ``.reqnctapercluster`` / ``__cluster_dims__``, which needs nothing at launch),
        ``pdl=True`` / ``False`` for a programmatic dependent launch or not (default: the
        kernel's ``pdl``)."""
        s = self._s
        if s is None:
            s = self._loaded()
        key = (_LAUNCH, grid, block, stream, shared_mem, cooperative, cluster, pdl)
        try:
            launcher = s.launchers.get(key)
        except TypeError:  # a list for a grid, say: configured anew each time
            launcher = None
        if launcher is None or type(cooperative) is not bool or (pdl is not None and type(pdl) is not bool) or \
                _inexact((grid, block, shared_mem, cluster)):
            # (a launcher for equal values of other types, 4.0 == 4, is not for these: they are checked)
            launcher = self.configure(LaunchConfig.make(grid, block, stream, shared_mem, cluster, cooperative, pdl,
                                                        kernel=s.label))
            s.launchers.keep(key, launcher)
        launcher(*args)

    def bind(self, grid: int | tuple, block: int | tuple, *args: Any, stream: Any = None,
             shared_mem: int = 0) -> "BoundLaunch":
        """Pack ``args`` once; the returned object relaunches with them at the lowest cost."""
        label = self._loaded().label
        from nbjit._pylaunch import BoundLaunch
        return BoundLaunch(self.configure(LaunchConfig.make(grid, block, stream, shared_mem, kernel=label)), args)


_LAUNCH = object()  # marks kernel.launch(...)'s configurations among kernel[...]'s


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
        this thread: ``_kernel_extra.may_relaunch``), else the error raised."""
        from nbjit._kernel_extra import may_relaunch
        if may_relaunch(self._s, err):
            return True
        raise self.error(err)

    def error(self, err) -> NbjitLaunchError:
        """The error a launch that failed with ``err`` raises (``_kernel_extra.launch_error``)."""
        from nbjit._kernel_extra import launch_error
        return launch_error(self, err)


@record
class LauncherSpec:
    """What nbjit's C ``Launcher`` is made from (``_launch.c`` reads these by name)."""

    func: int  # the CUfunction's address
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int  # dynamic shared memory, bytes
    stream: int  # the CUstream's address
    layout: tuple  # per parameter (offset, code, ...): see _launch.c
    size: int  # the parameter buffer's size
    extractors: dict  # type -> how to find a device array's address
    numbers: dict  # numpy scalar type -> kind and size ("f4")
    fallback: Callable[[tuple], bytes]  # the precise rules: the whole buffer, or an error
    on_error: Callable[[int], bool]  # a failed launch: True to launch again once, else raises
    param_offsets: tuple[int, ...] | None = None  # where the kernel's parameters are not the arguments
    attributes: bytes = b""  # cuLaunchKernelEx's attributes (72 bytes each); none: cuLaunchKernel


if _EXTENSION is not None:  # (else the Python launcher serves)
    class _CLauncher(_EXTENSION.Launcher, _Launcher):
        """The launch path in C: packs on the C stack with the same rules as the Python path,
        handing anything unusual to the precise Python rules (``fallbacks`` counts those
        calls)."""

        path = "c"

        def __init__(self, kernel: Kernel, cfg: LaunchConfig, tail: int = 0, count_error=None):
            self._setup(kernel, cfg, tail, count_error)
            s = self._s
            layout = s.layout[:self.nargs] + tuple((off, "Z") for off, *_ in s.layout[self.nargs:])
            if cfg.extended:
                from nbjit._driver_extra import launch_attributes
                self._attrs = launch_attributes(cooperative=cfg.cooperative, cluster=cfg.cluster, pdl=cfg.pdl)
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


def _launcher_type(config: LaunchConfig) -> type:
    """The C launcher where nbjit's extension is built and set up and one GPU is visible (for
    a launch with attributes, where it has cuLaunchKernelEx), else a Python one (_pylaunch)."""
    if not _MULTI[0] and _CLauncher is not None:
        backend = _driver.backend()
        if backend.name == "c" and (backend.extended or not config.extended):
            return _CLauncher
    from nbjit._pylaunch import launcher_types
    plain, extended = launcher_types(_Launcher)
    return extended if config.extended else plain


@functools.lru_cache(maxsize=None)
def _numbers() -> dict:
    """numpy scalar types the C path converts itself, as kind and size: "f4", "i8", "u2"."""
    types = (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
             np.uint32, np.uint64)
    return {t: f"{np.dtype(t).kind}{np.dtype(t).itemsize}" for t in types}
