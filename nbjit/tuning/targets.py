"""What a search varies: a CUDA C++ template instantiated per variant (``Template``), a source
compiled with each choice as a ``-D`` macro (``Defines``), a loaded kernel's launch
configuration (any nbjit ``Kernel``), or a Python launch function that takes the choices
as keyword arguments. Each says what identifies it in an answer's key and, for the two
that compile, the programs that make its variants (plain data for ``compile_many``)."""
from __future__ import annotations

import hashlib
import inspect
import os
import string
from typing import Any, Callable, Mapping, Sequence

from nbjit.errors import NbjitTuneError
from nbjit.read.image import content_digest
from nbjit.toolchain.request import _headers, source_text

__all__ = ["Template", "Defines", "Program", "LaunchFunction", "as_target", "choice_text"]


def choice_text(v: Any) -> str:
    """A choice as C++ reads it in a template argument or a macro: ``true``, ``256``, ``0.5``,
    a string as written (``cub::BLOCK_REDUCE_RAKING``)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else str(v)


class Program:
    """One NVRTC program of a search: ``compile``'s arguments, and for each variant it holds
    (by index) the name expression or name of its kernel."""

    __slots__ = ("args", "variants", "kernels")

    def __init__(self, args: dict, variants: list[int], kernels: list[str]) -> None:
        self.args, self.variants, self.kernels = args, variants, kernels


class _Source:
    """What ``Template`` and ``Defines`` share: a CUDA C++ source and its compile options."""

    def __init__(self, source: str | os.PathLike, name: str, *, options: Sequence[str] = (),
                 headers: Mapping[str, str] | None = None, include_paths: Sequence[str] = (),
                 program: str | None = None) -> None:
        if not isinstance(name, str) or not name.strip():
            raise NbjitTuneError(f"{type(self).__name__}: name must be the kernel's name (str), not {name!r}")
        self.text, self.program, include_paths = source_text(source, program, include_paths)
        if isinstance(include_paths, (str, os.PathLike)):
            include_paths = (include_paths,)
        self.name = name
        self.options = tuple(str(o) for o in options)
        self.include_paths = tuple(os.fspath(p) for p in include_paths)
        self.headers = _headers(headers)

    def _common(self) -> dict:
        return {"source": self.text, "name": self.program, "options": list(self.options),
                "headers": dict(self.headers), "include_paths": list(self.include_paths)}

    def key_fields(self) -> dict:
        """What identifies the target in an answer's key: the source's digest, the digests of
        the headers it reads (given, or found in the user's include directories: by content,
        not where they are), the options, the kernel's name or pattern. No path of this
        machine: the answer holds wherever the same source is tuned."""
        from nbjit.toolchain.identity import cccl_include_dir, cuda_include_dir
        from nbjit.toolchain.includes import walk_includes
        ours = [d for d in (cuda_include_dir(), cccl_include_dir()) if d]
        walk = walk_includes(self.text, self.program or "kernel.cu", dict(self.headers), self.include_paths, ours,
                             self.options)
        return {"kind": type(self).__name__, "name": self.name, "source": content_digest(self.text.encode()),
                "program": os.path.basename(self.program or "kernel.cu"), "options": list(self.options),
                "headers": {k: content_digest(v.encode()) for k, v in sorted(self.headers.items())},
                "read": sorted(digest for _, digest in walk.files)}

    def label(self) -> str:
        """How messages and answers name it: ``block_sum<{BLOCK}> in reduce.cu``."""
        return f"{self.name} in {self.program or 'kernel.cu'}"


class Template(_Source):
    """A CUDA C++ kernel template: ``name`` is its name expression with ``{CHOICE}`` fields
    (``"block_sum<{BLOCK}, {ITEMS}, {ALGO}>"``), filled in per variant. Variants are
    instantiated several to a program (``programs``), so the headers are parsed once per
    program, not per variant."""

    def __init__(self, source: str | os.PathLike, name: str, **kw: Any) -> None:
        super().__init__(source, name, **kw)
        try:
            self.fields = [f for _, f, _, _ in string.Formatter().parse(name) if f is not None]
        except ValueError as e:
            raise NbjitTuneError(f"Template: name {name!r} is not a pattern with {{CHOICE}} fields: {e}") from None
        if any(not f.isidentifier() for f in self.fields):
            raise NbjitTuneError(f"Template: name {name!r}: each field names a choice ({{BLOCK}}), not "
                                 f"{[f for f in self.fields if not f.isidentifier()]}")

    def check(self, names: Sequence[str]) -> None:
        """Refuse a space without a choice for each field of the name."""
        missing = [f for f in self.fields if f not in names]
        if missing:
            raise NbjitTuneError(f"Template {self.name!r}: the space has no choice {', '.join(missing)} "
                                 f"(it has {', '.join(names)})")

    def expression(self, config: Mapping[str, Any]) -> str:
        """The name expression of one variant: ``block_sum<256, 4>``."""
        return self.name.format(**{k: choice_text(v) for k, v in config.items()})

    def programs(self, configs: list[dict], count: int) -> list[Program]:
        """``configs`` spread over ``count`` programs (or fewer), in order; variants with the
        same expression (choices the template does not take) share its instantiation."""
        exprs = [self.expression(c) for c in configs]
        unique = list(dict.fromkeys(exprs))
        count = max(1, min(count, len(unique)))
        per = -(-len(unique) // count)
        out = []
        for start in range(0, len(unique), per):
            chunk = unique[start:start + per]
            members = [i for i, e in enumerate(exprs) if e in set(chunk)]
            out.append(Program({**self._common(), "name_expressions": chunk}, members, [exprs[i] for i in members]))
        return out

    def alone(self, config: Mapping[str, Any], together: Sequence[str] = ()) -> Program:
        """The program of one variant: alone (to say which of a failed program's variants
        fail), or in ``together``, the expressions of the program a search compiled it in,
        where those hold it (that compile is then a cache hit)."""
        e = self.expression(config)
        exprs = list(together) if e in together else [e]
        return Program({**self._common(), "name_expressions": exprs}, [0], [e])


class Defines(_Source):
    """A source compiled once per variant, each choice (or those named in ``defines``) given
    as ``-DNAME=value``; ``name`` is the kernel's (``extern "C"`` or a name expression)."""

    def __init__(self, source: str | os.PathLike, name: str, *, defines: Sequence[str] | None = None,
                 **kw: Any) -> None:
        super().__init__(source, name, **kw)
        self.defines = None if defines is None else tuple(defines)

    def check(self, names: Sequence[str]) -> None:
        """Refuse ``defines`` that name no choice of the space."""
        if self.defines is not None:
            missing = [d for d in self.defines if d not in names]
            if missing:
                raise NbjitTuneError(f"Defines {self.name!r}: defines= names {', '.join(missing)}, which the space "
                                     f"does not (it has {', '.join(names)})")

    def key_fields(self) -> dict:
        """What identifies the target in an answer's key, with the choices given as macros."""
        return {**super().key_fields(), "defines": None if self.defines is None else list(self.defines)}

    def options_for(self, config: Mapping[str, Any]) -> list[str]:
        """The compile options of one variant: the target's, then ``-DNAME=value`` per choice."""
        names = self.defines if self.defines is not None else list(config)
        return [*self.options, *(f"-D{n}={choice_text(config[n])}" for n in names)]

    def programs(self, configs: list[dict], count: int) -> list[Program]:
        """One program per distinct set of macros (``count`` is not used: each compiles alone)."""
        out, seen = [], {}
        for i, c in enumerate(configs):
            opts = tuple(self.options_for(c))
            if opts in seen:
                out[seen[opts]].variants.append(i)
                out[seen[opts]].kernels.append(self.name)
                continue
            seen[opts] = len(out)
            out.append(Program({**self._common(), "options": list(opts),
                                "name_expressions": [self.name] if "<" in self.name else []}, [i], [self.name]))
        return out

    def alone(self, config: Mapping[str, Any], together: Sequence[str] = ()) -> Program:
        """The program of one variant (each variant is a program alone: ``together`` is not used)."""
        return self.programs([dict(config)], 1)[0]


class LaunchFunction:
    """A Python function that launches with the choices as keyword arguments and on the
    stream given as ``stream=``: ``fn(*args, stream=s, **choices)``."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None
        if sig is not None and "stream" not in sig.parameters and not any(
                p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            raise NbjitTuneError(f"tune: the launch function {_qualname(fn)} must take stream= (the tuner times "
                                 "it on a stream of its own and passes it there)")

    def key_fields(self) -> dict:
        """What identifies the function in an answer's key: its name and its source's digest."""
        fn = inspect.unwrap(self.fn)
        try:
            text = inspect.getsource(fn)
        except (OSError, TypeError):
            code = getattr(fn, "__code__", None)
            text = repr(code.co_code + repr(code.co_consts).encode()) if code is not None else ""
        return {"kind": "function", "name": _qualname(fn), "source": hashlib.blake2b(text.encode(), digest_size=16)
                .hexdigest()}

    def label(self) -> str:
        """How messages and answers name it."""
        return _qualname(self.fn)


def _qualname(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def as_target(target: Any) -> Any:
    """The target object for what ``tune`` was given: a ``Template``, ``Defines``, an nbjit
    ``Kernel`` (its launch configuration searched) or a launch function."""
    from nbjit.launch.kernel import Kernel  # (a search over compiled variants loads no kernel yet)
    if isinstance(target, (Template, Defines, Kernel)):
        return target
    if callable(target) and not isinstance(target, type):
        if hasattr(target, "py_func") and hasattr(target, "overloads"):  # a @cuda.jit dispatcher
            raise NbjitTuneError("tune: a @cuda.jit kernel is tuned as nbjit.from_numba(kernel, signature) (its "
                                 "launch configuration), or through a launch function that takes stream=")
        return LaunchFunction(target)
    raise NbjitTuneError(f"tune: the target must be nbjit.tuning.Template, nbjit.tuning.Defines, an nbjit Kernel or a "
                         f"launch function, not {type(target).__name__}")
