"""Kernel: a loaded function plus its signature; ``kernel[grid, block, stream, shared](*args)``.

The launch hot path: one cached dictionary look-up for the launch configuration (in C where
nbjit's extension is built), the argument converters that are needed (pointers), the
parameters packed into a buffer, and ``cuLaunchKernel`` (the launchers: ``launchers.py``).
Beside the kernel: its attributes as the driver reports them (``KernelAttributes``), its
occupancy, programmatic dependent launch, its SASS, and tensor maps over device arrays.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from nbjit.errors import NbjitLaunchError
from nbjit.gpu import driver as _driver
from nbjit.gpu import extension
from nbjit.gpu.host import current_host
from nbjit.launch.arguments import ArgPacker
from nbjit.launch.config import LaunchConfig
from nbjit.launch import nvtx
from nbjit.launch.launchers import BoundLaunch, adopt_context, launcher_type, several_gpus
from nbjit.params.signature import KernelInfo, KernelSignature, Param
from nbjit.records import record

if TYPE_CHECKING:
    from nbjit.arch import Arch
    from nbjit.launch.entry import CEntry
    from nbjit.launch.launchers import _Launcher

__all__ = ["Kernel", "KernelAttributes", "kernel_of_function", "remember_function"]


_MAX_CONFIGS = 256


class Launchers(dict):
    """Configured launchers by key: ``kernel[...]``'s (the config), ``kernel.launch()``'s (its
    keywords), and groups of them kept elsewhere (a Triton grid's, by stream). At most
    ``_MAX_CONFIGS`` each; all dropped together when there are more, or when ``kernel.pdl``
    changes (a group with the cache it came from). A dict, so that ``kernel[config]`` is one
    look-up (in C where nbjit's extension is built)."""

    __slots__ = ("_parent", "_token", "__weakref__")

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
        for v in list(self.values()):  # (a copy: another thread may keep one meanwhile)
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
        self.layout = self.packer.c_layout
        # the kernel's own parameters where they are not the arguments (Numba kernels)
        self.param_offsets = info.launch_offsets
        self.ctx_key = ctx_key
        self.device = device
        self.recipe = (name, None, ())  # what makes it again elsewhere: (name, signature, extra layouts)
        self.tls = threading.local()
        self.launchers = Launchers()
        nvtx.watch(self.launchers)  # (emptied when NVTX ranges are switched on or off)
        # programmatic dependent launch by default: where the kernel waits for the grid before it
        self.pdl = info.waits_for_grid
        self.pdl_chosen = False  # set by kernel.pdl = ...: a producer's default no longer applies
        self.optin = 0  # dynamic shared bytes this function has been opted in to
        self.attrs: KernelAttributes | None = None
        self.pointer_params = tuple(i for i, p in enumerate(info.params) if p.pointer or p.size == 8)
        self.lock = threading.Lock()
        self.entries: dict = {}  # (tail, pdl) -> the kernel's C entry (launch/entry.py), kept while it lives
        several_gpus()  # (asked once, by the first kernel made: the launchers read it)


# CUfunction address -> (the module's weak reference, recipe, state) of every kernel made live
# in this process: what a graph's kernel node runs, found again (graphs/nodes.py)
_BY_FUNCTION: dict[int, tuple] = {}


def remember_function(module, recipe: tuple, state: _State, replace: bool = True) -> None:
    """Note which kernel ``state.func`` is (forgotten when its module goes); ``replace=False``:
    unless it is noted already (a kernel typed by a signature of its own is the same function)."""
    key = _driver.as_int(state.func)
    if not replace and key in _BY_FUNCTION and _BY_FUNCTION[key][0]() is not None:
        return

    def forget(ref, key=key):
        if _BY_FUNCTION.get(key, (None,))[0] is ref:
            del _BY_FUNCTION[key]

    _BY_FUNCTION[key] = (weakref.ref(module, forget), recipe, state)


def kernel_of_function(func: int) -> "Kernel | None":
    """The nbjit kernel whose CUfunction is ``func``, where one was made live in this process."""
    hit = _BY_FUNCTION.get(func)
    module = hit[0]() if hit is not None else None
    return None if module is None else Kernel(module, hit[1], hit[2])


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


_EXTENSION = extension.extension()  # nbjit's C extension where it is used (decided there), or None


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
        set_pdl(self._loaded(), value, chosen=True)

    def default_pdl(self, value: bool) -> None:
        """Set ``pdl`` as a producer's default (Triton's ``launch_pdl``): a value the user set
        stays. Launchers configured before follow the new default."""
        set_pdl(self._loaded(), bool(value), chosen=False)

    def _pdl(self, requested: bool | None) -> bool:
        """Whether a launch is a programmatic dependent one: ``requested`` (the caller's
        word), else the kernel's ``pdl``. Asked explicitly where the device cannot, an error;
        by default there, a plain launch."""
        s = self._loaded()
        want = requested if requested is not None else s.pdl
        if not want:
            return False
        cc = _driver.device_info(s.device).cc
        if cc >= (9, 0):
            return True
        if requested:
            raise NbjitLaunchError(f"kernel {s.label!r}: programmatic dependent launch (pdl=True) needs a device "
                                   f"of compute capability 9.0 or newer; device {s.device} is {cc[0]}.{cc[1]}")
        return False

    @property
    def c_entry(self) -> "CEntry":
        """The kernel's C entry point: function addresses and an argument ABI for launching
        from compiled code without Python (ctypes, cffi, a Numba ``cfunc``, C; ``@njit`` code
        uses it too). See ``nbjit.launch.entry`` and docs/launching.md."""
        from nbjit.launch.entry import kernel_entry  # (a cold concern: compiled callers only)
        return kernel_entry(self)

    @property
    def attributes(self) -> KernelAttributes:
        """What the driver says about the loaded function (read once)."""
        return kernel_attributes(self)

    def sass(self, arch: "Arch | str | None" = None) -> str:
        """The kernel's SASS as ``nvdisasm`` prints it (nbjit-core's ``sass`` extra): of the
        module's cubin, or of the cubin its PTX or fatbin gives for ``arch`` (default: the
        current device's). Needs no GPU for a cubin or with ``arch`` given."""
        return sass(self, arch)

    def max_active_blocks_per_sm(self, block: int | tuple, dynamic_shared: int = 0) -> int:
        """How many blocks of this size can be resident on one SM at once."""
        s = self._loaded()
        threads = LaunchConfig.make(1, block, kernel=s.label).threads
        return blocks_per_sm(s, threads, dynamic_shared)

    def suggested_block_size(self, dynamic_shared: int = 0) -> tuple[int, int]:
        """(minimum grid size for full occupancy, block size) from the occupancy calculator."""
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
            most = per_sm * _driver.device_info(s.device).sm_count
            if config.blocks > most:
                raise NbjitLaunchError(f"kernel {s.label!r}: a cooperative launch of {config.blocks} blocks exceeds "
                                       f"the {most} that can be resident at once ({per_sm} per SM)")
        return launcher_type(config)(self, config, tail, count_error)

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
        cfg = LaunchConfig.make(*config, kernel=s.label)
        launcher = nvtx.ranged(self.configure(cfg), s.label, cfg)
        s.launchers.keep(config, launcher)
        return launcher

    def _shared(self, nbytes: int) -> int:
        """Opt the function in to ``nbytes`` of dynamic shared memory above the default limit."""
        s = self._loaded()
        if nbytes <= s.optin:
            return nbytes
        dev = _driver.device_info(s.device)
        static = self.attributes.shared
        if static + nbytes > dev.max_shared_optin:
            raise NbjitLaunchError(
                f"kernel {s.label!r}: {nbytes} bytes of dynamic shared memory plus {static} static exceed the "
                f"{dev.max_shared_optin} bytes a block can have on this device")
        if static + nbytes > dev.max_shared_default:
            with s.lock:
                if nbytes > s.optin:
                    _driver.set_max_dynamic_shared(s.func, nbytes)
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
            cfg = LaunchConfig.make(grid, block, stream, shared_mem, cluster, cooperative, pdl, kernel=s.label)
            launcher = nvtx.ranged(self.configure(cfg), s.label, cfg)
            s.launchers.keep(key, launcher)
        launcher(*args)

    def bind(self, grid: int | tuple, block: int | tuple, *args: Any, stream: Any = None,
             shared_mem: int = 0) -> "BoundLaunch":
        """Pack ``args`` once; the returned object relaunches with them at the lowest cost
        (with NVTX ranges on, ``nbjit.nvtx``, within a range: a ``BoundLaunch`` in a
        ``RangedLauncher``)."""
        label = self._loaded().label
        cfg = LaunchConfig.make(grid, block, stream, shared_mem, kernel=label)
        return nvtx.ranged(BoundLaunch(self.configure(cfg), args), label, cfg)


_LAUNCH = object()  # marks kernel.launch(...)'s configurations among kernel[...]'s


@record
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
    # from the cubin's own records (None where the code came as PTX, which the driver compiled):
    frame: int | None = None  # the kernel's stack frame, bytes (spills and local arrays live there)
    spills: int | None = None  # instructions that spill or refill registers
    # as ptxas reported them compiling it (nbjit.compile with -Xptxas=-v; None where not known):
    spill_stores: int | None = None  # bytes stored by spills
    spill_loads: int | None = None  # bytes loaded by refills




def kernel_attributes(kernel) -> KernelAttributes:
    """``Kernel.attributes``."""
    s = kernel._loaded()
    attrs = s.attrs
    if attrs is None:  # (the driver's, read once per loaded function: modules of the same bytes share it)
        attrs = s.attrs = KernelAttributes(**_driver.function_attributes(s.func), frame=s.info.frame,
                                           spills=s.info.spills)
    mod = kernel.module  # what ptxas said while compiling it, where nbjit compiled this module's image
    told = mod.image.resources.get(s.name) if mod is not None else None
    if told:
        return replace(attrs, spill_stores=told.get("spill_stores"), spill_loads=told.get("spill_loads"))
    return attrs


def set_pdl(s, value: bool, chosen: bool) -> None:
    """``kernel.pdl = value`` (``chosen``: the user's word) or a producer's default
    (``Kernel.default_pdl``), for the kernel's state ``s``."""
    if chosen and not isinstance(value, bool):
        raise NbjitLaunchError(f"kernel {s.label!r}: pdl must be True or False, got {value!r}")
    with s.lock:
        if chosen:
            s.pdl_chosen = True
        elif s.pdl_chosen or s.pdl == value:
            return
        s.pdl = value
        s.launchers.clear()  # launchers configured before (Triton's included) follow the new default


def blocks_per_sm(s, threads: int, dynamic_shared: int) -> int:
    """``Kernel.max_active_blocks_per_sm`` for blocks of ``threads``."""
    adopt_context(s)  # (the occupancy queries need a current context)
    return _driver.max_active_blocks(s.func, threads, dynamic_shared)


def block_size(s, dynamic_shared: int) -> tuple[int, int]:
    """``Kernel.suggested_block_size``."""
    adopt_context(s)
    return _driver.potential_block_size(s.func, dynamic_shared)


def sass(kernel, arch) -> str:
    """``Kernel.sass``: the kernel's SASS through nvdisasm."""
    from nbjit.toolchain.sass import cubin_for, disassemble
    img = kernel.module.image
    if img.kind != "cubin" and arch is None:
        arch = current_host().device_arch()
    return disassemble(cubin_for(img, arch), kernel=kernel.name, name=img.name)


