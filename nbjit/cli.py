"""The ``nbjit`` command: inspect and strip PTX (and, as they land, cubins, fatbins, caches)."""
from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import NoReturn

from nbjit.arch import SHIPPED, Arch, existence_problem
from nbjit.read.cubin import EM_CUDA, CubinInfo, inspect_cubin
from nbjit.errors import ImageFormatError, NbjitError, NbjitWarning
from nbjit.read.fatbin import DECODERS, FatbinInfo, inspect_fatbin, undecoded
from nbjit.files import write_output
from nbjit.read.image import MAX_FILE_BYTES, Image, inspect_image, read_regular, sniff
from nbjit.read.ptx import PtxInfo, inspect_ptx, strip_debug
from nbjit.params.cdecl import demangled_text
from nbjit.params.signature import typed_entries
from nbjit.params.signature import RESOURCES, shown_param_name

__all__ = ["main"]


class _Usage(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as nbjit's: one line, ``nbjit <command>: error: ...``, and
    a did-you-mean where a close name exists."""

    commands: dict[str, "_Parser"]  # the top level's: each command's parser

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
            elif a.split("=", 1)[0] in ("-o", "--output") and self.prog in _NO_OUTPUT:
                hints.append(_NO_OUTPUT[self.prog])
        self.error(f"unrecognized arguments: {' '.join(extra)}" + (f" ({'; '.join(hints)})" if hints else ""))


# what a command without -o writes to, for a -o given it
_NO_OUTPUT = {"nbjit cache": "the archive is FILE: nbjit cache export FILE, - for standard output",
              "nbjit inspect": "inspect prints to standard output: redirect it, > FILE"}


def _read(path: str) -> bytes:
    """A regular file's bytes: FIFOs, devices and directories are refused, never waited on
    or read without end. ``-`` is standard input (up to the same limit)."""
    if path == "-":
        data = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise _Usage(f"standard input holds more than nbjit reads ({MAX_FILE_BYTES} bytes)")
        return data
    try:
        return read_regular(path)
    except OSError as e:
        raise _Usage(f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise _Usage(f"{path} is {e}") from None


def _write(path: str, data: bytes, source: str, in_place: bool, in_place_option: bool = True) -> None:
    """Write ``data`` to ``path`` (see ``write_output``: a file is replaced whole, a device
    written through); an output that is the input (also through a link) is refused unless
    ``in_place`` (the hint names ``--in-place`` where the command has it). ``-`` is
    standard output."""
    if path == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    if not in_place:
        _refuse_input(path, source, in_place_option)
    try:
        write_output(path, lambda f: f.write(data))
    except OSError as e:
        raise _Usage(f"cannot write {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise _Usage(f"cannot write {path}: it is {e}") from None


def _shown(path: str) -> str:
    """An output as a report names it: ``-`` is standard output."""
    return "standard output" if path == "-" else path


def _binary_to_stdout(what: str, given: str = "-o -") -> None:
    """Refuse binary output to standard output (``given``) where that is a terminal, as gzip and tar do."""
    if sys.stdout.isatty():
        raise _Usage(f"{given}: {what} is binary, not for a terminal: redirect standard output (> FILE) or pipe it")


# the kinds of file an output's suffix names (any other suffix, and -, names none): nothing is
# written under the name of another kind than it is
_NAMED = {".ptx": "PTX", ".cubin": "a cubin", ".fatbin": "a fatbin", ".nbjit": "a kernel bundle"}


def _named(output: str | None) -> str | None:
    """The kind of file ``-o output``'s suffix names (``_NAMED``), or None."""
    return None if output is None or output == "-" else _NAMED.get(Path(output).suffix.lower())


def _refuse_named(output: str, writes: str, why: str) -> None:
    """Refuse ``-o output`` where its suffix names another kind than the ``writes`` it would
    get; ``why`` says which option makes it that and what to do instead."""
    named = _named(output)
    if named is not None and named != writes:
        raise _Usage(f"-o {output} names {named}, and {why}; nothing written")


_ARCH_EXAMPLES = "e.g. sm_90, sm_90a, sm_100f, compute_90"


def _parse_archs(text: str, option: str) -> list[Arch]:
    """The architectures of ``--arch sm_80,sm_90`` (``option``), each given once."""
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        raise _Usage(f"{option} {text!r}: give one or more architectures, separated by commas ({option} sm_80,sm_90)")
    archs = []
    for t in items:
        try:
            archs.append(Arch.parse(t) if t else None)
        except ValueError:
            raise _Usage(f"{option} {t!r}: not an architecture ({_ARCH_EXAMPLES})") from None
    if None in archs or len(set(archs)) != len(archs):
        raise _Usage(f"{option} {text!r}: give architectures once each, separated by commas (sm_80,sm_90)")
    return archs


def _check_exists(a: Arch, option: str) -> None:
    """Refuse an architecture no chip has (sm_91, sm_89a); one newer than all is let be."""
    problem = existence_problem(a)
    if problem:
        raise _Usage(f"{option} {a}: {problem}")


def _check_compilable(a: Arch, option: str, *, tool: str = "NVRTC", newer: str = "") -> None:
    """Refuse an architecture this NVRTC (or nvJitLink, ``tool``, where it is NVRTC's version)
    cannot compile for, naming those it can; ``newer``: the option that would give PTX for
    the newest it knows, for a GPU newer than it (none: no such hint)."""
    from nbjit.toolchain.nvjitlink import nvjitlink_version
    from nbjit.toolchain.nvrtc import nvrtc_version, supported_archs
    try:
        known, version = supported_archs(), nvrtc_version()
    except NbjitError:
        _check_exists(a, option)
        return  # no NVRTC: what compiles (or not) says why
    problem = existence_problem(a, known or SHIPPED)  # (suggesting only what this NVRTC compiles for)
    if problem:
        raise _Usage(f"{option} {a}: {problem}")
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
    raise _Usage(f"{option} {a}: {tool} {version[0]}.{version[1]} cannot {verb} for it; it {verbs} for "
                 + ", ".join(f"{prefix}_{n}" for n in known) + hint)


def _refuse_input(path: str, source: str, in_place_option: bool = True) -> None:
    """Refuse an output that is the input (also through a link)."""
    if source != "-" and os.path.exists(path) and os.path.exists(source) and os.path.samefile(path, source):
        hint = "pass --in-place to replace it, or choose another -o" if in_place_option else "choose another -o"
        named = "" if os.path.normpath(path) == os.path.normpath(source) else f" {source}"  # (a path said once)
        raise _Usage(f"-o {path} is the input file{named}: refusing to overwrite it ({hint})")


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip(), fmt.format(*("-" * w for w in widths))] + \
        [fmt.format(*map(str, r)).rstrip() for r in rows]


def _ptx_type(p) -> str:
    """A parameter's type as the PTX declares it: ``.u32``, ``.b8[2]``, ``.u64 .ptr .global``."""
    return (f".{p.type}" + (f"[{p.count}]" if p.count is not None else "")
            + (" .ptr" + (f" .{p.space}" if p.space else "") if p.pointer else ""))


def format_entries(entries, out: list[str], declared=None) -> None:
    """Append a person-readable description of kernel entries to ``out``: ``entries`` typed
    (C types from mangled names), ``declared`` the same entries as the PTX declares them
    (None for a cubin, which declares no types)."""
    if not entries:
        out += ["", "no kernels"]  # (a template never instantiated, an empty source: nothing to launch)
    for k, e in enumerate(entries):
        head = f"entry {e.name}"
        if e.linkage:
            head += f"  ({e.linkage})"
        readable = demangled_text(e.name)
        if readable:
            head += f"\n  = {readable}"
        out.append("")
        out.append(head)
        res = [f"{k} {getattr(e, k)}" for k in RESOURCES
               if getattr(e, k) is not None]
        if res:
            out.append("  resources: " + ", ".join(res))
        if e.params:
            own = declared[k].params if declared is not None else None
            rows = [[i, shown_param_name(p.name, i), p.ctype or "?",
                     *([_ptx_type(own[i])] if own else []),
                     p.size, "?" if p.align is None else p.align, p.offset] for i, p in enumerate(e.params)]
            out += ["  " + line for line in _table(rows, ["#", "name", "C type", *(["PTX type"] if own else []),
                                                          "size", "align", "offset"])]
        out.append(f"  parameter buffer: {e.param_size} bytes")
        d = e.directives.to_json()
        if d:
            out.append("  directives: " + ", ".join(
                k if v is True else f"{k} {','.join(map(str, v)) if isinstance(v, list) else v}"
                for k, v in d.items()))
        if e.griddepcontrol:
            out.append(f"  griddepcontrol: {', '.join(e.griddepcontrol)}"
                       + (" (programmatic dependent launch by default)" if e.waits_for_grid else ""))


def format_ptx(info: PtxInfo, path: str) -> str:
    out = [f"{path}: PTX {info.version[0]}.{info.version[1]}, target {', '.join(info.targets)}"
           + (" (debug)" if info.debug.target_debug else "")
           + (f", address size {info.address_size}" if info.address_size else "")]
    format_entries(typed_entries(info.entries, "ptx"), out, info.entries)
    if info.functions:
        out.append("")
        out.append("device functions: " + ", ".join(
            f.name + ("" if f.defined else " (extern)") for f in info.functions))
    if info.globals:
        out.append("")
        rows = [[g.name, g.space, g.type, "dynamic" if g.size is None else g.size, g.align,
                 g.linkage or ""] for g in info.globals]
        out += _table(rows, ["global", "space", "type", "size", "align", "linkage"])
    if info.metadata:
        out.append("")
        out.append("metadata comments: " + ", ".join(f"{k}={v}" for k, v in info.metadata.items()))
    d = info.debug
    out.append("")
    desc = {"none": "none", "lineinfo": "line info (.file/.loc)", "dwarf": "DWARF"}[d.kind]
    extra = []
    if d.sections:
        extra.append("sections " + " ".join(d.sections))
    if d.lineinfo:
        extra.append(".loc lines")
    if d.files:
        extra.append(f"{len(d.files)} .file")
    if d.target_debug:
        extra.append(".target debug")
    if d.dwarf_legacy:
        extra.append("@@DWARF lines")
    out.append(f"debug info: {desc}" + (f" ({'; '.join(extra)})" if extra else ""))
    return "\n".join(out)


def format_cubin(info: CubinInfo, path: str) -> str:
    tk = f", CUDA {info.toolkit // 10}.{info.toolkit % 10}" if info.toolkit else ""
    vt = f", from PTX for compute_{info.virtual_arch}" if info.virtual_arch else ""
    out = [f"{path}: cubin for {info.arch}{vt}{tk} (ELF ABI v{info.abi_version - 6}"
           f"{', relocatable' if info.relocatable else ''})"]
    entries = typed_entries(info.entries, "cubin")
    if any(p.ctype is None and p.type == "unknown" for e in entries for p in e.params):
        out.append("(a cubin records parameter sizes and offsets, not types; C types come from mangled names: "
                   "'?' = type unknown)")
    format_entries(entries, out)
    if info.shared_reserved:
        out.append("")
        out.append(f"(shared memory excludes the {info.shared_reserved} bytes the system reserves per block "
                   f"on {info.arch})")
    if info.functions:
        out.append("")
        out.append("device functions: " + ", ".join(info.functions))
    if info.globals:
        out.append("")
        out += _table([[g.name, g.space, g.size, g.section] for g in info.globals],
                      ["global", "space", "size", "section"])
    return "\n".join(out)


def damaged_entries(info: FatbinInfo, path: str) -> dict[int, str]:
    """{index: what is wrong} for each cubin of fatbin ``info`` whose ELF structure (header,
    section table, sections within the file, a CUDA machine) is broken."""
    from nbjit.read.elf import ElfFile

    out = {}
    for e in info.entries:
        if e.kind == "cubin" and e.payload is not None:
            try:
                ElfFile(e.payload, f"{path}[{e.index}]", machine=(EM_CUDA, "CUDA"), what="cubin")
            except ImageFormatError as err:
                out[e.index] = str(err)
    return out


def format_fatbin(info: FatbinInfo, path: str, arch: Arch | str | None, damaged: dict[int, str] | None = None) -> str:
    out = [f"{path}: fatbin with {_count(len(info.entries), 'entry')}"]
    if damaged is None:
        damaged = damaged_entries(info, path)
    rows = [[e.index, e.kind, e.arch_name, e.compression or "-", e.size,
             "no (damaged: below)" if e.index in damaged else
             "yes" if e.payload is not None else "no (nvJitLink reads it)" if e.kind == "ltoir" else
             f"no (needs {DECODERS[e.compression]})"] for e in info.entries]
    out += _table(rows, ["#", "kind", "arch", "compressed", "bytes", "readable"])
    for msg in damaged.values():
        out.append(f"damaged: {msg}")
    if arch:
        chosen = info.select(arch)
        out.append("")
        if chosen is None:
            out.append(f"no entry runs on {arch}")
        else:
            out.append(f"{arch} uses entry {chosen.index} ({chosen.kind} {chosen.arch}):")
            if chosen.index in damaged:
                out.append("  damaged (above): not a cubin the driver can load")
            elif chosen.payload is None:
                out.append(f"  {undecoded(chosen)}: the driver will read the whole fatbin")
            else:
                out.append(_describe(Image(chosen.payload, chosen.kind, f"{path}[{chosen.index}]"), None))
    return "\n".join(out)


def format_triton(d: dict, path: str) -> str:
    r = d["launch"]
    out = [f"{path}: Triton kernel {d['name']} (Triton {d['triton_version'] or '?'}, sm_{d['arch']}; metadata "
           f"from {d['metadata_from']})",
           f"  images: {', '.join(x for x in (d['cubin'], d['ptx']) if x)}",
           f"  launch: kernel[grid](*args): block ({r['block'][0]}, 1, 1) = {d['num_warps']} warps, "
           f"{r['dynamic_shared']} bytes dynamic shared memory, grid x times {r['num_ctas']} CTA(s)"
           + (", cooperative" if r["cooperative"] else "")
           + (", programmatic dependent (launch_pdl)" if d.get("launch_pdl") else ""),
           f"  arguments: {r['user_params']}, the first {r.get('kernel_params', r['user_params'])} parameters; "
           f"nbjit passes {r['scratch_params']} scratch "
           f"pointer(s): global {r['global_scratch']['bytes_per_program']} B/program (align "
           f"{r['global_scratch']['align']}), profile {r['profile_scratch']['bytes_per_program']} B/program"]
    if d.get("griddepcontrol"):
        out.append(f"  griddepcontrol: {', '.join(d['griddepcontrol'])}")
    role, descs = {}, {x["param"] for x in r.get("descriptors", ())}
    for x in r.get("descriptors", ()):
        role[x["param"]] = f"argument {x['arg']}: tensor descriptor ({x['dtype']}, box {x['block']}, swizzle " \
                           f"{x['swizzle']})"
        for j in range(x["ndim"]):
            role[x["param"] + 1 + j] = f"  its shape[{j}]"
            role[x["param"] + 1 + x["ndim"] + j] = f"  its strides[{j}]"
    rows, arg = [], 0
    for i, p in enumerate(d["params"]):
        if i >= r.get("kernel_params", r["user_params"]):
            what = "scratch"
        elif i in role:
            what = role[i]
            arg += i in descs  # a descriptor is one argument; its shape and strides are not
        else:
            what, arg = f"argument {arg}", arg + 1
        rows.append([i, p["name"], p.get("ctype", "?"), p["type"], p["size"], p["offset"], what])
    out += ["  " + line for line in _table(rows, ["#", "name", "C type", "PTX type", "size", "offset", "role"])]
    return "\n".join(out)


def _describe(img: Image, arch: str | None, info=None, damaged: dict[int, str] | None = None) -> str:
    info = inspect_image(img) if info is None else info
    if isinstance(info, PtxInfo):
        return format_ptx(info, img.name)
    if isinstance(info, CubinInfo):
        return format_cubin(info, img.name)
    return format_fatbin(info, img.name, arch, damaged)


def _typed_json(info) -> dict:
    """``info.to_json()``, with each kernel's parameters typed as nbjit launches them."""
    j = info.to_json()
    if isinstance(info, (PtxInfo, CubinInfo)):
        j["entries"] = [e.to_json() for e in typed_entries(info.entries, j["kind"])]
    return j


def _inspect(args) -> int:
    if args.arch:
        try:
            args.arch = Arch.parse(args.arch)  # (the value from here on)
        except ValueError:
            raise _Usage(f"--arch {args.arch!r}: not an architecture ({_ARCH_EXAMPLES})") from None
        _check_exists(args.arch, "--arch")
    compiled = args.sass or args.occupancy or args.fail_on_spills
    what = "--sass, --occupancy and --fail-on-spills read one cubin, or PTX with --arch"
    if args.file != "-" and (Path(args.file).is_dir() or args.file.endswith(".json")):
        if compiled:
            raise _Usage(f"{what}: give the Triton kernel's .cubin file, not {args.file}")
        if args.arch:
            raise _Usage("--arch chooses a fatbin's entry; a Triton kernel has its own")
        from nbjit.loading.triton import describe
        d = describe(args.file)
        print(json.dumps(d, indent=2) if args.json else format_triton(d, args.file))
        return 0
    raw = _read(args.file)
    if raw.startswith(b"PK\x03\x04"):  # a ZIP archive: a kernel bundle, or refused as not one
        if compiled:
            raise _Usage(f"{what}: a kernel bundle holds several: {_unzip_hint(args, raw)}")
        return _inspect_bundle(args, raw)
    if args.file.endswith(".nbjit") and _kind(raw, args.file) is None:
        raise _Usage(f"{args.file}: not a kernel bundle (a bundle is a ZIP archive, and this file is not one) nor "
                     "an image (PTX, cubin, fatbin)")
    img = Image.from_bytes(raw, "<stdin>" if args.file == "-" else args.file)
    if args.arch and img.kind == "cubin" and not args.occupancy:
        raise _Usage(f"--arch chooses a fatbin's entry, or with --occupancy the GPU whose limits count; "
                     f"{args.file} is a cubin, whose SASS is its own")
    if args.arch and img.kind == "ptx" and not compiled:
        raise _Usage(f"--arch chooses a fatbin's entry; {args.file} is ptx, not a fatbin (with --sass, "
                     "--occupancy or --fail-on-spills it names the SASS to assemble the PTX to)")
    if compiled:
        return _inspect_compiled(args, img)
    info = inspect_image(img)
    damaged = damaged_entries(info, img.name) if isinstance(info, FatbinInfo) else {}
    if args.json:
        j = _typed_json(info)
        if isinstance(info, FatbinInfo):
            for e in j["entries"]:
                if e["index"] in damaged:
                    e["damaged"] = damaged[e["index"]]
            if args.arch:
                chosen = info.select(args.arch)
                j["selected"] = None if chosen is None else chosen.index
                if chosen is not None and chosen.payload is not None and chosen.index not in damaged:
                    j["selected_entry"] = _typed_json(inspect_image(Image(chosen.payload, chosen.kind)))
        print(json.dumps(j, indent=2))
    else:
        print(_describe(img, args.arch, info, damaged))
    # a check that found nothing to run fails, for scripts: a damaged cubin, no entry for --arch
    failed = []
    if damaged:
        failed.append(f"{_count(len(damaged), 'entry')} damaged (#{', #'.join(map(str, damaged))}): not a cubin "
                      "the driver can load")
    if isinstance(info, FatbinInfo) and args.arch and info.select(args.arch) is None:
        failed.append(f"no entry runs on {args.arch}")
    return _failed(img.name, failed)


def _failed(name: str, failed: list[str]) -> int:
    """Exit status 1 where an inspection found what makes ``name`` fail (``failed``, each said
    on standard error), else 0."""
    for why in failed:
        try:
            print(f"nbjit inspect: {name}: {why}", file=sys.stderr)
        except BrokenPipeError:  # (standard error's reader went away: the status still says it)
            pass
    return 1 if failed else 0


def _count(n: int, noun: str) -> str:
    """``1 entry``, ``2 entries``, ``0 images``."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun[:-1] + 'ies' if noun.endswith('y') else noun + 's'}"


_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"', re.M)


def _occupancy_arg(text: str) -> tuple[int, int]:
    """``BLOCK[,SMEM]`` -> (threads per block, dynamic shared bytes)."""
    parts = text.split(",")
    try:
        if len(parts) > 2:
            raise ValueError
        block, smem = int(parts[0]), int(parts[1]) if len(parts) == 2 else 0
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not BLOCK[,SMEM] (threads per block, then dynamic shared "
                                         "memory in bytes: 256 or 256,4096)") from None
    if not 1 <= block <= 1024 or smem < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a block is 1 to 1024 threads (on every NVIDIA GPU), shared "
                                         "memory at least 0 bytes")
    return block, smem


def _inspect_compiled(args, img: Image) -> int:
    """--sass, --occupancy, --fail-on-spills: about the cubin ``img`` is, or gives for --arch."""
    from nbjit.read.occupancy import occupancy
    from nbjit.toolchain.sass import cubin_for, disassemble
    if img.kind != "cubin" and not args.arch:
        raise _Usage(f"{img.name} is {img.kind}: give --arch (e.g. sm_90) for the SASS it gives")
    ptx = img.data if img.kind == "ptx" else None
    if img.kind == "fatbin":
        fat = inspect_fatbin(img.data, source=img.name)
        chosen = fat.select(args.arch)
        if chosen is None:
            raise _Usage(f"--arch {args.arch}: no entry of {img.name} runs on it (it holds "
                         f"{', '.join(e.arch_name for e in fat.entries)})")
        ptx = chosen.payload if chosen.kind == "ptx" else None
    if ptx is not None:  # assembled for --arch by nvJitLink: said here, in one line, what it would refuse
        _check_compilable(args.arch.real(), "--arch", tool="nvJitLink")
        declared = inspect_ptx(ptx, source=img.name).arch
        try:
            target = Arch.parse(declared, virtual=True)
        except ValueError:  # (a .target that names no architecture: nvJitLink says what it makes of it)
            target = None
        if target is not None and not target.runs_on(args.arch):
            where = {"a": f"{target.real()} only", "f": f"the sm_{target.major}x family from {target.real()}"}.get(
                target.variant, f"{target.real()} and newer")
            raise _Usage(f"--arch {args.arch}: {img.name} holds PTX for {target.real()}, which assembles for "
                         f"{where}")
    data = cubin_for(img, args.arch)
    info = inspect_cubin(data, source=img.name)
    if img.kind == "cubin" and args.arch and not info.arch.runs_on(args.arch):
        raise _Usage(f"--arch {args.arch}: {img.name} is a cubin for {info.arch}, which does not run on it")
    entries = typed_entries(info.entries, "cubin")
    out: dict = {"file": img.name, "arch": str(info.arch)}
    device = args.arch.real() if args.arch else info.arch  # (an sm_86 GPU runs an sm_80 cubin by sm_86's limits)
    if args.occupancy:
        block, smem = args.occupancy
        out["occupancy"] = [occupancy(e, device, block, smem).to_json() for e in info.entries]
    spilling = [e for e in entries if e.spills]
    out["spills"] = [{"kernel": e.name, "spills": e.spills, "frame": e.frame} for e in spilling]
    if args.sass:
        out["sass"] = disassemble(data, name=img.name)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        if args.sass:
            print(out["sass"], end="")
        if args.occupancy:
            rows = [[o["kernel"], e.registers, e.shared, o["blocks_per_sm"],
                     f"{o['warps_per_sm']}/{o['max_warps_per_sm']}", f"{o['occupancy']:.0%}",
                     ",".join(o["limited_by"])] for o, e in zip(out["occupancy"], entries)]
            print(f"{img.name}: occupancy on {device}" + (f" (its {info.arch} cubin)" if device != info.arch else "")
                  + f", block {block}, dynamic shared {smem} bytes")
            print("\n".join(_table(rows, ["kernel", "registers", "shared", "blocks/SM", "warps/SM", "occupancy",
                                          "limited by"])))
        if args.fail_on_spills and not spilling:
            print(f"{img.name}: no kernel spills registers ({len(entries)} kernels, {info.arch})")
    if args.fail_on_spills and spilling:
        names = ", ".join(f"{e.name} ({e.spills} spill instructions, {e.frame} byte stack frame)" for e in spilling)
        print(f"nbjit inspect: {img.name}: {len(spilling)} kernel(s) spill registers to local memory: {names}",
              file=sys.stderr)
        return 1
    unknown = [e.name for e in entries if e.spills is None]
    if args.fail_on_spills and unknown:
        print(f"nbjit inspect: {img.name}: whether {', '.join(unknown)} spill is not recorded (a cubin from a ptxas "
              "older than CUDA 13 with a stack frame): check its SASS (--sass) for STL/LDL", file=sys.stderr)
        return 1
    return 0


def _unzip_hint(args, raw: bytes) -> str:
    """How to take one of bundle ``raw``'s members out to inspect it (a bundle is a ZIP archive
    of the compiler's own files): the member --arch would use, else its first cubin."""
    from nbjit.bundles.build import image_of, read_bundle
    member = "IMAGE/sm_XX.cubin"
    try:
        info = read_bundle(raw, args.file)
        first = info.images[0]
        chosen = inspect_fatbin(image_of(info, first).data).select(args.arch) if args.arch else None
        member = f"{first.name}/{chosen.arch}.{chosen.kind}" if chosen else \
            next((e for e in first.entries if e.kind == "cubin"), first.entries[0]).file
    except (NbjitError, IndexError):  # (a bundle that does not read: the placeholder)
        pass
    bundle = "BUNDLE" if args.file == "-" else args.file
    return (f"take one out with unzip and inspect that (unzip -p {bundle} {member} > {Path(member).name}; "
            f"'nbjit inspect {bundle}' lists the members)")


def _inspect_bundle(args, raw: bytes) -> int:
    from nbjit.bundles.build import image_of, read_bundle

    label = "<stdin>" if args.file == "-" else args.file
    info = read_bundle(raw, label)
    chosen = {}
    if args.arch:
        for img in info.images:
            e = inspect_fatbin(image_of(info, img).data).select(args.arch)
            chosen[img.name] = None if e is None else f"{img.name}/{e.arch}.{e.kind}"
    none = [name for name, member in chosen.items() if member is None]
    failed = [f"no entry of image{'s' * (len(none) > 1)} {', '.join(none)} runs on {args.arch}"] if none else []
    if args.json:
        j = info.to_json()
        if args.arch:
            j["selected"] = chosen
        print(json.dumps(j, indent=2))
        return _failed(label, failed)
    out = [f"{label}: nbjit bundle (format {info.version}, made by nbjit {info.nbjit or '?'}), "
           f"{len(info.images)} image{'s' * (len(info.images) != 1)}"]
    for img in info.images:
        out += ["", f"image {img.name}: from " + ", ".join(f"{s.get('name')} ({s.get('kind')})" for s in img.sources)
                + (f", {img.producer}" if img.producer else "") + (f", options {' '.join(img.options)}"
                                                                    if img.options else "")]
        rows = [[e.kind, e.arch, e.size, e.file + (f"  <- {args.arch}" if chosen.get(img.name) == e.file else "")]
                for e in img.entries]
        out += ["  " + line for line in _table(rows, ["kind", "arch", "bytes", "member"])]
        if args.arch and chosen.get(img.name) is None:
            out.append(f"  no entry runs on {args.arch}")
        for e, m in img.lowered_names.items():
            out.append(f"  {e} -> {m}")
        if img.triton is not None:
            out.append(f"  Triton metadata: num_warps {img.triton.get('num_warps')}, shared {img.triton.get('shared')}")
        format_entries(img.kernels, out)
    print("\n".join(out))
    return _failed(label, failed)


def _bundle(args) -> int:
    from nbjit.bundles.archive import is_image_name
    from nbjit.bundles.build import bundle_bytes

    # everything the command line can get wrong is said here, in its terms (--arch, --name), before
    # anything is compiled; what only building finds is said by build_bundle's own checks
    to_stdout = args.output == "-"
    files = [f for f in args.files if f != "-"]  # (-: standard input, read by _bundle_inputs)
    for f in files:
        if not os.path.lexists(f):
            raise _Usage(f"cannot read {f}: No such file or directory")
    if to_stdout:
        _binary_to_stdout("a bundle")
    else:
        if os.path.isdir(args.output):
            raise _Usage(f"-o {args.output} is a directory: give the bundle's file name "
                         f"({os.path.join(args.output, 'kernels.nbjit')})")
        for f in files:
            _refuse_input(args.output, f, in_place_option=False)
        _refuse_named(args.output, "a kernel bundle", f"nbjit bundle writes a kernel bundle (a ZIP archive): name it "
                      f"{Path(args.output).stem}.nbjit")
    if args.name is not None and not is_image_name(args.name):
        raise _Usage(f"--name {args.name!r}: an image name is 1 to 128 letters, digits, '_', '.', '+' or '-', not "
                     "starting with '.', '+' or '-'")
    archs = _parse_archs(args.arch, "--arch") if args.arch is not None else []
    for a in archs:
        if a.virtual:
            raise _Usage(f"--arch {a} is a virtual architecture (PTX): give --ptx {a} for PTX, or --arch {a.real()} "
                         "for a cubin")
        _check_compilable(a, "--arch", newer="--ptx")
    ptx = [Arch(a.number, a.variant, True) for a in _parse_archs(args.ptx, "--ptx")] if args.ptx is not None else []
    for a in ptx:
        _check_compilable(a, "--ptx", newer="--ptx")
    inputs, sources = _bundle_inputs(args)
    if sources and not archs and not ptx:
        shown = "standard input" if sources[0] == "-" else sources[0]
        raise _Usage(f"{shown} is CUDA source: say what to compile it for with --arch (SASS: sm_80,sm_90) "
                     "and/or --ptx (PTX: compute_80)")
    if args.expr and not sources:
        raise _Usage(f"--expr {args.expr[0]}: name expressions instantiate templates of CUDA C++ sources (FILEs named "
                     ".cu, .cuh or .cuda), and no FILE is one: drop --expr")
    if (archs or ptx) and not sources:
        from nbjit.loading.triton import read_triton
        for f in files:  # a FILE that is no image (or a directory holding no Triton kernel) is said first
            if os.path.isdir(f) or f.endswith(".json"):
                read_triton(f)
            else:
                Image.from_bytes(_read(f), f)
        given = " and ".join(o for o, v in (("--arch", archs), ("--ptx", ptx)) if v)
        raise _Usage(f"{given} {'say' if ptx and archs else 'says'} what to compile CUDA sources for, and no FILE is "
                     "one (named .cu, .cuh or .cuda; PTX, cubins, fatbins and Triton kernels go in as they were "
                     f"built): drop {given}")
    opts = [o for d in args.include for o in ("-I", d)] + [f"-D{d}" for d in args.define] + list(args.option)
    with warnings.catch_warnings():
        # (a source that compiles to no kernel: the error below says so, with what to do)
        warnings.filterwarnings("ignore", "(?s).*NVRTC compiled no kernel", NbjitWarning)
        data, info = bundle_bytes(inputs, None if to_stdout else Path(args.output), archs=archs, ptx=ptx,
                                  options=opts, name_expressions=_expressions(args, sources))
    for img in info.images:
        if not img.kernels:
            names = ", ".join(str(s.get("name")) for s in img.sources)
            why = ("a template kernel is compiled only where it is instantiated (--expr 'name<float>'), and a "
                   "kernel is declared __global__" if any(s.get("kind") == "cuda" for s in img.sources)
                   else "it declares no .entry")
            raise _Usage(f"{names}: no kernel to launch in image {img.name!r}: {why}; nothing written")
    _write(args.output, data, "-", in_place=True)  # (never over an input: refused above)
    shown = "<stdout>" if to_stdout else args.output
    for img in info.images:
        print(f"{shown}: {img.name}: {', '.join(map(str, img.archs))} ({_count(len(img.kernels), 'kernel')})",
              file=sys.stderr)
        for e, m in img.lowered_names.items():
            print(f"  {e} -> {m}", file=sys.stderr)
    return 0


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
            raise _Usage(f"{f} is given twice")
        if first != f:
            raise _Usage(f"{first} and {f} would both be image {_image_name(p)!r} (each FILE is one image, named "
                         "after the file): rename one, or give --name NAME to put them in one image")
    sources = [f for f in args.files if Path(f).suffix.lower() in SOURCE_SUFFIXES]
    if "-" not in args.files:
        return ({args.name: args.files} if args.name else args.files), sources
    if args.files.count("-") > 1:
        raise _Usage("- is given twice: standard input is read once")
    if len(args.files) > 1 and not args.name:
        raise _Usage("- among other FILEs needs --name NAME, to put them all in one image (each FILE is one image "
                     "named after the file, and standard input has no name)")
    raw = _read("-")
    kind = _kind(raw, "<stdin>")
    if kind is not None:
        given: object = Image(raw, kind, "<stdin>")
    else:
        _check_source(raw, "<stdin>")
        text = raw.decode("utf-8")
        given, sources = text if "\n" in text else text + "\n", [*sources, "-"]  # (one line of text is no path)
    if args.name:
        return {args.name: [given if f == "-" else f for f in args.files]}, sources
    return {"stdin": given}, sources


def _cannot_write(directory) -> str | None:
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


def _expressions(args, sources: list[str]) -> "list[str] | dict[str, list[str]]":
    """``bundle``'s --expr: each ``EXPR`` for every CUDA source, each ``IMAGE=EXPR`` for that
    image's only (as ``build_bundle``'s ``name_expressions={image: [...]}``)."""
    from nbjit.bundles.build import _image_name

    images = [args.name] if args.name else ["stdin" if f == "-" else _image_name(Path(f)) for f in sources]
    every: list[str] = []
    each: dict[str, list[str]] = {}
    for e in args.expr:
        image, eq, rest = e.partition("=")
        if eq and rest and not _IN_EXPRESSION.search(image):  # (an = inside an expression: f<(a==b)>)
            if image not in images:
                raise _Usage(f"--expr {e}: no CUDA source makes image {image!r} (they make: "
                             f"{', '.join(images) or 'none'})")
            each.setdefault(image, []).append(rest)
        else:
            every.append(e)
    return {i: every + each.get(i, []) for i in images} if each else every


_IN_EXPRESSION = re.compile(r"[<>(:]")  # what IMAGE in --expr IMAGE=EXPR never holds, and an = in an expression follows


def _strip(args) -> int:
    if args.in_place and args.file == "-":
        raise _Usage("--in-place replaces a file; standard input (-) is none: give -o OUT")
    if args.in_place and args.output is not None:
        raise _Usage(f"--in-place replaces {args.file} and -o {args.output} writes elsewhere: give one of them")
    if args.output is not None:
        _refuse_named(args.output, "PTX", f"nbjit strip writes PTX: name it {Path(args.output).stem}.ptx")
    data = _read(args.file)
    name = "<stdin>" if args.file == "-" else args.file
    kind = sniff(data, name)  # refuse what is not PTX, saying what it is
    if kind != "ptx":
        raise _Usage(f"{name} is a {kind}, not PTX: 'nbjit strip' removes debug information from PTX text "
                     f"(for a {kind} without it, build without -G and -lineinfo)")
    info = inspect_ptx(data, source=name)
    out = strip_debug(data, keep_lineinfo=args.keep_lineinfo).encode("utf-8")
    output = args.file if args.in_place else args.output
    if output is None:
        raise _Usage("give -o OUT (or --in-place to replace the input)")
    _write(output, out, args.file, args.in_place)
    print(f"{name}: debug info {info.debug.kind} -> {_shown(output)} ({len(data)} -> {len(out)} bytes)",
          file=sys.stderr)
    return 0


def _cache(args) -> int:
    from nbjit.cache.store import default_cache, format_size

    if args.max_bytes is not None and args.action != "prune":
        raise _Usage(f"--max-bytes applies to 'cache prune', not 'cache {args.action}'")
    if args.key_file is not None and args.action not in ("export", "import"):
        raise _Usage(f"--key-file applies to 'cache export' and 'cache import', not 'cache {args.action}'")
    if (args.file is None) == (args.action in ("export", "import")):
        raise _Usage(f"'cache {args.action}' takes an archive FILE" if args.file is None
                     else f"'cache {args.action}' takes no FILE (only export and import do)")
    if args.json and args.action not in ("info", "list"):
        raise _Usage(f"--json applies to 'cache info' and 'cache list', not 'cache {args.action}'")
    if args.remote is not None and args.action not in ("info", "list", "push", "pull"):
        raise _Usage(f"--remote applies to 'cache info', 'list', 'push' and 'pull', not 'cache {args.action}' "
                     "(which works on the local cache only)")
    if args.action == "export" and args.file == "-":
        _binary_to_stdout("a cache archive", "cache export -")
    c = default_cache()
    if args.remote is not None:
        from nbjit.cache.store import Cache
        c = Cache(c.path, max_bytes=c.max_bytes, lock_timeout=c.lock_timeout, remote=args.remote)
    if args.action in ("push", "pull") and c.remote is None:
        raise _Usage(f"'cache {args.action}' needs a remote cache: give --remote URL (s3://bucket/prefix, "
                     "gs://..., file:///dir) or set NBJIT_CACHE_REMOTE")
    if args.action == "info":
        i = c.info()
        if c.remote is not None:
            try:
                listed = c.remote.listing()
                i.update(remote_entries=len(listed), remote_bytes=sum(n for _, n in listed))
            except NbjitError as e:  # info says what it can: the store's trouble is part of it
                i.update(remote_entries=None, remote_error=str(e))
        if args.json:
            print(json.dumps(i, indent=2, default=str))
            return 0
        print(f"location: {os.path.abspath(i['location']) if i['location'] else '(disk cache off: NBJIT_CACHE=0)'}")
        print(f"entries:  {i['entries']}" + (f" (and {i['temporary_files']} temporary files of writers)"
                                             if i["temporary_files"] else ""))
        print(f"size:     {format_size(i['bytes'])} (limit {format_size(i['max_bytes'])})")
        if c.remote is None:
            print("remote:   none (NBJIT_CACHE_REMOTE or --remote)")
        else:
            mode = "read-write" if i["remote_write"] else "read-only"
            print(f"remote:   {i['remote']} ({mode}): " + (f"{_count(i['remote_entries'], 'entry')}, "
                                                          f"{format_size(i['remote_bytes'])}"
                                                          if i["remote_entries"] is not None else i["remote_error"]))
    elif args.action == "list":
        from nbjit.cache.entries import OTHER_FORMAT, entry_file
        rows = []
        for f, size, used in c.entries():
            got = entry_file(f)
            if got is None:
                continue  # removed meanwhile by another process
            entry, why, _ = got
            status = "ok" if entry else "unused" if why.startswith(OTHER_FORMAT) else "corrupt"
            if args.json:
                rows.append({"key": f.stem, "bytes": size, "used": used, "where": "local", "status": status,
                             "why": why or None,
                             **({"kind": entry.kind, "arch": entry.arch, "producer": entry.producer} if entry else {})})
                continue
            what = f"{entry.kind} {entry.arch} {entry.producer}" if entry else f"{status}: {why}"
            print(f"{f.stem[:16]}  {size:>9}  {time.strftime('%Y-%m-%d %H:%M', time.localtime(used))}  {what}")
        if c.remote is not None:
            local = {r["key"] for r in rows} if args.json else {f.stem for f, _, _ in c.entries()}
            for key, size in c.remote.listing():
                # the remote's objects are listed, not fetched: each is checked when it is used or pulled
                where = "remote and local" if key in local else "remote only"
                if args.json:
                    rows.append({"key": key, "bytes": size, "where": "remote", "local": key in local})
                else:
                    print(f"{key[:16]}  {size:>9}  {'':16}  {where}: {c.remote.url}")
        if args.json:
            print(json.dumps(rows, indent=2))
    elif args.action == "push":
        pushed, there = c.push()
        print(f"published {_count(pushed, 'entry')} to {c.remote.url}" + _there(there))
    elif args.action == "pull":
        added, refused = c.pull()
        for why in refused:
            print(f"refused {why}", file=sys.stderr)
        print(f"pulled {_count(added, 'new entry')} from {c.remote.url} into {c.path}"
              + (f"; refused {len(refused)}" if refused else ""))
        return 1 if refused else 0
    elif args.action in ("clear", "prune") and c.path is None:
        print(f"nothing to {args.action}: the disk cache is off (NBJIT_CACHE=0)")
    elif args.action == "clear":
        print(f"removed {_count(c.clear(), 'entry')} from {c.path}")
    elif args.action == "export":
        if args.file == "-":  # streamed to standard output, as tar does; what was done said on standard error
            n = c.export_archive(sys.stdout.buffer, archive_key_file=args.key_file)
            sys.stdout.buffer.flush()
            print(f"exported {_count(n, 'entry')} to {_shown('-')}", file=sys.stderr)
        else:
            print(f"exported {_count(c.export_archive(args.file, archive_key_file=args.key_file), 'entry')} to "
                  f"{args.file}")
    elif args.action == "import":
        src = args.file
        if src == "-":
            src = io.BytesIO(_read("-"))
            src.name = "<stdin>"
        got = c.import_archive(src, archive_key_file=args.key_file)
        added, refused = got
        for why in refused:
            print(f"refused {why}", file=sys.stderr)
        print(f"imported {_count(added, 'new entry')} into {c.path}" + _there(got.present)
              + (f"; refused {len(refused)}" if refused else ""))
        return 1 if refused else 0
    else:
        print(f"removed {_count(c.prune(args.max_bytes), 'entry')}; {format_size(c.info()['bytes'])} left "
              f"(limit {format_size(c.max_bytes if args.max_bytes is None else args.max_bytes)})")
    return 0


def _there(n: int) -> str:
    """What a report adds for ``n`` entries that were there already."""
    return "" if not n else "; 1 was there already" if n == 1 else f"; {n} were there already"


def _compile(args) -> int:
    from nbjit.toolchain.nvrtc import compile_image, compile_key

    path = Path(args.file)
    archs = _parse_archs(args.arch, "--arch")  # what each compile is told it is for
    for a in archs:
        _check_compilable(a, "--arch", newer="--arch")
    if args.json and args.output == "-":
        raise _Usage("--json prints to standard output, and so does -o -: choose one")
    if args.cache_only and args.output is not None:
        raise _Usage("--cache-only writes no file: drop -o")
    if args.file == "-" and args.output is None and not args.cache_only:
        raise _Usage("standard input has no name to name the output after: give -o FILE (or -o - for standard "
                     "output)")
    cache = None
    if args.cache_only:
        from nbjit.cache.store import default_cache
        cache = default_cache()
        if cache.path is None:
            raise _Usage("--cache-only would store nothing: the disk cache is off (NBJIT_CACHE=0); set "
                         "NBJIT_CACHE_DIR to a writable directory")
    if args.output == "-" and (len(archs) > 1 or not args.ptx and sys.stdout.isatty()):
        raise _Usage("-o - writes one architecture's output to standard output" if len(archs) > 1 else
                     "-o -: a cubin is binary, not for a terminal: redirect standard output, or add --ptx")
    if len(archs) > 1 and args.output is not None and not os.path.isdir(args.output):
        what = "a file" if os.path.exists(args.output) else "nothing"
        raise _Usage(f"-o {args.output}: with several architectures -o names an existing directory (one file "
                     f"each), and there is {what} at that path")
    if len(archs) == 1 and args.output not in (None, "-"):  # said before NVRTC runs, not after
        _refuse_input(args.output, args.file, in_place_option=False)
        _check_compile_output(args.output, archs[0], args.ptx)
    raw = _read(args.file)
    _check_source(raw, args.file)
    source = raw.decode("utf-8")
    # #include "..." found beside the source, as nvcc does (only where it has one: the key of a
    # source without one stays that of its text, which a program's nbjit.compile(text) finds)
    here = (str(Path(args.file).resolve().parent),) if args.file != "-" and _QUOTED_INCLUDE.search(source) else ()
    opts = ([o for d in args.include for o in ("-I", d)] + [f"-D{d}" for d in args.define]
            + ([f"-std={args.std}"] if args.std else []) + (["-G"] if args.G else [])
            + (["-lineinfo"] if args.lineinfo else []) + list(args.option))
    # an output file named .cubin or .ptx asks for that kind (a contradiction is refused above)
    named = _named(args.output) if len(archs) == 1 else None
    output = "ptx" if args.ptx or named == "PTX" else "cubin" if named == "a cubin" else "auto"
    stored = {}  # --cache-only: each arch's entry file
    if args.cache_only:
        stored = {a: cache._file(compile_key(source, name=path.name, options=opts, arch=a, output=output,
                                             name_expressions=args.expr, include_paths=here)) for a in archs}
        why = None if all(map(os.path.exists, stored.values())) else _cannot_write(cache.path)
        if why:  # said before NVRTC runs, in one line (a read-only cache that has them all is fine)
            raise _Usage(f"--cache-only would store nothing: the cache directory {cache.path} cannot be written "
                         f"({why}); set NBJIT_CACHE_DIR to a writable directory")
    made = []
    for arch in archs:
        img = compile_image(source, name=path.name, options=opts, arch=arch, output=output,
                            name_expressions=args.expr, include_paths=here)
        if img.log:
            print(img.log, file=sys.stderr)
        for e, m in img.lowered_names.items():
            print(f"{e} -> {m}", file=sys.stderr)
        for k, r in img.resources.items():  # what ptxas reported, where a kernel uses local memory
            if any(r.values()):
                print(f"{k}: {r['stack_frame']} bytes stack frame, {r['spill_stores']} bytes spill stores, "
                      f"{r['spill_loads']} bytes spill loads", file=sys.stderr)
        made.append({"arch": str(img.arch), "kind": img.kind, "bytes": len(img.data), "file": None,
                     "lowered_names": dict(img.lowered_names),
                     "resources": {k: dict(r) for k, r in img.resources.items()}})
        if args.cache_only:
            if cache.path is None:  # the cache gave up writing (a warning said why)
                raise _Usage(f"--cache-only: {img.kind} for {img.arch} was compiled but not stored: the cache "
                             "directory cannot be written (set NBJIT_CACHE_DIR to a writable directory)")
            continue
        if len(archs) == 1:
            out = args.output or path.with_suffix("." + img.kind).name
        else:
            out = os.path.join(args.output or ".", f"{path.stem}.{arch}.{img.kind}")
        _write(str(out), img.data, args.file, in_place=False, in_place_option=False)
        made[-1]["file"] = str(out)
        print(f"{args.file}: {img.kind} for {img.arch} -> {_shown(str(out))} ({len(img.data)} bytes)",
              file=sys.stderr)
    if args.cache_only:  # (checked once all are written: a later write may prune an earlier entry)
        gone = [m for m, a in zip(made, archs) if not os.path.exists(stored[a])]
        if gone:
            raise _Usage(f"--cache-only: {', '.join(m['kind'] + ' for ' + m['arch'] for m in gone)} written to the "
                         f"cache and pruned at once: its size limit ({cache.max_bytes} bytes, NBJIT_CACHE_MAX_BYTES) "
                         f"cannot hold {'them' if len(archs) > 1 else 'it'}; raise the limit")
        for m in made:
            print(f"{args.file}: {m['kind']} for {m['arch']} in the cache {cache.path} ({m['bytes']} bytes)",
                  file=sys.stderr)
    if args.json:
        print(json.dumps({"source": args.file, "lowered_names": made[-1]["lowered_names"], "outputs": made},
                         indent=2))
    return 0


def _check_compile_output(output: str, arch: Arch, ptx: bool) -> None:
    """Refuse a ``compile -o`` whose suffix names another kind than compile writes there: PTX
    (``--ptx``, a ``compute_XX``) is never written under a cubin's name, and compile writes
    no fatbin or bundle."""
    stem = Path(output).stem
    if ptx or arch.virtual:
        why = "--ptx writes PTX" if ptx else f"--arch {arch} gives PTX"
        fix = "drop --ptx for a cubin" if ptx else f"give --arch {arch.real()} for a cubin"
        _refuse_named(output, "PTX", f"{why}: name it {stem}.ptx, or {fix}")
    elif _named(output) != "PTX":  # (.ptx asks for PTX)
        _refuse_named(output, "a cubin", f"nbjit compile writes a cubin (or PTX): name it {stem}.cubin"
                      + (" (nbjit bundle makes a bundle)" if _named(output) == "a kernel bundle" else ""))


def _kind(raw: bytes, path: str) -> str | None:
    """The kind of image ``raw`` is (``sniff``), or None where it is none."""
    try:
        return sniff(raw, path)
    except ImageFormatError:
        return None


def _check_source(raw: bytes, path: str) -> None:
    """CUDA C++ source is UTF-8 text; compiled code and binary files are named as what they are."""
    kind = _kind(raw, path)  # (None: not an image; good, it should be source)
    if kind is not None:
        raise _Usage(f"{path} is {kind}, already compiled: inspect it with 'nbjit inspect' or load it with "
                     "nbjit.load(), it needs no compiling")
    if raw.startswith(b"PK\x03\x04"):
        raise _Usage(f"{path} is a ZIP archive (a kernel bundle?), not CUDA source: a bundle is already compiled "
                     "(inspect it with 'nbjit inspect', load it with nbjit.load_bundle())")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Usage(f"{path} is not UTF-8 text (byte {e.start} is {raw[e.start:e.start + 1]!r}): CUDA source must "
                     "be UTF-8 (convert it, e.g. iconv -f latin1 -t utf-8)") from None
    if b"\0" in raw:
        raise _Usage(f"{path} holds NUL bytes: binary data, not CUDA source")


def _size(text: str) -> int:
    """--max-bytes's value: a byte count, with a unit or without."""
    from nbjit.cache.store import parse_size
    n = parse_size(text)
    if n is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count >= 0 (e.g. 1073741824, 100k, 512M, 1G)")
    return n


# nbjit cache's actions, as its --help says them
_CACHE_ACTIONS = {
    "info": "location, entries and size (and the remote tier's, with --remote)",
    "list": "one line per entry: key, bytes, last use, kind, architecture, producer",
    "clear": "remove every entry",
    "prune": "remove the least recently used entries down to the limit (--max-bytes)",
    "export": "write the verified entries to an archive FILE (.tar.gz; - for stdout)",
    "import": "add an archive FILE's entries, each verified (- for stdin)",
    "push": "publish the verified local entries to the remote tier (--remote)",
    "pull": "copy the remote tier's entries this cache lacks, each verified",
}


def _parser() -> argparse.ArgumentParser:
    from nbjit import __version__
    p = _Parser(prog="nbjit", description="Inspect and prepare externally compiled GPU kernels.")
    p.add_argument("--version", action="version", version=f"nbjit {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    p.commands = sub.choices
    i = sub.add_parser("inspect", help="show the kernels, parameters and metadata of an image")
    i.add_argument("file", help="a PTX, cubin or fatbin file (- for standard input), an nbjit bundle (.nbjit), "
                   "or a Triton cache entry")
    i.add_argument("--json", action="store_true", help="machine-readable output (see docs/cli.md)")
    i.add_argument("--arch", help="for a fatbin or a bundle: show the entry this architecture (e.g. sm_90) would "
                   "use; with --sass, --occupancy or --fail-on-spills, also the SASS PTX is assembled to, and for "
                   "--occupancy the GPU whose limits count")
    i.add_argument("--sass", action="store_true",
                   help="print the SASS (needs nvdisasm: nbjit-core's sass extra, "
                   "pip install -e '.[sass]' in a checkout)")
    i.add_argument("--occupancy", type=_occupancy_arg, metavar="BLOCK[,SMEM]", help="resident blocks per SM of each "
                   "kernel for this block size and dynamic shared memory (bytes), by CUDA's occupancy rules")
    i.add_argument("--fail-on-spills", action="store_true", help="exit 1 naming the kernels that spill registers "
                   "to local memory (a CI check)")
    i.set_defaults(func=_inspect)
    s = sub.add_parser("strip", help="remove debug information from PTX")
    s.add_argument("file", help="a PTX file (- for standard input)")
    s.add_argument("-o", "--output", help="where to write the stripped PTX (never the input, unless --in-place; "
                   "- for standard output)")
    s.add_argument("--in-place", action="store_true", help="replace the input file")
    s.add_argument("--keep-lineinfo", action="store_true", help="keep .file/.loc line information")
    s.set_defaults(func=_strip)
    c = sub.add_parser("cache", help="show, list, clear, prune, export or import nbjit's compile cache; push "
                       "to or pull from its remote tier", formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="nbjit's compile cache (docs/cache.md).\n\nactions:\n" + "\n".join(
                           f"  {a:<8}{what}" for a, what in _CACHE_ACTIONS.items()))
    c.add_argument("action", choices=list(_CACHE_ACTIONS), metavar="ACTION", help="one of the actions above")
    c.add_argument("file", nargs="?", help="for export and import: the archive (a .tar.gz; - for standard output "
                   "or input)")
    c.add_argument("--max-bytes", type=_size, metavar="SIZE", help="for prune: the size to prune to, in bytes "
                   "or with a unit: 100k, 512M, 1G (powers of 1024; default: the cache's limit)")
    c.add_argument("--json", action="store_true", help="for info and list: machine-readable output")
    c.add_argument("--key-file", help="for export and import: sign with, or import only archives signed with, "
                   "the archive key in this file (default: $NBJIT_CACHE_ARCHIVE_KEY_FILE, $NBJIT_CACHE_ARCHIVE_KEY)")
    c.add_argument("--remote", metavar="URL", help="the remote tier (s3://bucket/prefix, gs://..., file:///dir or "
                   "an existing directory, https://... read-only; default: $NBJIT_CACHE_REMOTE); push and pull need "
                   "one")
    c.set_defaults(func=_cache)
    k = sub.add_parser("compile", help="compile CUDA C++ with NVRTC (through the cache)")
    k.add_argument("file", help="the CUDA C++ source (.cu)")
    k.add_argument("--arch", required=True, help="sm_90, sm_90a, compute_90, ...; several separated by commas "
                   "(sm_80,sm_90,sm_100): one output each")
    k.add_argument("--cache-only", action="store_true", help="fill the compile cache, write no file")
    k.add_argument("--ptx", action="store_true", help="write PTX instead of a cubin")
    k.add_argument("-o", "--output", help="output file (default: FILE's name with .cubin or .ptx, in the current "
                   "directory; never the input; - for standard output)")
    k.add_argument("-I", dest="include", action="append", default=[], metavar="DIR",
                   help="a directory to search for #include files (repeatable)")
    k.add_argument("-D", dest="define", action="append", default=[], metavar="NAME[=VALUE]",
                   help="define a preprocessor macro (repeatable)")
    k.add_argument("--std", metavar="DIALECT", help="the C++ dialect: c++11, c++14, c++17, c++20 (NVRTC -std=)")
    k.add_argument("-G", action="store_true", help="device debug information, optimisation off (NVRTC -G)")
    k.add_argument("--lineinfo", action="store_true", help="line information for profilers (NVRTC -lineinfo)")
    k.add_argument("--json", action="store_true", help="print what was made as JSON: each name expression's "
                   "mangled name, and each architecture's output")
    k.add_argument("--expr", action="append", default=[], help="a name expression to instantiate "
                   "(e.g. 'fill<float>'; repeatable)")
    k.add_argument("--option", action="append", default=[], metavar="NVRTC_OPTION",
                   help="any other NVRTC option, e.g. --option -use_fast_math or --option=-maxrregcount=64 "
                   "(repeatable)")
    k.set_defaults(func=_compile)
    b = sub.add_parser("bundle", help="build a kernel bundle: cubins for several architectures, PTX and a manifest "
                       "in one file that loads with no NVRTC (nbjit.load_bundle)")
    b.add_argument("files", nargs="+", metavar="FILE", help=".cu sources (compiled), PTX, cubins, fatbins, Triton "
                   "cache entries; each one image named after its file")
    b.add_argument("--arch", help="SASS to compile each .cu for: sm_80,sm_90,sm_100,... (those NVRTC compiles for)")
    b.add_argument("--ptx", help="virtual architecture(s) to compile each .cu to PTX for: compute_80")
    b.add_argument("-o", "--output", required=True, help="the bundle to write (e.g. kernels.nbjit; - for standard "
                   "output, where that is not a terminal)")
    b.add_argument("--name", help="put every FILE in one image of this name (cubins nvcc built per architecture)")
    b.add_argument("-I", dest="include", action="append", default=[], metavar="DIR",
                   help="an include directory for the CUDA C++ sources (repeatable)")
    b.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE",
                   help="a macro defined for the CUDA C++ sources (repeatable)")
    b.add_argument("--expr", action="append", default=[], metavar="[IMAGE=]EXPR",
                   help="a name expression to instantiate ('scale<float>'), in every CUDA source, or with IMAGE= "
                        "in that image's only (axpy='scale<float>')")
    b.add_argument("--option", action="append", default=[], help="another NVRTC option")
    b.set_defaults(func=_bundle)
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
        except _Usage as e:  # (a closed standard stream used as the arguments were read: --help >&-)
            print(f"nbjit: error: {e}", file=sys.stderr)
            return 2


class _Closed:
    """A standard stream that was closed as nbjit started (``>&-``, ``<&-``): reading or
    writing it is a usage error (one line, status 2)."""

    def __init__(self, what: str, hint: str):
        self.what, self.hint = what, hint

    def _refuse(self, *args, **kwargs) -> NoReturn:
        raise _Usage(f"{self.what} is closed ({self.hint})")

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
    args, extra = parser.parse_known_args(_option_values(sys.argv[1:] if argv is None else list(argv)))
    if args.cmd is None and extra:
        parser.unrecognized(extra)  # (nbjit --versoin: did you mean --version?)
    if args.cmd is None:
        parser.error("give a command: inspect, strip, compile, bundle or cache (nbjit --help, nbjit COMMAND --help)")
    if extra:
        parser.commands[args.cmd].unrecognized(extra)

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
    except (NbjitError, _Usage, OSError) as e:
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
