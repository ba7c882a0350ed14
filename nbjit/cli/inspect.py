"""``nbjit inspect``: the kernels, parameters and metadata of a PTX, cubin or fatbin file, a
bundle or a Triton cache entry, as text or JSON; a cubin's SASS, occupancy and spills."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nbjit.arch import Arch
from nbjit.cli.common import ARCH_EXAMPLES, Usage, check_compilable, check_exists, count, image_kind, read_input, table
from nbjit.errors import ImageFormatError, NbjitError
from nbjit.params.cdecl import demangled_text
from nbjit.params.signature import RESOURCES, shown_param_name, typed_entries
from nbjit.read.cubin import EM_CUDA, CubinInfo, inspect_cubin
from nbjit.read.fatbin import DECODERS, FatbinInfo, inspect_fatbin, undecoded
from nbjit.read.image import Image, inspect_image
from nbjit.read.ptx import PtxInfo, inspect_ptx


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
            out += ["  " + line for line in table(rows, ["#", "name", "C type", *(["PTX type"] if own else []),
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
        out += table(rows, ["global", "space", "type", "size", "align", "linkage"])
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
        out += table([[g.name, g.space, g.size, g.section] for g in info.globals],
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
    out = [f"{path}: fatbin with {count(len(info.entries), 'entry')}"]
    if damaged is None:
        damaged = damaged_entries(info, path)
    rows = [[e.index, e.kind, e.arch_name, e.compression or "-", e.size,
             "no (damaged: below)" if e.index in damaged else
             "yes" if e.payload is not None else "no (nvJitLink reads it)" if e.kind == "ltoir" else
             f"no (needs {DECODERS[e.compression]})"] for e in info.entries]
    out += table(rows, ["#", "kind", "arch", "compressed", "bytes", "readable"])
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
    out += ["  " + line for line in table(rows, ["#", "name", "C type", "PTX type", "size", "offset", "role"])]
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


def run(args) -> int:
    if args.arch is not None:
        if not args.arch.strip():
            raise Usage(f"--arch {args.arch!r}: give an architecture ({ARCH_EXAMPLES})")
        try:
            args.arch = Arch.parse(args.arch)  # (the value from here on)
        except ValueError:
            raise Usage(f"--arch {args.arch!r}: not an architecture ({ARCH_EXAMPLES})") from None
        check_exists(args.arch, "--arch")
    if args.source and not args.sass:
        raise Usage("--source interleaves the SASS with source lines: give it with --sass")
    compiled = args.sass or args.occupancy or args.fail_on_spills
    what = "--sass, --occupancy and --fail-on-spills read one cubin, or PTX with --arch"
    if args.file != "-" and (Path(args.file).is_dir() or args.file.endswith(".json")):
        if compiled:
            raise Usage(f"{what}: give the Triton kernel's .cubin file, not {args.file}")
        if args.arch:
            raise Usage("--arch chooses a fatbin's entry; a Triton kernel has its own")
        from nbjit.loading.triton import describe
        d = describe(args.file)
        print(json.dumps(d, indent=2) if args.json else format_triton(d, args.file))
        return 0
    raw = read_input(args.file)
    if raw.startswith(b"PK\x03\x04"):  # a ZIP archive: a kernel bundle, or refused as not one
        if compiled:
            raise Usage(f"{what}: a kernel bundle holds several: {_unzip_hint(args, raw)}")
        return _inspect_bundle(args, raw)
    if args.file.endswith(".nbjit") and image_kind(raw, args.file) is None:
        raise Usage(f"{args.file}: not a kernel bundle (a bundle is a ZIP archive, and this file is not one) nor "
                     "an image (PTX, cubin, fatbin)")
    img = Image.from_bytes(raw, "<stdin>" if args.file == "-" else args.file)
    if args.arch and img.kind == "cubin" and not args.occupancy:
        raise Usage(f"--arch chooses a fatbin's entry, or with --occupancy the GPU whose limits count; "
                     f"{args.file} is a cubin, whose SASS is its own")
    if args.arch and img.kind == "ptx" and not compiled:
        raise Usage(f"--arch chooses a fatbin's entry; {args.file} is ptx, not a fatbin (with --sass, "
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
        failed.append(f"{count(len(damaged), 'entry')} damaged (#{', #'.join(map(str, damaged))}): not a cubin "
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
        raise Usage(f"{img.name} is {img.kind}: give --arch (e.g. sm_90) for the SASS it gives")
    ptx = img.data if img.kind == "ptx" else None
    if img.kind == "fatbin":
        fat = inspect_fatbin(img.data, source=img.name)
        chosen = fat.select(args.arch)
        if chosen is None:
            raise Usage(f"--arch {args.arch}: no entry of {img.name} runs on it (it holds "
                         f"{', '.join(e.arch_name for e in fat.entries)})")
        ptx = chosen.payload if chosen.kind == "ptx" else None
    if ptx is not None:  # assembled for --arch by nvJitLink: said here, in one line, what it would refuse
        check_compilable(args.arch.real(), "--arch", tool="nvJitLink")
        declared = inspect_ptx(ptx, source=img.name).arch
        try:
            target = Arch.parse(declared, virtual=True)
        except ValueError:  # (a .target that names no architecture: nvJitLink says what it makes of it)
            target = None
        if target is not None and not target.runs_on(args.arch):
            where = {"a": f"{target.real()} only", "f": f"the sm_{target.major}x family from {target.real()}"}.get(
                target.variant, f"{target.real()} and newer")
            raise Usage(f"--arch {args.arch}: {img.name} holds PTX for {target.real()}, which assembles for "
                         f"{where}")
    data = cubin_for(img, args.arch)
    info = inspect_cubin(data, source=img.name)
    if img.kind == "cubin" and args.arch and not info.arch.runs_on(args.arch):
        raise Usage(f"--arch {args.arch}: {img.name} is a cubin for {info.arch}, which does not run on it")
    entries = typed_entries(info.entries, "cubin")
    out: dict = {"file": img.name, "arch": str(info.arch)}
    device = args.arch.real() if args.arch else info.arch  # (an sm_86 GPU runs an sm_80 cubin by sm_86's limits)
    if args.occupancy:
        block, smem = args.occupancy
        out["occupancy"] = [occupancy(e, device, block, smem).to_json() for e in info.entries]
    spilling = [e for e in entries if e.spills]
    out["spills"] = [{"kernel": e.name, "spills": e.spills, "frame": e.frame} for e in spilling]
    if args.sass:
        out["sass"] = disassemble(data, name=img.name, source=args.source)
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
            print("\n".join(table(rows, ["kernel", "registers", "shared", "blocks/SM", "warps/SM", "occupancy",
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
    from nbjit.graphs.saved import graph_summary
    graph = graph_summary(raw, label)
    if args.json:
        j = info.to_json()
        if args.arch:
            j["selected"] = chosen
        if graph is not None:
            j["graph"] = graph
        print(json.dumps(j, indent=2))
        return _failed(label, failed)
    out = [f"{label}: nbjit bundle (format {info.version}, made by nbjit {info.nbjit or '?'}), "
           f"{len(info.images)} image{'s' * (len(info.images) != 1)}"]
    if graph is not None:
        kinds = ", ".join(f"{n} {k}" for k, n in graph["by_kind"].items())
        out += [f"a saved graph (format {graph['version']}): {graph['nodes']} nodes ({kinds}), "
                f"{count(graph['conditions'], 'condition')}; load it with nbjit.load_graph(FILE, bindings={{...}})",
                "  bindings: " + (", ".join(f"{name} {b['dtype']}{b['shape']}" for name, b in graph["bindings"].items())
                                  or "none")]
    for img in info.images:
        out += ["", f"image {img.name}: from " + ", ".join(f"{s.get('name')} ({s.get('kind')})" for s in img.sources)
                + (f", {img.producer}" if img.producer else "") + (f", options {' '.join(img.options)}"
                                                                    if img.options else "")]
        rows = [[e.kind, e.arch, e.size, e.file + (f"  <- {args.arch}" if chosen.get(img.name) == e.file else "")]
                for e in img.entries]
        out += ["  " + line for line in table(rows, ["kind", "arch", "bytes", "member"])]
        if args.arch and chosen.get(img.name) is None:
            out.append(f"  no entry runs on {args.arch}")
        for e, m in img.lowered_names.items():
            out.append(f"  {e} -> {m}")
        if img.triton is not None:
            out.append(f"  Triton metadata: num_warps {img.triton.get('num_warps')}, shared {img.triton.get('shared')}")
        format_entries(_as_numba_passes(img, out), out)
    print("\n".join(out))
    return _failed(label, failed)


def _as_numba_passes(img, out: list[str]) -> tuple:
    """A bundle image's kernels, those of ``@cuda.jit`` kernels one parameter per Python
    argument (``array(float32, 1d, C)``) as Numba passes them, their signatures said in ``out``."""
    if not img.numba:
        return img.kernels
    from nbjit.params import numba_abi
    out += [f"  @cuda.jit signature: {s['signature']}" for s in img.sources if s.get("signature")]
    return tuple(numba_abi.signature(k.name, k, img.numba[k.name], "numba types") if k.name in img.numba else k
                 for k in img.kernels)


def add_parser(sub) -> None:
    """``nbjit inspect``'s arguments, on the command line's subparsers ``sub``."""
    p = sub.add_parser("inspect", help="show the kernels, parameters and metadata of an image")
    p.add_argument("file", help="a PTX, cubin or fatbin file (- for standard input), an nbjit bundle (.nbjit), "
                   "or a Triton cache entry")
    p.add_argument("--json", action="store_true", help="machine-readable output (see docs/cli.md)")
    p.add_argument("--arch", help="for a fatbin or a bundle: show the entry this architecture (e.g. sm_90) would "
                   "use; with --sass, --occupancy or --fail-on-spills, also the SASS PTX is assembled to, and for "
                   "--occupancy the GPU whose limits count")
    p.add_argument("--sass", action="store_true",
                   help="print the SASS (needs nvdisasm: nbjit-core's sass extra, "
                   "pip install -e '.[sass]' in a checkout)")
    p.add_argument("--source", action="store_true", help="with --sass: each run of instructions under its source "
                   "line (a kernel compiled with -lineinfo or -G; a kept source from nbjit's cache is found there)")
    p.add_argument("--occupancy", type=_occupancy_arg, metavar="BLOCK[,SMEM]", help="resident blocks per SM of each "
                   "kernel for this block size and dynamic shared memory (bytes), by CUDA's occupancy rules")
    p.add_argument("--fail-on-spills", action="store_true", help="exit 1 naming the kernels that spill registers "
                   "to local memory (a CI check)")
    p.set_defaults(func=run)
