"""Compiling on request: what ``nbjit.compile``, ``nbjit.compile_many``, ``nbjit.compile_image``
and ``nbjit.from_numba`` do (``module.py`` keeps the first two's signatures and documentation,
and hands over here): compiling through the cache and the memo of modules made, the target
each is compiled for (the current device's where none is named), a ``@cuda.jit`` kernel's
PTX and its checks. A bundle's or a cubin's first kernel never comes here; this imports no
``module``: what makes a module of an image (``place``) is handed in."""
from __future__ import annotations

import re
import weakref
from typing import Any, Callable, Iterable

from nbjit.arch import Arch
from nbjit.cache.store import Cache, default_cache
from nbjit.errors import NbjitCompileError, NbjitLoadError
from nbjit.read.image import Image
from nbjit.records import Pattern
from nbjit.toolchain.many_sources import compile_many as compile_images
from nbjit.toolchain.nvrtc import compile_image as _compile_image
from nbjit.toolchain.nvrtc import repeatable
from nbjit.toolchain.pch import check_arg
from nbjit.toolchain.request import one_or_many, option_list, source_text

__all__: list[str] = []


# place(image, context, lazy, keep_debug) -> Module: loaded into the context, or waiting for
# first use where lazy (module._place)
Place = Callable[[Image, Any, bool, bool], Any]


def compile(place: Place, source, name, name_expressions, headers, include_paths, options, arch, output, keep_debug,
            cache, lazy, pch, link, link_options):
    """``module.compile`` (its arguments checked as yes/no there)."""
    if pch is not None:  # (checked before the memo of calls, which does not hold it)
        check_arg(pch)
    if link is not None:  # LTO with the link inputs: nbjit.toolchain.link
        from nbjit.toolchain.link import link_image
        if output not in ("auto", "cubin"):
            raise NbjitCompileError(f"output={output!r}: a link makes a cubin (leave output out)")
        ctx, lazy = _context_for(arch, lazy)
        target = arch if arch is not None else _device_arch(ctx)
        img = link_image(source, link, name=name, name_expressions=name_expressions, headers=headers,
                         include_paths=include_paths, options=options, arch=target, link_options=link_options,
                         cache=cache, pch=pch)
        return place(img, ctx, lazy, keep_debug)
    if type(source) is not str or source[-1:] in _PATH_ENDS:  # a file's path: its text (and its directory)
        source, name, include_paths = source_text(source, name, include_paths)
    exprs, opts = name_expressions, options
    if type(exprs) is not tuple or type(opts) is not tuple:  # (the defaults are: nothing to do)
        exprs, opts = one_or_many(exprs), option_list(opts)  # a str is one item; options split as a shell does
        try:
            exprs, opts = tuple(exprs), tuple(opts)
        except TypeError:  # not a list at all: compile_image says so
            pass
    # A repeated call is one look-up in the cache's memo of calls: {context: the module the
    # call made there}, weakly. Not with include_paths, nor where the source reads a header on
    # disk (found beside it or in the working directory): its files may change between calls.
    memo = cache if cache is not None else default_cache()
    call = None
    if not include_paths and not lazy and isinstance(memo, Cache):
        try:
            call = ("module", source, name, exprs, tuple(sorted(headers.items())) if headers else (), opts, arch,
                    output, keep_debug)
        except Exception:  # headers that are not a dict of str: compile_image says so
            call = None
        made = memo.recall(call) if call is not None else None
        if made:  # (a process's first call finds nothing: it asks the driver nothing here)
            try:
                from nbjit.gpu.driver import current_context_key  # (a named architecture asks no driver)
                ref = made.get(current_context_key())
            except Exception:  # no driver, a forked child: the long way says what is wrong
                ref = None
            mod = ref() if ref is not None else None
            if mod is not None:
                return mod
    ctx, lazy = _context_for(arch, lazy)
    target = arch if arch is not None else _device_arch(ctx)
    img = _compile_image(source, name=name, name_expressions=exprs, headers=headers, include_paths=include_paths,
                         options=opts, arch=target, output=output, cache=cache, pch=pch)
    if lazy:
        return place(img, None, True, keep_debug)
    mod = place(img, ctx, False, keep_debug)
    if call is not None and repeatable(source, name, headers, opts):
        # a new dict (a reader keeps the one it found), without modules that are gone
        made = {k: r for k, r in (memo.recall(call) or {}).items() if r() is not None}
        made[mod._ctx_key] = weakref.ref(mod)
        memo.remember(call, made)
    return mod


def compile_many(place: Place, sources: Iterable, workers: int | None, keep_debug: bool, lazy: bool,
                 common: dict) -> list:
    """``module.compile_many`` (its arguments checked as yes/no there)."""
    ctx, lazy = _context_for(common.get("arch"), lazy)
    if common.get("arch") is None:
        common["arch"] = _device_arch(ctx)
    images = compile_images(sources, workers=workers, **common)
    return [img if isinstance(img, BaseException) else place(img, ctx, lazy, keep_debug) for img in images]


def _context_for(arch, lazy: bool) -> tuple[Any, bool]:
    """(the context a compiled module loads into, or None; whether it loads on first use
    instead): the current context; where there is no usable GPU and ``arch`` names the
    target, none (the module loads on first use, which says what is wrong if it still is)."""
    if lazy:
        return None, True
    try:
        from nbjit.gpu.host import current_host
        return current_host().current_context(), False
    except NbjitLoadError:
        if arch is None:  # the device is what it compiles for: say what to do
            raise
        return None, True


def _device_arch(ctx) -> Arch:
    """The architecture of ``ctx``'s device (the current device's where ``ctx`` is None)."""
    from nbjit.gpu.host import current_host
    host = current_host()
    return Arch.parse(host.context_cc(ctx) if ctx is not None else host.current_cc())


# the last letters of request.SOURCE_SUFFIXES (.cu, .cuh, .cuda), either case: a str ending
# so may be a path (tests/test_module.py holds the two together)
_PATH_ENDS = frozenset("uhaUHA")


def from_numba(place: Place, is_numba_name: Callable[[str], bool], dispatcher: Any, signature: Any):
    """``module.from_numba`` (``is_numba_name``: ``module._is_numba_name``)."""
    from nbjit.gpu.host import current_host, host_of
    from nbjit.params import numba_abi
    host = host_of(dispatcher)
    py = getattr(dispatcher, "py_func", None)
    opts = dict(getattr(dispatcher, "targetoptions", None) or {})
    if py is None:
        raise NbjitLoadError(f"{type(dispatcher).__name__} is not a @cuda.jit kernel")
    what = f"@cuda.jit kernel {py.__name__!r}"
    if opts.get("device"):
        raise NbjitLoadError(f"{what} is a device function: only kernels can be launched")
    if opts.get("debug"):
        raise NbjitLoadError(f"{what} is compiled with debug=True, which reports exceptions through Numba's own "
                             "launcher: nbjit does not run it; compile it without debug=True")
    if opts.get("link"):
        raise NbjitLoadError(f"{what} links other code (link={list(opts['link'])!r}), which {host.name}'s linker adds "
                             f"and nbjit does not: launch it with {host.name}")
    if opts.get("extensions"):
        raise NbjitLoadError(f"{what} prepares its arguments at each launch (extensions=), which nbjit's launcher "
                             f"does not run: launch it with {host.name}")
    try:
        args, ret = host.kernel_types(signature)
    except Exception as e:  # numba's TypeError / parse errors
        raise NbjitLoadError(f"{what}: {signature!r} is not a signature ({e})") from None
    if not host.returns_nothing(ret):
        raise NbjitLoadError(f"{what}: a kernel returns nothing; the signature says {ret}")
    try:
        nargs = numba_abi.from_numba_types(args, host.describe_type, host.abi)
    except numba_abi.NumbaAbiError as e:
        raise numba_abi.NumbaAbiError(f"{what}: {e}") from None
    serving = current_host()
    cc = serving.context_cc(serving.current_context())
    cache = default_cache()
    call = (host.name, py, args, cc, tuple(sorted((k, str(v)) for k, v in opts.items())))
    ptx = cache.recall(call)
    if ptx is None:
        ptx = host.compile_ptx(py, args, cc, **host.ptx_options(opts))
        cache.remember(call, ptx)
    if "cudaCG" in ptx:
        raise NbjitLoadError(f"{what} uses cooperative groups, which need Numba's linker (cudadevrt): launch it "
                             "with Numba")
    missing = sorted(set(_EXTERN_FUNC.findall(ptx)) - _JIT_PROVIDES)
    if missing:
        raise NbjitLoadError(f"{what} calls {', '.join(missing[:4])}, which its PTX declares and {host.name}'s "
                             f"linker adds: nbjit loads the PTX alone; launch it with {host.name}")
    mod = place(Image(ptx.encode(), "ptx", f"{py.__name__}.ptx"), serving.current_context(), False, False)
    names = [k for k in mod.kernels if is_numba_name(k)] or list(mod.kernels)
    if len(names) != 1:
        raise NbjitLoadError(f"{what}: expected one kernel in Numba's PTX, found {names}")
    mod._learn_numba({names[0]: nargs})
    return mod._kernel(names[0])


# Functions a PTX may call that the driver's JIT provides (PTX ISA, "System calls");
# any other `.extern .func` is defined in code the host's linker adds.
_EXTERN_FUNC = Pattern(r"^\s*\.extern\s+\.func\s*(?:\([^)]*\)\s*)?([A-Za-z_$%][\w$]*)", re.M)
_JIT_PROVIDES = frozenset({"vprintf", "malloc", "free", "__assertfail"})


def current_arch() -> Arch:
    """The SASS architecture of the current context's device (``sm_90`` on an H100); Numba's
    context is made current where none is.

    Raises
    ------
    NbjitLoadError: there is no usable GPU or driver (the message says to give ``arch=``).
    """
    from nbjit.gpu.host import current_host  # (a named architecture needs no driver, nor Numba)
    return current_host().device_arch()


def compile_image(source: str, *, arch: Arch | str | None = None, **options: Any) -> Image:
    """Compile CUDA C++ with NVRTC to an ``Image`` (cubin or PTX), loading nothing: for
    ``arch`` (``"sm_90"``, ``"sm_90a"``, ``"compute_90"`` or an ``Arch``), or where it is not
    given, the current device's (the one case that needs a GPU).

    Parameters
    ----------
    source: CUDA C++ text, or a ``.cu`` file's path.
    arch: what to compile for; default: the current device's architecture.
    options: the other arguments of ``nbjit.toolchain.nvrtc.compile_image`` (``name``,
        ``name_expressions``, ``headers``, ``include_paths``, ``options``, ``output``,
        ``cache``, ``pch``), with the same meaning.

    Raises
    ------
    NbjitCompileError: as ``nbjit.toolchain.nvrtc.compile_image``. NbjitLoadError: no ``arch`` and
    no usable GPU.
    """
    return _compile_image(source, arch=current_arch() if arch is None else arch, **options)
