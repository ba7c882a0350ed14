"""The ``nbjit`` command: its parser (each verb adds its own arguments: ``inspect.py``,
``strip.py``, ``cache.py``, ``compile.py``, ``bundle.py``, ``tune.py``), and ``main``, which runs a verb with
nbjit's errors as one line and status 2, Ctrl-C as status 130, and closed or full standard
streams handled."""
from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import sys
import warnings
from typing import NoReturn

from nbjit.cli import bundle as bundle_verb
from nbjit.cli import cache as cache_verb
from nbjit.cli import compile as compile_verb
from nbjit.cli import inspect as inspect_verb
from nbjit.cli import strip as strip_verb
from nbjit.cli import tune as tune_verb
from nbjit.cli.common import NO_OUTPUT, Usage
from nbjit.errors import NbjitError

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as nbjit's: one line, ``nbjit <command>: error: ...``, and
    a did-you-mean where a close name exists."""

    commands: dict[str, "_Parser"]  # the top level's: each command's parser

    def _print_message(self, message: str, file=None) -> None:
        """Help, version and usage text; standard output that cannot take it raises (argparse's
        own says nothing: ``--help > /dev/full`` would look done). On standard error nothing
        more can be said: the status says it."""
        stream = file or sys.stderr
        if message:
            try:
                stream.write(message)
            except OSError:
                if stream is sys.stdout:
                    raise

    def error(self, message: str) -> NoReturn:
        m = re.search(r"invalid choice: '(.*?)' \(choose from (.*)\)$", message)
        if m:
            near = difflib.get_close_matches(m[1], re.findall(r"'([^']*)'", m[2]), n=1)
            if near:
                message += f"; did you mean '{near[0]}'?"
        self.exit(2, f"{self.prog}: error: {message}\n")

    def unrecognized(self, extra: list[str]) -> NoReturn:
        """Refuse arguments this command does not take, suggesting the option meant."""
        options = [o for a in self._actions for o in a.option_strings if o not in ("-h", "--help")]
        hints = []
        for a in extra:
            if not a.startswith("-") or a == "-":
                continue
            near = difflib.get_close_matches(a.split("=", 1)[0], options, n=1, cutoff=0.6)
            if near:
                hints.append(f"did you mean {near[0]}?" if len(extra) == 1 else f"{a}: did you mean {near[0]}?")
            elif "--option" in options:
                hints.append(f"an NVRTC option goes as --option {a}")
            elif a.split("=", 1)[0] in ("-o", "--output") and self.prog in NO_OUTPUT:
                hints.append(NO_OUTPUT[self.prog])
        self.error(f"unrecognized arguments: {' '.join(extra)}" + (f" ({'; '.join(hints)})" if hints else ""))


def _parser() -> argparse.ArgumentParser:
    from nbjit import __version__
    p = _Parser(prog="nbjit", description="Inspect and prepare externally compiled GPU kernels.")
    p.add_argument("--version", action="version", version=f"nbjit {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    p.commands = sub.choices
    inspect_verb.add_parser(sub)
    strip_verb.add_parser(sub)
    cache_verb.add_parser(sub)
    compile_verb.add_parser(sub)
    bundle_verb.add_parser(sub)
    tune_verb.add_parser(sub)
    return p


def _option_values(argv: list[str]) -> list[str]:
    """``--option -X`` as ``--option=-X``: every NVRTC option starts with ``-``, which
    argparse would take for an option of nbjit's own."""
    out, it = [], iter(argv)
    for a in it:
        if a == "--":
            out += [a, *it]
            break
        if len(a) >= 4 and "--option".startswith(a):  # (argparse accepts --op, --opti, ...)
            nxt = next(it, None)
            out.append(a if nxt is None else f"--option={nxt}")
        else:
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``nbjit`` console script; returns the exit status."""
    with _standard_streams():
        try:
            return _main(argv)
        except Usage as e:  # (a closed standard stream used as the arguments were read: --help >&-)
            print(f"nbjit: error: {e}", file=sys.stderr)
            return 2


class _Closed:
    """A standard stream that was closed as nbjit started (``>&-``, ``<&-``): reading or
    writing it is a usage error (one line, status 2)."""

    def __init__(self, what: str, hint: str):
        self.what, self.hint = what, hint

    def _refuse(self, *args, **kwargs) -> NoReturn:
        raise Usage(f"{self.what} is closed ({self.hint})")

    write = writelines = read = readline = fileno = _refuse
    buffer = property(lambda self: self)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@contextlib.contextmanager
def _standard_streams():
    """While ``main`` runs, the standard streams that were closed as the process started
    (Python's are None): their descriptors held on /dev/null, so that no file nbjit opens
    takes their number (where a library's print would land); standard input and output
    ``_Closed``, standard error a sink (nothing can be said there, the status says it)."""
    saved = sys.stdin, sys.stdout, sys.stderr
    for fd, stream in enumerate(saved):
        if stream is None:
            _hold(fd)
    sink = None
    if sys.stdin is None:
        sys.stdin = _Closed("standard input", "'-' reads it: give a file, or < FILE")
    if sys.stdout is None:
        sys.stdout = _Closed("standard output", "the command writes there: redirect it, > FILE or > /dev/null")
    if sys.stderr is None:
        sys.stderr = sink = open(os.devnull, "w")
    try:
        yield
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
        if sink is not None:
            sink.close()


def _hold(fd: int) -> None:
    """A closed descriptor (0, 1 or 2) opened on /dev/null."""
    try:
        os.fstat(fd)
        return  # open (the stream was set to None by its host)
    except OSError:
        pass
    devnull = os.open(os.devnull, os.O_RDWR)
    if devnull != fd:
        os.dup2(devnull, fd)
        os.close(devnull)


def _main(argv: list[str] | None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a path or PTX comment in any locale
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(_option_values(sys.argv[1:] if argv is None else list(argv)))
        if args.cmd is None and extra:
            parser.unrecognized(extra)  # (nbjit --versoin: did you mean --version?)
        if args.cmd is None:
            parser.error("give a command: inspect, strip, compile, bundle or cache (nbjit --help, "
                         "nbjit COMMAND --help)")
        if extra:
            parser.commands[args.cmd].unrecognized(extra)
        sys.stdout.flush()
    except BrokenPipeError:  # (nbjit --help | head -0)
        _quiet(sys.stdout)
        return 0
    except OSError as e:  # help or version text that standard output cannot take (nbjit --help > /dev/full)
        _quiet(sys.stdout)
        print(f"nbjit: error: cannot write standard output: {e.strerror or e}", file=sys.stderr)
        return 2

    def warn(message, category, filename, lineno, file=None, line=None) -> None:
        text = str(message)
        text = text[len("nbjit cache: "):] if text.startswith("nbjit cache: ") and args.cmd == "cache" else text
        print(f"nbjit {args.cmd}: warning: {text}", file=sys.stderr)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = warn  # (restored on leaving: main may run in a host process)
            try:
                return args.func(args)
            finally:
                sys.stdout.flush()
    except KeyboardInterrupt:  # Ctrl-C: stopped, as the user asked (no traceback), with the shell's status
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (nbjit inspect x | head -1): stop quietly, as Unix tools do
        _quiet(sys.stdout)
        return 0
    except (NbjitError, Usage, OSError) as e:
        if isinstance(e, OSError) and not isinstance(e, NbjitError):  # (standard output full or broken: /dev/full)
            e = f"{e.filename}: {e.strerror or e}" if e.filename else f"cannot write standard output: {e.strerror or e}"
            _quiet(sys.stdout)  # (what Python flushes at exit would fail again)
        try:
            print(f"nbjit {args.cmd}: error: {e}", file=sys.stderr)
        except BrokenPipeError:  # (2>&1 | head -0: the error goes unsaid, the status says it)
            _quiet(sys.stderr)
        return 2


def _quiet(stream) -> None:
    """Point ``stream``'s descriptor at /dev/null: its reader is gone, and what Python flushes
    at exit must not fail there (a traceback, or status 120)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
