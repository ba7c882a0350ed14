"""The fatbin container writer: entries (cubins, PTX) -> one uncompressed container, and
where each payload lies in it. Apart from the reader (``nbjit.fatbin``) so that loading a
kernel bundle, which writes its image's entries into a fatbin, imports no reader. Format:
shared/docs/FORMATS.md §5."""
from __future__ import annotations

import struct
from typing import Iterable

from nbjit.arch import Arch, ArchLike
from nbjit.errors import ImageFormatError

__all__ = ["build_fatbin", "layout_fatbin", "cuda_elf_arch", "payload_arch", "FATBIN_MAGIC", "MAX_ENTRY_BYTES",
           "MAX_TOTAL_BYTES"]

FATBIN_MAGIC = 0xBA55ED50
_F_64BIT = 0x1
_F_LINUX = 0x10
_F_ARCH_SPECIFIC = 0x100000
_F_FAMILY = 0x200000
_MAX_ENTRIES = 4096
# Caps on decompressed sizes: the biggest real cubins are tens of MB.
MAX_ENTRY_BYTES = 256 << 20
MAX_TOTAL_BYTES = 512 << 20
_CONTAINER_HEADER = 16
_ELF_HEAD = struct.Struct("<4s4xB9xH28xI")  # an ELF64 header's magic, EI_ABIVERSION, e_machine and e_flags


def _ptx_version(data: bytes) -> tuple[int, int] | None:
    """The ISA version of PTX text's ``.version`` directive (the first line that starts with
    it, after blanks), as ``re.search(rb"^[ \\t]*\\.version[ \\t]+(\\d+)\\.(\\d+)", re.M)`` finds it;
    None where there is none. Read by hand: compiling that pattern was a quarter of a
    bundle's load (its first kernel: issue 26)."""
    at = data.find(b".version")
    while at >= 0:
        if not data[data.rfind(b"\n", 0, at) + 1:at].strip(b" \t"):  # only blanks before it on its line
            i = at + 8
            while data[i:i + 1] in (b" ", b"\t"):
                i += 1
            j = i
            while data[j:j + 1].isdigit():
                j += 1
            k = j + 1
            while data[k:k + 1].isdigit():
                k += 1
            if i > at + 8 and j > i and data[j:j + 1] == b"." and k > j + 1:
                return int(data[i:j]), int(data[j + 1:k])
        at = data.find(b".version", at + 1)
    return None


def cuda_elf_arch(abi_version: int, flags: int) -> tuple[int, bool]:
    """The SM (90) a CUDA ELF's header records in ``e_flags`` by its ABI version (FORMATS.md
    §4), and whether the header marks the code arch-specific (sm_90a); ABI 8 may mark that
    only in its compat section (``nbjit.cubin`` reads it)."""
    if abi_version >= 8:
        return (flags >> 8) & 0xFF, bool(flags & 0x8)
    return flags & 0xFF, bool(flags & 0x800)


def payload_arch(kind: str, data: bytes) -> tuple[int, str | None] | None:
    """What a cubin or PTX payload itself says it was built for, read cheaply: (the SM or
    compute capability number, the variant "", "a" or "f", or None where the payload does not
    say it): a cubin's from its ELF header, PTX's from its first ``.target``. None where
    neither is there to read (the readers say what is wrong with such a payload)."""
    if kind == "cubin":
        if len(data) < _ELF_HEAD.size:
            return None
        magic, abi, machine, flags = _ELF_HEAD.unpack_from(data)
        if magic != b"\x7fELF" or machine != 190:
            return None
        sm, specific = cuda_elf_arch(abi, flags)
        return sm, "a" if specific else None if abi >= 8 else ""
    target = _ptx_target(data[: 1 << 16])
    try:
        a = Arch.parse(target.decode("ascii"), virtual=True) if target else None
    except (UnicodeDecodeError, ValueError):
        return None
    return None if a is None else (a.number, a.variant)


def _ptx_target(data: bytes) -> bytes | None:
    """The first item of PTX text's first ``.target`` directive that starts its line
    (``sm_90a`` of ``.target sm_90a, debug``), None where there is none; read by hand as
    ``_ptx_version`` is."""
    at = data.find(b".target")
    while at >= 0:
        end = data.find(b"\n", at)
        rest = data[at + 7:end if end >= 0 else len(data)]
        if rest[:1] in (b" ", b"\t") and not data[data.rfind(b"\n", 0, at) + 1:at].strip(b" \t"):
            items = rest.replace(b",", b" ").split()
            return items[0] if items else None
        at = data.find(b".target", at + 1)
    return None


def build_fatbin(entries: Iterable[tuple[str, ArchLike, bytes]], *, source: str | None = None) -> bytes:
    """One uncompressed fatbin container holding ``entries``, each ``(kind, arch, payload)``:
    ``("cubin", "sm_90a", elf bytes)`` or ``("ptx", "compute_80", text bytes)``. What
    ``inspect_fatbin`` reads back is the same entries, in order (PTX without its NUL).

    Raises
    ------
    ImageFormatError: a kind other than "cubin" / "ptx", an architecture that is not one (or a
    virtual one for a cubin), a cubin that is no CUDA ELF, PTX without a ``.version``, no
    entries, or more than ``inspect_fatbin`` reads.
    """
    return layout_fatbin(entries, source=source)[0]


def layout_fatbin(entries: Iterable[tuple[str, ArchLike, bytes]], *, source: str | None = None
                  ) -> tuple[bytes, list[tuple[int, int]]]:
    """``build_fatbin``'s container and, for each entry, where its payload lies in it:
    ``(offset, length)`` of the cubin, or of the PTX text without the NUL and padding the
    container adds. Raises as ``build_fatbin``."""
    src = source or "<fatbin>"
    parts: list[bytes] = []
    spans: list[tuple[int, int]] = []
    total = 0
    for i, item in enumerate(entries):
        try:
            kind, arch, payload = item
        except (TypeError, ValueError):
            raise ImageFormatError(f"{src}: entry {i} is {type(item).__name__}, not (kind, arch, payload)") from None
        part, head, length = _entry_bytes(kind, arch, payload, f"{src}: entry {i}")
        spans.append((_CONTAINER_HEADER + total + head, length))
        parts.append(part)
        total += len(part)
        if len(parts) > _MAX_ENTRIES or total > MAX_TOTAL_BYTES:
            raise ImageFormatError(f"{src}: more than {_MAX_ENTRIES} entries or {MAX_TOTAL_BYTES} bytes: more than "
                                   "nbjit reads back")
    if not parts:
        raise ImageFormatError(f"{src}: a fatbin holds at least one entry")
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, _CONTAINER_HEADER, total) + b"".join(parts), spans


def _entry_bytes(kind: object, arch: object, payload: object, where: str) -> tuple[bytes, int, int]:
    """One entry: its header (FORMATS.md §5.2) and its payload; and where the payload starts
    in it and how long it is (PTX: the text, without the NUL and padding)."""
    if kind not in ("cubin", "ptx"):
        raise ImageFormatError(f"{where}: kind must be 'cubin' or 'ptx', not {kind!r}")
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise ImageFormatError(f"{where}: the payload is bytes, not {type(payload).__name__}")
    data = bytes(payload)
    try:
        target = Arch.parse(arch)
    except (TypeError, ValueError) as e:
        raise ImageFormatError(f"{where}: {e}") from None
    flags = _F_64BIT | _F_LINUX | (_F_ARCH_SPECIFIC if target.variant == "a" else 0) | \
        (_F_FAMILY if target.variant == "f" else 0)
    if kind == "cubin":
        if target.virtual:
            raise ImageFormatError(f"{where}: a cubin runs on a real architecture (sm_XX), not {target}")
        if data[:4] != b"\x7fELF" or len(data) < 20 or int.from_bytes(data[18:20], "little") != 190:
            raise ImageFormatError(f"{where}: the payload of a cubin entry is not a CUDA ELF (starts with "
                                   f"{data[:8].hex(' ')})")
        # ELF entries carry (1, EI_ABIVERSION) where PTX entries carry their ISA version
        major, minor, code = 1, data[8], 2
        length = len(data)
    else:
        version = _ptx_version(data[: 1 << 16])
        if version is None or b"\0" in data.rstrip(b"\0"):
            raise ImageFormatError(f"{where}: the payload of a PTX entry is not PTX text (no '.version' directive)")
        (major, minor), code = version, 1
        target = Arch(target.number, target.variant, True)  # (PTX for "sm_90" is PTX for compute_90)
        data = data.rstrip(b"\0")
        length = len(data)
        data += b"\0"  # NUL-terminated,
        data += b"\0" * (-len(data) % 8)  # and padded to 8 bytes as nvcc stores it
    if not 0 <= major < 1 << 16 or not 0 <= minor < 1 << 16:
        raise ImageFormatError(f"{where}: PTX ISA version {major}.{minor} does not fit a fatbin header")
    if len(data) > MAX_ENTRY_BYTES:
        raise ImageFormatError(f"{where}: {len(data)} bytes, more than nbjit reads back ({MAX_ENTRY_BYTES})")
    # A PTX entry names its ptxas options (none: an empty string) through a descriptor
    # {u32 offset, u32 length} after the 64 bytes, as nvcc writes it; cuobjdump refuses a PTX
    # entry without one ("Invalid fatbin header").
    tail = struct.pack("<IIQ", 72, 0, 0) if code == 1 else b""
    header = struct.pack("<HHIQIIHHIIIQQQ", code, 0x0101, 64 + len(tail), len(data), 0, 64 if tail else 0, minor,
                         major, target.number, 0, 0, flags, 0, 0)
    return header + tail + data, len(header) + len(tail), length
