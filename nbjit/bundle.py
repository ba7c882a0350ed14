"""Kernel bundles: one file holding, for one or more sources or images, cubins for several
architectures and PTX to fall back on, with a manifest (kernels and their C signatures, name
expressions, options, digests of the sources and of every payload, the toolchain).

The file is a ZIP archive whose members are all stored uncompressed: ``manifest.json`` and
the payloads ``<image>/<arch>.cubin`` / ``<image>/<arch>.ptx``, byte for byte what
cuobjdump and nvdisasm read (``unzip kernels.nbjit``). One file rather than a directory: a
package ships it as package data and reads it through ``importlib.resources`` with one
``read_bytes()``, also from a zip import. Loading builds a fatbin of one image's entries in
memory, so the loader's fatbin route picks the code for each device (exact SASS, else
compatible SASS, else the PTX) and a pickled kernel carries every architecture.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import stat
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from .arch import Arch
from .errors import BundleError, ImageFormatError, NbjitError, NbjitLoadError
from .image import Image, read_regular, sniff

if TYPE_CHECKING:
    from .module import Module
    from .triton import TritonKernel
    from .signature import KernelInfo

__all__ = ["BundleEntry", "BundleImage", "BundleInfo", "build_bundle", "inspect_bundle", "load_bundle",
           "read_bundle", "FORMAT", "VERSION", "MAX_BUNDLE_BYTES"]

FORMAT = "nbjit-bundle"
VERSION = 1  # the manifest's layout; a reader refuses a newer one
MAX_BUNDLE_BYTES = 1 << 30
MAX_MEMBERS = 4096
MAX_MANIFEST_BYTES = 64 << 20
MANIFEST = "manifest.json"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")  # an image's name: one safe path component
_SHA256 = re.compile(r"[0-9a-f]{64}")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the same input gives the same bytes
_KINDS = ("cubin", "ptx")


@dataclass(frozen=True)
class BundleEntry:
    """One payload of a bundle image: a cubin for a real architecture or PTX for a virtual
    one, stored as the member ``file``."""

    file: str
    kind: str  # "cubin" or "ptx"
    arch: str  # "sm_90", "sm_90a", "compute_80"
    sha256: str
    size: int
    payload: bytes = field(repr=False, compare=False)

    def to_json(self) -> dict:
        return {"file": self.file, "kind": self.kind, "arch": self.arch, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True)
class BundleImage:
    """One module of a bundle: its entries (one per architecture), what it was built from,
    and its kernels with the signatures ``kernel.params`` shows."""

    name: str
    entries: tuple[BundleEntry, ...]
    kernels: tuple["KernelInfo", ...]
    lowered_names: Mapping[str, str]
    declarations: Mapping[str, tuple]
    sources: tuple[Mapping[str, str], ...]  # {"name", "kind", "sha256"} of each input
    options: tuple[str, ...] = ()
    producer: str | None = None  # "NVRTC 13.5"
    toolchain: Any = None  # the compiler's build fingerprint (nbjit.compiler)
    triton: Mapping[str, Any] | None = None  # Triton's metadata JSON, for a Triton kernel

    @property
    def archs(self) -> tuple[str, ...]:
        """The entries' architectures, in order: ``("sm_80", "sm_90", "compute_80")``."""
        return tuple(e.arch for e in self.entries)

    def to_json(self) -> dict:
        d = {"name": self.name, "sources": [dict(s) for s in self.sources], "options": list(self.options),
             "name_expressions": dict(self.lowered_names), "producer": self.producer, "toolchain": self.toolchain,
             "declarations": _declarations_json(self.declarations),
             "kernels": {k.name: _signature_json(k) for k in self.kernels},
             "entries": [e.to_json() for e in self.entries]}
        if self.triton is not None:
            d["triton"] = dict(self.triton)
        return d


@dataclass(frozen=True)
class BundleInfo:
    """What a bundle holds: its images, read and verified (every payload's digest checked)."""

    images: tuple[BundleImage, ...]
    version: int = VERSION
    nbjit: str | None = None  # the nbjit version that built it
    source: str = "<bundle>"

    def image(self, name: str | None = None) -> BundleImage:
        """The image called ``name``; the only one where ``name`` is None."""
        return _pick(self, name)

    def to_json(self) -> dict:
        return {"kind": "bundle", "format": FORMAT, "version": self.version, "nbjit": self.nbjit,
                "images": [i.to_json() for i in self.images]}


# ------------------------------------------------------------------ reading


def read_bundle(bundle: Any, name: str | None = None) -> BundleInfo:
    """Read and verify a bundle: a path, its bytes (``name`` names them in messages), or an
    ``importlib.resources`` Traversable.
    Every payload is checked against its SHA-256 in the manifest, and kernels are read from
    the payloads with the manifest's C declarations (no GPU).

    Raises
    ------
    BundleError: not a bundle, a damaged or altered one (named member), one made by a newer
    nbjit, or one that breaks the format's rules (compressed, encrypted or escaping members).
    """
    data, src = _bytes_of(bundle)
    src = name or src
    members, manifest = _members(data, src)
    return _assemble(manifest, members, src)


def _read_for_loading(bundle: Any) -> BundleInfo:
    """``read_bundle`` without reading the kernels from the payloads (the digests prove the
    payloads are the ones the bundle was built and checked with; loading reads its entry)."""
    data, src = _bytes_of(bundle)
    members, manifest = _members(data, src)
    return _assemble(manifest, members, src, describe=False)


def inspect_bundle(bundle: Any) -> BundleInfo:
    """What a bundle holds (images, their entries and kernels with their signatures): see
    ``read_bundle``."""
    return read_bundle(bundle)


def load_bundle(bundle: Any, *, name: str | None = None, lazy: bool = False, keep_debug: bool = False) -> "Module":
    """Load one image of a bundle into the current Numba context, picking for the device the
    cubin built for it, else one that runs on it, else the PTX (``Arch`` rules). Needs no
    NVRTC and no CUDA headers; every digest is checked before anything reaches the driver.

    Parameters
    ----------
    bundle: a path, the bundle's bytes, or ``importlib.resources.files(pkg) / "k.nbjit"``.
    name: the image to load; may be left out where the bundle holds one.
    lazy: load on first use instead (no GPU needed now), as ``nbjit.load`` takes it.
    keep_debug: as ``nbjit.load``.

    Raises
    ------
    BundleError: see ``read_bundle``; no image of that name (the message lists them).
    NbjitLoadError: no entry runs on this device, or the driver refused it.
    """
    from .module import load

    info = _read_for_loading(bundle)
    img = _pick(info, name)
    return load(image_of(info, img), lazy=lazy, keep_debug=keep_debug)


def image_of(info: BundleInfo, img: BundleImage) -> Image:
    """``img`` as an ``nbjit.Image``: a fatbin of its entries, with its name expressions and
    C declarations."""
    from .fatbin import build_fatbin

    label = f"{info.source}:{img.name}"
    # PTX first: a module waiting for first use describes its kernels from the first entry,
    # and the PTX's names and types are what the manifest lists (each device still picks its own)
    entries = sorted(img.entries, key=lambda e: e.kind != "ptx")
    try:
        data = build_fatbin([(e.kind, e.arch, e.payload) for e in entries], source=label)
    except ImageFormatError as e:
        raise BundleError(str(e)) from None
    return Image(data, "fatbin", label, None, dict(img.lowered_names), declarations=dict(img.declarations))


def _pick(info: BundleInfo, name: str | None) -> BundleImage:
    names = [i.name for i in info.images]
    if name is None:
        if len(info.images) == 1:
            return info.images[0]
        raise BundleError(f"{info.source}: holds {len(names)} images ({', '.join(names)}): say which with name=")
    for i in info.images:
        if i.name == name:
            return i
    raise BundleError(f"{info.source}: no image {name!r}; it holds {', '.join(names)}")


def load_triton(source: Any, *, name: str | None = None, lazy: bool = False) -> "TritonKernel":
    """Load a Triton kernel compiled ahead of time into the current Numba context.

    ``source``: a Triton cache entry directory (``<name>.json`` beside ``<name>.cubin`` /
    ``<name>.ptx``), the ``.json`` itself, or a PTX file with ``// meta:`` comments. The
    cubin is used when it runs on this device, else the PTX (assembled by nvJitLink when it
    is newer than the driver).

    Or a kernel bundle (``nbjit.build_bundle`` of a cache entry): its path (known by its
    content), its bytes or an ``importlib.resources`` file. ``name`` picks the image where
    the bundle holds several with Triton metadata; the bundle's fatbin picks the entry for
    the device, as ``nbjit.load_bundle`` does. ``lazy=True`` (bundles only) loads on first
    launch, into the context current then: the kernel describes itself (``params``,
    ``rules``, ``meta``) without a GPU.

    Raises ``NbjitLoadError`` for unusable metadata, ``BundleError`` for a bundle that is not
    one or has no such image with Triton metadata.
    """
    from . import triton

    if not _is_bundle(source):
        if name is not None or lazy is not False:
            shown = os.fsdecode(source) if isinstance(source, (str, os.PathLike)) else repr(source)
            raise NbjitLoadError(f"{shown}: name= and lazy= are for a kernel bundle; a Triton cache entry loads the "
                                 "one kernel it holds, now (build a bundle of it with nbjit.build_bundle to load it "
                                 "lazily)")
        return triton.load_triton(source)
    from .module import load

    info = _read_for_loading(source)
    img = triton_image(info, name)
    label = f"{info.source}:{img.name}"
    meta = triton._from_json(img.triton, f"{label} (manifest)")
    ptx = next(((e.payload, f"{info.source}:{e.file}") for e in img.entries if e.kind == "ptx"), None)
    return triton.from_module(load(image_of(info, img), lazy=lazy), meta, ptx=ptx)


def _is_bundle(source: Any) -> bool:
    """Whether ``source`` is a kernel bundle: bytes, an ``importlib.resources`` file, or a
    path to a regular file whose content is a ZIP archive (a cache entry's files never are)."""
    if isinstance(source, (str, os.PathLike)):
        try:
            if not stat.S_ISREG(os.stat(source).st_mode):
                return False
            with open(source, "rb") as f:
                return f.read(4) == b"PK\x03\x04"
        except OSError:
            return False  # the cache entry reader says what is wrong with it
    return isinstance(source, (bytes, bytearray, memoryview)) or (
        hasattr(source, "open") and hasattr(source, "read_bytes"))


def triton_image(info: BundleInfo, name: str | None) -> BundleImage:
    """The image called ``name`` among those with Triton's metadata; the only one where
    ``name`` is None. A ``BundleError`` lists the images that qualify."""
    have = [i for i in info.images if i.triton is not None]
    names = ", ".join(i.name for i in have) or "none"
    if name is None:
        if len(have) == 1:
            return have[0]
        if not have:
            raise BundleError(f"{info.source}: no image holds Triton metadata (it holds "
                              f"{', '.join(i.name for i in info.images)}): load it with nbjit.load_bundle, or bundle "
                              "the Triton cache entry directory (or its .json) to keep the metadata")
        raise BundleError(f"{info.source}: holds {len(have)} Triton kernels ({names}): say which with name=")
    img = next((i for i in info.images if i.name == name), None)
    if img is None:
        raise BundleError(f"{info.source}: no image {name!r}; its Triton kernels are {names}")
    if img.triton is None:
        raise BundleError(f"{info.source}: image {name!r} holds no Triton metadata (its Triton kernels are {names}): "
                          "load it with nbjit.load_bundle")
    return img


def _bytes_of(bundle: Any) -> tuple[bytes, str]:
    """(the bundle's bytes, its name for messages), read at most ``MAX_BUNDLE_BYTES``."""
    if isinstance(bundle, (bytes, bytearray, memoryview)):
        return bytes(bundle), "<bundle>"
    if isinstance(bundle, (str, os.PathLike)):
        try:
            return read_regular(bundle, MAX_BUNDLE_BYTES), os.fsdecode(bundle)
        except FileNotFoundError:
            raise BundleError(f"{os.fsdecode(bundle)}: no such file") from None
        except (OSError, ValueError) as e:
            raise BundleError(f"{os.fsdecode(bundle)}: cannot read it as a bundle: {e}") from None
    if hasattr(bundle, "open") and hasattr(bundle, "read_bytes"):  # an importlib.resources Traversable
        label = str(getattr(bundle, "name", None) or bundle)
        try:
            with bundle.open("rb") as f:
                data = f.read(MAX_BUNDLE_BYTES + 1)
        except (OSError, ValueError, KeyError) as e:  # (zipfile.Path raises KeyError for a missing member)
            raise BundleError(f"{label}: cannot read it as a bundle: {e}") from None
        if len(data) > MAX_BUNDLE_BYTES:
            raise BundleError(f"{label}: more than {MAX_BUNDLE_BYTES} bytes, more than nbjit reads")
        return data, label
    raise BundleError(f"a bundle is a path, bytes or an importlib.resources file, not {type(bundle).__name__}")


def _members(data: bytes, src: str) -> tuple[dict[str, bytes], dict]:
    """The archive's members by name and the manifest, after the format's checks."""
    if not data.startswith(b"PK\x03\x04"):
        what = ""
        try:
            what = f" (it is a {sniff(data, src)}: load it with nbjit.load)"
        except ImageFormatError:
            pass
        raise BundleError(f"{src}: not an nbjit bundle (a ZIP archive of a manifest and images){what}")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as e:
        raise BundleError(f"{src}: a damaged bundle (not a readable ZIP archive: {e})") from None
    if len(infos) > MAX_MEMBERS:
        raise BundleError(f"{src}: {len(infos)} members, more than a bundle has ({MAX_MEMBERS})")
    members: dict[str, bytes] = {}
    total = 0
    for zi in infos:
        name = zi.filename
        where = f"{src}: member {name!r}"
        if _escapes(name):
            raise BundleError(f"{where}: a name outside the archive (absolute, '..' or a drive); bundle members are "
                              "<image>/<arch>.cubin or .ptx")
        if name in members:
            raise BundleError(f"{where} appears twice")
        if zi.flag_bits & 0x1:
            raise BundleError(f"{where} is encrypted; bundle members are stored as they are")
        if zi.compress_type != zipfile.ZIP_STORED:
            raise BundleError(f"{where} is compressed; bundle members are stored uncompressed (so cuobjdump reads "
                              "them as they are)")
        total += zi.file_size
        if zi.file_size != zi.compress_size or total > len(data):
            raise BundleError(f"{where} claims {zi.file_size} bytes, more than the archive holds")
        if name.endswith("/"):
            continue  # a directory entry, from a zip tool
        try:
            members[name] = zf.read(zi)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as e:  # a CRC mismatch
            raise BundleError(f"{where} is damaged: {e}") from None
    raw = members.pop(MANIFEST, None)
    if raw is None:
        raise BundleError(f"{src}: no {MANIFEST} (not an nbjit bundle)")
    if len(raw) > MAX_MANIFEST_BYTES:
        raise BundleError(f"{src}: {MANIFEST} has {len(raw)} bytes, more than nbjit reads ({MAX_MANIFEST_BYTES})")
    try:
        manifest = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise BundleError(f"{src}: {MANIFEST} is not JSON: {str(e)[:200]}") from None
    return members, manifest


def _no_constant(word: str):
    raise ValueError(f"{word} is not a JSON number")


def _escapes(name: str) -> bool:
    parts = name.replace("\\", "/").split("/")
    return name.startswith(("/", "\\")) or ".." in parts or (len(name) > 1 and name[1] == ":") or "\0" in name


def _assemble(m: Any, members: dict[str, bytes], src: str, describe: bool = True) -> BundleInfo:
    """The manifest ``m`` checked against the members: a BundleInfo (with each image's
    kernels read from its payloads where ``describe``)."""
    def fail(msg: str) -> BundleError:
        return BundleError(f"{src}: {MANIFEST}: {msg}")

    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise fail(f"not an nbjit bundle manifest (its format is not {FORMAT!r})")
    version = m.get("version")
    if type(version) is not int or version < 1:
        raise fail(f"format version {version!r} is not one nbjit writes")
    if version > VERSION:
        raise BundleError(f"{src}: made by a newer nbjit (format {version}; this one reads {VERSION}): upgrade nbjit")
    images = m.get("images")
    if not isinstance(images, list) or not images:
        raise fail("no images")
    out, used = [], set()
    for i, d in enumerate(images):
        img = _image(d, i, members, fail, describe)
        if any(o.name == img.name for o in out):
            raise fail(f"two images are called {img.name!r}")
        used.update(e.file for e in img.entries)
        out.append(img)
    extra = sorted(set(members) - used)
    if extra:
        raise BundleError(f"{src}: member {extra[0]!r} is in no image of the manifest (the bundle was altered)")
    return BundleInfo(tuple(out), version, _str(m.get("nbjit"), "nbjit", fail, optional=True), src)


def _str(v: Any, what: str, fail, optional: bool = False) -> Any:
    if (v is None and optional) or isinstance(v, str):
        return v
    raise fail(f"{what} is {type(v).__name__}, not text")


def _image(d: Any, i: int, members: dict[str, bytes], fail, describe: bool = True) -> BundleImage:
    if not isinstance(d, dict):
        raise fail(f"image {i} is {type(d).__name__}, not an object")
    name = d.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise fail(f"image {i}: {name!r} is not an image name (letters, digits, '_', '.', '+', '-')")

    def bad(msg: str) -> BundleError:
        return fail(f"image {name!r}: {msg}")

    entries = d.get("entries")
    if not isinstance(entries, list) or not entries:
        raise bad("no entries")
    got = []
    for e in entries:
        got.append(_entry(e, members, bad))
    seen = set()
    for e in got:
        if (e.kind, Arch.parse(e.arch)) in seen or e.file in (x.file for x in got if x is not e):
            raise bad(f"two entries for {e.kind} {e.arch}")
        seen.add((e.kind, Arch.parse(e.arch)))
    lowered = d.get("name_expressions", {})
    if not isinstance(lowered, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in lowered.items()):
        raise bad("name_expressions is not {expression: mangled name}")
    decls = _declarations(d.get("declarations", {}), bad)
    sources = d.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, dict) and all(isinstance(v, str) for v in s.values())
                                                for s in sources):
        raise bad("sources is not a list of {name, kind, sha256}")
    options = d.get("options", [])
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise bad("options is not a list of text")
    triton = d.get("triton")
    if triton is not None and not isinstance(triton, dict):
        raise bad("triton is not Triton's metadata object")
    producer = _str(d.get("producer"), "producer", bad, optional=True)
    kernels = _kernels(name, got, decls, bad) if describe else ()
    return BundleImage(name, tuple(got), kernels, dict(lowered), decls, tuple(sources), tuple(options), producer,
                       d.get("toolchain"), triton)


def _entry(e: Any, members: dict[str, bytes], bad) -> BundleEntry:
    if not isinstance(e, dict):
        raise bad(f"an entry is {type(e).__name__}, not an object")
    file, kind, arch, sha, size = (e.get(k) for k in ("file", "kind", "arch", "sha256", "size"))
    if kind not in _KINDS:
        raise bad(f"entry {file!r}: kind {kind!r} is not 'cubin' or 'ptx'")
    try:
        a = Arch.parse(arch) if isinstance(arch, str) else None
    except ValueError:
        a = None
    if a is None or a.virtual != (kind == "ptx"):
        raise bad(f"entry {file!r}: {arch!r} is not a {'virtual (compute_XX)' if kind == 'ptx' else 'real (sm_XX)'} "
                  "architecture")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha) or type(size) is not int:
        raise bad(f"entry {file!r}: no sha256 (64 hex digits) and size")
    if not isinstance(file, str) or file not in members:
        raise bad(f"entry {file!r}: the archive has no such member")
    payload = members[file]
    if len(payload) != size or hashlib.sha256(payload).hexdigest() != sha:
        raise bad(f"member {file!r}: its bytes do not match the manifest's size and SHA-256 (the bundle is damaged "
                  "or was altered)")
    return BundleEntry(file, kind, str(a), sha, size, payload)


def _declarations(d: Any, bad) -> dict[str, tuple]:
    """The manifest's C declarations as an image carries them: {kernel: (label, (CParam, ...))}."""
    from .cdecl import CParam

    if not isinstance(d, dict):
        raise bad("declarations is not {kernel: {from, params}}")
    out = {}
    for k, v in d.items():
        ps = v.get("params") if isinstance(v, dict) else None
        label = v.get("from") if isinstance(v, dict) else None
        if not isinstance(label, str) or not isinstance(ps, list):
            raise bad(f"declaration of {k!r} is not {{from, params}}")
        params = []
        for p in ps:
            if not isinstance(p, dict) or not isinstance(p.get("base"), str) or \
                    not all(type(p.get(f, False)) is bool for f in ("pointer", "const")) or \
                    not isinstance(p.get("name"), (str, type(None))):
                raise bad(f"declaration of {k!r}: {str(p)[:80]} is not a C parameter {{base, pointer, const, name}}")
            params.append(CParam(p["base"], p.get("pointer", False), p.get("const", False), p.get("name")))
        out[k] = (label, tuple(params))
    return out


def _declarations_json(decls: Mapping[str, tuple]) -> dict:
    return {k: {"from": label, "params": [{"base": p.base, "pointer": p.pointer, "const": p.const, "name": p.name}
                                          for p in params]}
            for k, (label, params) in decls.items()}


def _signature_json(k: "KernelInfo") -> dict:
    """A kernel as the manifest lists it: its parameters and directives (``KernelInfo.to_json``)."""
    return k.to_json()


def _kernels(name: str, entries: Iterable[BundleEntry], decls: Mapping, bad) -> tuple["KernelInfo", ...]:
    """The image's kernels, merged from every entry (PTX first: it has types) with the C
    declarations and mangled names; the entries must describe the same kernels alike."""
    from .cdecl import demangle
    from .cubin import inspect_cubin
    from .ptx import inspect_ptx
    from .signature import RESOURCES, SignatureConflict, merge, replace

    per = []
    for e in sorted(entries, key=lambda e: e.kind != "ptx"):
        try:
            info = inspect_ptx(e.payload, source=e.file) if e.kind == "ptx" else inspect_cubin(e.payload,
                                                                                               source=e.file)
        except NbjitError as x:
            raise bad(f"entry {e.file!r}: {x}") from None
        per.append((e, {k.name: k for k in info.entries}))
    names = list(per[0][1])
    for e, ks in per[1:]:
        if set(ks) != set(names):
            diff = sorted(set(ks) ^ set(names))
            raise bad(f"entries {per[0][0].file!r} and {e.file!r} hold different kernels ({', '.join(diff[:4])}): "
                      "the entries of one image are the same code for other architectures")
    out = []
    for k in names:
        try:
            info = merge(k, [(e.kind, ks[k]) for e, ks in per], [decls.get(k), ("mangled name", demangle(k))])
        except SignatureConflict as x:
            raise bad(str(x)) from None
        # registers, shared memory...: each cubin's own, not the image's
        out.append(replace(info, **dict.fromkeys(RESOURCES)))
    return tuple(out)


# ------------------------------------------------------------------ building


@dataclass
class _Part:
    """One image being built: its entries and what it was made from."""

    name: str
    entries: list = field(default_factory=list)  # (kind, Arch, payload)
    sources: list = field(default_factory=list)
    lowered: dict = field(default_factory=dict)
    decls: dict = field(default_factory=dict)
    options: tuple = ()
    producer: str | None = None
    toolchain: Any = None
    triton: dict | None = None
    paths: list = field(default_factory=list)  # the input files (never overwritten)


def build_bundle(inputs: Any, dest: str | os.PathLike, *, archs: Iterable[str] | str = (),
                 ptx: Iterable[str] | str = (), options: Iterable[str] | str = (),
                 name_expressions: Iterable[str] | str = (), include_paths: Iterable[str] = (),
                 headers: Mapping[str, str] | None = None, cache: Any = None) -> BundleInfo:
    """Build a bundle file at ``dest`` (written whole, then moved into place).

    Parameters
    ----------
    inputs: what goes in, each becoming one image named after its file (``axpy.cu`` ->
        ``axpy``): a ``.cu`` file (compiled by NVRTC), a PTX, cubin or fatbin file (taken as
        it is, at its own architectures), a Triton cache entry directory or its ``.json``
        (cubin, PTX and metadata), an ``nbjit.Image``; one of them or a list. A dict
        ``{image name: input or list of inputs}`` names the images, gives CUDA source text or
        image bytes, and puts several inputs (cubins nvcc built for several architectures,
        say) in one image.
    archs: the SASS to compile each CUDA source for (``"sm_80,sm_90,sm_100"`` or a list).
    ptx: the virtual architecture(s) to compile each CUDA source to PTX for (``"compute_80"``).
    options, name_expressions, include_paths, headers, cache: for each CUDA source, as
        ``nbjit.compile_image`` takes them.

    Returns the ``BundleInfo`` of what was written.

    Raises
    ------
    BundleError: an input that is none of these, two images of one name, entries of one image
    that describe different kernels, no architecture for a CUDA source, ``dest`` naming an
    input. NbjitCompileError: NVRTC rejected a source.
    """
    import nbjit

    dest = Path(dest)
    archs_l, ptx_l = _arch_list(archs, "archs", False), _arch_list(ptx, "ptx", True)
    parts = _parts(inputs, dict(archs=archs_l, ptx=ptx_l, options=options, name_expressions=name_expressions,
                                include_paths=include_paths, headers=headers, cache=cache))
    for p in parts:
        for path in p.paths:
            if dest.exists() and Path(path).exists() and os.path.samefile(dest, path):
                raise BundleError(f"{dest}: is an input ({path}); write the bundle elsewhere")
    manifest = {"format": FORMAT, "version": VERSION, "nbjit": nbjit.__version__, "images": []}
    members: list[tuple[str, bytes]] = []
    for p in parts:
        entries = []
        for kind, a, payload in p.entries:
            file = f"{p.name}/{a}.{kind}"
            entries.append(BundleEntry(file, kind, str(a), hashlib.sha256(payload).hexdigest(), len(payload),
                                       payload))
            members.append((file, payload))
        kernels = _kernels(p.name, entries, p.decls, lambda msg, n=p.name: BundleError(f"{dest}: image {n!r}: {msg}"))
        img = BundleImage(p.name, tuple(entries), kernels, p.lowered, p.decls, tuple(p.sources), tuple(p.options),
                          p.producer, p.toolchain, p.triton)
        manifest["images"].append(img.to_json())
    raw = json.dumps(manifest, indent=1, sort_keys=True).encode() + b"\n"
    data = _zip([(MANIFEST, raw), *members])
    info = read_bundle(data)  # what a reader will find: checked before it is written
    _write_atomic(dest, data)
    return dataclasses.replace(info, source=str(dest))


def _zip(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, payload in members:
            zi = zipfile.ZipInfo(name, _ZIP_TIME)
            zi.compress_type = zipfile.ZIP_STORED
            zi.external_attr = 0o644 << 16
            zi.create_system = 3  # unix: the mode above is read as one
            zf.writestr(zi, payload)
    return buf.getvalue()


def _write_atomic(dest: Path, data: bytes) -> None:
    """``data`` at ``dest``, complete or not at all (a reader never sees half a bundle)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=dest.parent if str(dest.parent) else ".", prefix=f".{dest.name}.",
                                   suffix=".tmp")
    except OSError as e:
        raise BundleError(f"{dest}: cannot write there: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise BundleError(f"{dest}: cannot write it: {e.strerror or e}") from None
        raise


def _arch_list(value: Any, what: str, virtual: bool) -> list[Arch]:
    """``"sm_80,sm_90"`` or a list of architectures, checked: real ones for ``archs``, virtual
    (``compute_80``; ``sm_80`` is taken as ``compute_80``) for ``ptx``."""
    if isinstance(value, str):
        value = [v for v in value.replace(" ", ",").split(",") if v]
    try:
        items = list(value)
    except TypeError:
        raise BundleError(f"{what} must be a list of architectures, not {type(value).__name__}") from None
    out: list[Arch] = []
    for v in items:
        try:
            a = Arch.parse(v)
        except (TypeError, ValueError) as e:
            raise BundleError(f"{what}: {e}") from None
        if virtual:
            a = Arch(a.number, a.variant, True)
        elif a.virtual:
            raise BundleError(f"{what}: {a} is a virtual architecture; give it as ptx={str(a)!r} for PTX, or "
                              f"{a.real()} for a cubin")
        if a not in out:
            out.append(a)
    return out


def _parts(inputs: Any, how: dict) -> list[_Part]:
    """The images to build, each with its entries."""
    if isinstance(inputs, Mapping):
        named = [(n, v) for n, v in inputs.items()]
    elif isinstance(inputs, (str, os.PathLike, bytes, bytearray, memoryview, Image)):
        named = [(None, inputs)]
    else:
        try:
            named = [(None, v) for v in inputs]
        except TypeError:
            raise BundleError(f"inputs must be paths, images or a dict of them, not {type(inputs).__name__}") from None
    if not named:
        raise BundleError("no inputs: give the .cu, PTX, cubin, fatbin or Triton files to bundle")
    parts: list[_Part] = []
    compiled_any = False
    for name, value in named:
        if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
            raise BundleError(f"image name {name!r}: letters, digits, '_', '.', '+', '-' (it names the archive's "
                              "directory of the image)")
        items = value if isinstance(value, (list, tuple)) else [value]
        part = _Part(name or "")
        for item in items:
            compiled_any |= _add(part, item, how, name is None and len(items) == 1)
        if not part.name:
            raise BundleError(f"{items[0]!r}: give it a name ({{'name': ...}}) to bundle it")
        if any(p.name == part.name for p in parts):
            raise BundleError(f"two images would be called {part.name!r}: name them ({{'a': ..., 'b': ...}})")
        parts.append(part)
    if (how["archs"] or how["ptx"]) and not compiled_any:
        raise BundleError("archs and ptx say what to compile CUDA sources for; the inputs hold none (PTX, cubins and "
                          "fatbins go in at their own architectures)")
    return parts


def _add(part: _Part, item: Any, how: dict, naming: bool) -> bool:
    """Put ``item``'s entries in ``part``; whether it was a CUDA source (compiled)."""
    from .compiler import SOURCE_SUFFIXES

    if isinstance(item, Image):
        _add_image(part, item.data, item.kind, item.name, naming)
        part.lowered.update(item.lowered_names)
        part.decls.update(item.declarations)
        return False
    if isinstance(item, (bytes, bytearray, memoryview)):
        data = bytes(item)
        _add_image(part, data, _sniff(data, part.name or "<bytes>"), part.name or "<bytes>", False)
        return False
    if isinstance(item, str) and "\n" in item:  # text: PTX where it says so, else CUDA C++
        if re.search(r"^[ \t]*\.version[ \t]+\d", item, re.M) and "__global__" not in item:
            _add_image(part, item.encode(), "ptx", part.name or "<ptx>", False)
            return False
        _compile(part, item, part.name + ".cu" if part.name else None, how)
        return True
    if not isinstance(item, (str, os.PathLike)):
        raise BundleError(f"a bundle input is a path, an nbjit.Image, bytes or text, not {type(item).__name__}")
    path = Path(item)
    if naming and not part.name:
        part.name = _image_name(path)
    part.paths.append(path)
    if path.is_dir() or path.suffix == ".json":
        _add_triton(part, path, naming)
        return False
    if path.suffix.lower() in SOURCE_SUFFIXES:
        _compile(part, path, None, how)
        return True
    try:
        data = read_regular(path)
    except FileNotFoundError:
        raise BundleError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise BundleError(f"{path}: cannot read it: {e}") from None
    _add_image(part, data, _sniff(data, str(path)), str(path), False)
    return False


def _image_name(path: Path) -> str:
    stem = path.name.split(".")[0] if not path.is_dir() else path.name
    name = re.sub(r"[^A-Za-z0-9_.+-]", "_", stem).lstrip(".") or "image"
    return name[:128]


def _sniff(data: bytes, name: str) -> str:
    try:
        return sniff(data, name)
    except ImageFormatError as e:
        raise BundleError(str(e)) from None


def _add_image(part: _Part, data: bytes, kind: str, label: str, naming: bool) -> None:
    """A PTX, cubin or fatbin's entries, at the architectures they were built for."""
    from .cubin import inspect_cubin
    from .fatbin import inspect_fatbin
    from .ptx import inspect_ptx

    if naming and not part.name:
        part.name = _image_name(Path(label))
    try:
        if kind == "fatbin":
            found = []
            for e in inspect_fatbin(data, source=label).entries:
                if e.kind == "ltoir":
                    continue  # linked, never loaded: a bundle holds what loads
                if e.payload is None:
                    raise BundleError(f"{label}: entry {e.index} ({e.arch}) is zstd-compressed and 'zstandard' is not "
                                      "installed (pip install zstandard)")
                found.append((e.kind, e.target, e.payload))
        elif kind == "cubin":
            found = [("cubin", Arch.parse(inspect_cubin(data, source=label).arch), data)]
        else:
            text = data.rstrip(b"\0")
            found = [("ptx", Arch.parse(inspect_ptx(text, source=label).arch, virtual=True), text)]
    except (ImageFormatError, ValueError) as e:
        raise BundleError(f"{label}: {e}") from None
    for k, a, payload in found:
        _put(part, k, a, payload, label)
    part.sources.append({"name": os.path.basename(label), "kind": kind, "sha256": hashlib.sha256(data).hexdigest()})


def _put(part: _Part, kind: str, arch: Arch, payload: bytes, label: str) -> None:
    for k, a, _ in part.entries:
        if k == kind and a == arch:
            raise BundleError(f"{label}: image {part.name!r} has a {kind} for {arch} already")
    part.entries.append((kind, arch, payload))


def _compile(part: _Part, source: Any, name: str | None, how: dict) -> None:
    """A CUDA source compiled by NVRTC: a cubin for each of ``archs``, PTX for each of ``ptx``."""
    from .compiler import _toolchain_fingerprint, compile_image, nvrtc_version, source_text

    if not how["archs"] and not how["ptx"]:
        raise BundleError(f"{source if isinstance(source, Path) else name or 'CUDA source'}: say what to compile it "
                          "for: archs=['sm_80', 'sm_90', ...] and/or ptx='compute_80'")
    text, label, include_paths = source_text(source, name, how["include_paths"])
    label = label or "kernel.cu"
    if not part.name:
        part.name = _image_name(Path(label))
    exprs = how["name_expressions"]
    if isinstance(exprs, Mapping):
        exprs = exprs.get(part.name, ())
    jobs = [(a, "cubin") for a in how["archs"]] + [(a, "ptx") for a in how["ptx"]]
    for a, output in jobs:
        img = compile_image(text, name=label, name_expressions=exprs, headers=how["headers"],
                            include_paths=include_paths, options=how["options"], arch=str(a), output=output,
                            cache=how["cache"])
        for k, v in img.lowered_names.items():
            if part.lowered.setdefault(k, v) != v:
                raise BundleError(f"{label}: name expression {k!r} is {part.lowered[k]} for one architecture and {v} "
                                  f"for {a}")
        part.decls.update(img.declarations)
        _add_image(part, img.data, img.kind, f"{label}[{a}]", False)
        part.sources.pop()  # the source itself is recorded once, below
    major, minor = nvrtc_version()
    part.producer = f"NVRTC {major}.{minor}"
    part.toolchain = _toolchain_fingerprint()
    opts = how["options"]
    part.options = (opts,) if isinstance(opts, str) else tuple(str(o) for o in opts)
    part.sources.append({"name": os.path.basename(label), "kind": "cuda",
                         "sha256": hashlib.sha256(text.encode()).hexdigest()})


def _add_triton(part: _Part, path: Path, naming: bool) -> None:
    """A Triton kernel compiled ahead of time: its cubin and/or PTX, the C types of its IR and
    its metadata (kept whole in the manifest, for Triton's launch rules)."""
    from .triton import read_triton

    try:
        art = read_triton(path)
    except NbjitLoadError as e:
        raise BundleError(str(e)) from None
    if naming:
        part.name = _image_name(Path(art.meta.name))
    meta_file = path if path.suffix == ".json" else path / f"{art.meta.name}.json"
    if meta_file.is_file():
        try:
            part.triton = json.loads(read_regular(meta_file, 1 << 24), parse_constant=_no_constant)
        except (OSError, ValueError, RecursionError) as e:
            raise BundleError(f"{meta_file}: unreadable Triton metadata: {e}") from None
    for f in (art.cubin, art.ptx):
        if f is None:
            continue
        data = art.ptx_text if f == art.ptx and art.ptx_text else read_regular(f)
        _add_image(part, data, "cubin" if f == art.cubin else "ptx", str(f), False)
    part.decls.update(art.declarations())
