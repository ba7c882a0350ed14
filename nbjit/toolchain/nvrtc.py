"""NVRTC: CUDA C++ compiled to a cubin or PTX through the cache (``compile_image``), a
compile as request -> key -> entry -> image (``CompileJob``): the request checked
(``request.py``), what the source reads (``includes.py``), the key (the toolchain's identity:
``identity.py``), the entry found or made, the image with the facts read of it. No GPU
needed: each compile is told the architecture it is for (``nbjit.compile_image``,
``nbjit.compile`` and ``nbjit.compile_many`` fill in the current device's where the caller
names none)."""
from __future__ import annotations

import functools
import os
import re
import signal
import threading
import warnings
from typing import Iterable, Mapping

from nbjit.arch import Arch, existence_problem
from nbjit.cache.entries import CacheEntry, cache_key
from nbjit.cache.facts import Facts
from nbjit.cache.sources import header_dirs, kept_sources, portable, program_name, wants_sources
from nbjit.cache.store import Cache, default_cache
from nbjit.errors import CompileFailure, NbjitCompileError, NbjitWarning, install_hint, warn
from nbjit.params.declarations import source_declarations
from nbjit.params.signature import typed_entries
from nbjit.read.cubin import inspect_cubin
from nbjit.read.image import Image
from nbjit.records import record
from nbjit.toolchain import identity as _identity
from nbjit.toolchain import pch as _pch
from nbjit.toolchain.identity import _cccl, _cuda_headers_id, _toolchain_fingerprint, cccl_include_dir, cuda_include_dir
from nbjit.toolchain.includes import IncludeWalk, walk_includes
from nbjit.toolchain.request import (
    CompileRequest, _request, normalize_options, one_or_many, option_list, read_once, source_text)

__all__ = ["compile_image", "compile_key", "nvrtc_version", "supported_archs", "CompileJob"]


# ------------------------------------------------------------------ NVRTC


def _nvrtc():
    """cuda.bindings' NVRTC module, its library loaded; NbjitCompileError saying what to
    install where it is missing."""
    try:
        from cuda.bindings import nvrtc as N
        N.nvrtcVersion()  # loads the library (cuda.pathfinder raises here when it is missing)
        return N
    except Exception as e:  # ImportError, cuda.pathfinder's DynamicLibNotFoundError, RuntimeError
        why = (str(e).strip().splitlines() or [""])[0][:160]
        raise NbjitCompileError(
            f"NVRTC is not installed ({type(e).__name__}: {why}): it comes with {install_hint('cu13')}; "
            "'cu12' for CUDA 12 drivers, 'mlir' with numba-cuda-mlir instead of numba-cuda"
        ) from None


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC that cuda-bindings loads (as numba-cuda does)."""
    N = _nvrtc()
    err, major, minor = N.nvrtcVersion()
    if err != N.nvrtcResult.NVRTC_SUCCESS:
        raise NbjitCompileError(f"NVRTC is not usable: {err}")
    return major, minor


@functools.lru_cache(maxsize=None)
def supported_archs() -> tuple[int, ...]:
    N = _nvrtc()
    err, archs = N.nvrtcGetSupportedArchs()
    return tuple(archs) if err == N.nvrtcResult.NVRTC_SUCCESS else ()


def compile_image(source: str, *, name: str | None = None, name_expressions: Iterable[str] = (),
                  headers: Mapping[str, str] | None = None, include_paths: Iterable[str] = (),
                  options: Iterable[str] = (), arch: Arch | str | None = None, output: str = "auto",
                  cache: Cache | None = None, pch: bool | str | None = None) -> Image:
    """Compile CUDA C++ with NVRTC to an ``Image`` (cubin or PTX) for ``arch``, loading
    nothing: no GPU is needed where ``arch`` is given.

    Parameters
    ----------
    source: CUDA C++ text, or a ``.cu`` file's path.
    name: the source's name in messages and line info (default ``"kernel.cu"``).
    name_expressions: kernels to instantiate and find by the expression written
        (``"fill<float>"``); their mangled names are in ``image.lowered_names``.
    headers: {include name: text} for ``#include "name"`` without files on disk.
    include_paths: real directories to search.
    options: further NVRTC options (``-std=c++17``, ``-DN=4``, ``--use_fast_math`` ...).
        ``options``, ``name_expressions`` and ``include_paths`` are lists; one str alone is one item
        (options in one str are split as a shell splits them).
    arch: ``"sm_90"``, ``"sm_90a"``, ``"compute_90"`` or an ``Arch``: what to compile for;
        default: the current device's architecture (the one case that needs a GPU).
    output: ``"auto"`` (a cubin where this NVRTC can target the arch, else PTX), ``"cubin"``
        or ``"ptx"``.
    cache: a ``nbjit.Cache`` (default: ``nbjit.default_cache()``).
    pch: NVRTC precompiled headers (12.8+): ``None`` follows ``NBJIT_PCH`` (unset: ``"auto"``,
        for sources that include large headers such as CUB, Thrust or ``cuda/std``); ``True``
        for any source that includes headers; ``False`` never. The first compile of a set of
        headers in a process makes the PCH, later ones use it; the output is the same either
        way (and so is the cache key).

    Raises
    ------
    NbjitCompileError: NVRTC rejected the source (with its log, options and source name), an
    architecture it cannot compile for, or an argument of the wrong kind (named).
    NbjitLoadError: no ``arch`` and no usable GPU (the message says to give ``arch=``).
    """
    if arch is None:
        from nbjit.gpu.host import current_host  # (a named architecture needs no driver, nor Numba)
        arch = current_host().device_arch()
    call = _called(source, name, name_expressions, headers, include_paths, options, arch, output, cache, pch)
    img = call.recalled()
    if img is not None:
        return img
    job = call.job()
    through = getattr(_ROUTE, "make", None)  # (compile_many's process route: job -> entry)
    entry = job.entry(_run_nvrtc) if through is None else through(job)
    return _finish(entry, job)


def compile_key(source: str, *, name: str | None = None, name_expressions: Iterable[str] = (),
                headers: Mapping[str, str] | None = None, include_paths: Iterable[str] = (),
                options: Iterable[str] = (), arch: Arch | str | None = None, output: str = "auto") -> str:
    """The cache key ``compile_image`` files its output under for these arguments (what
    ``nbjit compile --cache-only`` looks for on disk after compiling). ``NbjitCompileError``
    for a source that is never cached (an ``#include`` through a macro)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NbjitWarning)
        job = _called(source, name, name_expressions, headers, include_paths, options, arch, output, Cache(None),
                      None).job()
    if job.walk.unknown is not None:
        raise NbjitCompileError(uncached_warning(job.request.name, job.walk.unknown))
    return job.key


@record(frozen=False, eq=False)
class CompileCall:
    """A ``compile_image`` call, its arguments read once (a generator is read by the memo's
    key and would reach NVRTC empty) and checked as far as the memo of calls needs:
    ``recalled`` asks the memo, ``job`` makes the rest of the request ready.

    Whether a compile was made before is answered in these two steps, in this order: the
    memo of calls (``recalled``: one dictionary look-up in this process, nothing hashed;
    ``nbjit.compile`` keeps its own of the modules a call made, per context), then the
    cache under the compile's key (``CompileJob.entry``: ``Cache.get_or_create`` asks its
    memory, its directory, then its remote tier, under the key's lock)."""

    source: str
    name: str | None
    name_expressions: Iterable[str]
    headers: Mapping[str, str] | None
    include_paths: Iterable[str]
    options: Iterable[str]
    arch: object
    output: str
    pch: object
    cache: Cache
    memo: tuple | None  # the memo's key (None: not remembered, its result may change between calls)

    def recalled(self) -> Image | None:
        """The image this call made before in this process, or None."""
        return None if self.memo is None else self.cache.recall(self.memo)

    def job(self) -> CompileJob:
        """The request checked in full, what the source reads and the key: the job to find or
        make the entry (uncached, with a warning, where a macro names an included file)."""
        req = _request(self.source, self.name, self.name_expressions, self.headers, self.include_paths, self.options,
                       self.arch, self.output, _pch.pch_mode(self.pch), self.cache._root)
        walk = includes_of(req)
        cache = self.cache
        if walk.unknown is not None:
            warn(uncached_warning(req.name, walk.unknown))
            cache = Cache(None)
        return CompileJob(req, walk, _key(req, walk), cache, self.memo if walk.repeatable else None)


@record(frozen=False, eq=False)
class CompileJob:
    """One ``compile_image`` call made ready: the checked request, what the source reads
    (``walk``), the cache key, the cache it goes through, and the memo's key it is
    remembered by (None: not remembered, its result may change between two calls)."""

    request: "CompileRequest"
    walk: IncludeWalk
    key: str
    cache: Cache
    call: tuple | None

    def entry(self, make) -> CacheEntry:
        """The entry of this compile: found (memory, directory, remote tier), or made by
        ``make(request)`` and kept."""
        req = self.request
        return self.cache.get_or_create(self.key, lambda: make(req), lambda e: _derive_facts(e, req))


def _called(source, name, name_expressions, headers, include_paths, options, arch, output, cache,
            pch) -> CompileCall:
    """``compile_image``'s arguments as a ``CompileCall``: the source's text (a path read),
    lists read once, the cache and ``pch`` checked, the memo's key."""
    source, name, include_paths = source_text(source, name, include_paths)
    if pch is not None:  # (before the memo, which does not hold it)
        _pch.check_arg(pch)
    if cache is not None and not isinstance(cache, Cache):
        raise NbjitCompileError(f"cache must be an nbjit.Cache (or None for the default), not {type(cache).__name__}")
    name_expressions, options = read_once(one_or_many(name_expressions)), read_once(option_list(options))
    include_paths = read_once(include_paths)
    memo = _memo_key(source, name, name_expressions, headers, include_paths, options, arch, output)
    return CompileCall(source, name, name_expressions, headers, include_paths, options, arch, output, pch,
                       cache or default_cache(), memo)


def _memo_key(source, name, name_expressions, headers, include_paths, options, arch, output) -> tuple | None:
    """The memo's key of a ``compile_image`` call, its arguments as given; None where it has
    none: with ``include_paths`` (their files may change between calls), or an argument that
    is not hashable (the long way says what is wrong with it)."""
    if include_paths:
        return None
    try:
        call = ("nvrtc", source, name, tuple(name_expressions), tuple(sorted((headers or {}).items())),
                tuple(options), arch, output, id(_identity._FINGERPRINTS))
        hash(call)
    except Exception:
        return None
    return call


def uncached_warning(name: str, directive: str) -> str:
    """What a compile that cannot be cached says."""
    return (f"{name}: {directive} names its file through a macro: nbjit cannot tell which file NVRTC reads, so "
            "this source is compiled every time and never cached (write the header's name in the #include)")


def repeatable(source: str, name: str | None, headers: Mapping[str, str] | None, options: Iterable[str]) -> bool:
    """Whether compiling ``source`` with these arguments reads no file outside CUDA's and
    CCCL's directories, and names each it reads: a repeated call then compiles the same."""
    opts = normalize_options(list(options))
    ours = [d for d in (cuda_include_dir(), cccl_include_dir()) if d]
    user = [o.split("=", 1)[1] for o in opts if o.startswith("--include-path=") and o.split("=", 1)[1] not in ours]
    return walk_includes(source, name or "kernel.cu", dict(headers or {}), user, ours, opts).repeatable


def includes_of(req: "CompileRequest", source: str | None = None) -> IncludeWalk:
    """The files NVRTC reads for ``req`` (or for ``source`` with ``req``'s headers and
    options): CUDA's and CCCL's directories are the toolchain's, the others the user's."""
    ours = [d for d in (cuda_include_dir(), cccl_include_dir()) if d]
    return walk_includes(req.source if source is None else source, req.name, dict(req.headers), req.user_dirs,
                         ours, req.options)


def _finish(entry: CacheEntry, job: CompileJob) -> Image:
    """``compile_image``'s second half: the image of the entry found or made (warned of where
    it holds no kernel), remembered for its call."""
    img = _image(entry, job.request)
    if _no_kernels(img):
        warn(f"{img.name}: NVRTC compiled no kernel (the {img.kind} for {img.arch} holds none): a template kernel is "
             "compiled only where it is instantiated (name_expressions=['kern<float>']; on the command line --expr "
             "'kern<float>'), and a kernel is declared __global__")
    if job.call is not None:
        job.cache.remember(job.call, img)
    return img


def _image(entry: CacheEntry, req: "CompileRequest") -> Image:
    """The ``Image`` of a compile's cache entry, with the facts it carries (where it carries
    none, nbjit could not read the image: the source's declarations alone)."""
    f = entry.facts
    if f is None:
        decls, info, typed, resources = _source_decls(req.source), None, {}, {}
    else:  # (copies: the entry in the cache's memory is shared by every image made from it)
        decls, info, typed, resources = dict(f.declarations), f.info, dict(f.typed), dict(f.resources)
    img = Image(entry.payload, entry.kind, req.name, Arch.parse(entry.arch), dict(entry.lowered_names), entry.log,
                decls, info, typed, resources, sources=_kept(entry.meta.get("sources")))
    if entry.payload_digest:  # hashed once already, checking the entry
        img.__dict__["digest"] = entry.payload_digest
    return img


def _kept(sources) -> dict:
    """An entry's kept sources ({program: text}), where they are what ``cache.sources`` keeps."""
    if not isinstance(sources, dict):
        return {}
    return {k: v for k, v in sources.items() if isinstance(k, str) and isinstance(v, str)}


def _no_kernels(img: Image) -> bool:
    """Whether a compiled image has no kernel (where that can be told without parsing it)."""
    if img.kind == "ptx":
        return _PTX_ENTRY.search(img.data) is None
    return img.info is not None and not img.info.entries


_PTX_ENTRY = re.compile(rb"\.entry\s")


def _source_decls(source: str) -> dict:
    """The kernels' C declarations in ``source``, labelled as an image's declarations are."""
    return {k: ("source", v) for k, v in source_declarations(source).items()}


def _derive_facts(entry: CacheEntry, req: "CompileRequest") -> Facts | None:
    """The facts nbjit reads from a compile's entry and its request (see ``cache.facts``): the
    source's C declarations and, for a cubin, its inspection, its kernels typed with them and
    what ptxas reported of each function in NVRTC's log (where the options asked for its
    report); None where they cannot be read (the loader then reports what is wrong). An
    entry a worker process made carries them already."""
    if entry.facts is not None:
        return entry.facts
    try:
        decls = _source_decls(req.source)
        info = inspect_cubin(entry.payload, source=req.name) if entry.kind == "cubin" else None
        entries = info.entries if info is not None else ()
        # kernels whose sources agree (the others are merged, and refused, when asked for)
        typed = {e.name: t for e, t in zip(entries, typed_entries(entries, "cubin", decls)) if t is not e}
    except Exception:  # an image nbjit cannot read (the loader reports it)
        return None
    return Facts(decls, info, typed, ptxas_report(entry.log) if info is not None else {})


def _key(req: CompileRequest, walk: IncludeWalk | None = None) -> str:
    """The cache key: everything that changes NVRTC's output (see cache.md), the files the
    source includes (``walk``, else walked here) among it."""
    walk = includes_of(req) if walk is None else walk
    cccl = _cccl()
    return cache_key({
        "producer": "nvrtc", "toolchain": _toolchain_fingerprint(), "cccl": cccl[1] if cccl else None,
        "cuda_headers": _cuda_headers_id(),
        "source": req.source, "name": req.name, "headers": [list(h) for h in req.headers],
        "options": _portable_options(req.options),
        "arch": str(req.arch), "output": req.output, "expressions": list(req.expressions),
        "includes": [list(f) for f in walk.files],
        # line tables name the placeholders of cache.sources (entries made before named the source's
        # file as given, then its headers as given)
        **({"program": "nbjit-sources/2"} if wants_sources(req.options) else {}),
    })


def _portable_options(options) -> list[str]:
    """Options as the key holds them: CUDA's and CCCL's include directories by what they
    are (the toolchain's fingerprint and CCCL's version identify them), not where they are."""
    ours = {f"--include-path={d}": f"--include-path=<{what}>"
            for what, d in (("cuda", cuda_include_dir()), ("cccl", cccl_include_dir())) if d}
    return [ours.get(o, o) for o in options]


def _nvrtc_arch(target: Arch, output: str, name: str, nvrtc: str) -> Arch:
    """The -arch NVRTC compiles ``target`` for: ``target`` where this NVRTC knows it; for
    output "auto" and a real device newer than this NVRTC, PTX for the newest architecture it
    knows, which the driver compiles for the device; else an ``NbjitCompileError`` naming the
    architectures it knows (an architecture no chip has is refused before NVRTC sees it)."""
    known = supported_archs()
    problem = existence_problem(target)
    if problem is None and (not known or target.number in known):
        return target
    newer = bool(known) and target.number > max(known)
    if problem is None and output == "auto" and not target.virtual and not target.variant and newer:
        return Arch(max(known), virtual=True)
    if problem is not None:
        why = problem
    elif not newer and target.number < min(known):
        why = "older than any it knows (an older CUDA's NVRTC may know it)"
    elif not newer:
        why = "it is not one this NVRTC knows (another CUDA's NVRTC may know it)"
    elif target.variant:
        why = f"'{target.variant}' code runs on that architecture{' family' * (target.variant == 'f')} only"
    else:
        why = ("PTX" if target.virtual or output == "ptx" else "a cubin") + " for exactly that architecture was " \
            "asked for (output='auto' with a real architecture compiles PTX for the newest it knows below)"
    known_text = ", ".join(f"sm_{k}" for k in known) if known else "the architectures it lists"
    raise NbjitCompileError(f"{name}: {nvrtc} cannot compile for {target}: {why}. It compiles for {known_text}")


def _run_nvrtc(req: CompileRequest):
    """Run NVRTC on a request: a CacheEntry (cubin or PTX), or CompileFailure. Called on the
    main thread, NVRTC runs in a thread of its own, waited for so that Ctrl-C stops the
    wait at once (``_interruptible``)."""
    if threading.current_thread() is threading.main_thread():
        return _interruptible(_nvrtc_entry, req)
    return _nvrtc_entry(req)


def _interruptible(fn, *args):
    """``fn(*args)`` in a daemon thread, waited for on this one. NVRTC holds the thread that
    calls it until its compile ends (minutes, for some), and Python runs a signal's handler
    on the main thread between its own steps only, so Ctrl-C waited for the compile; an
    event's wait is interrupted at once (KeyboardInterrupt). The compile left behind ends in
    its thread, its result dropped (and its program destroyed there); a daemon thread, it
    does not hold up the interpreter's exit."""
    box: list = []
    done = threading.Event()

    def run():
        try:
            _no_interrupts_here()
            box.append((True, fn(*args)))
        except BaseException as e:  # raised on the waiting thread
            box.append((False, e))
        finally:
            done.set()
    threading.Thread(target=run, name="nbjit-nvrtc", daemon=True).start()
    try:
        _wait(done)
    except BaseException:
        _left_running()
        raise
    ok, value = box.pop()
    if not ok:
        raise value
    return value


def _no_interrupts_here() -> None:
    """In a compile's thread: Ctrl-C (SIGINT) is delivered to another thread, never this
    one, which NVRTC holds (the kernel gives a process's signal to any thread that does not
    block it, and a signal taken here would not wake the waiting thread)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _wait(done: threading.Event) -> None:
    """Wait for ``done``, looking at signals four times a second (a signal some other thread
    took is handled here all the same: KeyboardInterrupt)."""
    while not done.wait(0.25):
        pass


_LEFT_RUNNING: list = []


def _left_running() -> None:
    """A compile was left running in its thread (Ctrl-C): should the process exit before it
    ends, the C libraries' teardown is skipped (glibc's ``on_exit`` calls ``_exit`` with the
    exit status, before the destructors registered earlier), which would destroy NVRTC's
    state under the compile: a crash at exit (status -11, 1 run in 12 on the 2-core machine).
    Python's own shutdown (its atexit functions, flushing its streams) has run by then."""
    if _LEFT_RUNNING:
        return
    _LEFT_RUNNING.append(True)
    import ctypes
    try:
        libc = ctypes.CDLL(None)
        on_exit, exit_now = libc.on_exit, libc._exit
    except (OSError, AttributeError):  # (not glibc: nothing to register it with)
        return
    on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    on_exit(ctypes.cast(exit_now, ctypes.c_void_p), None)  # (called as _exit(status, NULL): the NULL unread)


def _nvrtc_entry(req: CompileRequest):
    """``_run_nvrtc``'s compile, on the thread that runs it."""
    N = _nvrtc()
    major, minor = nvrtc_version()
    arch = _nvrtc_arch(req.arch, req.output, req.name, f"NVRTC {major}.{minor}")
    full = [f"-arch={arch}", *req.options]
    plan = _pch_plan(req, arch, (major, minor))
    if plan is None:
        return _nvrtc_compile(N, req, arch, full, None)
    with _pch.STORE.lock:  # one PCH heap per process: its files and size change under this lock
        return _nvrtc_compile(N, req, arch, full, plan)


def _pch_supported(version: tuple[int, int]) -> bool:
    """Whether this NVRTC (12.8+) and cuda.bindings have precompiled headers."""
    if version < (12, 8):
        return False
    from cuda.bindings import nvrtc as N
    return all(hasattr(N, f) for f in ("nvrtcGetPCHCreateStatus", "nvrtcGetPCHHeapSizeRequired",
                                       "nvrtcSetPCHHeapSize", "nvrtcGetPCHHeapSize"))


def _pch_plan(req: CompileRequest, arch: Arch, version: tuple[int, int]) -> str | None:
    """The PCH key of a compile that gets a PCH (made or used), else None."""
    if req.pch == "off" or _pch.user_pch_option(req.options):
        return None
    prefix = _pch.header_prefix(req.source)
    if not _pch.includes(prefix) or not _pch_supported(version):
        return None
    walk = includes_of(req, prefix)
    if walk.unknown is not None or not _pch.worth_it(req.pch, prefix, walk.size):
        return None
    cccl = _cccl()
    key = cache_key({
        "producer": "nvrtc-pch", "toolchain": _toolchain_fingerprint(), "cccl": cccl[1] if cccl else None,
        "cuda_headers": _cuda_headers_id(), "prefix": prefix, "name": req.name,
        "headers": [list(h) for h in req.headers], "arch": str(arch), "includes": [list(f) for f in walk.files],
        # (not the back-end options NVRTC does not compare for a PCH: one PCH serves every value)
        "options": _portable_options(_pch.pch_options(req.options)),
    })
    if req.pch == "auto" and key not in _pch.STORE.seen and _pch.STORE.get(key) is None:
        # a PCH serves this process only, and making one costs its compile a quarter more and
        # a file of up to hundreds of MB: "auto" makes it when the same headers come a second time
        _pch.STORE.seen.add(key)
        return None
    return key


# NVRTC's built-in runtime headers lack cudaGraphSetConditional, which nvcc's declare (a graph's
# condition set by a kernel: ptxas provides it); a source that calls it gets the declaration
_SET_CONDITIONAL = "cudaGraphSetConditional"
_DECLARES_IT = "nbjit_graph_conditional.h"
_SET_CONDITIONAL_DECL = ('extern "C" __device__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle, '
                         "unsigned int value);\n")


def _nvrtc_compile(N, req: CompileRequest, arch: Arch, full: list[str], plan):
    """One NVRTC compile of ``req`` with the options ``full``; with ``plan`` (a PCH key),
    making or using that PCH (under ``pch.STORE.lock``)."""
    source, name, exprs, headers, output = req.source, req.name, req.expressions, dict(req.headers), req.output
    ok = N.nvrtcResult.NVRTC_SUCCESS
    major, minor = nvrtc_version()
    store, pch_file, making = _pch.STORE, None, False
    if plan is not None:
        pch_file = store.get(plan)
        if pch_file is None:
            making, pch_file = True, store.path_for(plan, req.cache_dir)
            _pch_heap(N, store)
    opts = full + ([f"--create-pch={pch_file}" if making else f"--use-pch={pch_file}"] if pch_file else [])
    if _SET_CONDITIONAL in source and _DECLARES_IT not in headers:
        headers[_DECLARES_IT] = _SET_CONDITIONAL_DECL
        opts = opts + [f"--pre-include={_DECLARES_IT}"]
    program, swaps, kept, opts = _line_table_names(req, full, opts)
    err, prog = N.nvrtcCreateProgram(source.encode(), program.encode(), len(headers),
                                     [t.encode() for t in headers.values()], [k.encode() for k in headers])
    if err != ok:
        raise NbjitCompileError(f"{name}: nvrtcCreateProgram failed: {err}")
    try:
        for e in exprs:
            N.nvrtcAddNameExpression(prog, e.encode())
        res = N.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])[0]
        log = _nvrtc_log(N, prog).replace(program, name)  # (diagnostics name the user's files)
        for d, (padded, _) in swaps.items():
            log = log.replace(padded, d)
        if pch_file is not None:
            log = _pch_outcome(N, prog, store, plan, pch_file, making, res == ok, log)
        if res != ok:
            raise CompileFailure(name, source, full, log, f"NVRTC {major}.{minor}", _header_hint(log),
                                 _portable_options(full))
        names = {}
        for e in exprs:
            err, lowered = N.nvrtcGetLoweredName(prog, e.encode())
            if err != ok:
                raise NbjitCompileError(f"{name}: no kernel for name expression {e!r} ({err})")
            names[e] = lowered.decode()
        if output == "ltoir":  # (-dlto: what nvJitLink links, nbjit.toolchain.link)
            err, size = N.nvrtcGetLTOIRSize(prog)
            buf = bytearray(size)
            N.nvrtcGetLTOIR(prog, buf)
            kind, payload = "ltoir", buf
        elif not arch.virtual and output != "ptx":
            err, size = N.nvrtcGetCUBINSize(prog)
            buf = bytearray(size)  # NVRTC writes here: never a bytes object (CPython shares small ones)
            N.nvrtcGetCUBIN(prog, buf)
            kind, payload = "cubin", buf
        else:
            err, size = N.nvrtcGetPTXSize(prog)
            buf = bytearray(size)
            N.nvrtcGetPTX(prog, buf)
            kind, payload = "ptx", buf.rstrip(b"\0")
        # (LTO-IR's strings are not plain bytes: the linked cubin's are replaced, nbjit.toolchain.link)
        later = list(swaps.values()) if kind == "ltoir" else []
        meta = kept_sources(program, source, kept, later) if program != name else {}
        return CacheEntry(kind, str(arch), portable(bytes(payload), swaps.values()), names, log,
                          f"NVRTC {major}.{minor}", meta=meta)
    finally:
        N.nvrtcDestroyProgram(prog)


def _line_table_names(req: CompileRequest, full: list[str], opts: list[str]):
    """For a compile with line information (``full``): the program's placeholder name, the
    user's include directories NVRTC is given padded with their placeholders and the headers
    kept from them (``cache.sources.header_dirs``), and ``opts`` naming the padded directories.
    Otherwise the program's own name, nothing kept and ``opts`` as they are."""
    if not wants_sources(full):
        return req.name, {}, {}, opts
    walk = includes_of(req)
    if walk.unknown is not None:  # (a header named by a macro: which directory it is found through is unknown)
        return program_name(req.source, req.name), {}, {}, opts
    swaps, kept = header_dirs(req.user_dirs, walk.found_in)
    given = {f"--include-path={d}": f"--include-path={padded}" for d, (padded, _) in swaps.items()}
    return program_name(req.source, req.name), swaps, kept, [given.get(o, o) for o in opts]


def _pch_heap(N, store) -> None:
    """Before this process's first PCH: a heap large enough for CCCL's headers (NVRTC's
    default is not). Resizing voids every PCH made before, so it happens while there is none."""
    if store.heap_set or store.files:
        return
    store.heap_set = True
    err, size = N.nvrtcGetPCHHeapSize()
    if err == N.nvrtcResult.NVRTC_SUCCESS and size < _pch.HEAP_BYTES:
        N.nvrtcSetPCHHeapSize(_pch.HEAP_BYTES)


def _pch_outcome(N, prog, store, key: str, pch_file: str, making: bool, compiled: bool, log: str) -> str:
    """Record what became of a compile's PCH; its log without NVRTC's PCH lines."""
    log, said = _pch.clean_log(log)
    if making:
        status = N.nvrtcGetPCHCreateStatus(prog)[0]
        if status == N.nvrtcResult.NVRTC_SUCCESS and compiled and os.path.isfile(pch_file):
            store.add(key, pch_file)
            return log
        _pch._remove(pch_file)
        if status == N.nvrtcResult.NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED:
            err, required = N.nvrtcGetPCHHeapSizeRequired(prog)
            if err == N.nvrtcResult.NVRTC_SUCCESS and required:
                store.resized()  # every PCH made in the old heap is void; the next compile makes this one
                N.nvrtcSetPCHHeapSize(_pch.heap_for(required))
        return log
    if said.get("used") == pch_file:
        store.stats["used"] += 1
    elif 20282 in said["refused"]:  # the heap was resized by someone else: every PCH of ours is void
        store.stats["refused"] += 1
        store.resized()
    else:  # its headers or options did not match after all (NVRTC compiled without it): make it again
        store.stats["refused"] += 1
        store.forget(key)
    return log


_MISSING_HEADER = re.compile(r'cannot open source file "([^"\n]+)"')
_C_HEADERS = {"stdint.h": "cstdint", "stddef.h": "cstddef", "limits.h": "climits", "float.h": "cfloat",
              "math.h": "cmath", "assert.h": "cassert", "string.h": "cstring", "stdlib.h": "cstdlib"}


def _header_hint(log: str) -> str:
    """What to include instead of a standard header NVRTC has not got (it compiles device
    code only: no host C++ library), where CCCL's libcu++ has the same under cuda/std."""
    hints = []
    for h in dict.fromkeys(_MISSING_HEADER.findall(log)):
        std = _C_HEADERS.get(h, h)
        cccl = cccl_include_dir()
        if "/" not in std and cccl and os.path.isfile(os.path.join(cccl, "cuda", "std", std)):
            hints.append(f"hint: NVRTC has no C++ standard library headers; for <{h}> include <cuda/std/{std}> "
                         "(CCCL's libcu++, on nbjit's include path) and use cuda::std::")
        elif h in _C_HEADERS or ("/" not in h and "." not in h):
            hints.append(f"hint: <{h}> is a host C++ standard library header, which NVRTC does not have (it "
                         "compiles device code only)")
    return "\n".join(hints)


# ptxas's report, which NVRTC's log holds where the options ask for it (-Xptxas=-v; nvJitLink:
# -verbose): per function, its stack frame and spill stores and loads in bytes. Never asked
# for by nbjit itself: ptxas records its options in the cubin (a note), so -v changes the bytes.
_FUNCTION_PROPERTIES = re.compile(
    r"^ptxas[ \t]+info[ \t]*:[ \t]*Function properties for ([^\s']+)[ \t]*\r?\n"
    r"ptxas[ \t]+\.[ \t]+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", re.M)


def ptxas_report(log: str) -> dict[str, dict[str, int]]:
    """What ptxas reported of each function in a verbose log (NVRTC with ``-Xptxas=-v``,
    nvJitLink with ``-verbose``): ``{function: {"stack_frame": bytes, "spill_stores": bytes,
    "spill_loads": bytes}}``; empty where the log holds no report."""
    if "ptxas" not in log:
        return {}
    return {m[1]: {"stack_frame": int(m[2]), "spill_stores": int(m[3]), "spill_loads": int(m[4])}
            for m in _FUNCTION_PROPERTIES.finditer(log)}


def _nvrtc_log(N, prog) -> str:
    err, size = N.nvrtcGetProgramLogSize(prog)
    buf = bytearray(size)  # written by NVRTC: b" " * 1 would be the interpreter's shared b" "
    N.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\0").decode(errors="replace").strip()


# compile_many's process route: a thread of a call on it holds ``make(job) -> entry`` here
_ROUTE = threading.local()


