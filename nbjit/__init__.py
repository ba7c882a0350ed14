"""nbjit: run GPU kernels compiled outside Numba (PTX, cubins, fatbins, NVRTC, Triton) from Numba.

Public API
----------
Inspection (pure data, no GPU):
    inspect_ptx(text) -> PtxInfo        header, kernels, parameters, directives, globals,
                                        Triton metadata comments, debug information
    strip_debug(text, keep_lineinfo=False) -> str
                                        remove DWARF / line info so the driver JIT takes the PTX
    inspect_cubin(data) -> CubinInfo    arch, kernels with parameter offsets/sizes, .nv.info
                                        attributes, registers/shared/const/local, globals
    inspect_fatbin(data) -> FatbinInfo  entries (PTX, cubin or LTO-IR, arch, compression);
                                        FatbinInfo.select(arch) picks the one a device uses
    Image, as_image(obj), inspect_image(obj)
                                        device code as bytes + kind, sniffed by content

Loading and launching (needs a GPU):
    load(image, name=None, keep_debug=False, lazy=False) -> Module
                                        into the current Numba context; PTX newer than the
                                        driver is assembled with nvJitLink (or lowered);
                                        lazy=True: on first use (no GPU needed now)
    Module["kernel"], Module.kernel, Module.kernels, Module.get_kernel(name, signature=...),
    Module.get_global(name) -> DeviceGlobal (.ptr, .size, .as_array(dtype, shape))
    Kernel[grid, block, stream, shared](*args), Kernel.launch(...), Kernel.bind(...),
    Kernel.params, Kernel.attributes, Kernel.max_active_blocks_per_sm, suggested_block_size
    nvtx(on=None) -> bool               each launch from Python an NVTX range named for the
                                        kernel, grid and block (Nsight Systems); also NBJIT_NVTX=1

What the compiler made (no GPU):
    KernelInfo.frame / .spills / .barriers
                                        stack frame, spill instructions, barriers (the cubin's own)
    Image.resources, Kernel.attributes.spill_stores / .spill_loads
                                        stack frame and spill bytes as ptxas reported them
                                        (compile with options=["-Xptxas=-v"]; kept in the cache)
    disassemble(cubin, kernel=None, source=False) -> str, Kernel.sass(arch=None)
                                        SASS through nvdisasm (nbjit-core's sass extra)
    nbjit.read.occupancy.occupancy(kernel_info, arch, block, dynamic_shared=0) -> Occupancy
                                        resident blocks per SM by CUDA's occupancy rules

Compiling (NVRTC; no GPU needed with an explicit arch) and the cache:
    compile(source, name=..., name_expressions=(), headers=None, include_paths=(), options=(),
            arch=None, output="auto", lazy=False, pch=None) -> Module
                                        pch: NVRTC precompiled headers for heavy headers
                                        (CUB, Thrust, cuda/std), per process; NBJIT_PCH=0: off
    compile_image(...same...) -> Image (.data, .kind, .arch, .lowered_names, .log)
    compile(source, link=[(py_function, "float32(float32, float32)"), "ops.ltoir", ...])
                                        link-time optimisation: the source compiled to LTO-IR and
                                        linked by nvJitLink with Python device functions (Numba),
                                        LTO-IR, CUDA C++ and relocatable device code; cached
    link_image(source, link, ...) -> Image
                                        the same, loading nothing (no GPU with an arch)
    compile_many([source or {compile's arguments}, ...], workers=None, **common) -> [Module]
                                        independent sources compiled at once (threads; NVRTC
                                        releases the GIL); errors name the source that failed
    Cache(path, remote=None), default_cache(), set_default_cache(cache)
    RemoteTier(url, write=None, timeout=10.0)
                                        a shared tier behind the local cache (s3://, gs://,
                                        az://, file://, https:// read-only; through fsspec)

Processes: Module, Kernel and TritonKernel pickle as data (bytes and facts, no handle) and
load on first use in the process that unpickles them, on its current device.

Numba's own kernels through nbjit's launcher:
    from_numba(dispatcher, signature) -> Kernel
                                        a @cuda.jit kernel compiled by Numba for a signature,
                                        launched with Numba's arguments at nbjit's cost; PTX or
                                        cubins Numba made elsewhere load with load() and are
                                        typed from Numba's mangled names

The Numba beside nbjit (its context, arrays, streams, @cuda.jit): numba-cuda or numba-cuda-mlir,
whichever the user imported (numba-cuda where both are):
    use_host("numba-cuda-mlir")         choose it before nbjit's first use (or NBJIT_HOST=...)

Hopper launch features:
    Kernel.pdl, Kernel.launch(..., pdl=True)
                                        programmatic dependent launch (default for kernels
                                        that run griddepcontrol.wait, and Triton's launch_pdl)
    tensor_map(array, box, swizzle=..., oob_fill=...) -> TensorMap
                                        a TMA descriptor for a const __grid_constant__
                                        CUtensorMap parameter (rules checked before the driver)

Launching from compiled code (no Python, no GIL in the way):
    kernel[grid, block, stream, shared](...) inside @numba.njit (nogil=True too)
                                        any nbjit kernel passed in or closed over; typed by its
                                        signature when the njit function is (TypingError naming
                                        the parameter); one call of nbjit's C entry point
    device_view(array) -> DeviceView    a device array (Numba, CuPy, torch, DLPack) as njit code
                                        takes it; view[i] and view[a:b:c] select rows
    StreamHandle(stream)                a stream as njit code takes it; .synchronize()
    Kernel.c_entry -> CEntry            function addresses and an argument ABI for ctypes,
                                        cffi, a Numba cfunc, C (nbjit.launch.entry documents it)

Kernels as framework operators (PyTorch installed; no GPU needed to register and trace):
    torch.op(kernel, name="ns::op", grid=..., block=..., outputs={...}, inplace=(...),
             reads=(...), fill={...}, backward=None)
                                        nbjit.torch.op: a torch.library custom op read from the
                                        kernel's signature, for torch.compile(fullgraph=True),
                                        CUDA graphs, opcheck and autograd
    jax.call(kernel, *args, grid=..., block=..., outputs={...}, inplace=(...), reads=(...))
                                        nbjit.jax.call: the kernel inside jax.jit, through one
                                        XLA FFI handler in nbjit's C extension

CUDA graphs for Numba users (stream capture of nbjit and @cuda.jit work alike):
    capture(stream) -> Capture          with nbjit.capture(s) as g: ...; g.launch() replays;
                                        with g.update(): ... re-captures new arguments in place
    g.condition(default, reset=True) -> Condition
                                        a value kernels set on the device (CUDA C++:
                                        cudaGraphSetConditional; @cuda.jit: set_condition)
    with g.while_loop(c): / g.if_then(c) / g.if_else(c) as (then, otherwise) / g.switch(c, n) as cases
                                        loops and branches recorded as conditional nodes
    set_condition(handle, value)        the device function @cuda.jit kernels call
    g.nodes[i].set_args(...) / .set_grid(grid, block) / .enable() / .disable()
                                        update one node of the instantiated graph in place
    g.save(path, bindings={"x": x, ...}); load_graph(path, bindings={...}) -> LoadedGraph
                                        a graph as a file (kernels' images, topology, arguments;
                                        arrays as named bindings); .rebind(x=array) swaps one

Tuning (answers kept in the cache, found again by any process on a GPU of the same model):
    tune(target, space, args, key=..., grid=..., block=..., shared=...) -> Tuned
                                        the fastest variant over space ({name: [choices]}) of
                                        Template(source, "k<{BLOCK}, {ITEMS}>"), Defines(source,
                                        "k") (choices as -D macros), a Kernel's launch settings,
                                        or a launch function fn(*args, stream=h, **choices);
                                        variants compiled at once, pruned by what the compiler
                                        made, timed with CUDA events; tuned(*args, stream=s)
    autotune(space, key=...)            a decorator: a launch function tuned per key on first use

Kernel bundles (one file: cubins for several architectures, PTX, a manifest; loads with no
NVRTC and no CUDA headers, also as package data through importlib.resources):
    build_bundle(inputs, dest, archs=..., ptx=..., ...) -> BundleInfo
                                        .cu sources compiled per architecture, PTX, cubins,
                                        fatbins and Triton kernels taken as they are
    load_bundle(bundle, name=None, lazy=False) -> Module
                                        the device's SASS, else compatible SASS, else the PTX
    inspect_bundle(bundle) -> BundleInfo
                                        images, entries (kind, arch, size), kernels

Triton kernels compiled ahead of time (no Triton import at run time):
    load_triton(path) -> TritonKernel   a cache entry dir, its <name>.json, or PTX with
                                        // meta: comments; kernel[grid](*args, stream=...)
    load_triton(bundle, name=None, lazy=False) -> TritonKernel   a bundle's Triton image

Data types: PtxInfo, CubinInfo, FatbinInfo, FatbinEntry, KernelInfo, KernelSignature,
Param, Directives.

Errors: every error nbjit raises on bad input derives from NbjitError
(PtxParseError, ImageFormatError, NbjitCompileError and its CompileFailure (NVRTC's log and
the source lines it points at) and LinkFailure (nvJitLink's log), NbjitLoadError, NbjitHostError,
NbjitLaunchError, NbjitArgumentError, NbjitGraphError, NbjitOpError, NbjitCacheError,
KernelNotFoundError, BundleError); NbjitWarning says what nbjit did on the user's behalf.
"""
import importlib
from typing import TYPE_CHECKING

from nbjit import errors
from nbjit.errors import *  # noqa: F403 (every error is public: errors.__all__ says which)

# The public names load with the module that defines them, on first use (PEP 562): `import
# nbjit` stays cheap (no numpy, no readers) and `nbjit inspect` imports only what it runs.
_HOMES = {
    "bundles.build": ("BundleEntry", "BundleImage", "BundleInfo", "build_bundle", "inspect_bundle", "load_triton"),
    "bundles.archive": ("load_bundle",),
    "cache.store": ("Cache", "default_cache", "set_default_cache"),
    "cache.remote": ("RemoteTier",),
    "loading.compiling": ("compile", "compile_many", "from_numba"),
    "toolchain.nvrtc": ("compile_image",),
    "toolchain.link": ("link_image",),
    "read.cubin": ("CubinInfo", "inspect_cubin"),
    "read.fatbin": ("FatbinEntry", "FatbinInfo", "inspect_fatbin"),
    "read.image": ("Image", "as_image", "inspect_image"),
    "launch.kernel": ("Kernel", "KernelAttributes"),
    "launch.launchers": ("BoundLaunch",),
    "launch.tma": ("TensorMap", "tensor_map"),
    "launch.views": ("DeviceView", "StreamHandle", "device_view"),
    "launch.entry": ("CEntry",),
    "launch.nvtx": ("nvtx",),
    "graphs.capture": ("Capture", "Condition", "capture"),
    "graphs.saved": ("LoadedGraph", "load_graph"),
    "gpu.device_functions": ("set_condition",),
    "loading.module": ("DeviceGlobal", "Module", "load"),
    "read.occupancy": ("Occupancy",),
    "toolchain.sass": ("disassemble",),
    "read.ptx": ("PtxInfo", "inspect_ptx", "strip_debug"),
    "loading.triton": ("TritonKernel", "TritonMeta"),
    "params.signature": ("Directives", "KernelInfo", "KernelSignature", "Param"),
    "gpu.host": ("use_host",),
    "tuning.search": ("Tuned", "autotune", "tune"),
    "tuning.targets": ("Defines", "Template"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

if TYPE_CHECKING:  # what type checkers and the API reference read
    from nbjit.bundles.archive import load_bundle
    from nbjit.bundles.build import BundleEntry, BundleImage, BundleInfo, build_bundle, inspect_bundle, load_triton
    from nbjit.cache.remote import RemoteTier
    from nbjit.cache.store import Cache, default_cache, set_default_cache
    from nbjit.gpu.host import use_host
    from nbjit.gpu.device_functions import set_condition
    from nbjit.graphs.capture import Capture, Condition, capture
    from nbjit.graphs.saved import LoadedGraph, load_graph
    from nbjit.launch.kernel import Kernel, KernelAttributes
    from nbjit.launch.launchers import BoundLaunch
    from nbjit.launch.entry import CEntry
    from nbjit.launch.nvtx import nvtx
    from nbjit.launch.tma import TensorMap, tensor_map
    from nbjit.launch.views import DeviceView, StreamHandle, device_view
    from nbjit.loading.compiling import compile, compile_many, from_numba
    from nbjit.loading.module import DeviceGlobal, Module, load
    from nbjit.loading.triton import TritonKernel, TritonMeta
    from nbjit.params.signature import Directives, KernelInfo, KernelSignature, Param
    from nbjit.read.cubin import CubinInfo, inspect_cubin
    from nbjit.read.fatbin import FatbinEntry, FatbinInfo, inspect_fatbin
    from nbjit.read.image import Image, as_image, inspect_image
    from nbjit.read.occupancy import Occupancy
    from nbjit.read.ptx import PtxInfo, inspect_ptx, strip_debug
    from nbjit.toolchain.link import link_image
    from nbjit.toolchain.nvrtc import compile_image
    from nbjit.toolchain.sass import disassemble
    from nbjit.tuning.search import Tuned, autotune, tune
    from nbjit.tuning.targets import Defines, Template


# the framework bridges, as modules: nbjit.torch.op(...), nbjit.jax.call(...); what each needs
_MODULES = {"torch": "frameworks.torch", "jax": "frameworks.jax"}
_FRAMEWORKS = {"torch": "PyTorch (pip install torch)", "jax": "JAX (pip install 'jax[cuda13]')"}


def __getattr__(name: str):
    if name in _MODULES:
        try:
            module = importlib.import_module(f".{_MODULES[name]}", __name__)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            raise errors.NbjitError(f"nbjit.{name} needs {_FRAMEWORKS[name]}, which this environment lacks "
                                    f"({e})") from None
        globals()[name] = module
        return module
    home = _HOME_OF.get(name)
    if home is None:
        raise AttributeError(f"module 'nbjit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted((set(globals()) - _NOT_API) | set(_HOME_OF) | set(_MODULES))


_NOT_API = {"importlib", "TYPE_CHECKING"}  # (this module's own imports: dir(nbjit) showed them)


__version__ = "0.1.0"

# the names above (their homes), then every error
__all__ = [
    "load",
    "load_triton",
    "load_bundle",
    "build_bundle",
    "inspect_bundle",
    "BundleInfo",
    "BundleImage",
    "BundleEntry",
    "from_numba",
    "use_host",
    "capture",
    "Capture",
    "Condition",
    "set_condition",
    "load_graph",
    "LoadedGraph",
    "TritonKernel",
    "TritonMeta",
    "compile",
    "compile_many",
    "compile_image",
    "link_image",
    "disassemble",
    "tune",
    "autotune",
    "Tuned",
    "Template",
    "Defines",
    "Occupancy",
    "Cache",
    "RemoteTier",
    "default_cache",
    "set_default_cache",
    "Module",
    "Kernel",
    "KernelAttributes",
    "BoundLaunch",
    "tensor_map",
    "TensorMap",
    "device_view",
    "DeviceView",
    "StreamHandle",
    "CEntry",
    "nvtx",
    "DeviceGlobal",
    "inspect_ptx",
    "strip_debug",
    "inspect_cubin",
    "inspect_fatbin",
    "inspect_image",
    "as_image",
    "Image",
    "PtxInfo",
    "CubinInfo",
    "FatbinInfo",
    "FatbinEntry",
    "KernelInfo",
    "KernelSignature",
    "Param",
    "Directives",
]
__all__ += errors.__all__
