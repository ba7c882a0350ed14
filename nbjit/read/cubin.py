"""CUDA ELF (cubin) -> CubinInfo: architecture, kernels, per-kernel .nv.info attributes,
resources and module globals. Pure data: standard library only, no CUDA needed.

Format facts (record framing, attribute ids, the two e_flags ABIs) are in
shared/docs/FORMATS.md §4, each checked against cuobjdump.
"""
from __future__ import annotations

import struct

from nbjit.arch import Arch
from nbjit.errors import ImageFormatError
from nbjit.params.signature import Directives, KernelInfo, KernelSignature, Param, find_entry
from nbjit.read.elf import ElfFile, cuda_elf_arch
from nbjit.records import field, record

__all__ = ["CubinInfo", "GlobalSymbol", "inspect_cubin", "EM_CUDA", "arch_name"]

EM_CUDA = 190
_SHT_NOTE = 7
_SHT_CUDA_INFO = 0x70000000
_SHT_CUDA_COMPAT = 0x70000086
_STT_OBJECT = 1
_STT_FUNC = 2
_STT_CUDA_OBJECT = 13  # what relocatable (-rdc) cubins call their variables
_STO_CUDA_ENTRY = 0x10

# .nv.info record formats (FORMATS.md §4.5)
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4
# EIATTR ids used here
_PARAM_CBANK = 0x0A
_MAX_THREADS = 0x05
_REQNTID = 0x10
_FRAME_SIZE = 0x11
_MIN_STACK_SIZE = 0x12
_KPARAM_INFO = 0x17
_CBANK_PARAM_SIZE = 0x19
_MAXREG_COUNT = 0x1B
_REGCOUNT = 0x2F
_CUDA_API_VERSION = 0x37
_CTA_PER_CLUSTER = 0x3D
_EXPLICIT_CLUSTER = 0x3E
_MAX_CLUSTER_RANK = 0x3F
_NUM_BARRIERS = 0x4C
_ANNOTATIONS = 0x55  # (kind u32, instruction offset u32) pairs; kind 1 = SpillRefill
_BLOCKS_ARE_CLUSTERS = 0x5B
_COMPAT_ACCELERATOR = 0x09
# KPARAM_INFO pointee state space (bits 8-11)
_POINTER_SPACES = {1: "local", 2: "shared", 4: "global", 5: None}
_SPILL_REFILL = 1
# CUDA 13.0's ptxas is the oldest seen to annotate every spill (FORMATS.md §4.5): for older
# cubins, no annotation in a kernel with a stack frame says nothing
_ANNOTATES_SPILLS = 130

# symbol binding -> the PTX linkage it comes from (FORMATS.md §1.7)
_BINDINGS = {0: None, 1: "visible", 2: "weak"}


@record
class GlobalSymbol:
    """A module variable (``__device__``, ``__constant__``) found in a cubin's symbol table."""

    name: str
    space: str  # "global", "const", "shared"
    size: int
    section: str

    def to_json(self) -> dict:
        return {"name": self.name, "space": self.space, "size": self.size, "section": self.section}


@record
class CubinInfo:
    """What nbjit reads from a cubin."""

    arch: Arch  # sm_90, sm_90a (equal to its text, "sm_90")
    sm: int  # 90
    arch_specific: bool  # an "a" build: runs only on exactly this compute capability
    virtual_arch: int | None  # the PTX .target it was assembled from, where recorded
    toolkit: int | None  # CUDA version x10 that produced it (130 = 13.0), where recorded
    abi_version: int  # ELF EI_ABIVERSION: 7 (CUDA <= 12.9 for sm <= 90) or 8
    address_size: int
    relocatable: bool  # ET_REL (-rdc / ptxas -c)
    entries: tuple[KernelInfo, ...]
    functions: tuple[str, ...]  # device functions with their own symbol
    globals: tuple[GlobalSymbol, ...]
    max_registers: dict = field(default_factory=dict)  # kernel -> MAXREG_COUNT
    shared_reserved: int = 0  # bytes of each kernel's .nv.shared.K reserved by the system (sm_90+)
    source: str | None = None

    def entry(self, name: str) -> KernelInfo:
        """The kernel called ``name`` (KeyError if none)."""
        return find_entry(self.entries, name)

    def to_json(self) -> dict:
        return {
            "kind": "cubin",
            "arch": str(self.arch),
            "sm": self.sm,
            "arch_specific": self.arch_specific,
            "virtual_arch": self.virtual_arch,
            "toolkit": self.toolkit,
            "abi_version": self.abi_version,
            "address_size": self.address_size,
            "relocatable": self.relocatable,
            "entries": [e.to_json() for e in self.entries],
            "functions": list(self.functions),
            "globals": [g.to_json() for g in self.globals],
            "shared_reserved": self.shared_reserved,
        }


def arch_name(sm: int, arch_specific: bool = False, family: bool = False, virtual: bool = False) -> str:
    """``(90, True)`` -> ``"sm_90a"``; ``virtual`` gives ``"compute_90"``."""
    return str(Arch(sm, "a" if arch_specific else "f" if family else "", virtual))


def inspect_cubin(data: bytes, *, source: str | None = None) -> CubinInfo:
    """Read a cubin's architecture, kernels (with parameter offsets and sizes, launch
    attributes and resources) and module globals.

    Raises
    ------
    ImageFormatError: not a CUDA ELF, or a truncated / corrupt one; the message says what.
    """
    src = source or "<cubin>"
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageFormatError(f"{src}: a cubin is bytes, not {type(data).__name__} (read the file first, or use "
                               "nbjit.inspect_image(path))")
    e = ElfFile(bytes(data), src, machine=(EM_CUDA, "CUDA"), what="cubin")
    syms = e.symbols()
    per_symbol = _per_symbol(e)  # module-wide .nv.info: registers, frame and stack per function symbol
    regs, frame, stack = per_symbol[_REGCOUNT], per_symbol[_FRAME_SIZE], per_symbol[_MIN_STACK_SIZE]
    sm, arch_specific, virtual, toolkit = _architecture(e)
    # sm_90+ reserves 1 KiB at the start of each block's shared memory
    # (a -G build has .nv_debug.shared there instead: the driver counts it as that reserve too)
    reserved = 1024 if sm >= 90 and any(n.startswith((".nv.shared.reserved", ".nv_debug.shared"))
                                        for n in e.by_name) else 0
    info_by_target = {s.info: s for s in e.of_type(_SHT_CUDA_INFO) if s.name.startswith(".nv.info.")}

    entries, functions, max_registers = [], [], {}
    for sym in syms:
        if sym.type != _STT_FUNC or sym.shndx == 0:
            continue
        if not sym.other & _STO_CUDA_ENTRY:
            if sym.shndx < len(e.sections) and e.sections[sym.shndx].name == f".text.{sym.name}":
                functions.append(sym.name)
            continue
        if sym.shndx >= len(e.sections):
            raise e.fail(f"kernel {sym.name!r} points at section {sym.shndx}, which does not exist")
        info_sec = e.by_name.get(f".nv.info.{sym.name}")
        if info_sec is None or info_sec.type != _SHT_CUDA_INFO:
            info_sec = info_by_target.get(sym.shndx)
        kinfo, maxreg, spills, barriers = _kernel(sym.name, e.content(info_sec) if info_sec else b"", e,
                                info_sec.name if info_sec else f".nv.info.{sym.name}")
        shared_sec = e.by_name.get(f".nv.shared.{sym.name}")
        const_sec = e.by_name.get(f".nv.constant0.{sym.name}")
        local_sec = e.by_name.get(f".nv.local.{sym.name}")
        entries.append(KernelInfo(
            sym.name, kinfo[0], kinfo[1], linkage=_BINDINGS.get(sym.bind), registers=regs.get(sym.index),
            shared=max(0, shared_sec.size - reserved) if shared_sec else 0,
            const=const_sec.size if const_sec else None, local=local_sec.size if local_sec else 0,
            # a relocatable cubin's callees are resolved at link time: only its own frame is known
            stack=stack.get(sym.index, frame.get(sym.index, 0)), frame=frame.get(sym.index),
            spills=_spills(spills, frame.get(sym.index), toolkit),
            # ABI v7 (CUDA 12) keeps the count in the code section's flags, bits 20-24 (FORMATS.md §4.5)
            barriers=barriers if e.abi_version >= 8 else (e.sections[sym.shndx].flags >> 20) & 0x1F))
        if maxreg is not None:
            max_registers[sym.name] = maxreg

    return CubinInfo(
        arch=Arch(sm, "a" if arch_specific else ""), sm=sm, arch_specific=arch_specific, virtual_arch=virtual,
        toolkit=toolkit, abi_version=e.abi_version, address_size=64, relocatable=e.type == 1,
        entries=tuple(entries), functions=tuple(functions), globals=tuple(_globals(e, syms)),
        max_registers=max_registers, shared_reserved=reserved, source=source)


def _spills(annotated: int, frame: int | None, toolkit: int | None) -> int | None:
    """Spill and refill instructions: as annotated; none without a stack frame (spills live
    there) or from a ptxas that annotates them; else unknown (None)."""
    if annotated or frame == 0 or (toolkit or 0) >= _ANNOTATES_SPILLS:
        return annotated
    return None


def _per_symbol(e: ElfFile) -> dict[int, dict[int, int]]:
    out: dict[int, dict[int, int]] = {_REGCOUNT: {}, _FRAME_SIZE: {}, _MIN_STACK_SIZE: {}}
    s = e.by_name.get(".nv.info")
    if s is not None and s.type == _SHT_CUDA_INFO:
        for attr, fmt, val in _records(e.content(s), e, s.name):
            if attr in out and fmt == _EIFMT_SVAL and len(val) >= 8:
                sym, n = struct.unpack_from("<II", val)
                out[attr][sym] = n
    return out


def _architecture(e: ElfFile) -> tuple[int, bool, int | None, int | None]:
    """(sm, arch-specific, virtual arch, toolkit) from e_flags (both ABIs, FORMATS.md §4),
    the compat section and the .note.nv.cuinfo record."""
    compat: dict[int, int] = {}
    for s in e.of_type(_SHT_CUDA_COMPAT):
        for attr, fmt, val in _records(e.content(s), e, s.name):
            if fmt in (_EIFMT_BVAL, _EIFMT_HVAL):
                compat[attr] = val
    virtual = toolkit = None
    note_sec = e.by_name.get(".note.nv.cuinfo")
    note = e.note(note_sec) if note_sec is not None and note_sec.type == _SHT_NOTE else None
    if note is not None and len(note[1]) >= 8:
        _, virtual, toolkit = struct.unpack_from("<HHI", note[1])
    sm, arch_specific = cuda_elf_arch(e.abi_version, e.flags)
    if e.abi_version >= 8:
        arch_specific = arch_specific or compat.get(_COMPAT_ACCELERATOR) == 1
    else:
        virtual = virtual or ((e.flags >> 16) & 0xFF) or None
    if not 10 <= sm <= 9999:
        raise e.fail(f"no plausible SM architecture in e_flags {e.flags:#x} (sm {sm})")
    return sm, arch_specific, virtual, toolkit


def _globals(e: ElfFile, syms) -> list[GlobalSymbol]:
    """Module variables: object symbols (CUDA_OBJECT in relocatable cubins) in .nv.global,
    .nv.constant or .nv.shared sections, less the compiler's own."""
    out = []
    for sym in syms:
        if sym.type not in (_STT_OBJECT, _STT_CUDA_OBJECT) or sym.shndx == 0 or sym.shndx >= len(e.sections) \
                or sym.name.startswith(("__nv_", "$")):
            continue
        sec = e.sections[sym.shndx].name
        space = "global" if sec.startswith(".nv.global") else "const" if sec.startswith(".nv.constant") \
            else "shared" if sec.startswith(".nv.shared") else None
        if space:
            out.append(GlobalSymbol(sym.name, space, sym.size, sec))
    return out


def _records(blob: bytes, e: ElfFile, section: str):
    """Yield (attribute, format, value) from .nv.info-style records; SVAL values are bytes."""
    off = 0
    while off + 4 <= len(blob):
        fmt, attr, val = struct.unpack_from("<BBH", blob, off)
        off += 4
        if fmt == _EIFMT_SVAL:
            if off + val > len(blob):
                raise e.fail(f"{section}: attribute {attr:#x} says {val} bytes, only {len(blob) - off} remain")
            yield attr, fmt, blob[off: off + val]
            off += val
        elif fmt in (_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL):
            yield attr, fmt, (val & 0xFF if fmt == _EIFMT_BVAL else val)
        else:
            raise e.fail(f"{section}: unknown record format {fmt} at offset {off - 4}")


def _dims(val: bytes) -> tuple[int, ...]:
    return struct.unpack_from("<III", val) if len(val) >= 12 else ()


def _kernel(name: str, blob: bytes, e: ElfFile, section: str
            ) -> tuple[tuple[KernelSignature, Directives], int | None, int, int]:
    kparams: dict[int, tuple[int, int, int]] = {}  # ordinal -> (offset, size, packed)
    size = None
    kw: dict = {}
    maxreg = None
    spills = barriers = 0
    for attr, fmt, val in _records(blob, e, section):
        if attr == _KPARAM_INFO and fmt == _EIFMT_SVAL and len(val) >= 12:
            _, ordinal, offset, packed = struct.unpack_from("<IHHI", val)
            kparams[ordinal] = (offset, (packed >> 18) & 0x3FFF, packed)
        elif attr == _CBANK_PARAM_SIZE and fmt == _EIFMT_HVAL:
            size = val
        elif attr == _PARAM_CBANK and fmt == _EIFMT_SVAL and len(val) >= 8 and size is None:
            size = struct.unpack_from("<HH", val, 4)[1]
        elif attr == _MAX_THREADS and fmt == _EIFMT_SVAL:
            kw["maxntid"] = _dims(val) or None
        elif attr == _REQNTID and fmt == _EIFMT_SVAL:
            kw["reqntid"] = _dims(val) or None
        elif attr == _MAXREG_COUNT and fmt == _EIFMT_HVAL:
            maxreg = val
            if val < 0xFF:
                kw["maxnreg"] = val
        elif attr == _CTA_PER_CLUSTER and fmt == _EIFMT_SVAL:
            kw["reqnctapercluster"] = _dims(val) or None
        elif attr == _EXPLICIT_CLUSTER:
            kw["explicitcluster"] = True
        elif attr == _MAX_CLUSTER_RANK and fmt == _EIFMT_SVAL and len(val) >= 4:
            kw["maxclusterrank"] = struct.unpack_from("<I", val)[0]
        elif attr == _BLOCKS_ARE_CLUSTERS:
            kw["blocksareclusters"] = True
        elif attr == _NUM_BARRIERS and fmt == _EIFMT_BVAL:
            barriers = val
        elif attr == _ANNOTATIONS and fmt == _EIFMT_SVAL:
            spills += sum(1 for (kind, _) in struct.iter_unpack("<II", val[:len(val) & ~7]) if kind == _SPILL_REFILL)
    if sorted(kparams) != list(range(len(kparams))):
        raise e.fail(f"{section}: parameter ordinals {sorted(kparams)} are not 0..{len(kparams) - 1}")
    spans = sorted((off, off + sz, i) for i, (off, sz, _) in kparams.items())
    for (a0, a1, i), (b0, _, j) in zip(spans, spans[1:]):
        if b0 < a1:
            raise e.fail(f"{section}: parameters {i} (bytes {a0}..{a1 - 1}) and {j} (from byte {b0}) overlap")
    params = []
    end = 0
    for ordinal in range(len(kparams)):
        offset, psize, packed = kparams[ordinal]
        space = (packed >> 8) & 0xF
        pointer = space in _POINTER_SPACES
        params.append(Param(
            name=f"param_{ordinal}", type="unknown", size=psize, align=None,
            offset=offset, pointer=pointer, space=_POINTER_SPACES.get(space),
            pointee_align=(1 << (packed & 0xFF)) if pointer else None))
        end = max(end, offset + psize)
    if size is None:
        size = end
    if end > size:
        raise e.fail(f"{section}: parameters end at byte {end}, past the parameter buffer's {size} bytes")
    return (KernelSignature(tuple(params), size), Directives(**kw)), maxreg, spills, barriers
