"""A small bounds-checked reader of little-endian ELF64 files: header, sections by index and
name, symbols and note records. It decodes; what the sections mean for CUDA is cubin.py's.
Pure data, standard library only."""
from __future__ import annotations

import os
import struct

from nbjit.errors import ImageFormatError
from nbjit.records import record

__all__ = ["ElfFile", "Section", "Symbol", "gnu_build_id"]

SHT_SYMTAB = 2
SHT_NOTE = 7
SHT_NOBITS = 8
_MAX_SECTIONS = 1 << 16


@record
class Section:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


@record
class Symbol:
    index: int
    name: str
    type: int  # st_info & 0xf
    bind: int  # st_info >> 4
    other: int
    shndx: int
    value: int
    size: int


class ElfFile:
    """An ELF64 little-endian image, checked as it is read; errors are ImageFormatErrors
    naming ``source`` and the offset."""

    def __init__(self, data: bytes, source: str, *, machine: tuple[int, str] | None = None, what: str = "ELF file"):
        self.d = data
        self.source = source
        d = data
        if len(d) < 64 or d[:4] != b"\x7fELF":
            raise self.fail("not an ELF file (no \\x7fELF magic)" if d[:4] != b"\x7fELF" else
                            f"truncated ELF header ({len(d)} bytes)")
        if d[4] != 2:
            raise self.fail(f"32-bit ELF: only 64-bit {what}s are supported")
        if d[5] != 1:
            raise self.fail(f"big-endian ELF: not a {what}")
        (self.type, self.machine, _, _, _, shoff, self.flags, _, _, _, shentsize, shnum,
         shstrndx) = self.unpack("<HHIQQQIHHHHHH", 16, "ELF header")
        self.abi_version = d[8]
        if machine is not None and self.machine != machine[0]:
            raise self.fail(f"ELF for machine {self.machine}, not {machine[1]} ({machine[0]}): a host object or "
                            f"library, not a {what} (extract its device code with 'cuobjdump -xelf all')")
        if shentsize != 64:
            raise self.fail(f"section header size {shentsize}, expected 64")
        # (pyelftools: e_shnum == 0 would mean "count in section 0"; cubins never use it)
        if shnum == 0 or shnum > _MAX_SECTIONS or shoff + shnum * 64 > len(d):
            raise self.fail(f"section header table ({shnum} entries at {shoff:#x}) does not fit in the file "
                            f"({len(d)} bytes; truncated?)")
        if shstrndx >= shnum:
            raise self.fail(f"section name table index {shstrndx} is not below the section count {shnum}")
        raw = []
        for i in range(shnum):
            (name, typ, flags, _, off, size, link, info, _, entsize) = self.unpack(
                "<IIQQQQIIQQ", shoff + i * 64, f"section header {i}")
            if typ != SHT_NOBITS and typ != 0 and off + size > len(d):
                raise self.fail(f"section {i} (offset {off:#x}, {size} bytes) runs past the end of the file "
                                f"({len(d)} bytes; truncated?)")
            raw.append((name, typ, flags, off, size, link, info, entsize))
        names = self.bytes(raw[shstrndx][3], raw[shstrndx][4], "section name table")
        self.sections = [Section(i, cstr(names, r[0]), *r[1:]) for i, r in enumerate(raw)]
        self.by_name = {s.name: s for s in self.sections}

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

    def content(self, s: Section) -> bytes:
        return b"" if s.type == SHT_NOBITS else self.bytes(s.offset, s.size, f"section {s.name}")

    def of_type(self, typ: int) -> list[Section]:
        return [s for s in self.sections if s.type == typ]

    def symbols(self) -> list[Symbol]:
        """The entries of the symbol table (none without one)."""
        symtab = next(iter(self.of_type(SHT_SYMTAB)), None)
        if symtab is None:
            return []
        if symtab.link >= len(self.sections):
            raise self.fail(f".symtab names string table {symtab.link}, which does not exist")
        strtab = self.content(self.sections[symtab.link])
        body = self.content(symtab)
        if len(body) % 24:
            raise self.fail(f".symtab size {len(body)} is not a multiple of 24")
        out = []
        for i, k in enumerate(range(0, len(body), 24)):
            st_name, st_info, st_other, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", body, k)
            out.append(Symbol(i, cstr(strtab, st_name), st_info & 0xF, st_info >> 4, st_other, st_shndx, st_value,
                              st_size))
        return out

    def note(self, s: Section) -> tuple[bytes, bytes] | None:
        """(name, description) of the first record of a note section, None if too short."""
        body = self.content(s)
        if len(body) < 12:
            return None
        namesz, descsz, _ = struct.unpack_from("<III", body)
        doff = 12 + (namesz + 3) // 4 * 4
        if doff + descsz > len(body):
            return None
        return body[12: 12 + namesz], body[doff: doff + descsz]


def cstr(blob: bytes, off: int) -> str:
    """The NUL-terminated string at ``off`` ("" past the end)."""
    if off >= len(blob):
        return ""
    end = blob.find(b"\0", off)
    return blob[off: end if end != -1 else len(blob)].decode("utf-8", "replace")


_PT_NOTE, _NT_GNU_BUILD_ID = 4, 3


def gnu_build_id(path: str) -> bytes | None:
    """The GNU build ID of an ELF64 little-endian file on disk (a shared library), read through
    its program headers (a few hundred bytes, not the file), or None where it has none."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        first = os.pread(fd, 4096, 0)  # (the header, program headers and notes are most often here)

        def read(size: int, at: int) -> bytes:
            return first[at:at + size] if at + size <= len(first) else os.pread(fd, size, at)
        head = first[:64]
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return None
        (phoff,) = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        if phentsize < 56 or phnum > 512:
            return None
        ph = read(phentsize * phnum, phoff)
        for i in range(len(ph) // phentsize):
            p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", ph, i * phentsize)
            if p_type != _PT_NOTE or p_filesz > 1 << 16:
                continue
            notes, pos = read(p_filesz, p_offset), 0
            while pos + 12 <= len(notes):
                namesz, descsz, kind = struct.unpack_from("<III", notes, pos)
                name_at = pos + 12
                desc_at = name_at + (namesz + 3) // 4 * 4  # name and desc are 4-byte aligned
                if kind == _NT_GNU_BUILD_ID and notes[name_at:name_at + namesz] == b"GNU\0":
                    desc = notes[desc_at:desc_at + descsz]
                    return desc if len(desc) == descsz and desc else None
                pos = desc_at + (descsz + 3) // 4 * 4
    except (OSError, struct.error):
        return None
    finally:
        os.close(fd)
    return None


def cuda_elf_arch(abi_version: int, flags: int) -> tuple[int, bool]:
    """The SM (90) a CUDA ELF's header records in ``e_flags`` by its ABI version (FORMATS.md
    §4), and whether the header marks the code arch-specific (sm_90a); ABI 8 may mark that
    only in its compat section (``nbjit.read.cubin`` reads it)."""
    if abi_version >= 8:
        return (flags >> 8) & 0xFF, bool(flags & 0x8)
    return flags & 0xFF, bool(flags & 0x800)
