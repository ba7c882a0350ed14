"""nbjit's exception hierarchy: everything nbjit raises on bad input derives from NbjitError."""
from __future__ import annotations

import os
import re
import sys
import warnings

__all__ = [
    "NbjitError",
    "PtxParseError",
    "ImageFormatError",
    "NbjitCompileError",
    "CompileFailure",
    "LinkFailure",
    "NbjitLoadError",
    "NbjitHostError",
    "NbjitLaunchError",
    "NbjitArgumentError",
    "NbjitGraphError",
    "NbjitCacheError",
    "NbjitOpError",
    "KernelNotFoundError",
    "BundleError",
    "NbjitTuneError",
    "NbjitWarning",
]


class NbjitError(Exception):
    """Base class of every error nbjit raises. Each pickles as what it holds (message and
    attributes, such as NVRTC's log), so it crosses to the parent of a worker process."""

    def __reduce__(self):
        # not cls(*args): subclasses' constructors take other arguments than their message
        return _rebuild, (type(self), self.args, dict(self.__dict__))


def _rebuild(cls: type, args: tuple, attrs: dict) -> NbjitError:
    e = cls.__new__(cls)
    Exception.__init__(e, *args)
    e.__dict__.update(attrs)
    return e


class PtxParseError(NbjitError, ValueError):
    """PTX text that nbjit cannot parse; ``source`` and ``line`` say where."""

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None):
        self.source = source
        self.line = line
        where = source or "<ptx>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: {message}")


class ImageFormatError(NbjitError, ValueError):
    """Bytes that are not a usable PTX / cubin / fatbin image (wrong magic, truncated, corrupt)."""


class NbjitCompileError(NbjitError):
    """NVRTC (or nvJitLink) rejected the input."""


class CompileFailure(NbjitCompileError):
    """NVRTC rejected a source: ``log``, ``options``, ``name`` and ``source`` are kept, and
    the message shows the log and the source lines it points at, numbered. The message shows
    ``shown_options`` (default: ``options``): the toolchain's own include directories by what
    they are (``--include-path=<cuda>``), not where they are installed."""

    def __init__(self, name: str, source: str, options: list[str], log: str, producer: str, hint: str = "",
                 shown_options: list[str] | None = None):
        self.name, self.source, self.options, self.log = name, source, list(options), log
        self.producer, self.hint = producer, hint
        self.shown_options = list(options if shown_options is None else shown_options)
        lines = source.splitlines()
        marks = sorted({int(m) for m in re.findall(re.escape(name) + r"\((\d+)\)", log)})
        shown = []
        for n in marks[:5]:
            for i in range(max(1, n - 2), min(len(lines), n + 2) + 1):
                shown.append(f"{'>' if i == n else ' '}{i:5d} | {lines[i - 1]}")
            shown.append("")
        super().__init__(f"{name}: {producer} could not compile it (options: {' '.join(self.shown_options)})\n{log}"
                         + ("\n\n" + "\n".join(shown).rstrip() if shown else "") + (f"\n\n{hint}" if hint else ""))

    def source_with_line_numbers(self) -> str:
        """The whole source, each line numbered."""
        return "\n".join(f"{i:5d} | {line}" for i, line in enumerate(self.source.splitlines(), 1))


class LinkFailure(NbjitCompileError):
    """nvJitLink could not link: its error ``log``, the label of the ``input`` it refused (None
    where the link as a whole failed), every input's label (``inputs``), the symbols no input
    defines (``undefined``) and nvJitLink's own ``error`` (its result code)."""

    def __init__(self, message: str, *, log: str = "", input: str | None = None, inputs: tuple = (),
                 undefined: tuple = (), error: str = ""):
        self.log, self.input, self.inputs, self.undefined, self.error = log, input, tuple(inputs), \
            tuple(undefined), error
        super().__init__(message)


class NbjitLoadError(NbjitError):
    """The driver could not load a module."""


class NbjitHostError(NbjitError, ValueError):
    """A Numba host asked for that nbjit cannot serve: not a host's name, or asked for after
    another was chosen (``nbjit.use_host``, ``NBJIT_HOST``)."""


class NbjitLaunchError(NbjitError):
    """A kernel launch failed or its configuration is invalid."""


class NbjitGraphError(NbjitError):
    """A CUDA graph that could not be captured, updated, replayed, saved or loaded: a capture
    broken by what it cannot record, a condition used outside its graph, a node update the
    driver refused, a saved graph's description or bindings that do not fit."""


class NbjitArgumentError(NbjitError, TypeError):
    """A launch argument does not fit the kernel's parameter."""


class NbjitOpError(NbjitError, ValueError):
    """A kernel declared as a framework's operator (``nbjit.torch.op``, ``nbjit.jax.call``) in
    a way that does not fit the kernel: an unknown or unnamed parameter, an output rule against
    the parameter's element type, a pointer the kernel may write left undeclared."""


class NbjitCacheError(NbjitError):
    """The on-disk cache cannot be used."""


class KernelNotFoundError(NbjitError, KeyError):
    """No kernel of that name in the module."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class BundleError(NbjitError, ValueError):
    """A kernel bundle that cannot be read (not one, damaged or altered, made by a newer
    nbjit) or built from the inputs given."""


class NbjitTuneError(NbjitError, ValueError):
    """A tuning search asked in a way nbjit cannot carry out (a space, a target, a key that
    does not fit), or one in which no variant could be timed (each one's reason said)."""


class NbjitWarning(UserWarning):
    """Something nbjit did on the user's behalf that they may want to know about."""


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str) -> None:
    """An ``NbjitWarning`` naming the user's line: the innermost frame outside nbjit's
    package (however deep nbjit's own calls ran; in a thread nbjit started, its outermost)."""
    depth, frame = 1, sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, depth = frame.f_back, depth + 1
    warnings.warn(message, NbjitWarning, stacklevel=depth + 1)


def install_hint(extra: str) -> str:
    """How to install nbjit-core's ``extra``, for the messages that say what to install: nbjit
    is installed from a checkout or from a wheel built from one (it is not on PyPI)."""
    return (f"nbjit-core's '{extra}' extra: pip install -e '.[{extra}]' in a checkout of nbjit "
            f"(or pip install '<nbjit_core wheel>[{extra}]' for a wheel built from one)")
