"""A compile request: what ``compile_image`` is asked, checked and put in one spelling
(``CompileRequest``): the source (text, or a file's, whose directory is searched for its
headers), its name, name expressions, in-memory headers, include directories and options
(``-I``/``--include-path``, ``-D``/``--define-macro`` and aliases unified), the architecture
and output kind. Everything a compile could be refused for before NVRTC runs is refused here,
naming the source and the argument."""
from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from typing import Iterable, Mapping

from nbjit.arch import Arch
from nbjit.cache.sources import wants_sources
from nbjit.errors import NbjitCompileError
from nbjit.files import read_regular
from nbjit.records import record
from nbjit.toolchain.identity import cccl_include_dir, cuda_include_dir

__all__ = ["CompileRequest", "normalize_options", "source_text", "SOURCE_SUFFIXES"]

# patterns used on every call, compiled once at import
_ARCH_NAME = re.compile(r"(sm|compute)_\d+[af]?", re.ASCII)
# a source line that includes a file by "...", looked for beside the source first
QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"', re.M)


_ALIASES = {"--std": "-std", "--device-debug": "-G", "--generate-line-info": "-lineinfo",
            "-use_fast_math": "--use_fast_math", "-fmad": "--fmad", "--gpu-architecture": "-arch",
            "--define-macro": "-D", "--include-path": "-I", "-default-device": "--device-as-default-execution-space",
            "-dopt": "--dopt", "-rdc": "--relocatable-device-code"}


def normalize_options(options: Iterable[object]) -> list[str]:
    """Compiler options in one spelling each (``-I DIR``, ``-IDIR``, ``--include-path=DIR`` ->
    ``--include-path=<absolute DIR>``; ``-D X``/``--define-macro=X`` -> ``-DX``; long and short
    aliases unified), order kept: what the cache key and NVRTC both see."""
    out: list[str] = []
    it = iter(str(o).strip() for o in options if str(o).strip())
    for o in it:
        if o in ("-I", "-D", "--include-path", "--define-macro"):
            try:
                o = o + ("=" if o.startswith("--") else "") + next(it)
            except StopIteration:
                raise NbjitCompileError(f"option {o} needs a value") from None
        name, eq, val = o.partition("=")
        if o[:2] in ("-I", "-D") and len(o) > 2:  # (-DX=1: the macro is all after -D, '=' and all)
            name, eq, val = o[:2], "=", o[2:]
        name = _ALIASES.get(name, name)
        if name == "-I":
            out.append(f"--include-path={os.path.abspath(val)}")
        elif name == "-D":
            if not val or val.startswith("="):
                raise NbjitCompileError(f"option {o!r} defines no macro name (-D NAME or -D NAME=VALUE)")
            out.append(f"-D{val}")
        elif name == "-arch":
            raise NbjitCompileError("give the architecture as arch=... (on the command line: --arch), not in options")
        else:
            out.append(name + (eq + val if eq else ""))
    return out


def one_or_many(value):
    """A str given where a list of them goes (``name_expressions="fill<float>"``) as the
    one item it is."""
    return (value,) if isinstance(value, str) else value


def option_list(options):
    """Options given as one str (``"-std=c++17 -DN=4"``) split as a shell splits a command
    line; a list as it is."""
    if not isinstance(options, str):
        return options
    if len(options) > MAX_OPTION_BYTES:  # (before the split, which takes seconds per megabyte)
        raise NbjitCompileError(f"options: one str of {len(options)} characters: more than NVRTC is given "
                                f"({MAX_OPTION_BYTES >> 10} KiB of options)")
    try:
        return tuple(shlex.split(options))
    except ValueError as e:  # an unclosed quote
        raise NbjitCompileError(f"options {options!r}: {e}") from None


def _text_items(values, what: str, *, paths: bool = False) -> list[str]:
    """``values`` (str or paths; one of them alone is one item, an empty one none) as a list
    of str; ``NbjitCompileError`` naming ``what`` and the item that is not one."""
    if type(values) is tuple and not values:  # (the default)
        return []
    if isinstance(values, str) or (paths and isinstance(values, os.PathLike)):
        values = (values,)
    kind = "path" if paths else "str"
    try:
        items = list(values)
    except TypeError:
        raise NbjitCompileError(f"{what} must be a list of {'paths' if paths else 'str'}, not "
                                f"{type(values).__name__}") from None
    out = []
    for v in items:
        if isinstance(v, os.PathLike):
            v = os.fspath(v)
        if not isinstance(v, str):
            raise NbjitCompileError(f"{what}: {v!r} ({type(v).__name__}) is not a {kind}")
        if v.strip():  # (an empty one is none, as NVRTC's options go)
            out.append(v)
    return out


MAX_OPTIONS = 4096


MAX_OPTION_BYTES = 1 << 20


def _check_encodable(text: str, what: str, name: str) -> None:
    """``text`` goes to NVRTC as UTF-8: a lone surrogate (from a file name read with
    ``surrogateescape``, say) cannot, and is named with its position."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        where = f"{what} {text[:60]!r}" if what != "source" else "the source"
        at = f" (line {text.count(chr(10), 0, e.start) + 1})" if what == "source" else ""
        raise NbjitCompileError(f"{name}: {where} holds {text[e.start]!r}{at}, which is not Unicode text (a lone "
                                "surrogate): it cannot be given to NVRTC") from None


def _headers(headers) -> dict[str, str]:
    """``headers`` checked: {include name: text}, both str."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise NbjitCompileError(f"headers must be a dict {{include name: text}}, not {type(headers).__name__}")
    for k, v in headers.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise NbjitCompileError(f"headers: {k!r} -> {type(v).__name__}: both the include name and the header's "
                                    "text must be str")
    return dict(headers)


def _arch_for(arch: "Arch | str | None", name: str) -> Arch:
    """The architecture a compile is for: ``arch`` (an ``Arch``, or its text) checked; an
    ``NbjitCompileError`` naming ``name`` where it is missing or not an architecture."""
    if type(arch) is Arch:
        return arch
    if arch is None:
        raise NbjitCompileError(
            f"{name}: no architecture to compile for: give arch= (e.g. 'sm_90')")
    a = arch.strip().lower() if isinstance(arch, str) else None  # (as the command line reads --arch SM_90)
    if a is None or not _ARCH_NAME.fullmatch(a):
        raise NbjitCompileError(f"{name}: arch {arch!r} is not an architecture (expected e.g. 'sm_90', 'sm_90a', "
                                "'compute_90')")
    return Arch.parse(a)


SOURCE_SUFFIXES = (".cu", ".cuh", ".cuda")


IMAGE_SUFFIXES = (".ptx", ".cubin", ".fatbin", ".nbjit")  # (a one-line str ending so is a path, not a source)


MAX_SOURCE_BYTES = 256 << 20


def source_text(source, name: str | None, include_paths) -> tuple[str, str | None, object]:
    """(CUDA C++ text, name, include paths) for ``source`` given as text or as a file: a
    ``pathlib.Path`` or a str naming a ``.cu``/``.cuh`` file (one line, no code). A file's
    name is the default name and its directory is searched first for ``#include "..."``, as
    nvcc does."""
    if type(source) is not str and isinstance(source, os.PathLike):  # (a str skips the ABC: its first check ~10 us)
        path = os.fspath(source)
    elif isinstance(source, str) and "\n" not in source and source.rstrip().lower().endswith(SOURCE_SUFFIXES):
        path = source.rstrip()
    elif isinstance(source, str):
        if "\n" not in source and source.rstrip().lower().endswith(IMAGE_SUFFIXES):
            raise NbjitCompileError(f"{source.rstrip()!r} names compiled code, not CUDA C++: load it with "
                                    "nbjit.load(path) (compile_image compiles CUDA C++ source text or a .cu file)")
        return source, name, include_paths
    else:
        raise NbjitCompileError(f"source must be CUDA C++ text (str) or a .cu file's path, not "
                                f"{type(source).__name__}")
    path = os.fsdecode(path)
    try:
        raw = read_regular(path, MAX_SOURCE_BYTES)
    except FileNotFoundError:
        raise NbjitCompileError(f"{path}: no such file" + ("" if isinstance(source, os.PathLike) else
                                f" (a str ending in {'/'.join(SOURCE_SUFFIXES)} is taken as a source file's path; "
                                "pass the file's text to compile it as text)")) from None
    except OSError as e:
        raise NbjitCompileError(f"{path}: cannot read it as CUDA source: {e.strerror or e}") from None
    except ValueError as e:
        raise NbjitCompileError(f"{path}: cannot read it as CUDA source: {e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NbjitCompileError(f"{path}: not UTF-8 text (byte {e.start}): CUDA source must be UTF-8") from None
    here = os.path.dirname(os.path.abspath(path))
    if isinstance(include_paths, (str, os.PathLike)):
        include_paths = (include_paths,)
    try:
        include_paths = (here, *include_paths)
    except TypeError:  # not a list of paths: the request's check names it
        pass
    return text, name if name is not None else os.path.basename(path), include_paths


def read_once(values):
    """``values`` as a tuple where reading it would use it up (a generator, an iterator); as
    it is otherwise (a str, a list, something that is not a list: checked later)."""
    if type(values) in _NOT_ITERATORS:  # (no check against Iterator, whose first costs a warm start ~10 us)
        return values
    return tuple(values) if isinstance(values, Iterator) else values


_NOT_ITERATORS = (tuple, list, str, type(None))


@record
class CompileRequest:
    """One NVRTC compile as data: what ``_key`` hashes and ``_run_nvrtc`` runs."""

    source: str
    name: str
    expressions: tuple[str, ...]
    headers: tuple[tuple[str, str], ...]
    options: tuple[str, ...]  # normalised, with CUDA's and CCCL's include directories
    user_dirs: tuple[str, ...]  # the user's include directories (their files go in the key)
    arch: Arch
    output: str
    pch: str = "off"  # "auto", "on" or "off": whether NVRTC makes or uses a PCH (not in the key)
    cache_dir: str | None = None  # where PCH files go (not in the key)


def _request(source: str, name: str | None, name_expressions, headers, include_paths, options, arch,
             output: str, pch: str = "off", cache_dir=None) -> CompileRequest:
    """The compile request, checked, with options normalised (no NVRTC needed)."""
    if output not in ("auto", "cubin", "ptx"):
        raise NbjitCompileError(f"output must be 'auto', 'cubin' or 'ptx', not {output!r}")
    if name is not None and not isinstance(name, str):
        raise NbjitCompileError(f"name must be the source's name (str), not {type(name).__name__}")
    include_paths = _text_items(include_paths, "include_paths", paths=True)
    options, name_expressions = _text_items(options, "options"), _text_items(name_expressions, "name_expressions")
    headers = _headers(headers)
    label = name or "kernel.cu"
    if len(options) > MAX_OPTIONS or sum(map(len, options)) > MAX_OPTION_BYTES:
        raise NbjitCompileError(f"{label}: {len(options)} options ({sum(map(len, options))} characters): more than "
                                f"NVRTC is given ({MAX_OPTIONS} options, {MAX_OPTION_BYTES >> 10} KiB); NVRTC crashed "
                                "on millions")
    for what, texts in (("source", (source,)), ("name", (label,)), ("options", options),
                        ("name_expressions", name_expressions), ("include_paths", include_paths),
                        ("headers", [t for kv in headers.items() for t in kv])):
        for t in texts:
            _check_encodable(t, what, label)
    a = _arch_for(arch, label)
    if output == "cubin" and a.virtual:
        raise NbjitCompileError(f"{label}: a cubin needs a real architecture (sm_XX), not {a}")
    opts = normalize_options([*(f"--include-path={p}" for p in include_paths), *options])
    if wants_sources(opts) and QUOTED_INCLUDE.search(source):
        # NVRTC looks for "..." includes in its program's directory first; with line information the
        # program is named by a placeholder (cache.sources), so the source's own directory is said
        here = f"--include-path={os.path.abspath(os.path.dirname(label) or '.')}"
        opts = opts if here in opts else [here, *opts]
    ours = [f"--include-path={d}" for d in (cuda_include_dir(), cccl_include_dir()) if d]
    user_dirs = tuple(o.split("=", 1)[1] for o in opts if o.startswith("--include-path=") and o not in ours)
    opts += [o for o in ours if o not in opts]  # CUDA's headers, then CCCL's (<cub/...>, <cuda/std/...>)
    return CompileRequest(source, name or "kernel.cu", tuple(name_expressions), tuple(sorted(headers.items())),
                          tuple(opts), user_dirs, a, output, pch, None if cache_dir is None else os.fspath(cache_dir))
