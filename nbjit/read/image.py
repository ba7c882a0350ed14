"""Image: compiled device code (PTX, cubin or fatbin) as immutable bytes, the one function
that tells the kinds apart by content (``sniff``), and what it says of bytes that are no
image the driver loads (what they are, and what to do instead)."""
from __future__ import annotations

import functools
import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from nbjit.read.cubin import CubinInfo
    from nbjit.read.fatbin import FatbinInfo
    from nbjit.read.ptx import PtxInfo

from nbjit.arch import Arch
from nbjit.errors import ImageFormatError
from nbjit.files import read_regular
from nbjit.records import Pattern, field, record

__all__ = ["Image", "ImageLike", "sniff", "as_image", "inspect_image"]

IMAGE_KINDS = ("ptx", "cubin", "fatbin")

_ELF = b"\x7fELF"
_FATBIN = b"\x50\xed\x55\xba"
# what the driver cannot load, by its first bytes (``_image_extra`` says what to do instead)
_NOT_LOADABLE = ((b"\xb1\x43\x62\x46", "fatbin wrapper"),  # __fatBinC_Wrapper_t magic 0x466243B1
                 (b"\xed\x43\x4e\x7f", "LTO-IR"),  # NVVM LTO-IR (nvcc/NVRTC -dlto)
                 (b"BC\xc0\xde", "bitcode"), (b"\xde\xc0\x17\x0b", "bitcode"))  # LLVM bitcode, raw and wrapped
_PTX_VERSION = Pattern(rb"^[ \t]*\.version[ \t]+\d+\.\d+", re.M)


@record
class Image:
    """Device code ready to load: ``data`` (bytes), ``kind`` ("ptx", "cubin", "fatbin"),
    ``name`` (for messages), the ``arch`` it was built for where known, the
    ``lowered_names`` of NVRTC name expressions, the producer's ``log`` and the C parameter
    types its producer's input ``declarations`` give, ``{kernel: (source label, (CParam,
    ...))}`` (the CUDA source of ``nbjit.compile``, a Triton kernel's IR). ``info``,
    ``typed`` and ``entries`` hold what reading ``data`` would give, where it is known
    already (a cache entry's facts, a kernel bundle's manifest)."""

    data: bytes
    kind: str
    name: str = "<image>"
    arch: Arch | None = None  # (text given is parsed: "sm_90" -> Arch, which equals its text)
    lowered_names: Mapping[str, str] = field(default_factory=dict)
    log: str = ""
    declarations: Mapping[str, tuple] = field(default_factory=dict)
    # what inspecting ``data`` gives (a CubinInfo), where already known (a cache entry's facts)
    info: Any = field(default=None, compare=False, repr=False)
    # {kernel: KernelInfo} typed from ``info`` with ``declarations`` and the mangled names,
    # where already known (a cache entry's facts; a kernel bundle's manifest, without ``info``:
    # merged from every entry, less the resources each cubin has its own of): what loading it
    # would merge again
    typed: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # {function: {"stack_frame", "spill_stores", "spill_loads": bytes}} as ptxas reported them
    # compiling it (NVRTC's log where the options asked: -Xptxas=-v; kept in the cache entry's
    # facts); {} where unknown
    resources: Mapping[str, Mapping[str, int]] = field(default_factory=dict, compare=False, repr=False)
    # for a fatbin: what each entry is, where its payload lies in ``data`` and what reading it
    # would give, ``((kind, Arch, offset, length, facts or None), ...)`` in the container's
    # order, where already known (a kernel bundle's image): loading picks the device's entry
    # without reading the container, and reads no cubin whose facts are listed
    entries: tuple = field(default=(), compare=False, repr=False)
    # the CUDA C++ its line tables name, {placeholder path: text} (a compile with -lineinfo or -G;
    # see cache.sources): written where the loader points them
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        if self.kind not in IMAGE_KINDS:
            raise ValueError(f"image kind must be one of {IMAGE_KINDS}, not {self.kind!r}")
        if self.arch is not None and type(self.arch) is not Arch:
            object.__setattr__(self, "arch", Arch.parse(self.arch))

    @classmethod
    def from_bytes(cls, data: bytes | str, name: str = "<image>") -> "Image":
        """An image of whatever kind ``data`` holds (sniffed by content)."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        return cls(raw, sniff(raw, name), name)

    @classmethod
    def from_path(cls, path: str | os.PathLike) -> "Image":
        p = Path(path)
        try:
            raw = read_regular(p)
        except OSError as e:
            raise ImageFormatError(f"{p}: cannot read: {e.strerror}") from None
        except ValueError as e:
            raise ImageFormatError(f"{p}: {e}") from None
        return cls(raw, sniff(raw, str(p)), str(p))

    @functools.cached_property
    def sha256(self) -> str:
        """The SHA-256 of the bytes."""
        return _sha256(self.data)

    @functools.cached_property
    def digest(self) -> str:
        """The BLAKE2b-256 of the bytes, as the cache's keys (what identifies a module in a
        context: no OpenSSL, whose first digest in a process costs ~50 us, on a warm start)."""
        return content_digest(self.data)

    def __repr__(self) -> str:
        return f"Image(kind={self.kind!r}, name={self.name!r}, {len(self.data)} bytes)"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_hash(data: bytes) -> bytes:
    """The BLAKE2b-256 of ``data``: what nbjit's cache keys, entry checksums and module
    registry name content by."""
    return hashlib.blake2b(data, digest_size=32).digest()


def content_digest(data: bytes) -> str:
    """``content_hash`` as 64 hex digits."""
    return content_hash(data).hex()


ImageLike = Image | bytes | bytearray | memoryview | str | os.PathLike


def sniff(data: bytes, name: str = "<image>") -> str:
    """Say what ``data`` is: "ptx", "cubin" or "fatbin".

    Raises
    ------
    ImageFormatError: none of these; the message names what it is where nbjit can tell
    (LTO-IR, LLVM bitcode or IR, CUDA C++ source, a host object) and what to do instead.
    """
    head = bytes(data[:64])
    if head.startswith(_ELF):
        if len(head) >= 20 and int.from_bytes(head[18:20], "little") == 190:
            return "cubin"
        what = "host ELF" if len(head) >= 52 else "truncated ELF"  # (52: the smallest ELF header, 32-bit)
    elif head.startswith(_FATBIN):
        return "fatbin"
    else:
        what = "" if head else "empty"
        for magic, kind in _NOT_LOADABLE:
            if head.startswith(magic):
                what = kind
        if not what:
            sample = bytes(data[: 1 << 16])
            binary = b"\0" in sample.rstrip(b"\0")
            if not binary and _PTX_VERSION.search(sample):
                return "ptx"
            what = "binary" if binary else "text"
    raise not_an_image(what, data, name)


def as_image(obj: ImageLike, name: str | None = None) -> Image:
    """An ``Image`` from an Image, a path, PTX text (``str``) or raw bytes."""
    if isinstance(obj, Image):
        return obj
    if isinstance(obj, os.PathLike):
        return Image.from_path(obj)
    if isinstance(obj, str):
        # A str is PTX text when it spans lines (no path does); else a path when such a file
        # exists; else one-line PTX text when it holds a .version directive.
        if "\n" in obj:
            return Image.from_bytes(obj, name or "<ptx>")
        if os.path.exists(obj):
            return Image.from_path(obj)
        if ".version" in obj:
            return Image.from_bytes(obj, name or "<ptx>")
        raise ImageFormatError(f"{obj[:200]!r}: no such file, and not PTX text either")
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return Image.from_bytes(bytes(obj), name or "<image>")
    raise _NotAnImage(f"an image is a path, bytes, PTX text or nbjit.Image, not {type(obj).__name__}")


class _NotAnImage(ImageFormatError, TypeError):
    """An object of a type no image comes in (an ImageFormatError, and a TypeError as Python's own are)."""


def inspect_image(obj: ImageLike, name: str | None = None) -> "PtxInfo | CubinInfo | FatbinInfo":
    """Inspect any image: a ``PtxInfo``, ``CubinInfo`` or ``FatbinInfo`` by its kind."""
    img = as_image(obj, name)
    if img.info is not None and name is None:
        return img.info
    if img.kind == "ptx":
        from nbjit.read.ptx import inspect_ptx
        return inspect_ptx(img.data, source=img.name)
    if img.kind == "cubin":
        from nbjit.read.cubin import inspect_cubin
        return inspect_cubin(img.data, source=img.name)
    from nbjit.read.fatbin import inspect_fatbin
    return inspect_fatbin(img.data, source=img.name)


_SAID = {
    "empty": "empty image",
    "host ELF": "an ELF file for the host, not a cubin: nbjit does not read host objects or libraries; extract "
                "their device code with 'cuobjdump -xelf all' or '-xptx all'",
    "truncated ELF": "a truncated ELF file (shorter than an ELF header): not a whole cubin",
    "fatbin wrapper": "a host-side fatbin wrapper (.nvFatBinSegment), not the fatbin itself",
    "LTO-IR": "NVVM LTO-IR (from -dlto), which the driver cannot load: link it to a cubin (nbjit.compile(source, "
              "link=[it]) or nbjit.link_image), or compile without -dlto to get PTX or a cubin",
    "bitcode": "LLVM bitcode (NVVM IR), which the driver cannot load: compile it to PTX with libNVVM or llc first",
}


def not_an_image(what: str, data: bytes, name: str) -> ImageFormatError:
    """The error for ``data`` (called ``name``) that ``sniff`` found to be ``what``: one of
    ``_SAID``'s, "binary" (other binary data) or "text" (text that is not PTX)."""
    said = _SAID.get(what)
    if said is not None:
        return ImageFormatError(f"{name}: {said}")
    if what == "binary" and bytes(data[:4]) == b"PK\x03\x04":
        return ImageFormatError(f"{name}: a ZIP archive (a kernel bundle?), not a kernel image: load a bundle with "
                                "nbjit.load_bundle, read it with 'nbjit inspect'")
    if what == "binary":
        return ImageFormatError(f"{name}: binary data that is neither PTX, a cubin (ELF) nor a fatbin "
                                f"(starts with {bytes(data[:8]).hex(' ')})")
    sample = bytes(data[: 1 << 16])
    if re.search(rb"__global__|#include", sample):
        return ImageFormatError(f"{name}: CUDA C++ source, not compiled code: compile it first "
                                "(nbjit.compile(), or 'nbjit compile FILE --arch sm_XX')")
    if re.search(rb"^(?:target (?:triple|datalayout)|define |; ModuleID)", sample, re.M):
        return ImageFormatError(f"{name}: LLVM IR text, which the driver cannot load: compile it to PTX first")
    return ImageFormatError(f"{name}: not PTX (no '.version' directive), a cubin or a fatbin")
