"""``nbjit bundle``: a kernel bundle built from CUDA sources (compiled per architecture),
PTX, cubins, fatbins and Triton cache entries."""
from __future__ import annotations

import os
import re
import sys
import warnings
from pathlib import Path

from nbjit.arch import Arch
from nbjit.cli.common import (
    Usage, binary_to_stdout, check_compilable, check_source, count, image_kind, parse_archs, read_input,
    refuse_input, refuse_named, write_result)
from nbjit.errors import NbjitWarning
from nbjit.read.image import Image


def run(args) -> int:
    from nbjit.bundles.archive import is_image_name
    from nbjit.bundles.build import bundle_bytes

    # everything the command line can get wrong is said here, in its terms (--arch, --name), before
    # anything is compiled; what only building finds is said by build_bundle's own checks
    to_stdout = args.output == "-"
    kernels = {f: _numba_kernel(f) for f in args.files if _NUMBA_SPEC.fullmatch(f) and not os.path.lexists(f)}
    if kernels and "-" in args.files and not args.name:
        raise Usage("- among other FILEs needs --name NAME, to put them all in one image (each FILE is one image "
                    "named after the file, and standard input has no name)")
    args.files = [f for f in args.files if f not in kernels]
    files = [f for f in args.files if f != "-"]  # (-: standard input, read by _bundle_inputs)
    for f in files:
        if not os.path.lexists(f):
            raise Usage(f"cannot read {f}: No such file or directory")
    if to_stdout:
        binary_to_stdout("a bundle")
    else:
        if os.path.isdir(args.output):
            raise Usage(f"-o {args.output} is a directory: give the bundle's file name "
                         f"({os.path.join(args.output, 'kernels.nbjit')})")
        for f in files:
            refuse_input(args.output, f, in_place_option=False)
        refuse_named(args.output, "a kernel bundle", f"nbjit bundle writes a kernel bundle (a ZIP archive): name it "
                      f"{Path(args.output).stem}.nbjit")
    if args.name is not None and not is_image_name(args.name):
        raise Usage(f"--name {args.name!r}: an image name is 1 to 128 letters, digits, '_', '.', '+' or '-', not "
                     "starting with '.', '+' or '-'")
    archs, ptx = _targets(args)
    inputs, sources = _bundle_inputs(args) if args.files else ({args.name: []} if args.name else [], [])
    if kernels:  # (@cuda.jit kernels compile for --arch and --ptx, as sources do)
        inputs = {args.name: [*inputs[args.name], *kernels.values()]} if args.name else [*inputs, *kernels.values()]
    compiled = [*sources, *kernels]
    if compiled and not archs and not ptx:
        what = "standard input" if compiled[0] == "-" else compiled[0]
        what += " is a @cuda.jit kernel" if compiled[0] in kernels else " is CUDA source"
        raise Usage(f"{what}: say what to compile it for with --arch (SASS: sm_80,sm_90) "
                     "and/or --ptx (PTX: compute_80)")
    if args.expr and not sources:
        raise Usage(f"--expr {args.expr[0]}: name expressions instantiate templates of CUDA C++ sources (FILEs named "
                     ".cu, .cuh or .cuda), and no FILE is one: drop --expr")
    if (archs or ptx) and not compiled:
        from nbjit.loading.triton import read_triton
        for f in files:  # a FILE that is no image (or a directory holding no Triton kernel) is said first
            if os.path.isdir(f) or f.endswith(".json"):
                read_triton(f)
            else:
                Image.from_bytes(read_input(f), f)
        given = " and ".join(o for o, v in (("--arch", archs), ("--ptx", ptx)) if v)
        raise Usage(f"{given} {'say' if ptx and archs else 'says'} what to compile CUDA sources for, and no FILE is "
                     "one (named .cu, .cuh or .cuda; PTX, cubins, fatbins and Triton kernels go in as they were "
                     f"built): drop {given}")
    opts = [o for d in args.include for o in ("-I", d)] + [f"-D{d}" for d in args.define] + list(args.option)
    with warnings.catch_warnings():
        # (a source that compiles to no kernel: the error below says so, with what to do)
        warnings.filterwarnings("ignore", "(?s).*NVRTC compiled no kernel", NbjitWarning)
        data, info = bundle_bytes(inputs, None if to_stdout else Path(args.output), _answers(args.tuning),
                                  archs=archs, ptx=ptx, options=opts, name_expressions=_expressions(args, sources))
    for img in info.images:
        if not img.kernels:
            names = ", ".join(str(s.get("name")) for s in img.sources)
            why = ("a template kernel is compiled only where it is instantiated (--expr 'name<float>'), and a "
                   "kernel is declared __global__" if any(s.get("kind") == "cuda" for s in img.sources)
                   else "it declares no .entry")
            raise Usage(f"{names}: no kernel to launch in image {img.name!r}: {why}; nothing written")
    write_result(args.output, data, "-", in_place=True)  # (never over an input: refused above)
    where = "standard output" if to_stdout else args.output
    for img in info.images:
        print(f"{where}: {img.name}: {', '.join(map(str, img.archs))} ({count(len(img.kernels), 'kernel')})",
              file=sys.stderr)
        for e, m in img.lowered_names.items():
            print(f"  {e} -> {m}", file=sys.stderr)
    return 0


def _answers(given: list[str]) -> list[tuple[str, bytes]]:
    """The members that ship the tuning answers --tuning names (key prefixes, or all)."""
    if not given:
        return []
    from nbjit.bundles.build import _answers as members
    from nbjit.cache.store import default_cache
    from nbjit.tuning.answers import listed, named
    c = default_cache()
    keys = [k for k, _, _ in listed(c)] if "all" in given else [named(c, p)[0] for p in given]
    if not keys:
        raise Usage(f"--tuning all: no tuning answers in {c.path} (nbjit.tune keeps them there)")
    return members(keys, c)


def _targets(args) -> tuple[list, list]:
    """--arch's real architectures and --ptx's virtual ones, each checked."""
    archs = parse_archs(args.arch, "--arch") if args.arch is not None else []
    for a in archs:
        if a.virtual:
            raise Usage(f"--arch {a} is a virtual architecture (PTX): give --ptx {a} for PTX, or --arch {a.real()} "
                        "for a cubin")
        check_compilable(a, "--arch", newer="--ptx")
    ptx = [Arch(a.number, a.variant, True) for a in parse_archs(args.ptx, "--ptx")] if args.ptx is not None else []
    for a in ptx:
        check_compilable(a, "--ptx", newer="--ptx")
    return archs, ptx


def _bundle_inputs(args) -> tuple:
    """What ``bundle`` builds from its FILEs: build_bundle's inputs (the FILEs, or {NAME:
    FILEs} with --name; ``-``, standard input, as image "stdin": the image it holds, or CUDA
    source text), and those of them that are CUDA sources (``-`` for standard input's)."""
    from nbjit.bundles.build import _image_name
    from nbjit.toolchain.request import SOURCE_SUFFIXES

    seen: dict[str, str] = {}  # image name -> the FILE it comes from
    for f in args.files:
        p = Path(f)
        if args.name or f == "-" or p.is_dir() or p.suffix == ".json":
            continue  # (a Triton kernel is named by its metadata: build_bundle says where two are alike)
        first = seen.setdefault(_image_name(p), f)
        if first != f and os.path.exists(first) and os.path.samefile(first, f):
            raise Usage(f"{f} is given twice")
        if first != f:
            raise Usage(f"{first} and {f} would both be image {_image_name(p)!r} (each FILE is one image, named "
                         "after the file): rename one, or give --name NAME to put them in one image")
    sources = [f for f in args.files if Path(f).suffix.lower() in SOURCE_SUFFIXES]
    if "-" not in args.files:
        return ({args.name: args.files} if args.name else args.files), sources
    if args.files.count("-") > 1:
        raise Usage("- is given twice: standard input is read once")
    if len(args.files) > 1 and not args.name:
        raise Usage("- among other FILEs needs --name NAME, to put them all in one image (each FILE is one image "
                     "named after the file, and standard input has no name)")
    raw = read_input("-")
    kind = image_kind(raw, "<stdin>")
    if kind is not None:
        given: object = Image(raw, kind, "<stdin>")
    else:
        check_source(raw, "<stdin>")
        text = raw.decode("utf-8")
        given, sources = text if "\n" in text else text + "\n", [*sources, "-"]  # (one line of text is no path)
    if args.name:
        return {args.name: [given if f == "-" else f for f in args.files]}, sources
    return {"stdin": given}, sources


_NUMBA_SPEC = re.compile(r"([A-Za-z_][\w.]*):([A-Za-z_]\w*)(?::(.+))?", re.S)


def _numba_kernel(spec: str) -> object:
    """A FILE that names a ``@cuda.jit`` kernel, ``MODULE:FUNCTION[:SIGNATURE]``: the module
    imported (from the current directory too, as ``python -m`` finds it), and the kernel with
    its signature (or alone, where it was compiled for one)."""
    import importlib

    module, function, signature = _NUMBA_SPEC.fullmatch(spec).groups()
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # (its own import errors: ModuleNotFoundError, a SyntaxError, what it raises)
        lines = [x.strip() for x in str(e).splitlines() if x.strip(": \t")]  # (Numba's: a heading, then the cause)
        raise Usage(f"{spec}: cannot import module {module!r} ({type(e).__name__}: {' '.join(lines[:2])[:300]}); "
                    "a FILE of the form MODULE:FUNCTION:SIGNATURE names a @cuda.jit kernel (one whose signature "
                    "is given in @cuda.jit(...) compiles at import, which needs a GPU)") from None
    kernel = getattr(mod, function, None)
    if kernel is None:
        raise Usage(f"{spec}: module {module!r} ({getattr(mod, '__file__', '?')}) has no {function!r}")
    if not callable(getattr(kernel, "py_func", None)):
        raise Usage(f"{spec}: {module}.{function} is {type(kernel).__name__}, not a @cuda.jit kernel")
    if not signature and len(getattr(kernel, "overloads", ()) or ()) != 1:
        import inspect
        names = ", ".join(inspect.signature(kernel.py_func).parameters)
        raise Usage(f"{spec}: give the signature to compile it for, one Numba type per argument ({names}): "
                    f"{module}:{function}:'void(float32[::1], float32, ...)'")
    return (kernel, signature) if signature else kernel


def _expressions(args, sources: list[str]) -> "list[str] | dict[str, list[str]]":
    """``bundle``'s --expr: each ``EXPR`` for every CUDA source, each ``IMAGE=EXPR`` for that
    image's only (as ``build_bundle``'s ``name_expressions={image: [...]}``)."""
    from nbjit.bundles.build import _image_name

    images = [args.name] if args.name else ["stdin" if f == "-" else _image_name(Path(f)) for f in sources]
    every: list[str] = []
    each: dict[str, list[str]] = {}
    for e in args.expr:
        if not e.strip():
            raise Usage(f"--expr {e!r}: give the name expression to instantiate (e.g. --expr 'scale<float>')")
        image, eq, rest = e.partition("=")
        if eq and rest and not _IN_EXPRESSION.search(image):  # (an = inside an expression: f<(a==b)>)
            if image not in images:
                raise Usage(f"--expr {e}: no CUDA source makes image {image!r} (they make: "
                             f"{', '.join(images) or 'none'})")
            each.setdefault(image, []).append(rest)
        else:
            every.append(e)
    return {i: every + each.get(i, []) for i in images} if each else every


_IN_EXPRESSION = re.compile(r"[<>(:]")  # what IMAGE in --expr IMAGE=EXPR never holds, and an = in an expression follows


def add_parser(sub) -> None:
    """``nbjit bundle``'s arguments, on the command line's subparsers ``sub``."""
    p = sub.add_parser("bundle", help="build a kernel bundle: cubins for several architectures, PTX and a manifest "
                       "in one file that loads with no NVRTC (nbjit.load_bundle)")
    p.add_argument("files", nargs="+", metavar="FILE", help=".cu sources (compiled), PTX, cubins, fatbins, Triton "
                   "cache entries, each one image named after its file; MODULE:FUNCTION:SIGNATURE, a @cuda.jit "
                   "kernel compiled by its Numba (kernels:axpy:'void(float32[::1], float32)'), one image named "
                   "after the function")
    p.add_argument("--arch", help="SASS to compile each .cu for: sm_80,sm_90,sm_100,... (those NVRTC compiles for)")
    p.add_argument("--ptx", help="virtual architecture(s) to compile each .cu to PTX for: compute_80")
    p.add_argument("-o", "--output", required=True, help="the bundle to write (e.g. kernels.nbjit; - for standard "
                   "output, where that is not a terminal)")
    p.add_argument("--name", help="put every FILE in one image of this name (cubins nvcc built per architecture)")
    p.add_argument("-I", dest="include", action="append", default=[], metavar="DIR",
                   help="an include directory for the CUDA C++ sources (repeatable)")
    p.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE",
                   help="a macro defined for the CUDA C++ sources (repeatable)")
    p.add_argument("--expr", action="append", default=[], metavar="[IMAGE=]EXPR",
                   help="a name expression to instantiate ('scale<float>'), in every CUDA source, or with IMAGE= "
                        "in that image's only (axpy='scale<float>')")
    p.add_argument("--option", action="append", default=[], help="another NVRTC option")
    p.add_argument("--tuning", action="append", default=[], metavar="KEY",
                   help="ship a tuning answer of nbjit.tune from the cache: its key's first hex digits, as nbjit tune "
                        "--list shows them, or all (repeatable)")
    p.set_defaults(func=run)
