"""``@cuda.jit`` kernels compiled to PTX by their own Numba (numba-cuda or numba-cuda-mlir) for
one signature and chip, with the array ABI their arguments take: what ``nbjit.from_numba``
loads and what a bundle ships. What only Numba's own launcher and linker can run is refused
here, by name: ``debug=True`` (exceptions reported through a global Numba reads after each
launch), ``link=`` files, ``extensions=``, cooperative groups' grid sync (the device runtime
Numba links), and any other function the PTX declares and Numba's linker adds. ``print``
(``vprintf``), ``cuda.local``/``cuda.shared`` arrays and device functions are in the PTX."""
from __future__ import annotations

import re
from typing import Any

from nbjit.cache.store import Cache, default_cache
from nbjit.errors import NbjitCompileError, NbjitError, NbjitLoadError, install_hint
from nbjit.read.ptx import inspect_ptx
from nbjit.records import Pattern, record

__all__ = ["NumbaKernel", "NumbaPtx", "is_dispatcher"]

# Functions a PTX may call that the driver's JIT provides (PTX ISA, "System calls");
# any other `.extern .func` is defined in code the host's linker adds.
_EXTERN_FUNC = Pattern(r"^\s*\.extern\s+\.func\s*(?:\([^)]*\)\s*)?([A-Za-z_$%][\w$]*)", re.M)
_JIT_PROVIDES = frozenset({"vprintf", "malloc", "free", "__assertfail", "cudaGraphSetConditional"})
_ANSI = Pattern(r"\x1b\[[0-9;]*m")


@record
class NumbaPtx:
    """A ``@cuda.jit`` kernel's PTX for one signature and compute capability: ``kernel`` its
    entry's (mangled) name, ``args`` its arguments as nbjit passes them (``NumbaArray``,
    ``NumbaScalar``), ``host`` the name of the Numba that compiled it, ``function`` the
    Python function's name, ``options`` what of the dispatcher's options applied."""

    ptx: str
    kernel: str
    args: tuple
    host: str
    function: str
    options: tuple = ()


def is_dispatcher(obj: Any) -> bool:
    """Whether ``obj`` looks like a ``@cuda.jit`` dispatcher (a Python function and options)."""
    return callable(getattr(obj, "py_func", None)) and isinstance(getattr(obj, "targetoptions", None), dict)


class NumbaKernel:
    """A ``@cuda.jit`` dispatcher and one signature, checked (no GPU needed): ``host`` the
    Numba that compiles it, ``args`` its Numba argument types, ``abi`` them as nbjit passes
    them; ``ptx(cc)`` compiles it for a compute capability.

    Raises
    ------
    NbjitLoadError (``NumbaAbiError`` for an argument type): what the kernel is or uses that
    nbjit cannot run, named.
    """

    def __init__(self, dispatcher: Any, signature: Any) -> None:
        from nbjit.params import numba_abi

        self.host, self.what, self.py, self.opts = _checked(dispatcher)
        try:
            args, ret = self.host.kernel_types(signature)
        except NbjitError:  # (no Numba serves: the bare host says what to install)
            raise
        except Exception as e:  # numba's TypeError / parse errors
            raise NbjitLoadError(f"{self.what}: {signature!r} is not a signature ({e})") from None
        if not self.host.returns_nothing(ret):
            raise NbjitLoadError(f"{self.what}: a kernel returns nothing; the signature says {ret}")
        try:
            code = getattr(self.py, "__code__", None)  # (the parameters' names, which ops and calls declare by)
            names = code.co_varnames[:code.co_argcount] if code is not None else ()
            self.abi = numba_abi.from_numba_types(args, self.host.describe_type, self.host.abi, names)
        except numba_abi.NumbaAbiError as e:
            raise numba_abi.NumbaAbiError(f"{self.what}: {e}") from None
        self.args = tuple(args)

    def ptx(self, cc: tuple[int, int], cache: Cache | None = None) -> NumbaPtx:
        """The PTX the kernel's own Numba makes for compute capability ``cc``, with the
        dispatcher's fastmath, lineinfo, launch bounds and optimisation (remembered for the
        process in ``cache``'s memory); NbjitLoadError where it calls what only Numba's
        linker adds."""
        cache = cache or default_cache()
        host, options = self.host, self.host.ptx_options(self.opts)
        call = (host.name, self.py, self.args, tuple(cc), tuple(sorted((k, str(v)) for k, v in self.opts.items())))
        ptx = cache.recall(call)
        if ptx is None:
            try:
                ptx = host.compile_ptx(self.py, self.args, tuple(cc), **options)
            except NbjitError:
                raise
            except Exception as e:  # Numba's typing and lowering errors: many lines, the first say what
                raise NbjitCompileError(f"{self.what}: {host.name} could not compile it for "
                                        f"({', '.join(map(str, self.args))}) on sm_{cc[0]}{cc[1]}: "
                                        f"{_first_lines(e)}") from None
            cache.remember(call, ptx)
        _refuse_runtime_calls(ptx, self.what, host.name)
        entries = [e.name for e in inspect_ptx(ptx, source=f"{self.py.__name__}.ptx").entries]
        if len(entries) != 1:
            raise NbjitLoadError(f"{self.what}: expected one kernel in Numba's PTX, found {entries}")
        return NumbaPtx(ptx, entries[0], self.abi, host.name, self.py.__name__,
                        tuple(sorted((k, str(v)) for k, v in options.items())))


def _checked(dispatcher: Any) -> tuple:
    """(host, "@cuda.jit kernel 'name'", Python function, options) of a dispatcher nbjit can
    compile; NbjitLoadError naming what it is otherwise."""
    from nbjit.gpu.host import host_of

    py = getattr(dispatcher, "py_func", None)
    if py is None or not callable(py):
        from nbjit.gpu.host import current_host
        none = current_host().name == "bare"
        raise NbjitLoadError(f"{type(dispatcher).__name__} is not a @cuda.jit kernel" + (
            f" (and no Numba serves in this process: {install_hint('numba')}, or numba-cuda-mlir)" if none else ""))
    host = host_of(dispatcher)
    opts = dict(getattr(dispatcher, "targetoptions", None) or {})
    what = f"@cuda.jit kernel {py.__name__!r}"
    if opts.get("device"):
        raise NbjitLoadError(f"{what} is a device function: only kernels can be launched")
    if opts.get("debug"):
        raise NbjitLoadError(f"{what} is compiled with debug=True, which reports exceptions through Numba's own "
                             "launcher (it reads the kernel's error code after each launch): nbjit does not run it; "
                             "compile it without debug=True (lineinfo=True keeps source lines for profilers)")
    if opts.get("link"):
        raise NbjitLoadError(f"{what} links other code (link={list(opts['link'])!r}), which {host.name}'s linker adds "
                             f"and nbjit does not: launch it with {host.name}")
    if opts.get("extensions"):
        raise NbjitLoadError(f"{what} prepares its arguments at each launch (extensions=), which nbjit's launcher "
                             f"does not run: launch it with {host.name}")
    return host, what, py, opts


def _refuse_runtime_calls(ptx: str, what: str, host: str) -> None:
    """NbjitLoadError where the PTX calls what Numba's linker adds (cooperative groups' device
    runtime, ``declare_device`` functions of ``link=`` files)."""
    if "cudaCG" in ptx:
        raise NbjitLoadError(f"{what} uses cooperative groups (this_grid().sync()), whose device runtime "
                             f"(cudadevrt) {host}'s linker adds: launch it with {host}")
    missing = sorted(set(_EXTERN_FUNC.findall(ptx)) - _JIT_PROVIDES)
    if missing:
        raise NbjitLoadError(f"{what} calls {', '.join(missing[:4])}, which its PTX declares and {host}'s "
                             f"linker adds: nbjit loads the PTX alone; launch it with {host}")


def _first_lines(e: Exception, limit: int = 400) -> str:
    """An exception's text without Numba's banners and blank lines, cut at ``limit`` characters."""
    text = _ANSI.sub("", str(e))  # (Numba colours its messages)
    lines = [x.strip() for x in text.splitlines() if x.strip() and not x.strip().startswith(("- ", "During:"))]
    text = " ".join(lines) or type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
