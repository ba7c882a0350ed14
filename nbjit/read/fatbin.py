"""Fatbin container -> entries (PTX, cubin or LTO-IR, arch, compression), the choice of the
entry a device should use, and the inverse: entries -> an uncompressed container. Pure data,
no CUDA needed. Format: shared/docs/FORMATS.md §5 (LTO-IR entries: docs/cubin.md).
LZ4 and zstd payloads are decompressed by the ``lz4`` and ``zstandard`` packages, bounded by
the sizes the headers declare."""
from __future__ import annotations

import struct
from typing import Iterable

from nbjit.arch import Arch, ArchLike, pick
from nbjit.errors import ImageFormatError
from nbjit.read.elf import cuda_elf_arch
from nbjit.records import field, record

__all__ = ["FatbinEntry", "FatbinInfo", "inspect_fatbin", "select_entry", "parse_arch", "build_fatbin",
           "undecoded", "DECODERS", "FATBIN_MAGIC", "MAX_ENTRY_BYTES", "MAX_TOTAL_BYTES"]

_KIND = {1: "ptx", 2: "cubin", 8: "ltoir"}  # 8: NVVM LTO-IR (nvcc code=lto_XX; cuobjdump "nvvm code")
_F_DEBUG = 0x2
_F_LZ4 = 0x2000
_F_ZSTD = 0x8000
# Set (nvcc 13.0) on every compressed LTO-IR entry, whose payload is then neither a zstd frame
# nor an LZ4 block: nbjit does not decompress it (nvJitLink reads the fatbin itself).
_F_OPAQUE = 0x10000


@record
class FatbinEntry:
    """One image in a fatbin. ``payload`` is the (decompressed) image, or None where it is
    compressed in a way Python cannot undo here (LZ4 without the ``lz4`` package, zstd without
    ``zstandard``: ``undecoded`` says which; a compressed LTO-IR entry). LTO-IR entries (kind
    ``"ltoir"``) are linked, never loaded."""

    index: int
    kind: str  # "ptx", "cubin" or "ltoir"
    sm: int
    arch_specific: bool
    family: bool
    compression: str | None  # None, "lz4", "zstd"
    offset: int  # of the payload in the container
    stored_size: int
    size: int  # uncompressed
    debug: bool
    ptx_version: tuple[int, int] | None
    payload: bytes | None = field(repr=False)  # an image can be megabytes: not in repr()

    @property
    def arch(self) -> Arch:
        """The entry's architecture: ``sm_90``, ``sm_90a``, ``compute_90`` (virtual for PTX and
        LTO-IR; it equals its text, ``e.arch == "sm_90"``)."""
        return Arch(self.sm, "a" if self.arch_specific else "f" if self.family else "", self.kind != "cubin")

    target = arch  # (its name before ``arch`` was an Arch)

    @property
    def arch_name(self) -> str:
        """The architecture as nvcc's ``code=`` names the entry: ``sm_90``, ``compute_90``, and
        ``lto_90`` for LTO-IR (as ``--json`` and ``nbjit inspect`` print it)."""
        if self.kind == "ltoir":
            return f"lto_{self.sm}{'a' if self.arch_specific else 'f' if self.family else ''}"
        return str(self.arch)

    @property
    def compressed(self) -> bool:
        """Whether the payload is stored compressed (LZ4 or zstd)."""
        return self.compression is not None

    def to_json(self) -> dict:
        return {"index": self.index, "kind": self.kind, "arch": self.arch_name, "compressed": self.compressed,
                "compression": self.compression, "size": self.size, "stored_size": self.stored_size,
                "debug": self.debug, "decompressed": self.payload is not None,
                "ptx_version": list(self.ptx_version) if self.ptx_version else None}


@record
class FatbinInfo:
    """The entries of a fatbin (one or more containers back to back)."""

    entries: tuple[FatbinEntry, ...]
    source: str | None = None

    def select(self, device: ArchLike) -> FatbinEntry | None:
        """The entry a device of that architecture should use (see ``select_entry``)."""
        return select_entry(self.entries, device)

    def to_json(self) -> dict:
        return {"kind": "fatbin", "entries": [e.to_json() for e in self.entries]}


def parse_arch(arch: ArchLike) -> int:
    """``"sm_90"``, ``"sm_90a"``, ``"compute_90"``, ``90`` or ``(9, 0)`` -> 90."""
    return Arch.parse(arch).number


def select_entry(entries: Iterable[FatbinEntry], device: ArchLike) -> FatbinEntry | None:
    """Pick the image a device runs (``nbjit.arch.pick``: SASS for this very chip first, an
    arch-specific build before a generic one, then the newest SASS that runs on it, then the
    newest PTX it can JIT; LTO-IR is never picked: it must be linked first)."""
    entries = list(entries)
    i = pick([(e.kind, e.arch) for e in entries], device)
    return None if i is None else entries[i]


def inspect_fatbin(data: bytes, *, source: str | None = None) -> FatbinInfo:
    """List a fatbin's entries, decompressing LZ4 and zstd (with ``lz4`` and ``zstandard``;
    an entry whose package is missing keeps ``payload`` None).

    Decompression is bounded by the sizes the headers declare, at most ``MAX_ENTRY_BYTES``
    an entry and ``MAX_TOTAL_BYTES`` in all, judged before anything is decompressed.

    Raises
    ------
    ImageFormatError: wrong magic, a truncated container, an entry that overruns it, a
    payload that does not decompress to its declared size, sizes past the caps.
    """
    src = source or "<fatbin>"
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageFormatError(f"{src}: a fatbin is bytes, not {type(data).__name__} (read the file first, or use "
                               "nbjit.inspect_image(path))")
    d = bytes(data)

    def fail(msg: str) -> ImageFormatError:
        return ImageFormatError(f"{src}: {msg}")

    spans = _entry_spans(d, fail)  # every header first: sizes are judged before any work
    total = sum(_declared_size(d, off) for off, _ in spans)
    if total > MAX_TOTAL_BYTES:
        raise fail(f"its entries declare {total} bytes in all, more than nbjit reads ({MAX_TOTAL_BYTES}): not a "
                   "plausible fatbin (a decompression bomb?)")
    return FatbinInfo(tuple(_entry(d, off, end, i, fail) for i, (off, end) in enumerate(spans)), source)


def _entry_spans(d: bytes, fail) -> list[tuple[int, int]]:
    """(offset, container end) of every entry of every container, headers checked."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while pos < len(d):
        if len(d) - pos < 16:
            if not d[pos:].strip(b"\0"):
                break  # alignment padding after the last container
            raise fail(f"truncated fatbin header at offset {pos:#x}")
        magic, version, hsize, fat_size = struct.unpack_from("<IHHQ", d, pos)
        if magic != FATBIN_MAGIC:
            raise fail(f"bad fatbin magic {magic:#010x} at offset {pos:#x} (expected {FATBIN_MAGIC:#010x})")
        if version != 1 or hsize != 16:
            raise fail(f"unsupported fatbin container version {version} / header size {hsize}")
        start, end = pos + hsize, pos + hsize + fat_size
        if end > len(d):
            raise fail(f"container at {pos:#x} claims {fat_size} bytes, only {len(d) - start} remain (truncated?)")
        off = start
        while off < end:
            if len(spans) >= _MAX_ENTRIES:
                raise fail(f"more than {_MAX_ENTRIES} entries")
            if end - off < 64:
                raise fail(f"entry {len(spans)} at {off:#x}: header truncated ({end - off} bytes left)")
            hsize_e, stored = struct.unpack_from("<IQ", d, off + 4)
            if hsize_e < 64 or off + hsize_e + stored > end:
                raise fail(f"entry {len(spans)} at {off:#x}: header {hsize_e} + payload {stored} bytes overrun the "
                           "container")
            spans.append((off, end))
            off += hsize_e + stored
        pos = end
    if not spans:
        raise fail("fatbin holds no entries")
    return spans


def _declared_size(d: bytes, off: int) -> int:
    """The uncompressed size an entry header declares."""
    flags, usize = struct.unpack_from("<Q", d, off + 40)[0], struct.unpack_from("<Q", d, off + 56)[0]
    stored = struct.unpack_from("<Q", d, off + 8)[0]
    return usize if flags & (_F_LZ4 | _F_ZSTD) else stored


def _entry(d: bytes, off: int, end: int, index: int, fail) -> FatbinEntry:
    if end - off < 64:
        raise fail(f"entry {index} at {off:#x}: header truncated ({end - off} bytes left)")
    kind, _, hsize, stored, csize, _, minor, major, sm, _, _, flags, _, usize = struct.unpack_from(
        "<HHIQIIHHIIIQQQ", d, off)
    if kind not in _KIND:
        raise fail(f"entry {index} at {off:#x}: unknown kind {kind} (1 = PTX, 2 = ELF, 8 = LTO-IR)")
    if hsize < 64 or off + hsize + stored > end:
        raise fail(f"entry {index} at {off:#x}: header {hsize} + payload {stored} bytes overrun the container")
    if not 10 <= sm <= 9999:
        raise fail(f"entry {index} at {off:#x}: implausible architecture {sm}")
    payload_off = off + hsize
    stored_bytes = d[payload_off: payload_off + stored]
    compression = "lz4" if flags & _F_LZ4 else "zstd" if flags & _F_ZSTD else None
    payload: bytes | None = stored_bytes
    size = stored
    if compression:
        if not 0 < csize <= stored or usize <= 0:
            raise fail(f"entry {index} at {off:#x}: bad compressed/uncompressed sizes {csize}/{usize}")
        if usize > MAX_ENTRY_BYTES:
            raise fail(f"entry {index} at {off:#x} declares {usize} bytes uncompressed, more than nbjit reads "
                       f"({MAX_ENTRY_BYTES}): not a plausible image (a decompression bomb?)")
        if compression == "lz4" and usize > 255 * csize + 64:
            raise fail(f"entry {index} at {off:#x}: {csize} LZ4 bytes cannot expand to the {usize} declared")
        size = usize
        if flags & _F_OPAQUE and kind == 8:
            payload = None
        else:
            payload = _decompress(compression, stored_bytes[:csize], usize, lambda m: fail(f"entry {index}: {m}"))
    elif kind == 1:
        payload = stored_bytes
    if payload is not None and kind == 1:
        payload = payload.rstrip(b"\0")
    return FatbinEntry(index, _KIND[kind], sm, bool(flags & _F_ARCH_SPECIFIC), bool(flags & _F_FAMILY),
                       compression, payload_off, stored, size, bool(flags & _F_DEBUG),
                       (major, minor) if kind == 1 else None, payload)


DECODERS = {"lz4": "lz4", "zstd": "zstandard"}  # the package each compression needs (both dependencies of nbjit)


def undecoded(entry: FatbinEntry) -> str:
    """Why a compressed entry's ``payload`` is None, and what to install: "zstd-compressed
    and 'zstandard' is not installed (pip install zstandard)"."""
    if entry.kind == "ltoir":
        return f"{entry.compression}-compressed LTO-IR that nbjit leaves to nvJitLink"
    package = DECODERS[entry.compression]
    return f"{entry.compression}-compressed and {package!r} is not installed (pip install {package})"


def _decompress(kind: str, blob: bytes, size: int, fail) -> bytes | None:
    """The decompressed entry, never more than the ``size`` its header declares (checked
    against the caps by the caller): a bomb fails before anything large is allocated.
    None where the package it needs (``DECODERS``) is not installed."""
    if kind == "lz4":
        try:
            import lz4.block
        except ImportError:  # as for zstd below: this entry unread, the whole fatbin to the driver if it is chosen
            return None

        try:  # the output buffer is `size` bytes; more output is an error, not a reallocation
            out = lz4.block.decompress(blob, uncompressed_size=size)
        except lz4.block.LZ4BlockError as e:
            raise fail(f"corrupt LZ4 payload, or one larger than the {size} bytes declared: {e}") from None
    else:
        out = _zstd(blob, size, fail)
        if out is None:
            return None
    if len(out) != size:
        raise fail(f"{kind} payload decompressed to {len(out)} bytes, the header says {size}")
    return out


def _zstd(blob: bytes, size: int, fail) -> bytes | None:
    try:
        import zstandard
    except ImportError:  # a build without it: the whole fatbin goes to the driver
        return None
    try:
        declared = zstandard.frame_content_size(blob)
    except zstandard.ZstdError as e:
        raise fail(f"corrupt zstd payload: {e}") from None
    if declared not in (-1, size):  # -1: the frame does not say
        raise fail(f"zstd frame holds {declared} bytes, the fatbin header says {size}")
    try:  # a bounded read: at most size + 1 bytes are ever produced
        with zstandard.ZstdDecompressor(max_window_size=1 << 27).stream_reader(blob) as r:
            out = r.read(size + 1)
    except zstandard.ZstdError as e:
        raise fail(f"corrupt zstd payload: {e}") from None
    return out


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
    bundle's load (its first kernel)."""
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
