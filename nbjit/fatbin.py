"""Fatbin container -> entries (PTX or cubin, arch, compression), and the choice of the
entry a device should use. Pure data, no CUDA needed. Format: shared/docs/FORMATS.md §5."""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from .errors import ImageFormatError

__all__ = ["FatbinEntry", "FatbinInfo", "inspect_fatbin", "select_entry", "parse_arch", "FATBIN_MAGIC"]

FATBIN_MAGIC = 0xBA55ED50
_KIND = {1: "ptx", 2: "cubin"}
_F_DEBUG = 0x2
_F_LZ4 = 0x2000
_F_ZSTD = 0x8000
_F_ARCH_SPECIFIC = 0x100000
_F_FAMILY = 0x200000
_MAX_ENTRIES = 4096
_MAX_UNCOMPRESSED = 1 << 30


@dataclass(frozen=True)
class FatbinEntry:
    """One image in a fatbin. ``payload`` is the (decompressed) image, or None where it is
    compressed in a way Python cannot undo here (zstd without the ``zstandard`` package)."""

    index: int
    kind: str  # "ptx" or "cubin"
    sm: int
    arch_specific: bool
    family: bool
    compression: str | None  # None, "lz4", "zstd"
    offset: int  # of the payload in the container
    stored_size: int
    size: int  # uncompressed
    debug: bool
    ptx_version: tuple[int, int] | None
    payload: bytes | None

    @property
    def arch(self) -> str:
        base = "compute" if self.kind == "ptx" else "sm"
        return f"{base}_{self.sm}{'a' if self.arch_specific else 'f' if self.family else ''}"

    @property
    def compressed(self) -> bool:
        return self.compression is not None

    def to_json(self) -> dict:
        return {"index": self.index, "kind": self.kind, "arch": self.arch, "compressed": self.compressed,
                "compression": self.compression, "size": self.size, "stored_size": self.stored_size,
                "debug": self.debug, "decompressed": self.payload is not None,
                "ptx_version": list(self.ptx_version) if self.ptx_version else None}


@dataclass(frozen=True)
class FatbinInfo:
    """The entries of a fatbin (one or more containers back to back)."""

    entries: tuple[FatbinEntry, ...]
    source: str | None = None

    def select(self, device: str | int | tuple[int, int]) -> FatbinEntry | None:
        """The entry a device of that architecture should use (see ``select_entry``)."""
        return select_entry(self.entries, device)

    def to_json(self) -> dict:
        return {"kind": "fatbin", "images": [e.to_json() for e in self.entries]}


def parse_arch(arch: str | int | tuple[int, int]) -> int:
    """``"sm_90"``, ``"sm_90a"``, ``"compute_90"``, ``90`` or ``(9, 0)`` -> 90."""
    if isinstance(arch, tuple):
        return arch[0] * 10 + arch[1]
    if isinstance(arch, int):
        return arch
    m = re.fullmatch(r"(?:sm_|compute_)?(\d+)[af]?", str(arch).strip())
    if not m:
        raise ValueError(f"not an architecture: {arch!r} (expected e.g. 'sm_90' or (9, 0))")
    return int(m.group(1))


def select_entry(entries, device: str | int | tuple[int, int]) -> FatbinEntry | None:
    """Pick the image a device runs: an exact SASS match first (an arch-specific build
    of this very chip before a generic one), then the newest SASS of the same major
    version built for an older minor (never an ``a`` build of another chip; ``f``
    family builds within their family), then the newest PTX the device can JIT."""
    dev = parse_arch(device)
    cubins = [e for e in entries if e.kind == "cubin"]
    exact = [e for e in cubins if e.sm == dev]
    if exact:
        return max(exact, key=lambda e: (e.arch_specific, -e.index))
    older = [e for e in cubins if e.sm // 10 == dev // 10 and e.sm < dev and not e.arch_specific]
    if older:
        return max(older, key=lambda e: (e.sm, -e.index))
    ptx = [e for e in entries if e.kind == "ptx" and e.sm <= dev
           and (not e.arch_specific or e.sm == dev) and (not e.family or e.sm // 10 == dev // 10)]
    if ptx:
        return max(ptx, key=lambda e: (e.sm, e.arch_specific, -e.index))
    return None


def inspect_fatbin(data: bytes, *, source: str | None = None) -> FatbinInfo:
    """List a fatbin's entries, decompressing LZ4 (and zstd where ``zstandard`` is installed).

    Raises
    ------
    ImageFormatError: wrong magic, a truncated container, an entry that overruns it.
    """
    src = source or "<fatbin>"
    d = bytes(data)

    def fail(msg: str) -> ImageFormatError:
        return ImageFormatError(f"{src}: {msg}")

    entries: list[FatbinEntry] = []
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
            if len(entries) >= _MAX_ENTRIES:
                raise fail(f"more than {_MAX_ENTRIES} entries")
            entries.append(_entry(d, off, end, len(entries), fail))
            e = entries[-1]
            off = e.offset + e.stored_size
        pos = end
    if not entries:
        raise fail("fatbin holds no entries")
    return FatbinInfo(tuple(entries), source)


def _entry(d: bytes, off: int, end: int, index: int, fail) -> FatbinEntry:
    if end - off < 64:
        raise fail(f"entry {index} at {off:#x}: header truncated ({end - off} bytes left)")
    kind, _, hsize, stored, csize, _, minor, major, sm, _, _, flags, _, usize = struct.unpack_from(
        "<HHIQIIHHIIIQQQ", d, off)
    if kind not in _KIND:
        raise fail(f"entry {index} at {off:#x}: unknown kind {kind} (1 = PTX, 2 = ELF)")
    if hsize < 64 or off + hsize + stored > end:
        raise fail(f"entry {index} at {off:#x}: header {hsize} + payload {stored} bytes overrun the container")
    if sm == 0 or sm > 10000:
        raise fail(f"entry {index} at {off:#x}: implausible architecture {sm}")
    payload_off = off + hsize
    stored_bytes = d[payload_off: payload_off + stored]
    compression = "lz4" if flags & _F_LZ4 else "zstd" if flags & _F_ZSTD else None
    payload: bytes | None = stored_bytes
    size = stored
    if compression:
        if not 0 < csize <= stored or not 0 < usize <= _MAX_UNCOMPRESSED:
            raise fail(f"entry {index} at {off:#x}: bad compressed/uncompressed sizes {csize}/{usize}")
        size = usize
        payload = _decompress(compression, stored_bytes[:csize], usize, lambda m: fail(f"entry {index}: {m}"))
    elif kind == 1:
        payload = stored_bytes
    if payload is not None and kind == 1:
        payload = payload.rstrip(b"\0")
    return FatbinEntry(index, _KIND[kind], sm, bool(flags & _F_ARCH_SPECIFIC), bool(flags & _F_FAMILY),
                       compression, payload_off, stored, size, bool(flags & _F_DEBUG),
                       (major, minor) if kind == 1 else None, payload)


def _decompress(kind: str, blob: bytes, size: int, fail) -> bytes | None:
    if kind == "lz4":
        return lz4_block_decompress(blob, size, fail)
    try:  # zstd: Python 3.14's compression.zstd, else the zstandard package, else give up
        from compression import zstd  # type: ignore[import-not-found]
        out = zstd.decompress(blob)
    except ImportError:
        try:
            import zstandard  # type: ignore[import-not-found]
        except ImportError:
            return None
        try:
            out = zstandard.ZstdDecompressor().decompress(blob, max_output_size=size)
        except zstandard.ZstdError as e:
            raise fail(f"corrupt zstd payload: {e}") from None
    except Exception as e:  # compression.zstd.ZstdError
        raise fail(f"corrupt zstd payload: {e}") from None
    if len(out) != size:
        raise fail(f"zstd payload decompressed to {len(out)} bytes, header says {size}")
    return out


def _lz4_length(src: bytes, i: int, n: int, what: str, fail) -> tuple[int, int]:
    """A length from a token nibble: 15 means more bytes follow, each added, until one < 255."""
    if n != 15:
        return n, i
    while True:
        if i >= len(src):
            raise fail(f"LZ4 {what} length runs past the end")
        b = src[i]
        i += 1
        n += b
        if b != 255:
            return n, i


def lz4_block_decompress(src: bytes, size: int, fail=ValueError) -> bytes:
    """Decode one raw LZ4 block (no frame) of known decompressed ``size``."""
    dst = bytearray()
    i, n = 0, len(src)
    while i < n:
        token = src[i]
        i += 1
        lit, i = _lz4_length(src, i, token >> 4, "literal", fail)
        if i + lit > n or len(dst) + lit > size:
            raise fail("LZ4 literals run past the end")
        dst += src[i: i + lit]
        i += lit
        if i >= n:
            break  # the last sequence holds literals only
        if i + 2 > n:
            raise fail("LZ4 match offset truncated")
        dist = src[i] | (src[i + 1] << 8)
        i += 2
        if dist == 0 or dist > len(dst):
            raise fail(f"LZ4 match offset {dist} outside the output")
        ml, i = _lz4_length(src, i, token & 15, "match", fail)
        ml += 4
        if len(dst) + ml > size:
            raise fail("LZ4 output exceeds the declared size")
        start = len(dst) - dist
        if dist >= ml:
            dst += dst[start: start + ml]
        else:  # overlapping copy repeats the last `dist` bytes
            pat = bytes(dst[start:])
            dst += (pat * (ml // dist + 1))[:ml]
    if len(dst) != size:
        raise fail(f"LZ4 output is {len(dst)} bytes, header says {size}")
    return bytes(dst)
