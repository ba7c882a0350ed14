"""``nbjit strip``: PTX without its debug information."""
from __future__ import annotations

import sys
from pathlib import Path

from nbjit.cli.common import Usage, read_input, refuse_named, shown, write_result
from nbjit.read.image import sniff
from nbjit.read.ptx import inspect_ptx, strip_debug


def run(args) -> int:
    if args.in_place and args.file == "-":
        raise Usage("--in-place replaces a file; standard input (-) is none: give -o OUT")
    if args.in_place and args.output is not None:
        raise Usage(f"--in-place replaces {args.file} and -o {args.output} writes elsewhere: give one of them")
    if args.output is not None:
        refuse_named(args.output, "PTX", f"nbjit strip writes PTX: name it {Path(args.output).stem}.ptx")
    data = read_input(args.file)
    name = "<stdin>" if args.file == "-" else args.file
    kind = sniff(data, name)  # refuse what is not PTX, saying what it is
    if kind != "ptx":
        raise Usage(f"{name} is a {kind}, not PTX: 'nbjit strip' removes debug information from PTX text "
                     f"(for a {kind} without it, build without -G and -lineinfo)")
    info = inspect_ptx(data, source=name)
    out = strip_debug(data, keep_lineinfo=args.keep_lineinfo).encode("utf-8")
    output = args.file if args.in_place else args.output
    if output is None:
        raise Usage("give -o OUT (or --in-place to replace the input)")
    write_result(output, out, args.file, args.in_place)
    print(f"{name}: debug info {info.debug.kind} -> {shown(output)} ({len(data)} -> {len(out)} bytes)",
          file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    """``nbjit strip``'s arguments, on the command line's subparsers ``sub``."""
    p = sub.add_parser("strip", help="remove debug information from PTX")
    p.add_argument("file", help="a PTX file (- for standard input)")
    p.add_argument("-o", "--output", help="where to write the stripped PTX (never the input, unless --in-place; "
                   "- for standard output)")
    p.add_argument("--in-place", action="store_true", help="replace the input file")
    p.add_argument("--keep-lineinfo", action="store_true", help="keep .file/.loc line information")
    p.set_defaults(func=run)
