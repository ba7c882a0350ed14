"""What the command's verbs share: a usage error (``Usage``: one line, status 2), inputs
read (``-`` for standard input) and outputs written (never over an input, never binary to a
terminal, an output's suffix the kind written), architectures parsed, tables."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from nbjit.files import MAX_FILE_BYTES, read_regular, write_file
from nbjit.arch import SHIPPED, Arch, existence_problem
from nbjit.errors import ImageFormatError, NbjitError
from nbjit.read.image import sniff


class Usage(Exception):
    pass


# what a command without -o writes to, for a -o given it
NO_OUTPUT = {"nbjit cache": "the archive is FILE: nbjit cache export FILE, - for standard output",
              "nbjit inspect": "inspect prints to standard output: redirect it, > FILE"}


def read_input(path: str) -> bytes:
    """A regular file's bytes: FIFOs, devices and directories are refused, never waited on
    or read without end. ``-`` is standard input (up to the same limit)."""
    if path == "-":
        data = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise Usage(f"standard input holds more than nbjit reads ({MAX_FILE_BYTES} bytes)")
        return data
    try:
        return read_regular(path)
    except OSError as e:
        raise Usage(f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise Usage(f"{path} is {e}") from None


def write_result(path: str, data: bytes, source: str, in_place: bool, in_place_option: bool = True) -> None:
    """Write ``data`` to ``path`` (see ``write_output``: a file is replaced whole, a device
    written through); an output that is the input (also through a link) is refused unless
    ``in_place`` (the hint names ``--in-place`` where the command has it). ``-`` is
    standard output."""
    if path == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    if not in_place:
        refuse_input(path, source, in_place_option)
    write_file(path, lambda f: f.write(data), Usage)


def shown(path: str) -> str:
    """An output as a report names it: ``-`` is standard output."""
    return "standard output" if path == "-" else path


def binary_to_stdout(what: str, given: str = "-o -") -> None:
    """Refuse binary output to standard output (``given``) where that is a terminal, as gzip and tar do."""
    if sys.stdout.isatty():
        raise Usage(f"{given}: {what} is binary, not for a terminal: redirect standard output (> FILE) or pipe it")


# the kinds of file an output's suffix names (any other suffix, and -, names none): nothing is
# written under the name of another kind than it is
NAMED = {".ptx": "PTX", ".cubin": "a cubin", ".fatbin": "a fatbin", ".nbjit": "a kernel bundle"}


def named_kind(output: str | None) -> str | None:
    """The kind of file ``-o output``'s suffix names (``NAMED``), or None."""
    return None if output is None or output == "-" else NAMED.get(Path(output).suffix.lower())


def refuse_named(output: str, writes: str, why: str) -> None:
    """Refuse ``-o output`` where its suffix names another kind than the ``writes`` it would
    get; ``why`` says which option makes it that and what to do instead."""
    named = named_kind(output)
    if named is not None and named != writes:
        raise Usage(f"-o {output} names {named}, and {why}; nothing written")


ARCH_EXAMPLES = "e.g. sm_90, sm_90a, sm_100f, compute_90"


def parse_archs(text: str, option: str) -> list[Arch]:
    """The architectures of ``--arch sm_80,sm_90`` (``option``), each given once."""
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        raise Usage(f"{option} {text!r}: give one or more architectures, separated by commas ({option} sm_80,sm_90)")
    archs = []
    for t in items:
        try:
            archs.append(Arch.parse(t) if t else None)
        except ValueError:
            raise Usage(f"{option} {t!r}: not an architecture ({ARCH_EXAMPLES})") from None
    if None in archs or len(set(archs)) != len(archs):
        raise Usage(f"{option} {text!r}: give architectures once each, separated by commas (sm_80,sm_90)")
    return archs


def check_exists(a: Arch, option: str) -> None:
    """Refuse an architecture no chip has (sm_91, sm_89a); one newer than all is let be."""
    problem = existence_problem(a)
    if problem:
        raise Usage(f"{option} {a}: {problem}")


def check_compilable(a: Arch, option: str, *, tool: str = "NVRTC", newer: str = "") -> None:
    """Refuse an architecture this NVRTC (or nvJitLink, ``tool``, where it is NVRTC's version)
    cannot compile for, naming those it can; ``newer``: the option that would give PTX for
    the newest it knows, for a GPU newer than it (none: no such hint)."""
    from nbjit.toolchain.nvjitlink import nvjitlink_version
    from nbjit.toolchain.nvrtc import nvrtc_version, supported_archs
    try:
        known, version = supported_archs(), nvrtc_version()
    except NbjitError:
        check_exists(a, option)
        return  # no NVRTC: what compiles (or not) says why
    problem = existence_problem(a, known or SHIPPED)  # (suggesting only what this NVRTC compiles for)
    if problem:
        raise Usage(f"{option} {a}: {problem}")
    if tool != "NVRTC":
        if nvjitlink_version() != version:
            return  # another CUDA's nvJitLink: it says what it refuses
    if not known or a.number in known:
        return
    prefix = "compute" if a.virtual else "sm"
    hint = ""
    if a.number > max(known) and newer and not a.variant:
        hint = f" (for a newer GPU, PTX for compute_{max(known)} runs there: {newer} compute_{max(known)})"
    elif a.number < min(known):
        hint = " (an older CUDA's may)"
    verb, verbs = ("compile", "compiles") if tool == "NVRTC" else ("assemble PTX", "assembles PTX")
    raise Usage(f"{option} {a}: {tool} {version[0]}.{version[1]} cannot {verb} for it; it {verbs} for "
                 + ", ".join(f"{prefix}_{n}" for n in known) + hint)


def refuse_input(path: str, source: str, in_place_option: bool = True) -> None:
    """Refuse an output that is the input (also through a link)."""
    if source != "-" and os.path.exists(path) and os.path.exists(source) and os.path.samefile(path, source):
        hint = "pass --in-place to replace it, or choose another -o" if in_place_option else "choose another -o"
        named = "" if os.path.normpath(path) == os.path.normpath(source) else f" {source}"  # (a path said once)
        raise Usage(f"-o {path} is the input file{named}: refusing to overwrite it ({hint})")


def table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip(), fmt.format(*("-" * w for w in widths))] + \
        [fmt.format(*map(str, r)).rstrip() for r in rows]


def count(n: int, noun: str) -> str:
    """``1 entry``, ``2 entries``, ``0 images``."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun[:-1] + 'ies' if noun.endswith('y') else noun + 's'}"


def cannot_write(directory) -> str | None:
    """Why a file cannot be made in ``directory`` (made where it is missing), or None."""
    import tempfile
    try:
        os.makedirs(directory, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".nbjit-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return e.strerror or str(e)
    return None


def size_arg(text: str) -> int:
    """--max-bytes's value: a byte count, with a unit or without."""
    from nbjit.cache.store import parse_size
    n = parse_size(text)
    if n is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count >= 0 (e.g. 1073741824, 100k, 512M, 1G)")
    return n


def image_kind(raw: bytes, path: str) -> str | None:
    """The kind of image ``raw`` is (``sniff``), or None where it is none."""
    try:
        return sniff(raw, path)
    except ImageFormatError:
        return None


def check_source(raw: bytes, path: str) -> None:
    """CUDA C++ source is UTF-8 text; compiled code and binary files are named as what they are;
    an empty file is no source."""
    if not raw.strip():
        raise Usage(f"{'standard input' if path in ('-', '<stdin>') else path} is empty: no CUDA source to compile")
    kind = image_kind(raw, path)  # (None: not an image; good, it should be source)
    if kind is not None:
        raise Usage(f"{path} is {kind}, already compiled: inspect it with 'nbjit inspect' or load it with "
                     "nbjit.load(), it needs no compiling")
    if raw.startswith(b"PK\x03\x04"):
        raise Usage(f"{path} is a ZIP archive (a kernel bundle?), not CUDA source: a bundle is already compiled "
                     "(inspect it with 'nbjit inspect', load it with nbjit.load_bundle())")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Usage(f"{path} is not UTF-8 text (byte {e.start} is {raw[e.start:e.start + 1]!r}): CUDA source must "
                     "be UTF-8 (convert it, e.g. iconv -f latin1 -t utf-8)") from None
    if b"\0" in raw:
        raise Usage(f"{path} holds NUL bytes: binary data, not CUDA source")
