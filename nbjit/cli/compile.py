"""``nbjit compile``: CUDA C++ compiled with NVRTC through the cache, for one architecture or
several (one output each), or only into the cache."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from nbjit.arch import Arch
from nbjit.cli.common import (
    Usage, cannot_write, check_compilable, check_source, named_kind, parse_archs, read_input, refuse_input,
    refuse_named, shown, write_result)

if TYPE_CHECKING:
    from nbjit.cache.store import Cache

def run(args) -> int:
    from nbjit.cache.sources import relocated
    from nbjit.toolchain.nvrtc import compile_image
    from nbjit.toolchain.request import QUOTED_INCLUDE

    archs = parse_archs(args.arch, "--arch")  # what each compile is told it is for
    cache = _check_arguments(args, archs)
    raw = read_input(args.file)
    check_source(raw, args.file)
    source = raw.decode("utf-8")
    path = Path(args.file)
    # #include "..." found beside the source, as nvcc does (only where it has one: the key of a
    # source without one stays that of its text, which a program's nbjit.compile(text) finds)
    here = (str(path.resolve().parent),) if args.file != "-" and QUOTED_INCLUDE.search(source) else ()
    opts = ([o for d in args.include for o in ("-I", d)] + [f"-D{d}" for d in args.define]
            + ([f"-std={args.std}"] if args.std else []) + (["-G"] if args.G else [])
            + (["-lineinfo"] if args.lineinfo else []) + list(args.option))
    # an output file named .cubin or .ptx asks for that kind (a contradiction is refused above)
    named = named_kind(args.output) if len(archs) == 1 else None
    output = "ptx" if args.ptx or named == "PTX" else "cubin" if named == "a cubin" else "auto"
    kw = {"name": path.name, "options": opts, "output": output, "name_expressions": args.expr, "include_paths": here}
    stored = _cache_files(cache, archs, source, kw) if args.cache_only else {}
    made = []
    for arch in archs:
        img = compile_image(source, arch=arch, **kw)
        _report(img)
        made.append({"arch": str(img.arch), "kind": img.kind, "bytes": len(img.data), "file": None,
                     "lowered_names": dict(img.lowered_names),
                     "resources": {k: dict(r) for k, r in img.resources.items()}})
        if args.cache_only:
            if cache.path is None:  # the cache gave up writing (a warning said why)
                raise Usage(f"--cache-only: {img.kind} for {img.arch} was compiled but not stored: the cache "
                            "directory cannot be written (set NBJIT_CACHE_DIR to a writable directory)")
            continue
        if len(archs) == 1:
            out = args.output or path.with_suffix("." + img.kind).name
        else:
            out = os.path.join(args.output or ".", f"{path.stem}.{arch}.{img.kind}")
        # (with --lineinfo or -G: the line table pointed at this user's copy of the source, as a load does)
        write_result(str(out), relocated(img.data, img.sources), args.file, in_place=False, in_place_option=False)
        made[-1]["file"] = str(out)
        print(f"{args.file}: {img.kind} for {img.arch} -> {shown(str(out))} ({len(img.data)} bytes)",
              file=sys.stderr)
    if args.cache_only:
        _check_stored(args, cache, archs, stored, made)
    if args.json:
        print(json.dumps({"source": args.file, "lowered_names": made[-1]["lowered_names"], "outputs": made},
                         indent=2))
    return 0


def _check_arguments(args, archs: list) -> "Cache | None":
    """Everything the command line can get wrong, said before NVRTC runs; the cache that
    ``--cache-only`` fills."""
    for a in archs:
        check_compilable(a, "--arch", newer="--arch")
    if any(not e.strip() for e in args.expr):
        raise Usage("--expr '': give the name expression to instantiate (e.g. --expr 'fill<float>')")
    if args.json and args.output == "-":
        raise Usage("--json prints to standard output, and so does -o -: choose one")
    if args.cache_only and args.output is not None:
        raise Usage("--cache-only writes no file: drop -o")
    if args.file == "-" and args.output is None and not args.cache_only:
        raise Usage("standard input has no name to name the output after: give -o FILE (or -o - for standard "
                    "output)")
    cache = None
    if args.cache_only:
        from nbjit.cache.store import default_cache
        cache = default_cache()
        if cache.path is None:
            raise Usage("--cache-only would store nothing: the disk cache is off (NBJIT_CACHE=0); unset "
                        "NBJIT_CACHE (or set it to 1)")
    if args.output == "-" and (len(archs) > 1 or not args.ptx and sys.stdout.isatty()):
        raise Usage("-o - writes one architecture's output to standard output" if len(archs) > 1 else
                    "-o -: a cubin is binary, not for a terminal: redirect standard output, or add --ptx")
    if len(archs) > 1 and args.output is not None and not os.path.isdir(args.output):
        what = "a file" if os.path.exists(args.output) else "nothing"
        raise Usage(f"-o {args.output}: with several architectures -o names an existing directory (one file "
                    f"each), and there is {what} at that path")
    if len(archs) == 1 and args.output not in (None, "-"):
        refuse_input(args.output, args.file, in_place_option=False)
        _check_compile_output(args.output, archs[0], args.ptx)
    return cache


def _cache_files(cache, archs: list, source: str, kw: dict) -> dict:
    """``--cache-only``: each architecture's entry file, where the cache can hold it (else a
    usage error, before NVRTC runs; a read-only cache that has them all is fine)."""
    from nbjit.toolchain.nvrtc import compile_key
    stored = {a: cache._file(compile_key(source, arch=a, **kw)) for a in archs}
    why = None if all(map(os.path.exists, stored.values())) else cannot_write(cache.path)
    if why:
        raise Usage(f"--cache-only would store nothing: the cache directory {cache.path} cannot be written "
                    f"({why}); set NBJIT_CACHE_DIR to a writable directory")
    return stored


def _report(img) -> None:
    """What NVRTC said of a compile, on standard error: its log, the mangled name of each
    name expression, the local memory ptxas reported."""
    if img.log:
        print(img.log, file=sys.stderr)
    for e, m in img.lowered_names.items():
        print(f"{e} -> {m}", file=sys.stderr)
    for k, r in img.resources.items():  # what ptxas reported, where a kernel uses local memory
        if any(r.values()):
            print(f"{k}: {r['stack_frame']} bytes stack frame, {r['spill_stores']} bytes spill stores, "
                  f"{r['spill_loads']} bytes spill loads", file=sys.stderr)


def _check_stored(args, cache, archs: list, stored: dict, made: list) -> None:
    """``--cache-only``, once all are written (a later write may prune an earlier entry): each
    output in the cache, reported; a usage error where its size limit cannot hold them."""
    gone = [m for m, a in zip(made, archs) if not os.path.exists(stored[a])]
    if gone:
        raise Usage(f"--cache-only: {', '.join(m['kind'] + ' for ' + m['arch'] for m in gone)} written to the "
                    f"cache and pruned at once: its size limit ({cache.max_bytes} bytes, NBJIT_CACHE_MAX_BYTES) "
                    f"cannot hold {'them' if len(archs) > 1 else 'it'}; raise the limit")
    for m in made:
        print(f"{args.file}: {m['kind']} for {m['arch']} in the cache {cache.path} ({m['bytes']} bytes)",
              file=sys.stderr)


def _check_compile_output(output: str, arch: Arch, ptx: bool) -> None:
    """Refuse a ``compile -o`` whose suffix names another kind than compile writes there: PTX
    (``--ptx``, a ``compute_XX``) is never written under a cubin's name, and compile writes
    no fatbin or bundle."""
    stem = Path(output).stem
    if ptx or arch.virtual:
        why = "--ptx writes PTX" if ptx else f"--arch {arch} gives PTX"
        fix = "drop --ptx for a cubin" if ptx else f"give --arch {arch.real()} for a cubin"
        refuse_named(output, "PTX", f"{why}: name it {stem}.ptx, or {fix}")
    elif named_kind(output) != "PTX":  # (.ptx asks for PTX)
        refuse_named(output, "a cubin", f"nbjit compile writes a cubin (or PTX): name it {stem}.cubin"
                      + (" (nbjit bundle makes a bundle)" if named_kind(output) == "a kernel bundle" else ""))


def add_parser(sub) -> None:
    """``nbjit compile``'s arguments, on the command line's subparsers ``sub``."""
    p = sub.add_parser("compile", help="compile CUDA C++ with NVRTC (through the cache)")
    p.add_argument("file", help="the CUDA C++ source (.cu)")
    p.add_argument("--arch", required=True, help="sm_90, sm_90a, compute_90, ...; several separated by commas "
                   "(sm_80,sm_90,sm_100): one output each")
    p.add_argument("--cache-only", action="store_true", help="fill the compile cache, write no file")
    p.add_argument("--ptx", action="store_true", help="write PTX instead of a cubin")
    p.add_argument("-o", "--output", help="output file (default: FILE's name with .cubin or .ptx, in the current "
                   "directory; never the input; - for standard output)")
    p.add_argument("-I", dest="include", action="append", default=[], metavar="DIR",
                   help="a directory to search for #include files (repeatable)")
    p.add_argument("-D", dest="define", action="append", default=[], metavar="NAME[=VALUE]",
                   help="define a preprocessor macro (repeatable)")
    p.add_argument("--std", metavar="DIALECT", help="the C++ dialect: c++11, c++14, c++17, c++20 (NVRTC -std=)")
    p.add_argument("-G", action="store_true", help="device debug information, optimisation off (NVRTC -G)")
    p.add_argument("--lineinfo", action="store_true", help="line information for profilers (NVRTC -lineinfo)")
    p.add_argument("--json", action="store_true", help="print what was made as JSON: each name expression's "
                   "mangled name, and each architecture's output")
    p.add_argument("--expr", action="append", default=[], help="a name expression to instantiate "
                   "(e.g. 'fill<float>'; repeatable)")
    p.add_argument("--option", action="append", default=[], metavar="NVRTC_OPTION",
                   help="any other NVRTC option, e.g. --option -use_fast_math or --option=-maxrregcount=64 "
                   "(repeatable)")
    p.set_defaults(func=run)
