"""CUDA ELF (cubin) -> CubinInfo: architecture, kernels, per-kernel .nv.info attributes,
resources and module globals. Pure data: standard library only, no CUDA needed.

Format facts (record framing, attribute ids, the two e_flags ABIs) are in
shared/docs/FORMATS.md §4, each checked against cuobjdump.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .arch import Arch
from .errors import ImageFormatError
from .signature import Directives, KernelInfo, KernelSignature, Param, find_entry

__all__ = ["CubinInfo", "GlobalSymbol", "inspect_cubin", "EM_CUDA", "arch_name"]

EM_CUDA = 190
_SHT_SYMTAB = 2
_SHT_NOBITS = 8
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
_BLOCKS_ARE_CLUSTERS = 0x5B
_COMPAT_ACCELERATOR = 0x09
# KPARAM_INFO pointee state space (bits 8-11)
_POINTER_SPACES = {1: "local", 2: "shared", 4: "global", 5: None}

_MAX_SECTIONS = 1 << 16
# symbol binding -> the PTX linkage it comes from (FORMATS.md §1.7)
_BINDINGS = {0: None, 1: "visible", 2: "weak"}


@dataclass(frozen=True)
class GlobalSymbol:
    """A module variable (``__device__``, ``__constant__``) found in a cubin's symbol table."""

    name: str
    space: str  # "global", "const", "shared"
    size: int
    section: str

    def to_json(self) -> dict:
        return {"name": self.name, "space": self.space, "size": self.size, "section": self.section}


@dataclass(frozen=True)
class CubinInfo:
    """What nbjit reads from a cubin."""

    arch: str  # "sm_90", "sm_90a"
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
        return find_entry(self.entries, name)

    def to_json(self) -> dict:
        return {
            "kind": "cubin",
            "arch": self.arch,
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


class _Elf:
    """Bounds-checked reads of a little-endian ELF64 image."""

    def __init__(self, data: bytes, source: str):
        self.d = data
        self.source = source

    def fail(self, what: str) -> ImageFormatError:
        return ImageFormatError(f"{self.source}: {what}")

    def unpack(self, fmt: str, off: int, what: str) -> tuple:
        size = struct.calcsize(fmt)
        if off < 0 or off + size > len(self.d):
            raise self.fail(f"{what} at offset {off:#x} runs past the end of the file ({len(self.d)} bytes; "
                            "truncated?)")
        return struct.unpack_from(fmt, self.d, off)

    def bytes(self, off: int, size: int, what: str) -> bytes:
        if off < 0 or size < 0 or off + size > len(self.d):
            raise self.fail(f"{what} (offset {off:#x}, {size} bytes) runs past the end of the file "
                            f"({len(self.d)} bytes; truncated?)")
        return self.d[off: off + size]


@dataclass
class _Section:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


def _cstr(blob: bytes, off: int) -> str:
    if off >= len(blob):
        return ""
    end = blob.find(b"\0", off)
    return blob[off: end if end != -1 else len(blob)].decode("utf-8", "replace")


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
    e = _Elf(bytes(data), src)
    d = e.d
    if len(d) < 64 or d[:4] != b"\x7fELF":
        raise e.fail("not an ELF file (no \\x7fELF magic)" if d[:4] != b"\x7fELF" else
                     f"truncated ELF header ({len(d)} bytes)")
    if d[4] != 2:
        raise e.fail("32-bit ELF: only 64-bit cubins are supported")
    if d[5] != 1:
        raise e.fail("big-endian ELF: not a cubin")
    (e_type, e_machine, _, _, _, e_shoff, e_flags, _, _, _, e_shentsize, e_shnum,
     e_shstrndx) = e.unpack("<HHIQQQIHHHHHH", 16, "ELF header")
    if e_machine != EM_CUDA:
        raise e.fail(f"ELF for machine {e_machine}, not CUDA ({EM_CUDA}): a host object or library, not a cubin "
                     "(extract its device code with 'cuobjdump -xelf all')")
    if e_shentsize != 64:
        raise e.fail(f"section header size {e_shentsize}, expected 64")
    if e_shnum == 0 or e_shnum > _MAX_SECTIONS or e_shoff + e_shnum * 64 > len(d):
        raise e.fail(f"section header table ({e_shnum} entries at {e_shoff:#x}) does not fit in the file "
                     f"({len(d)} bytes; truncated?)")
    if e_shstrndx >= e_shnum:
        raise e.fail(f"section name table index {e_shstrndx} is not below the section count {e_shnum}")
    abiver = d[8]

    raw = []
    for i in range(e_shnum):
        (name, typ, flags, _, off, size, link, info, _, entsize) = e.unpack(
            "<IIQQQQIIQQ", e_shoff + i * 64, f"section header {i}")
        if typ != _SHT_NOBITS and typ != 0 and off + size > len(d):
            raise e.fail(f"section {i} (offset {off:#x}, {size} bytes) runs past the end of the file "
                         f"({len(d)} bytes; truncated?)")
        raw.append((name, typ, flags, off, size, link, info, entsize))
    shstr = raw[e_shstrndx]
    shstrtab = e.bytes(shstr[3], shstr[4], "section name table")
    secs = [_Section(i, _cstr(shstrtab, r[0]), *r[1:]) for i, r in enumerate(raw)]

    def content(s: _Section) -> bytes:
        return b"" if s.type == _SHT_NOBITS else e.bytes(s.offset, s.size, f"section {s.name}")

    # symbols
    symtab = next((s for s in secs if s.type == _SHT_SYMTAB), None)
    syms: list[tuple[str, int, int, int, int, int]] = []  # name, type, other, shndx, bind, size
    if symtab is not None:
        if symtab.link >= len(secs):
            raise e.fail(f".symtab names string table {symtab.link}, which does not exist")
        strtab = content(secs[symtab.link])
        body = content(symtab)
        if len(body) % 24:
            raise e.fail(f".symtab size {len(body)} is not a multiple of 24")
        for k in range(0, len(body), 24):
            st_name, st_info, st_other, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", body, k)
            syms.append((_cstr(strtab, st_name), st_info & 0xF, st_other, st_shndx, st_info >> 4, st_size))

    by_name = {s.name: s for s in secs}  # one look-up per kernel, not a scan of the sections
    info_by_target = {s.info: s for s in secs if s.type == _SHT_CUDA_INFO and s.name.startswith(".nv.info.")}

    # module-wide .nv.info: registers, frame and stack sizes per function symbol
    per_symbol: dict[int, dict[int, int]] = {_REGCOUNT: {}, _FRAME_SIZE: {}, _MIN_STACK_SIZE: {}}
    for s in secs:
        if s.type == _SHT_CUDA_INFO and s.name == ".nv.info":
            for attr, fmt, val in _records(content(s), e, s.name):
                if attr in per_symbol and fmt == _EIFMT_SVAL and len(val) >= 8:
                    sym, n = struct.unpack_from("<II", val)
                    per_symbol[attr][sym] = n
    regs, frame, stack = per_symbol[_REGCOUNT], per_symbol[_FRAME_SIZE], per_symbol[_MIN_STACK_SIZE]

    compat: dict[int, int] = {}
    for s in secs:
        if s.type == _SHT_CUDA_COMPAT:
            for attr, fmt, val in _records(content(s), e, s.name):
                if fmt in (_EIFMT_BVAL, _EIFMT_HVAL):
                    compat[attr] = val

    virtual = toolkit = None
    for s in secs:
        if s.type == _SHT_NOTE and s.name == ".note.nv.cuinfo":
            body = content(s)
            if len(body) >= 12:
                namesz, descsz, _ = struct.unpack_from("<III", body)
                doff = 12 + (namesz + 3) // 4 * 4
                if descsz >= 8 and doff + 8 <= len(body):
                    _, virtual, toolkit = struct.unpack_from("<HHI", body, doff)

    if abiver >= 8:
        sm = (e_flags >> 8) & 0xFF
        arch_specific = bool(e_flags & 0x8) or compat.get(_COMPAT_ACCELERATOR) == 1
    else:
        sm = e_flags & 0xFF
        arch_specific = bool(e_flags & 0x800)
        virtual = virtual or ((e_flags >> 16) & 0xFF) or None
    if not 10 <= sm <= 9999:
        raise e.fail(f"no plausible SM architecture in e_flags {e_flags:#x} (sm {sm})")

    reserved = 0
    for s in secs:
        if s.name.startswith(".nv.shared.reserved"):
            reserved = 1024 if sm >= 90 else 0  # sm_90+ reserves 1 KiB at the start of shared memory

    entries = []
    max_registers = {}
    functions = []
    for idx, (name, typ, other, shndx, bind, _) in enumerate(syms):
        if typ != _STT_FUNC or shndx == 0:
            continue
        if not other & _STO_CUDA_ENTRY:
            if shndx < len(secs) and secs[shndx].name == f".text.{name}":
                functions.append(name)
            continue
        if shndx >= len(secs):
            raise e.fail(f"kernel {name!r} points at section {shndx}, which does not exist")
        info_sec = by_name.get(f".nv.info.{name}")
        if info_sec is None or info_sec.type != _SHT_CUDA_INFO:
            info_sec = info_by_target.get(shndx)
        kinfo, maxreg = _kernel(name, content(info_sec) if info_sec else b"", e,
                                info_sec.name if info_sec else f".nv.info.{name}")
        shared_sec = by_name.get(f".nv.shared.{name}")
        const_sec = by_name.get(f".nv.constant0.{name}")
        shared = max(0, shared_sec.size - reserved) if shared_sec else 0
        entries.append(KernelInfo(
            name, kinfo[0], kinfo[1], linkage=_BINDINGS.get(bind), registers=regs.get(idx),
            shared=shared, const=const_sec.size if const_sec else None, local=frame.get(idx, 0),
            # a relocatable cubin's callees are resolved at link time: only its own frame is known
            stack=stack.get(idx, frame.get(idx, 0))))
        if maxreg is not None:
            max_registers[name] = maxreg

    globals_ = []
    for name, typ, _, shndx, _, size in syms:
        if typ not in (_STT_OBJECT, _STT_CUDA_OBJECT) or shndx == 0 or shndx >= len(secs) \
                or name.startswith(("__nv_", "$")):
            continue
        sec = secs[shndx].name
        space = "global" if sec.startswith(".nv.global") else "const" if sec.startswith(".nv.constant") \
            else "shared" if sec.startswith(".nv.shared") else None
        if space:
            globals_.append(GlobalSymbol(name, space, size, sec))

    return CubinInfo(
        arch=arch_name(sm, arch_specific), sm=sm, arch_specific=arch_specific, virtual_arch=virtual,
        toolkit=toolkit, abi_version=abiver, address_size=64, relocatable=e_type == 1,
        entries=tuple(entries), functions=tuple(functions), globals=tuple(globals_),
        max_registers=max_registers, shared_reserved=reserved, source=source)


def _records(blob: bytes, e: _Elf, section: str):
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


def _kernel(name: str, blob: bytes, e: _Elf, section: str) -> tuple[tuple[KernelSignature, Directives], int | None]:
    kparams: dict[int, tuple[int, int, int]] = {}  # ordinal -> (offset, size, packed)
    size = None
    kw: dict = {}
    maxreg = None
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
    return (KernelSignature(tuple(params), size), Directives(**kw)), maxreg
