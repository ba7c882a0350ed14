"""Linking with link-time optimisation: a CUDA C++ source compiled by NVRTC to LTO-IR, linked
by nvJitLink (``-lto``) into one cubin with Python device functions that Numba compiles to
LTO-IR, LTO-IR files, more CUDA C++ sources and relocatable device code (cubins, host objects,
fatbins, libraries, PTX). Each step goes through the cache; no GPU is needed when ``arch`` is
given. The rules for the C++ side are in docs/compiling.md ("Linking")."""
from __future__ import annotations

import builtins
import dataclasses
import functools
import glob
import os
import re
import sys
import types
from typing import Any, Iterable, Mapping

from nbjit.files import read_file
from nbjit.arch import Arch
from nbjit.cache.entries import CacheEntry, cache_key
from nbjit.cache.sources import merged, portable
from nbjit.cache.store import Cache, default_cache
from nbjit.errors import LinkFailure, NbjitCompileError, NbjitError, install_hint, warn
from nbjit.params.cdecl import CParam, scalar_facts, shown_name
from nbjit.params.declarations import DeviceDeclaration, device_declarations, parse_ctype
from nbjit.read.image import Image, content_digest
from nbjit.records import record
from nbjit.toolchain import identity, nvjitlink, nvrtc, request
from nbjit.toolchain import pch as _pch

__all__ = ["link_image"]

_C_NAME = re.compile(r"[A-Za-z_]\w*")
_PTX_VERSION = re.compile(r"^[ \t]*\.version[ \t]+\d+\.\d+", re.M)
_LTOIR = b"\xed\x43\x4e\x7f"  # NVVM LTO-IR (NVRTC/nvcc -dlto, Numba output="ltoir")
_FATBIN = b"\x50\xed\x55\xba"
_ARCHIVE = b"!<arch>\n"
_BITCODE = (b"BC\xc0\xde", b"\xde\xc0\x17\x0b")
# suffixes that make a one-line str a file's path (else it is CUDA C++ or PTX text)
_FILE_SUFFIXES = (*request.SOURCE_SUFFIXES, ".ltoir", ".lto", ".cubin", ".o", ".obj", ".a", ".fatbin", ".ptx")
_UNDEFINED = re.compile(r"Undefined reference to '([^'\n]+)'|Unresolved extern function '([^'\n]+)'")
_TWICE = re.compile(r"globals named '([^'\n]+)': symbol multiply defined|Multiple definition of '([^'\n]+)'")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Numba's error colours


@record
class _Input:
    """One link input, read: its kind ("python", "source" or one of nvJitLink's
    ``nvjitlink.LINK_INPUT_KINDS``), its label in messages (and in nvJitLink's log), and what
    it holds."""

    kind: str
    label: str
    data: bytes = b""
    text: str = ""
    dirs: tuple[str, ...] = ()  # a source file's directory (searched first, as nvcc does)
    func: Any = None
    signature: Any = None
    symbol: str = ""

    @property
    def signature_text(self) -> str:
        return self.signature if isinstance(self.signature, str) else str(self.signature)


def _is_python(x: object) -> bool:
    """Whether ``x`` is ``(function, signature)`` or ``(function, signature, name)``."""
    return isinstance(x, tuple) and 2 <= len(x) <= 3 and callable(x[0]) and not isinstance(x[0], type)


def _inputs(link: object) -> tuple[_Input, ...]:
    """The link inputs, each read and told apart (one input alone is one item)."""
    if isinstance(link, (str, bytes, bytearray, memoryview, os.PathLike)) or _is_python(link):
        link = (link,)
    try:
        items = list(link)  # type: ignore[call-overload]
    except TypeError:
        raise NbjitCompileError(f"link must be a list of inputs, not {type(link).__name__}") from None
    return tuple(_input(x, i) for i, x in enumerate(items))


def _input(x: object, i: int) -> _Input:
    where = f"link[{i}]"
    if _is_python(x):
        func, sig, *rest = x  # type: ignore[misc]
        py = getattr(func, "py_func", func)
        symbol = rest[0] if rest else getattr(py, "__name__", "")
        if not isinstance(symbol, str) or not _C_NAME.fullmatch(symbol):
            raise NbjitCompileError(f"{where}: {symbol!r} is not a C name to link the Python function by: give the "
                                    "name its extern \"C\" __device__ declaration has, (function, signature, 'name')")
        if not isinstance(sig, str) and not hasattr(sig, "args") and not isinstance(sig, tuple):
            raise NbjitCompileError(f"{where}: the signature of {getattr(py, '__qualname__', py)!r} is "
                                    f"{type(sig).__name__}, not a Numba signature ('float32(float32, float32)')")
        label = f"{getattr(py, '__qualname__', repr(py))} (Python, as {symbol})"
        return _Input("python", label, func=func, signature=sig, symbol=symbol)
    if isinstance(x, (bytes, bytearray, memoryview)):
        return _from_bytes(bytes(x), f"{where} ({len(x)} bytes)", f"link{i}.cu")
    if isinstance(x, os.PathLike) or (isinstance(x, str) and "\n" not in x and (
            x.rstrip().lower().endswith(_FILE_SUFFIXES) or os.path.isfile(x))):
        return _from_path(os.fsdecode(os.fspath(x)).rstrip(), where)
    if isinstance(x, str):
        if _PTX_VERSION.search(x):
            return _Input("ptx", f"{where} (PTX)", data=x.encode().rstrip(b"\0") + b"\0")
        return _Input("source", f"link{i}.cu", text=x)
    if callable(x):
        name = getattr(getattr(x, "py_func", x), "__name__", "f")
        raise NbjitCompileError(f"{where}: a Python function is linked with its signature: ({name}, "
                                "'float32(float32, float32)'), or (function, signature, 'C name')")
    raise NbjitCompileError(f"{where}: {type(x).__name__} is not a link input: give (function, signature), LTO-IR, "
                            "CUDA C++ (text or a .cu path), a relocatable cubin, a host object or library, a fatbin "
                            "or PTX (bytes or a path)")


def _from_path(path: str, where: str) -> _Input:
    if path.lower().endswith(request.SOURCE_SUFFIXES):
        text, name, dirs = request.source_text(path, None, ())
        return _Input("source", name or path, text=text, dirs=tuple(dirs))
    data = read_file(path, NbjitCompileError, f"{where}: {path}")
    return _from_bytes(data, path, os.path.basename(path))


def _from_bytes(data: bytes, label: str, source_name: str) -> _Input:
    """An input of the kind ``data`` holds, told by content."""
    head = data[:64]
    if head.startswith(_LTOIR):
        return _Input("ltoir", label, data)
    if head.startswith(b"\x7fELF"):
        if len(head) >= 20 and int.from_bytes(head[18:20], "little") == 190:
            if int.from_bytes(head[16:18], "little") != 1:  # ET_REL: relocatable device code
                raise NbjitCompileError(
                    f"{label}: a linked (executable) cubin: nvJitLink links relocatable device code only; build it "
                    "with -rdc=true (nvcc -cubin -rdc=true, or -dc), or give its LTO-IR (nvcc -dlto)")
            return _Input("cubin", label, data)
        return _Input("object", label, data)  # a host object: nvJitLink takes its device code
    if head.startswith(_FATBIN):
        return _Input("fatbin", label, data)
    if head.startswith(_ARCHIVE):
        return _Input("library", label, data)
    if head.startswith(_BITCODE):
        raise NbjitCompileError(f"{label}: LLVM bitcode (NVVM IR), which nvJitLink does not link: give LTO-IR "
                                "(NVRTC or nvcc -dlto, Numba output='ltoir')")
    sample = data[: 1 << 16]
    if b"\0" not in sample.rstrip(b"\0"):
        text = data.rstrip(b"\0").decode("utf-8", errors="replace")
        if _PTX_VERSION.search(text):
            return _Input("ptx", label, data.rstrip(b"\0") + b"\0")
        if re.search(r"__device__|__global__|#include", text):
            return _Input("source", source_name, text=text)
    raise NbjitCompileError(f"{label}: not a link input nbjit knows (starts with {head[:8].hex(' ')}): LTO-IR, a "
                            "relocatable cubin, a host object, a fatbin, a library (.a), PTX or CUDA C++")


# ------------------------------------------------------------------ Python functions (Numba)


class _Opaque(Exception):
    """A value whose effect on Numba's output nbjit cannot tell."""


# modules whose functions Numba types by its own rules (their versions are in the key)
_LIBRARIES = ("math", "cmath", "operator", "builtins", "numpy", "numba", "llvmlite")
_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _library(module: object) -> bool:
    return isinstance(module, str) and any(module == m or module.startswith(m + ".") for m in _LIBRARIES)


def fingerprint(func: object) -> str | None:
    """What decides Numba's output for a Python function besides its signature, as a digest:
    its code (bytecode, constants, names, nested functions), the values of the globals,
    closure cells and defaults it reads, and the same for the device functions it calls; None
    where any of them is something whose effect nbjit cannot tell (a plain Python function, an
    object of a user's class, a user's module): then Numba compiles it in every process."""
    try:
        return content_digest(repr(_function(func, set())).encode())
    except (_Opaque, RecursionError, ValueError):
        return None


def _function(f: object, seen: set) -> tuple:
    options = getattr(f, "targetoptions", None)
    if getattr(f, "py_func", None) is not None and _library(type(f).__module__):  # a Numba dispatcher
        return ("dispatcher", repr(sorted((str(k), repr(v)) for k, v in dict(options or {}).items())),
                _function(f.py_func, seen))  # type: ignore[attr-defined]
    if not isinstance(f, types.FunctionType):
        raise _Opaque(f)
    if id(f) in seen:
        return ("again", f.__module__, f.__qualname__)
    seen.add(id(f))
    code = f.__code__
    names: set[str] = set()
    out = [("function", f.__module__, f.__qualname__), _code(code, names),
           ("defaults", _value(f.__defaults__, seen), _value(tuple(sorted((f.__kwdefaults__ or {}).items())), seen))]
    for cell in f.__closure__ or ():
        out.append(("cell", _value(cell.cell_contents, seen)))  # (an empty cell: ValueError, opaque)
    g = f.__globals__
    for name in sorted(names):
        if name in g:
            out.append((name, _value(g[name], seen)))
        elif hasattr(builtins, name):
            out.append((name, "builtin"))
        # else an attribute's name (math.sin's "sin"), decided by the object it is read from
    return tuple(out)


def _code(code: types.CodeType, names: set) -> tuple:
    names.update(code.co_names)
    consts = tuple(_code(c, names) if isinstance(c, types.CodeType) else (type(c).__name__, repr(c))
                   for c in code.co_consts)
    return (code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
            code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
            getattr(code, "co_exceptiontable", b""), code.co_filename, code.co_firstlineno)


def _value(v: object, seen: set) -> object:
    if isinstance(v, _PLAIN):
        return (type(v).__name__, repr(v))
    if isinstance(v, tuple):
        return ("tuple", tuple(_value(x, seen) for x in v))
    if isinstance(v, types.ModuleType):
        if not _library(v.__name__):
            raise _Opaque(v)
        return ("module", v.__name__)
    kind = type(v).__module__
    if kind == "numpy" and hasattr(v, "dtype"):  # an array (Numba freezes it as a constant) or a scalar
        if hasattr(v, "tobytes") and hasattr(v, "shape") and getattr(v, "ndim", 0):
            return ("array", v.dtype.str, tuple(v.shape), content_digest(v.tobytes()))  # type: ignore[attr-defined]
        return ("scalar", v.dtype.str, repr(v))  # type: ignore[attr-defined]
    if getattr(v, "py_func", None) is not None and _library(kind):  # a Numba dispatcher
        if _library(getattr(v.py_func, "__module__", None)):  # type: ignore[attr-defined]
            return ("library dispatcher", v.py_func.__module__, v.py_func.__qualname__)  # type: ignore[attr-defined]
        return _function(v, seen)
    if isinstance(v, type) and _library(v.__module__):
        return ("type", v.__module__, v.__qualname__)
    if _library(getattr(v, "__module__", None)) and callable(v) and not isinstance(v, types.FunctionType):
        return ("library function", v.__module__, getattr(v, "__qualname__", getattr(v, "__name__", repr(v))))
    if isinstance(v, types.FunctionType) and _library(v.__module__):
        return ("library function", v.__module__, v.__qualname__)
    if kind.split(".")[:3] == ["numba", "core", "types"]:  # float32 and friends, used to cast (a name read, no import)
        return ("numba type", str(v))
    raise _Opaque(v)


@functools.lru_cache(maxsize=None)
def _numba_versions() -> dict:
    """The versions of Numba and what it compiles with: the imported packages' own, else
    their installed distributions' (reading those costs ~80 ms; no import of numba)."""
    out = {}
    for dist, module in (("numba-cuda", "numba_cuda"), ("numba", "numba"), ("llvmlite", "llvmlite")):
        version = getattr(sys.modules.get(module), "__version__", None)
        if not isinstance(version, str):
            from importlib import metadata
            try:
                version = metadata.version(dist)
            except metadata.PackageNotFoundError:
                version = None
        out[dist] = version
    return out


@functools.lru_cache(maxsize=None)
def _nvvm_id() -> list[str]:
    """The identity of the libNVVM copies Numba may load (each file's GNU build ID): the
    wheels' (nvidia/cu13/lib, nvidia/cuda_nvcc/nvvm/lib64) and CUDA_HOME's."""
    dirs = [f"{n}/{sub}" for n in identity._nvidia_dirs() for sub in ("cu13/lib", "cu12/lib", "cuda_nvcc/nvvm/lib64")]
    dirs += [f"{os.environ[v]}/nvvm/lib64" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    return sorted({identity._library_id(f) for d in dirs for f in glob.glob(f"{glob.escape(d)}/libnvvm.so*")})


def _numba_key(inp: _Input, fp: str, cc: tuple[int, int]) -> str:
    return cache_key({
        "producer": "numba-ltoir", "numba": _numba_versions(), "nvvm": _nvvm_id(),
        "python": list(sys.version_info[:2]), "function": fp, "signature": inp.signature_text,
        "name": inp.symbol, "cc": list(cc),
        "env": sorted((k, v) for k, v in os.environ.items() if k.startswith("NUMBA_")),
    })


def _python_ltoir(inp: _Input, cc: tuple[int, int], cache: Cache) -> tuple[bytes, str, tuple[str, ...]]:
    """(LTO-IR, C return type, C parameter types) of a Python input: in this process once
    per function as it is now; across processes through the cache where its fingerprint can
    be taken."""
    fp = fingerprint(inp.func)
    call = ("numba-ltoir", fp if fp is not None else inp.func, inp.signature_text, inp.symbol, cc)
    hit = cache.recall(call)
    if hit is not None:
        return hit  # type: ignore[return-value]
    if fp is None:
        out = _numba_compile(inp, cc)
    else:
        def make() -> CacheEntry:
            data, returns, params = _numba_compile(inp, cc)
            v = _numba_versions()
            return CacheEntry("ltoir", str(Arch.parse(cc, virtual=True)), data, {}, "", f"numba-cuda {v['numba-cuda']}",
                              meta={"returns": returns, "params": list(params)})

        key = _numba_key(inp, fp, cc)
        entry = cache.get_or_create(key, make)
        returns, params = entry.meta.get("returns"), entry.meta.get("params")
        if not isinstance(returns, str) or not isinstance(params, list) or \
                not all(isinstance(p, str) for p in params):  # not what make() writes: compile afresh
            entry = make()
            cache.write(key, entry, refresh=True)
            returns, params = entry.meta["returns"], entry.meta["params"]
        out = (entry.payload, returns, tuple(params))
    cache.remember(call, out)
    return out


def _numba_compile(inp: _Input, cc: tuple[int, int]) -> tuple[bytes, str, tuple[str, ...]]:
    try:
        from nbjit.gpu.host import host_of
        from nbjit.params.numba_abi import NumbaAbiError, device_ltoir
    except ImportError as e:
        raise NbjitCompileError(f"{inp.label}: compiling a Python function needs Numba ({e}): install "
                                f"{install_hint('cu13')}") from None
    try:
        return device_ltoir(inp.func, inp.signature, inp.symbol, cc, host_of(inp.func))  # (a dispatcher's own)
    except NumbaAbiError as e:
        raise NbjitCompileError(f"{inp.label}: {e}") from None
    except NbjitError:
        raise
    except Exception as e:  # Numba's typing and lowering errors, its signature parser's
        text = "\n".join(_ANSI.sub("", str(e)).strip().splitlines()[:12])
        hint = ""
        if type(e).__name__ == "CudaSupportError":  # (numba-cuda 0.30: a called dispatcher asks for the device)
            hint = ("\nNumba compiles the @cuda.jit device functions a function calls for the current device, "
                    "which needs a GPU and driver; a function that calls none (math, numpy and operators are fine) "
                    "compiles without one")
        raise NbjitCompileError(f"{inp.label}: Numba could not compile it for {inp.signature_text} (compute "
                                f"capability {cc[0]}.{cc[1]}): {type(e).__name__}: {text}{hint}") from e


# ------------------------------------------------------------------ C++ (NVRTC)


def _nvrtc_ltoir(text: str, name: str, exprs, headers, include_paths, options, arch: Arch, pch, cache: Cache):
    """NVRTC's LTO-IR of a source (through the cache, under ``compile_image``'s key with
    ``-dlto`` and output "ltoir"): (CacheEntry, CompileRequest, whether a repeated call reads
    the same files: ``IncludeWalk.repeatable``)."""
    req = request._request(text, name, exprs, headers, include_paths, options, arch, "cubin", pch, cache.path)
    opts = req.options if "-dlto" in req.options else (*req.options, "-dlto")
    req = dataclasses.replace(req, output="ltoir", options=opts)
    walk = nvrtc.includes_of(req)
    if walk.unknown is not None:
        warn(nvrtc.uncached_warning(req.name, walk.unknown))
        cache = Cache(None)
    return cache.get_or_create(nvrtc._key(req, walk), lambda: nvrtc._run_nvrtc(req)), req, walk.repeatable


# ------------------------------------------------------------------ declarations


def _same(declared: CParam, spelled: str) -> bool:
    """Whether a declared C type is the type Numba's C ABI passes as ``spelled`` (True where
    the declared type is one nbjit cannot read: a typedef, a struct)."""
    want = parse_ctype(spelled)
    if want is None or declared.pointer != want.pointer:
        return want is None
    if "void" in (declared.base, want.base):
        return declared.pointer or declared.base == want.base
    a, b = scalar_facts(declared.base), scalar_facts(want.base)
    return a is None or b is None or a == b


def _mismatch(d: DeviceDeclaration, returns: str, params: tuple[str, ...]) -> str | None:
    if d.returns is not None and not _same(d.returns, returns):
        return f"it returns {d.returns.text}, the Python function {returns}"
    if d.params is None:
        return None
    if len(d.params) != len(params):
        return f"it has {len(d.params)} parameters, the Python function {len(params)}"
    for i, (p, want) in enumerate(zip(d.params, params)):
        if not _same(p, want):
            return f"its parameter {i + 1} is {p.text}, the Python function's {want}"
    return None


def _check_declarations(pythons, decls: Mapping[str, Mapping[str, DeviceDeclaration]]) -> None:
    """Each Python function's C types against the ``extern "C"`` declarations of it that the
    C++ inputs hold (a mismatch links without a word and computes garbage)."""
    for inp, returns, params in pythons:
        for label, ds in decls.items():
            d = ds.get(inp.symbol)
            problem = d and _mismatch(d, returns, params)
            if problem:
                want = f'extern "C" __device__ {returns} {inp.symbol}({", ".join(params)});'
                raise NbjitCompileError(
                    f"{inp.label}: {label}:{d.line} declares {d.text}; but {problem} (Numba compiled it for "
                    f"{inp.signature_text}). Declare it so: {want} (or give the signature the declaration has)")


# ------------------------------------------------------------------ the link


def _target(arch: "Arch | str | None", name: str) -> Arch:
    if arch is None:  # the current device's (the one case that needs a GPU)
        from nbjit.gpu.host import current_host
        arch = current_host().device_arch()
    a = request._arch_for(arch, name)
    if a.virtual:
        raise NbjitCompileError(f"{name}: arch {a}: a link makes a cubin, for a real architecture (sm_90, sm_90a), "
                                "not a virtual one")
    return a


def _explain(e: LinkFailure, pythons, decls, producers: Mapping[str, str]) -> LinkFailure:
    """nvJitLink's failure, with what a person needs: for a symbol no input defines, which
    declaration asks for it; for one defined twice, which inputs define it; else who made
    each input."""
    undefined = list(dict.fromkeys(a or b for a, b in _UNDEFINED.findall(e.log)))
    python = {inp.symbol: inp for inp, _, _ in pythons}
    named = ", ".join(f"{inp.label.split(' ')[0]} as {sym!r}" for sym, inp in python.items())
    lines = []
    for sym in undefined:
        where = [f"{label}:{ds[sym].line} declares {ds[sym].text}" for label, ds in decls.items() if sym in ds]
        text = f"no input defines {sym!r}"
        if where:
            text += ", which " + "; ".join(where)
        elif sym.startswith("_Z"):
            text += f" ({shown_name(sym) or 'a C++ name'}): a C++ (mangled) name, so its declaration lacks " \
                    "extern \"C\""
        else:
            text += " (declared in a header or a macro nbjit does not read)"
        if named:
            text += f"; the Python functions are linked as: {named}"
            if len(python) == 1 and not sym.startswith("_Z"):
                inp = next(iter(python.values()))
                text += f" (to link it as {sym!r}: ({inp.label.split(' ')[0]}, {inp.signature_text!r}, {sym!r}))"
        lines.append(text)
    for sym in dict.fromkeys(a or b for a, b in _TWICE.findall(e.log)):
        by = [python[sym].label] if sym in python else []
        by += [f"{label}:{ds[sym].line}" for label, ds in decls.items() if sym in ds and ds[sym].defines]
        lines.append(f"more than one input defines {sym!r}" + (f": {', '.join(by)}" if by else ""))
    if not lines and e.log:  # (none where nvJitLink refused its options)
        made = [f"{label} (made by {p})" for label, p in producers.items() if p]
        if made:  # (LTO-IR from a newer CUDA than nvJitLink's is a common cause)
            lines.append(f"the inputs: {', '.join(made)}; nvJitLink {_version_text()} links LTO-IR of its own CUDA "
                         "version or older")
    text = f"{e}\n" + "\n".join(lines)
    return LinkFailure(text.rstrip(), log=e.log, input=e.input, inputs=e.inputs, undefined=tuple(undefined),
                       error=e.error)


def _version_text() -> str:
    v = nvjitlink.nvjitlink_version()
    return f"{v[0]}.{v[1]}" if v else "?"


def link_image(source: str | os.PathLike, link: Iterable[Any] | Any, *, name: str | None = None,
               name_expressions: Iterable[str] = (), headers: Mapping[str, str] | None = None,
               include_paths: Iterable[str] = (), options: Iterable[str] = (), arch: str | None = None,
               link_options: Iterable[str] = (), cache: Cache | None = None,
               pch: bool | str | None = None) -> Image:
    """Compile CUDA C++ with NVRTC to LTO-IR and link it with ``link`` by nvJitLink (``-lto``)
    into one cubin: an ``Image``, loading nothing (no GPU needed when ``arch`` is given).

    Parameters
    ----------
    source: CUDA C++ text or a ``.cu`` path, as for ``compile_image``. It declares what it
        calls from the other inputs ``extern "C" __device__`` (``float op(float, float);``).
    link: the inputs linked with it, each one of
        ``(function, signature)`` or ``(function, signature, name)``: a Python function or
        ``@cuda.jit(device=True)`` dispatcher compiled by Numba with the C ABI as the C function
        ``name`` (default: its ``__name__``); ``signature`` as Numba writes it,
        ``"float32(float32, float32)"``;
        LTO-IR (bytes or an ``.ltoir`` file, from ``-dlto``);
        CUDA C++ (text, or a ``.cu`` path), compiled to LTO-IR as ``source`` is (same options,
        headers, include paths);
        relocatable device code: a cubin built with ``-rdc=true``, a host object or library
        (``.o``, ``.a``), a fatbin (its LTO-IR or relocatable cubin), PTX.
        One input alone (a tuple, a path, bytes) is one item.
    name, name_expressions, headers, include_paths, options, pch: as for ``compile_image``
        (``module["reduce<Op>"]`` finds a template instantiated by a name expression).
    arch: the real architecture to link for (``"sm_90"``, ``"sm_90a"``); default: the
        current device's.
    link_options: more nvJitLink options (``"-ftz=1"``, ``"-maxrregcount=64"``, ``"-lineinfo"``).
    cache: a ``nbjit.Cache`` (default: ``nbjit.default_cache()``). The cubin's key holds every
        input's digest, the link options and the toolchains (NVRTC, nvJitLink, Numba); a Python
        function's LTO-IR is kept under its code's fingerprint (see docs/compiling.md).

    Returns
    -------
    Image: the linked cubin, with ``lowered_names`` for ``name_expressions``.

    Raises
    ------
    NbjitCompileError: an input nbjit cannot link (named, with what to give instead), a Python
    function Numba cannot compile (its error), an ``extern "C"`` declaration whose types differ
    from the Python function's; ``CompileFailure`` where NVRTC rejects a source; ``LinkFailure``
    where nvJitLink refuses an input or the link (its log; a symbol no input defines is named
    with the declaration that asks for it).
    """
    text, name, include_paths = request.source_text(source, name, include_paths)
    if cache is not None and not isinstance(cache, Cache):
        raise NbjitCompileError(f"cache must be an nbjit.Cache (or None for the default), not {type(cache).__name__}")
    cache = cache or default_cache()
    exprs = request.read_once(request.one_or_many(name_expressions))
    options, include_paths = request.read_once(request.option_list(options)), request.read_once(include_paths)
    link_opts = tuple(request._text_items(request.read_once(request.option_list(link_options)), "link_options"))
    bad = [o for o in link_opts if o.startswith("-arch")]
    if bad:
        raise NbjitCompileError(f"link_options: give the architecture as arch=..., not {bad[0]!r}")
    target = _target(arch, name or "<source>")
    inputs = _inputs(request.read_once(link))
    if pch is not None:  # (before the first level, which does not hold it)
        _pch.check_arg(pch)
    call = _memo_key(text, name, exprs, headers, include_paths, options, target, link_opts, inputs)
    hit = cache.recall(call) if call is not None else None
    if hit is not None:
        return hit  # type: ignore[return-value]

    return _link(call, text, name, exprs, headers, include_paths, options, target, link_opts, inputs, pch, cache)


def _link(call, text, name, exprs, headers, include_paths, options, target, link_opts, inputs, pch,
          cache) -> Image:
    """``link_image`` past the memo: each input made LTO-IR (through the cache), the key of
    the link, the linked cubin found or made by nvJitLink, remembered for ``call`` where no
    source read a header on disk."""
    pch_mode = _pch.pch_mode(pch)
    main, req, again = _nvrtc_ltoir(text, name, exprs, headers, include_paths, options, target, pch_mode, cache)
    parts, decls, producers, pythons, same, kept = _lto_parts(
        main, req, text, inputs, headers, include_paths, options, target, pch_mode, cache)
    again = again and same
    kept["sources"], kept["swaps"] = merged(kept["sources"], kept["swaps"])
    _check_declarations(pythons, decls)
    key = cache_key({
        "producer": "nvjitlink-lto", "toolchain": identity._toolchain_fingerprint("nvJitLink"),
        "nvrtc": identity._toolchain_fingerprint(),  # (each library by its build: no need to load either)
        "numba": _numba_versions() if pythons else None, "arch": str(target), "options": list(link_opts),
        "inputs": [[kind, content_digest(data)] for kind, data, _ in parts],
        "lowered_names": sorted(main.lowered_names.items()),
        # (line tables that name cache.sources' placeholders: the entry keeps their texts)
        **({"sources": ["nbjit-sources/2", sorted((k, content_digest(v.encode("utf-8", "surrogatepass")))
                                                   for k, v in kept["sources"].items())]} if kept["sources"] else {}),
    })

    def make() -> CacheEntry:
        try:
            out = nvjitlink.nvjitlink_cubin(parts, target, options=("-lto", *link_opts))
        except LinkFailure as e:
            raise _explain(e, pythons, decls, producers) from None
        made = ", ".join(dict.fromkeys(p for p in producers.values() if p))
        return CacheEntry("cubin", str(target), portable(out.data, kept["swaps"]), dict(main.lowered_names), out.log,
                          f"nvJitLink {_version_text()} -lto ({made})",
                          meta={"sources": kept["sources"]} if kept["sources"] else {})

    entry = cache.get_or_create(key, make, lambda e: nvrtc._derive_facts(e, req))
    img = nvrtc._image(entry, req)
    if call is not None and again:  # (not where a source reads a header on disk: it may change)
        cache.remember(call, img)
    return img


def _lto_parts(main, req, text, inputs, headers, include_paths, options, target, pch_mode, cache):
    """The link's parts as ``(kind, data, label)``: the main source's LTO-IR, then each input's
    (a source compiled by NVRTC as the main one is, a Python function by Numba, the rest as
    given); with each source's ``extern "C"`` declarations, each part's producer, the Python
    inputs with their types, whether no source read a header on disk, and what the sources
    compiled with line information keep (``{"sources": {placeholder: text}, "swaps": [...]}``,
    ``cache.sources``)."""
    parts = [("ltoir", main.payload, req.name)]
    kept: dict = {"sources": {}, "swaps": []}
    _keep(kept, main)
    decls = {req.name: device_declarations(text)}
    producers = {req.name: main.producer}
    pythons, again = [], True
    for inp in inputs:
        if inp.kind == "source":
            dirs = (*inp.dirs, *request._text_items(include_paths, "include_paths", paths=True))
            entry, _, same = _nvrtc_ltoir(inp.text, inp.label, (), headers, dirs, options, target, pch_mode, cache)
            again = again and same
            _keep(kept, entry)
            parts.append(("ltoir", entry.payload, inp.label))
            decls[inp.label] = device_declarations(inp.text)
            producers[inp.label] = entry.producer
        elif inp.kind == "python":
            data, returns, params = _python_ltoir(inp, target.cc, cache)
            parts.append(("ltoir", data, inp.label))
            pythons.append((inp, returns, params))
            producers[inp.label] = f"numba-cuda {_numba_versions()['numba-cuda']}"
        else:
            parts.append((inp.kind, inp.data, inp.label))
    return parts, decls, producers, pythons, again, kept


def _keep(kept: dict, entry: CacheEntry) -> None:
    """What NVRTC's LTO-IR ``entry`` keeps of its source and headers, added to ``kept``."""
    meta = entry.meta if isinstance(entry.meta, dict) else {}
    kept["sources"].update(nvrtc._kept(meta.get("sources")))
    swaps = meta.get("swaps")
    if isinstance(swaps, list):
        kept["swaps"] += [tuple(s) for s in swaps
                          if isinstance(s, list) and len(s) == 2 and all(isinstance(v, str) for v in s)]


def _memo_key(text, name, exprs, headers, include_paths, options, target, link_opts, inputs) -> tuple | None:
    """The in-process memo's key of a link call, or None where it cannot have one (include
    directories, whose files may change; unhashable arguments)."""
    if include_paths or any(i.dirs for i in inputs):
        return None
    parts = []
    for i in inputs:
        if i.kind == "python":
            fp = fingerprint(i.func)
            parts.append(("python", fp if fp is not None else i.func, i.signature_text, i.symbol))
        else:
            parts.append((i.kind, i.label, i.data, i.text))
    try:
        call = ("link", text, name, tuple(exprs), tuple(sorted((headers or {}).items())), tuple(options), target,
                link_opts, tuple(parts), id(identity._toolchain_fingerprint()))
        hash(call)
    except Exception:  # something unhashable or of the wrong kind: the long way says what is wrong
        return None
    return call
