"""Compiling on request: ``nbjit.compile``, ``nbjit.compile_many`` and ``nbjit.from_numba``:
compiled through the cache for the target named (the current
device's where none is), loaded as modules (``module.py``); a ``@cuda.jit`` kernel's PTX and
its checks. A bundle's or a cubin's first kernel never comes here (``nbjit/__init__.py``
imports this file on first use of one of these)."""
from __future__ import annotations

import weakref
from typing import Any, Iterable, Mapping

from nbjit.arch import Arch
from nbjit.cache.store import Cache, default_cache
from nbjit.errors import NbjitCompileError, NbjitLoadError
from nbjit.launch.kernel import Kernel
from nbjit.loading.module import Module, flag, load_into
from nbjit.read.image import Image
from nbjit.toolchain.many_sources import compile_many as compile_images
from nbjit.toolchain.nvrtc import compile_image as _compile_image
from nbjit.toolchain.nvrtc import repeatable
from nbjit.toolchain.pch import check_arg
from nbjit.toolchain.request import one_or_many, option_list, source_text

__all__ = ["compile", "compile_many", "from_numba"]


def compile(source: str, *, name: str | None = None, name_expressions: Iterable[str] = (),
            headers: Mapping[str, str] | None = None, include_paths: Iterable[str] = (),
            options: Iterable[str] = (), arch: Arch | str | None = None, output: str = "auto",
            keep_debug: bool = False, cache: Cache | None = None, lazy: bool = False,
            pch: bool | str | None = None, link: Any = None, link_options: Iterable[str] = ()) -> Module:
    """Compile CUDA C++ with NVRTC (through the disk cache) and load it into the current
    Numba context. Arguments as for ``nbjit.compile_image``; ``module["fill<float>"]``
    then finds a kernel by the name expression written. ``arch`` defaults to the device of
    the current context; with ``arch`` given no GPU is needed until a kernel is used: where
    there is none, the module loads on first use. ``lazy=True`` loads on first use always,
    as ``nbjit.load(..., lazy=True)``. ``pch``: NVRTC precompiled headers, as for
    ``compile_image`` (they change no output).
    ``link``: inputs linked into it with link-time optimisation — Python device functions
    ``(function, "float32(float32, float32)")``, LTO-IR, CUDA C++, relocatable device code —
    and ``link_options`` for nvJitLink, as for ``nbjit.link_image`` (``output`` is then a cubin).

    A repeated call in one context gives the module the first made (the memo of calls, then
    ``compile_image``'s, then the cache: ``toolchain.nvrtc.CompileCall`` says in what order)."""
    if keep_debug is not False or lazy is not False:  # (the defaults: nothing to check)
        keep_debug, lazy = flag(keep_debug, "keep_debug", NbjitCompileError), flag(lazy, "lazy", NbjitCompileError)
    if pch is not None:  # (checked before the memo of calls, which does not hold it)
        check_arg(pch)
    if link is not None:
        return _linked(source, link, name, name_expressions, headers, include_paths, options, arch, output,
                       keep_debug, cache, lazy, pch, link_options)
    if type(source) is not str or source[-1:] in _PATH_ENDS:  # a file's path: its text (and its directory)
        source, name, include_paths = source_text(source, name, include_paths)
    exprs, opts = name_expressions, options
    if type(exprs) is not tuple or type(opts) is not tuple:  # (the defaults are: nothing to do)
        exprs, opts = one_or_many(exprs), option_list(opts)  # a str is one item; options split as a shell does
        try:
            exprs, opts = tuple(exprs), tuple(opts)
        except TypeError:  # not a list at all: compile_image says so
            pass
    memo = cache if cache is not None else default_cache()
    call = None
    if not include_paths and not lazy and isinstance(memo, Cache):
        call = _memo_key(source, name, exprs, headers, opts, arch, output, keep_debug)
        mod = _made_here(memo, call)
        if mod is not None:
            return mod
    ctx, lazy, target = _destination(arch, lazy)
    img = _compile_image(source, name=name, name_expressions=exprs, headers=headers, include_paths=include_paths,
                         options=opts, arch=target, output=output, cache=cache, pch=pch)
    mod = _module(img, ctx, lazy, keep_debug)
    if not lazy and call is not None and repeatable(source, name, headers, opts):
        # a new dict (a reader keeps the one it found), without modules that are gone
        made = {k: r for k, r in (memo.recall(call) or {}).items() if r() is not None}
        made[mod._ctx_key] = weakref.ref(mod)
        memo.remember(call, made)
    return mod


def _memo_key(source, name, exprs, headers, opts, arch, output, keep_debug) -> tuple | None:
    """The key of ``compile``'s memo of calls (None for headers that are not a dict of str:
    ``compile_image`` says so). Not with include_paths, nor where the source reads a header
    on disk (found beside it or in the working directory): its files may change between calls."""
    try:
        return ("module", source, name, exprs, tuple(sorted(headers.items())) if headers else (), opts, arch,
                output, keep_debug)
    except Exception:
        return None


def _made_here(memo: Cache, call: tuple | None) -> Module | None:
    """The module this call made in the current context, from the memo of calls ({context:
    the module, weakly}), or None. A process's first call finds nothing: it asks the driver
    nothing here."""
    made = memo.recall(call) if call is not None else None
    if not made:
        return None
    try:
        from nbjit.gpu.driver import current_context_key  # (a named architecture asks no driver)
        ref = made.get(current_context_key())
    except Exception:  # no driver, a forked child: the long way says what is wrong
        return None
    return ref() if ref is not None else None


def _linked(source, link, name, name_expressions, headers, include_paths, options, arch, output, keep_debug, cache,
            lazy, pch, link_options) -> Module:
    """``compile`` with ``link``: LTO with the link inputs (``nbjit.toolchain.link``)."""
    from nbjit.toolchain.link import link_image
    if output not in ("auto", "cubin"):
        raise NbjitCompileError(f"output={output!r}: a link makes a cubin (leave output out)")
    ctx, lazy, target = _destination(arch, lazy)
    img = link_image(source, link, name=name, name_expressions=name_expressions, headers=headers,
                     include_paths=include_paths, options=options, arch=target, link_options=link_options,
                     cache=cache, pch=pch)
    return _module(img, ctx, lazy, keep_debug)


def compile_many(sources: Iterable, *, workers: int | None = None, keep_debug: bool = False, lazy: bool = False,
                 **common) -> list[Module]:
    """Compile independent sources at once (threads, or worker processes: ``processes=``), each through
    the cache, and load them into the current Numba context: Modules in the order given.
    Items and arguments as for ``nbjit.toolchain.many_sources.compile_many`` (each a source, a ``.cu`` path
    or a dict of ``compile``'s arguments); ``arch`` defaults to the current device's. With
    ``arch`` given no GPU is needed until a kernel is used (where there is none, each module
    loads on first use); ``lazy=True`` loads each on first use always. ``return_exceptions=True``:
    a source that failed has its error in its place in the list, the others their Modules.

    Raises
    ------
    NbjitCompileError: naming the first source that failed (its index and name); not with
    ``return_exceptions=True``.
    """
    keep_debug, lazy = flag(keep_debug, "keep_debug", NbjitCompileError), flag(lazy, "lazy", NbjitCompileError)
    ctx, lazy, common["arch"] = _destination(common.get("arch"), lazy)
    images = compile_images(sources, workers=workers, **common)
    return [img if isinstance(img, BaseException) else _module(img, ctx, lazy, keep_debug) for img in images]


def _destination(arch, lazy: bool) -> tuple[Any, bool, Any]:
    """(the context a compiled module loads into, or None; whether it loads on first use
    instead; what it is compiled for): the current context; where there is no usable GPU and
    ``arch`` names the target, none (the module loads on first use, which says what is wrong
    if it still is). The target is ``arch``, else the context's device's architecture (the
    current device's where the module loads on first use)."""
    from nbjit.gpu.host import current_host  # (a named architecture asks no driver)
    ctx = None
    if not lazy:
        try:
            ctx = current_host().current_context()
        except NbjitLoadError:
            if arch is None:  # the device is what it compiles for: say what to do
                raise
            lazy = True
    if arch is None:
        host = current_host()
        arch = Arch.parse(host.context_cc(ctx) if ctx is not None else host.current_cc())
    return ctx, lazy, arch


def _module(img: Image, ctx, lazy: bool, keep_debug: bool) -> Module:
    """The module of a compiled image: loaded into ``ctx``, or waiting for first use."""
    return Module._pending(img, keep_debug) if lazy else load_into(img, ctx, keep_debug)


# the last letters of request.SOURCE_SUFFIXES (.cu, .cuh, .cuda), either case: a str ending
# so may be a path (tests/test_module.py holds the two together)
_PATH_ENDS = frozenset("uhaUHA")


def from_numba(dispatcher: Any, signature: Any) -> Kernel:
    """A ``@cuda.jit`` kernel as an nbjit ``Kernel``: compiled by Numba for ``signature``
    (``"void(float32[::1], float32)"``, a tuple of Numba types, ...) and this device, loaded
    into the current context, launched by nbjit's launcher with the arguments the
    Numba kernel takes (device arrays, numpy and Python scalars) at a fraction of Numba's
    dispatch cost. Arrays are checked against the signature (dtype, ndim, layout). The
    dispatcher may be numba-cuda's or numba-cuda-mlir's: its own package compiles it (with
    its fastmath, lineinfo, launch bounds and optimisation), and its kernels' ABI is read.

    Raises
    ------
    NbjitLoadError: not a kernel dispatcher, a device function, ``debug=True`` (Numba's
    exception reporting), a cooperative kernel, one that links other code (``link=``) or
    prepares its arguments (``extensions=``), or argument types nbjit cannot pass (the
    message names the argument).
    """
    from nbjit.gpu.host import current_host
    from nbjit.toolchain.numba_kernels import NumbaKernel

    kernel = NumbaKernel(dispatcher, signature)  # (checked before the device is asked)
    serving = current_host()
    ctx = serving.current_context()
    made = kernel.ptx(serving.context_cc(ctx))
    mod = load_into(Image(made.ptx.encode(), "ptx", f"{made.function}.ptx"), ctx, False)
    mod._learn(numba={made.kernel: made.args})
    return mod._kernel(made.kernel)
