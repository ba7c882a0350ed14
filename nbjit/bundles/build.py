"""Kernel bundles: one file holding, for one or more sources or images, cubins for several
architectures and PTX to fall back on, with a manifest (kernels and their C signatures, name
expressions, options, digests of the sources and of every payload, the toolchain).

The file is a ZIP archive whose members are all stored uncompressed: ``manifest.json`` and
the payloads ``<image>/<arch>.cubin`` / ``<image>/<arch>.ptx``, byte for byte what
cuobjdump and nvdisasm read (``unzip kernels.nbjit``). One file rather than a directory: a
package ships it as package data and reads it through ``importlib.resources`` with one
``read_bytes()``, also from a zip import. Loading (``nbjit.bundles.archive``, which this
module's readers share) puts one image's entries in a fatbin in memory, listing where each
lies, so the loader picks the code for each device (exact SASS, else compatible SASS, else
the PTX) without reading the container, and a pickled kernel carries every architecture.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import stat
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from nbjit.files import read_file, read_regular, write_file
from nbjit.arch import Arch
from nbjit.bundles import archive as bundle_archive
from nbjit.bundles.archive import (
    FORMAT, MANIFEST, MAX_BUNDLE_BYTES, MAX_IMAGES, MAX_MANIFEST_BYTES, MAX_MEMBERS, VERSION, image_error,
    is_image_name, load_bundle, open_bundle, records)
from nbjit.errors import BundleError, CompileFailure, ImageFormatError, NbjitError, NbjitLoadError, warn
from nbjit.read.image import Image, sniff
from nbjit.records import field, record

if TYPE_CHECKING:
    from nbjit.loading.triton import TritonKernel
    from nbjit.params.signature import KernelInfo

__all__ = ["BundleEntry", "BundleImage", "BundleInfo", "build_bundle", "inspect_bundle", "load_bundle",
           "read_bundle", "FORMAT", "VERSION", "MAX_BUNDLE_BYTES", "MAX_MEMBERS", "MAX_IMAGES",
           "MAX_MANIFEST_BYTES", "MANIFEST"]

_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the same input gives the same bytes
_UTF8_NAMES = 0x800  # ZIP flag bit 11: the names are UTF-8


class _Utf8Member(zipfile.ZipInfo):
    """A member whose name is marked UTF-8 (flag bit 11), as ASCII names are too: zipfile
    then reads it without importing the cp437 codec (~0.5 ms of a first load). (zipfile
    writes its flags from here; without this hook a name is read as cp437, just as well.)"""

    def _encodeFilenameFlags(self):
        return self.filename.encode("utf-8"), self.flag_bits | _UTF8_NAMES


@record
class BundleEntry:
    """One payload of a bundle image: a cubin for a real architecture or PTX for a virtual
    one, stored as the member ``file``."""

    file: str
    kind: str  # "cubin" or "ptx"
    arch: Arch  # sm_90, sm_90a, compute_80 (equal to its text, "sm_90")
    sha256: str
    size: int
    payload: bytes = field(repr=False, compare=False)
    # a cubin's own facts, so that loading it reads no ELF: each kernel's resources
    # ({kernel: {"registers": 10, ...}}, the RESOURCES it records) and the module's globals
    # (GlobalSymbol.to_json()); None for PTX, and where a bundle does not record them
    resources: Mapping[str, Mapping[str, int]] | None = field(default=None, repr=False)
    globals: tuple[Mapping[str, Any], ...] | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        d = {"file": self.file, "kind": self.kind, "arch": str(self.arch), "sha256": self.sha256, "size": self.size}
        if self.resources is not None:
            d["resources"] = {k: dict(v) for k, v in self.resources.items()}
        if self.globals is not None:
            d["globals"] = [dict(g) for g in self.globals]
        return d


@record
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
    toolchain: Any = None  # the compiler's build fingerprint (nbjit.toolchain.nvrtc)
    triton: Mapping[str, Any] | None = None  # Triton's metadata JSON, for a Triton kernel
    # @cuda.jit kernels' arguments as Numba passes them: {kernel: (NumbaArray | NumbaScalar, ...)}
    numba: Mapping[str, tuple] = field(default_factory=dict)

    @property
    def archs(self) -> tuple[Arch, ...]:
        """The entries' architectures, in order: sm_80, sm_90, compute_80 (each equal to its
        text: ``img.archs == ("sm_80", "sm_90", "compute_80")``)."""
        return tuple(e.arch for e in self.entries)

    def to_json(self) -> dict:
        d = {"name": self.name, "sources": [dict(s) for s in self.sources], "options": list(self.options),
             "name_expressions": dict(self.lowered_names), "producer": self.producer, "toolchain": self.toolchain,
             "declarations": _declarations_json(self.declarations),
             "kernels": {k.name: _signature_json(k) for k in self.kernels},
             "entries": [e.to_json() for e in self.entries]}
        if self.triton is not None:
            d["triton"] = dict(self.triton)
        if self.numba:
            from nbjit.params.numba_abi import to_json
            d["numba"] = {k: to_json(v) for k, v in self.numba.items()}
        return d


@record
class BundleInfo:
    """What a bundle holds: its images, read and verified (every payload's digest checked)."""

    images: tuple[BundleImage, ...]
    version: int = VERSION
    nbjit: str | None = None  # the nbjit version that built it
    source: str = "<bundle>"

    def image(self, name: str | None = None) -> BundleImage:
        """The image called ``name``; the only one where ``name`` is None."""
        names = [i.name for i in self.images]
        if name is None:
            if len(self.images) == 1:
                return self.images[0]
            raise BundleError(f"{self.source}: holds {len(names)} images ({', '.join(names)}): say which with name=")
        for i in self.images:
            if i.name == name:
                return i
        raise BundleError(f"{self.source}: no image {name!r}; it holds {', '.join(names)}")

    def to_json(self) -> dict:
        return {"kind": "bundle", "format": FORMAT, "version": self.version, "nbjit": self.nbjit,
                "images": [i.to_json() for i in self.images]}


# ------------------------------------------------------------------ reading


def read_bundle(bundle: Any, name: str | None = None) -> BundleInfo:
    """Read and verify a bundle: a path, its bytes (``name`` names them in messages), or an
    ``importlib.resources`` Traversable.
    Every payload is checked against its SHA-256 in the manifest, and kernels are read from
    the payloads with the manifest's C declarations (no GPU); the manifest's own list of them
    (what a module waiting for first use describes its kernels by) must lay out each kernel's
    parameters as the payloads do.

    Raises
    ------
    BundleError: not a bundle, a damaged or altered one (named member), one made by a newer
    nbjit, or one that breaks the format's rules (compressed, encrypted or escaping members).
    """
    archive = open_bundle(bundle, name)
    src = archive.source
    images = []
    for rec in records(archive):
        entries = tuple(BundleEntry(file, kind, a, sha, size, bundle_archive.payload(archive, rec, e), res, glob)
                        for e in rec["entries"] for file, kind, a, sha, size, res, glob in (e,))
        kernels, facts = _kernels(rec["name"], entries, rec["declarations"],
                                  lambda msg, n=rec["name"]: image_error(src, n, msg))
        for e in entries:
            _same_facts(e, facts.get(e.file), lambda msg, n=rec["name"]: image_error(src, n, msg))
        _same_layouts(kernels, bundle_archive.kernels(rec, src), lambda msg, n=rec["name"]: image_error(src, n, msg))
        numba = bundle_archive.numba_args(rec, src)
        _same_numba(numba, kernels, lambda msg, n=rec["name"]: image_error(src, n, msg))
        if rec["triton"] is not None:
            _triton_meta(rec, src)
        images.append(BundleImage(rec["name"], entries, kernels, rec["name_expressions"], rec["declarations"],
                                  rec["sources"], rec["options"], rec["producer"], rec["toolchain"], rec["triton"],
                                  numba))
    made_by = archive.manifest.get("nbjit")
    if made_by is not None and not isinstance(made_by, str):
        raise BundleError(f"{src}: {MANIFEST}: nbjit is {type(made_by).__name__}, not text")
    return BundleInfo(tuple(images), archive.manifest["version"], made_by, src)


def _same_numba(numba: Mapping[str, tuple], kernels: tuple, bad) -> None:
    """The manifest's Numba argument types are those of a kernel of the image, and agree with
    what its mangled name says (its record fields excepted: a name does not say them), and lay
    out its parameters as the payloads do."""
    from nbjit.params import numba_abi

    found = {k.name: k for k in kernels}
    for name, args in numba.items():
        if name not in found:
            raise bad(f"numba: no kernel {name[:80]!r} in the image")
        try:
            said = numba_abi.from_mangled(name)
            numba_abi.signature(name, found[name], args, "numba types")
        except numba_abi.NumbaAbiError as e:
            raise bad(f"numba: {e}") from None
        for i, (a, b) in enumerate(zip(args, said)):
            same = type(a) is type(b) and (a.dtype is None or b.dtype is None or a.dtype == b.dtype) and \
                (not isinstance(a, numba_abi.NumbaArray) or (a.ndim, a.layout, a.readonly) == (b.ndim, b.layout,
                                                                                                   b.readonly))
            if not same:
                raise bad(f"numba: kernel {name[:80]!r}, argument {i}: the manifest says {a.text}, its name "
                          f"{b.text}")


def _triton_meta(rec: dict, src: str) -> None:
    """Image ``rec``'s Triton metadata checked by the rules ``load_triton`` applies to it."""
    from nbjit.loading.triton import _from_json

    try:
        _from_json(rec["triton"], f"{src}: {MANIFEST}: image {rec['name']!r}")
    except NbjitLoadError as e:
        raise BundleError(str(e)) from None


def _same_layouts(found: tuple["KernelInfo", ...], listed: dict, bad) -> None:
    """The manifest's kernels (``listed``) are the payloads' (``found``), each parameter at the
    same offset and size (their C types may be refined by a newer nbjit's reading)."""
    names = [k.name for k in found]
    if sorted(names) != sorted(listed):
        diff = sorted(set(names) ^ set(listed))
        raise bad(f"the manifest lists kernels {', '.join(diff[:4])} that its entries do not hold, or leaves out "
                  "some they do (the bundle was altered)")
    for k in found:
        ours = [(p.offset, p.size) for p in k.params]
        theirs = [(p.offset, p.size) for p in listed[k.name].params]
        if ours != theirs or k.param_size != listed[k.name].param_size:
            raise bad(f"kernel {k.name!r}: the manifest lays out its parameters as (offset, size) {theirs}, its "
                      f"entries as {ours} (the bundle was altered)")


def _same_facts(e: BundleEntry, found: tuple | None, bad) -> None:
    """What the manifest records of cubin ``e`` (resources, globals) is what the cubin says
    (``found``, from ``_kernels``); a newer nbjit may read more than an older one recorded."""
    if found is None:
        return
    resources, globals_ = found
    for k, recorded in (e.resources or {}).items():
        own = resources.get(k)
        if own is None or any(own.get(r) != v for r, v in recorded.items()):
            raise bad(f"entry {e.file!r}: the manifest records the resources of kernel {k!r} as {dict(recorded)}, the "
                      f"cubin as {own} (the bundle was altered)")
    if e.globals is not None:
        ours = [{k: g.get(k) for k in r} for g, r in zip(globals_, e.globals)]  # (the fields it records)
        if len(globals_) != len(e.globals) or ours != [dict(g) for g in e.globals]:
            raise bad(f"entry {e.file!r}: the manifest records the globals {[dict(g) for g in e.globals]}, the cubin "
                      f"{list(globals_)} (the bundle was altered)")


def inspect_bundle(bundle: Any) -> BundleInfo:
    """What a bundle holds (images, their entries and kernels with their signatures): see
    ``read_bundle``."""
    return read_bundle(bundle)


def image_of(info: BundleInfo, img: BundleImage) -> Image:
    """``img`` as an ``nbjit.Image``: a fatbin of its entries, with its name expressions and
    C declarations (as ``load_bundle`` loads it)."""
    entries = [(e.kind, e.arch, e.payload, None) for e in img.entries]
    return bundle_archive.fatbin_image(f"{info.source}:{img.name}", entries, img.lowered_names, img.declarations)


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
    from nbjit.loading import triton

    if not _is_bundle(source):
        if name is not None or lazy is not False:
            shown = os.fsdecode(source) if isinstance(source, (str, os.PathLike)) else repr(source)
            raise NbjitLoadError(f"{shown}: name= and lazy= are for a kernel bundle; a Triton cache entry loads the "
                                 "one kernel it holds, now (build a bundle of it with nbjit.build_bundle to load it "
                                 "lazily)")
        return triton.load_triton(source)
    from nbjit.loading.module import load

    archive = open_bundle(source)
    rec = triton_image(records(archive), name, archive.source)
    label = f"{archive.source}:{rec['name']}"
    meta = triton._from_json(rec["triton"], f"{label} (manifest)")
    img = bundle_archive.image_of(archive, rec)
    ptx = next(((img.data[off:off + n], f"{archive.source}:{rec['name']}/{a}.ptx")
                for kind, a, off, n, _ in img.entries if kind == "ptx"), None)
    return triton.from_module(load(img, lazy=lazy), meta, ptx=ptx)


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


def triton_image(recs: list[dict], name: str | None, src: str) -> dict:
    """Of a bundle's images (``archive.records``), the one called ``name`` among those
    with Triton's metadata; the only one where ``name`` is None. A ``BundleError`` lists the
    images that qualify."""
    have = [r for r in recs if r["triton"] is not None]
    names = ", ".join(r["name"] for r in have) or "none"
    if name is None:
        if len(have) == 1:
            return have[0]
        if not have:
            raise BundleError(f"{src}: no image holds Triton metadata (it holds "
                              f"{', '.join(r['name'] for r in recs)}): load it with nbjit.load_bundle, or bundle "
                              "the Triton cache entry directory (or its .json) to keep the metadata")
        raise BundleError(f"{src}: holds {len(have)} Triton kernels ({names}): say which with name=")
    rec = next((r for r in recs if r["name"] == name), None)
    if rec is None:
        raise BundleError(f"{src}: no image {name!r}; its Triton kernels are {names}")
    if rec["triton"] is None:
        raise BundleError(f"{src}: image {name!r} holds no Triton metadata (its Triton kernels are {names}): "
                          "load it with nbjit.load_bundle")
    return rec



def _declarations_json(decls: Mapping[str, tuple]) -> dict:
    return {k: {"from": label, "params": [{"base": p.base, "pointer": p.pointer, "const": p.const, "name": p.name}
                                          for p in params]}
            for k, (label, params) in decls.items()}


def _signature_json(k: "KernelInfo") -> dict:
    """A kernel as the manifest lists it: its parameters and directives (``KernelInfo.to_json``)."""
    return k.to_json()


def _kernels(name: str, entries: Iterable[BundleEntry], decls: Mapping, bad,
             labels: Mapping[str, str] | None = None) -> tuple[tuple["KernelInfo", ...], dict]:
    """The image's kernels, merged from every entry (PTX first: it has types) with the C
    declarations and mangled names (the entries must describe the same kernels alike); and
    each cubin's own facts, ``{file: (resources, globals)}`` as ``BundleEntry`` records them.
    ``labels``: what each entry (by member file) was made from, for messages (a build's inputs)."""
    labels = labels or {}
    from nbjit.params.cdecl import demangle
    from nbjit.params.signature import RESOURCES, SignatureConflict, merge, replace
    from nbjit.read.cubin import inspect_cubin
    from nbjit.read.ptx import inspect_ptx

    per = []
    facts = {}
    for e in sorted(entries, key=lambda e: e.kind != "ptx"):
        try:
            info = inspect_ptx(e.payload, source=e.file) if e.kind == "ptx" else inspect_cubin(e.payload,
                                                                                               source=e.file)
        except NbjitError as x:
            raise bad(f"entry {e.file!r}: {x}") from None
        per.append((e, {k.name: k for k in info.entries}))
        if e.kind == "cubin":
            facts[e.file] = ({k.name: {r: getattr(k, r) for r in RESOURCES if getattr(k, r) is not None}
                              for k in info.entries}, tuple(g.to_json() for g in info.globals))
    if not per:
        raise bad("it holds no cubin and no PTX, nothing a driver loads (LTO-IR is linked into a cubin "
                  "first: nbjit.link_image)")
    names = list(per[0][1])
    for e, ks in per[1:]:
        if set(ks) != set(names):
            diff = sorted(set(ks) ^ set(names))
            if labels:
                first, other = labels.get(per[0][0].file, per[0][0].file), labels.get(e.file, e.file)
                raise bad(f"{first} and {other} hold different kernels ({', '.join(diff[:4])}): the inputs of one "
                          "image are the same code built for other architectures")
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
    return tuple(out), facts


# ------------------------------------------------------------------ building


@record(frozen=False)
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
    numba: dict = field(default_factory=dict)  # @cuda.jit kernels' arguments, {kernel: (NumbaArray, ...)}
    paths: list = field(default_factory=list)  # the input files (never overwritten)
    labels: dict = field(default_factory=dict)  # {(kind, Arch): what that entry was made from}, for messages
    kept: dict = field(default_factory=dict)  # {placeholder: CUDA C++} its line tables name (cache.sources)


def build_bundle(inputs: Any, dest: str | os.PathLike, *, archs: Iterable[str] | str = (),
                 ptx: Iterable[str] | str = (), options: Iterable[str] | str = (),
                 name_expressions: Iterable[str] | str = (), include_paths: Iterable[str] = (),
                 headers: Mapping[str, str] | None = None, cache: Any = None, tuning: Iterable[Any] = ()
                 ) -> BundleInfo:
    """Build a bundle file at ``dest`` (written whole, then moved into place).

    Parameters
    ----------
    inputs: what goes in, each becoming one image named after its file (``axpy.cu`` ->
        ``axpy``): a ``.cu`` file (compiled by NVRTC), a PTX, cubin or fatbin file (taken as
        it is, at its own architectures), a Triton cache entry directory or its ``.json``
        (cubin, PTX and metadata), an ``nbjit.Image``; one of them or a list. A dict
        ``{image name: input or list of inputs}`` names the images, gives CUDA source text or
        PTX text (a str of several lines, or one line naming no file and holding ``__global__``
        or ``.entry``) or image bytes, and puts several inputs (cubins nvcc built for several
        architectures, say) in one image.
    archs: the SASS to compile each CUDA source for (``"sm_80,sm_90,sm_100"`` or a list).
    ptx: the virtual architecture(s) to compile each CUDA source to PTX for (``"compute_80"``).
    options, name_expressions, include_paths, headers, cache: for each CUDA source, as
        ``nbjit.compile_image`` takes them.
    tuning: answers of ``nbjit.tune`` to ship (each a ``Tuned`` or its cache key), read from
        ``cache`` (default: the default cache); a process that loads the bundle finds them
        and times nothing.

    Returns the ``BundleInfo`` of what was written.

    Raises
    ------
    BundleError: an input that is none of these, two images of one name, entries of one image
    that describe different kernels, no architecture for a CUDA source, ``dest`` naming an
    input. NbjitCompileError: NVRTC rejected a source.
    """
    if not isinstance(dest, (str, os.PathLike)):
        raise BundleError(f"dest must be the bundle file's path (str or os.PathLike), not {type(dest).__name__}")
    dest = Path(dest)
    data, info = bundle_bytes(inputs, dest, _answers(tuning, cache), archs=archs, ptx=ptx, options=options,
                              name_expressions=name_expressions, include_paths=include_paths, headers=headers,
                              cache=cache)
    _write_atomic(dest, data)
    return dataclasses.replace(info, source=str(dest))


TUNING_DIR = "tuning"  # answers of nbjit.tune: members tuning/<cache key>.nbjit, each an entry file


def _answers(tuning: Iterable[Any], cache: Any) -> list[tuple[str, bytes]]:
    """The members that ship ``tuning``'s answers: each answer's cache entry file, as the
    cache keeps it (self-checking: the loader verifies it again)."""
    if isinstance(tuning, (str, bytes)) or not hasattr(tuning, "__iter__"):
        tuning = (tuning,)
    from nbjit.cache.entries import _encode
    from nbjit.cache.store import default_cache
    c = default_cache() if cache is None else cache
    out = []
    for item in tuning:
        key = getattr(item, "key", item)
        try:
            entry = c.lookup(key, remote=True)
        except NbjitError as e:
            raise BundleError(f"tuning: {e}") from None
        if entry is None or entry.kind != "tuning":
            raise BundleError(f"tuning: no answer of nbjit.tune under key {key} in {c.path or 'the cache'} "
                              "(nbjit tune --list shows the answers kept)")
        out.append((f"{TUNING_DIR}/{key}.nbjit", _encode(key, entry)))
    return out


def bundle_bytes(inputs: Any, dest: Path | None = None, members: Iterable[tuple[str, bytes]] = (),
                 **how: Any) -> tuple[bytes, BundleInfo]:
    """``build_bundle``'s bundle as bytes, and its ``BundleInfo``, written nowhere (``dest``, where
    given, is where it will be written: never over an input). The keywords are build_bundle's;
    ``members``: (name, bytes) stored beside the images and listed, with their digests, in
    the manifest's ``members`` (a saved graph's description; ``archive.read_member`` reads them)."""
    import nbjit

    archs_l, ptx_l = _arch_list(how.pop("archs", ()), "archs", False), _arch_list(how.pop("ptx", ()), "ptx", True)
    how = {"options": (), "name_expressions": (), "include_paths": (), "headers": None, "cache": None, **how}
    how["name_expressions"] = _expressions(how["name_expressions"])
    parts = _parts(inputs, dict(archs=archs_l, ptx=ptx_l, **how))
    for p in parts:
        for path in p.paths:
            if dest is not None and dest.exists() and Path(path).exists() and os.path.samefile(dest, path):
                raise BundleError(f"{dest}: is an input ({path}); write the bundle elsewhere")
    manifest = {"format": FORMAT, "version": VERSION, "nbjit": nbjit.__version__, "images": []}
    payloads: list[tuple[str, bytes]] = []
    members = list(members)
    _kept_members(parts, 1 + len(members) + sum(len(p.entries) for p in parts))
    for p in parts:
        entries = []
        for kind, a, payload in p.entries:
            file = f"{p.name}/{a}.{kind}"
            entries.append(BundleEntry(file, kind, a, hashlib.sha256(payload).hexdigest(), len(payload),
                                       payload))
            payloads.append((file, payload))
        kernels, facts = _kernels(p.name, entries, p.decls, lambda msg, n=p.name: BundleError(f"image {n!r}: {msg}"),
                                  {f"{p.name}/{a}.{k}": label for (k, a), label in p.labels.items()})
        entries = [dataclasses.replace(e, resources=facts[e.file][0], globals=facts[e.file][1]) if e.file in facts
                   else e for e in entries]
        # (name expressions and declarations sorted: a compile and a cache hit list them in other orders)
        img = BundleImage(p.name, tuple(entries), kernels, dict(sorted(p.lowered.items())),
                          dict(sorted(p.decls.items())), tuple(p.sources), tuple(p.options), p.producer, p.toolchain,
                          p.triton, p.numba)
        manifest["images"].append(img.to_json())
    # keys in the order they are made (the same inputs make them in the same order): a
    # parameter's origin keeps the order in which its facts were found, as kernel.params shows it
    # (a header kept under two directories is one member)
    members += list({s["member"]: p.kept[s["program"]].encode("utf-8", "surrogatepass")
                     for p in parts for s in p.sources if "member" in s}.items())
    if members:
        manifest["members"] = {name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                               for name, data in members}
    raw = json.dumps(manifest, indent=1).encode() + b"\n"
    data = _zip([(MANIFEST, raw), *payloads, *members])
    return data, read_bundle(data)  # what a reader will find: checked before it is written


def _kept_members(parts: list[_Part], others: int) -> None:
    """Name the member of each kept source (``<image>/source/<digest>/<file>``) and header
    (``headers/<digest>/<file>``: once in the bundle, however many images read it). Where the
    headers would take the bundle past ``MAX_MEMBERS`` with the ``others`` members, they are
    left out, with a warning: their lines stay unresolved where the bundle is loaded."""
    kept = [(p, s) for p in parts for s in p.sources if "program" in s]
    headers = {(s["sha256"], s["name"]) for _, s in kept if s.get("kind") == "header"}
    with_headers = others + len(kept) - sum(s.get("kind") == "header" for _, s in kept) + len(headers) <= MAX_MEMBERS
    if headers and not with_headers:
        warn(f"the bundle would hold more than {MAX_MEMBERS} members with the {len(headers)} headers its images were "
             "compiled with line information from: they are left out (debuggers show their lines unresolved)")
    for p, s in kept:
        if s.get("kind") != "header":
            s["member"] = f"{p.name}/source/{s['sha256'][:16]}/{s['name']}"
        elif with_headers:
            s["member"] = f"headers/{s['sha256'][:16]}/{s['name']}"


def _zip(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, payload in members:
            zi = _Utf8Member(name, _ZIP_TIME)
            zi.compress_type = zipfile.ZIP_STORED
            zi.external_attr = 0o644 << 16
            zi.create_system = 3  # unix: the mode above is read as one
            zf.writestr(zi, payload)
    return buf.getvalue()


def _write_atomic(dest: Path, data: bytes) -> None:
    """``data`` at ``dest``, complete or not at all (a reader never sees half a bundle); through
    a link to where it points, into a FIFO or character device being read (as every nbjit output:
    ``files.write_output``)."""

    write_file(dest, lambda f: f.write(data), BundleError)


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


def _expressions(exprs: Any) -> "list[str] | dict[str, list[str]]":
    """``name_expressions`` read once: a list for every CUDA source, or {image: list}; one str
    is one expression."""
    def many(v: Any) -> list[str]:
        return [v] if isinstance(v, str) else list(v)
    return {k: many(v) for k, v in exprs.items()} if isinstance(exprs, Mapping) else many(exprs)


def _parts(inputs: Any, how: dict) -> list[_Part]:
    """The images to build, each with its entries."""
    if isinstance(inputs, Mapping):
        named = [(n, v) for n, v in inputs.items()]
    elif isinstance(inputs, (str, os.PathLike, bytes, bytearray, memoryview, Image)) or _is_numba(inputs):
        named = [(None, inputs)]
    else:
        try:
            named = [(None, v) for v in inputs]
        except TypeError:
            raise BundleError(f"inputs must be paths, images or a dict of them, not {type(inputs).__name__}") from None
    if not named:
        raise BundleError("no inputs: give the .cu, PTX, cubin, fatbin or Triton files to bundle")
    parts: list[_Part] = []
    compiled_any = cuda_any = False  # (CUDA sources or @cuda.jit kernels; CUDA sources)
    # how many images compile CUDA source (a message about name expressions that go to them all)
    how["cuda_images"] = sum(any(_is_source(x) for x in (v if isinstance(v, (list, tuple)) and not _is_numba(v)
                                                          else [v])) for _, v in named)
    exprs = how["name_expressions"]
    if isinstance(exprs, Mapping):  # each image it names compiles CUDA source (checked before compiling any)
        made = list(dict.fromkeys(name if name is not None else _source_image_name(x) for name, v in named
                                  for x in (v if isinstance(v, (list, tuple)) else [v]) if _is_source(x)))
        unknown = [k for k in exprs if k not in made]
        if unknown:  # (as the command line's --expr IMAGE=EXPR says)
            raise BundleError(f"name_expressions: no CUDA source makes image {unknown[0]!r} (they make: "
                              f"{', '.join(made) or 'none'})")
    for name, value in named:
        if name is not None and not is_image_name(name):
            raise BundleError(f"image name {name!r}: letters, digits, '_', '.', '+', '-' (it names the archive's "
                              "directory of the image)")
        items = value if isinstance(value, (list, tuple)) and not _is_numba(value) else [value]
        part = _Part(name or "")
        for item in items:
            made = _add(part, item, how, name is None and len(items) == 1)
            compiled_any |= made
            cuda_any |= made and not _is_numba(item)
        if not part.name:
            raise BundleError(f"{_shown(items[0])}: give it a name ({{'name': ...}}) to bundle it")
        other = next((p for p in parts if p.name == part.name), None)
        if other is not None and _origin(other) == _origin(part):
            twice = (f": a @cuda.jit kernel for two signatures is two images, named in a dict ({{'{part.name}_f32': "
                     f"(kernel, sig1), '{part.name}_f64': (kernel, sig2)}})" if part.numba else "")
            raise BundleError(f"{_origin(part)}: given twice{twice}")
        if other is not None:
            raise BundleError(f"{_origin(other)} and {_origin(part)}: two images would be called {part.name!r} (an "
                              "image is named after its file): name them ({'a': ..., 'b': ...})")
        parts.append(part)
    if exprs and not cuda_any:  # (a dict of them names CUDA images: checked above)
        raise BundleError(f"name_expressions ({', '.join(map(repr, exprs[:3]))}) instantiate templates of CUDA C++ "
                          "sources; the inputs hold none (PTX, cubins and fatbins are compiled already)")
    if (how["archs"] or how["ptx"]) and not compiled_any:
        raise BundleError("archs and ptx say what to compile CUDA sources for; the inputs hold none (PTX, cubins and "
                          "fatbins go in at their own architectures)")
    return parts


def _shown(item: Any) -> str:
    """An input as messages name it: a path as given, text and bytes by their length (not
    their repr)."""
    if _is_text(item):
        return f"unnamed text ({len(item)} characters)"
    if isinstance(item, (str, os.PathLike)):
        return str(item)
    if isinstance(item, (bytes, bytearray, memoryview)):
        return f"unnamed data ({len(item)} bytes)"
    if isinstance(item, Image):
        return f"image {item.name!r}"
    if _is_numba(item):
        return f"@cuda.jit kernel {_numba_pair(item)[0].py_func.__name__!r}"
    return repr(item)[:80]


def _origin(part: _Part) -> str:
    """What an image is made from, for messages: its first input."""
    if part.paths:
        return str(part.paths[0])
    return part.sources[0]["name"] if part.sources else f"image {part.name!r}"


def _add(part: _Part, item: Any, how: dict, naming: bool) -> bool:
    """Put ``item``'s entries in ``part``; whether it was a CUDA source (compiled)."""
    from nbjit.toolchain.request import SOURCE_SUFFIXES

    if _is_numba(item):
        _add_numba(part, item, how, naming)
        return True
    if isinstance(item, Image):
        _add_image(part, item.data, item.kind, item.name, naming)
        part.lowered.update(item.lowered_names)
        part.decls.update(item.declarations)
        _keep(part, item.sources)  # (a compile's image with line information: its source and headers)
        return False
    if isinstance(item, (bytes, bytearray, memoryview)):
        data = bytes(item)
        _add_image(part, data, _sniff(data, part.name or "<bytes>"), part.name or "<bytes>", False)
        return False
    if _is_text(item):  # text: PTX where it says so, else CUDA C++
        if _is_ptx_text(item):
            _add_image(part, item.encode(), "ptx", part.name or "<ptx>", False)
            return False
        _compile(part, item, part.name + ".cu" if part.name else None, how)
        return True
    if not isinstance(item, (str, os.PathLike)):
        raise BundleError(f"a bundle input is a path, an nbjit.Image, bytes, text or a @cuda.jit kernel with its "
                          f"signature, not {type(item).__name__}")
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
    data = read_file(path, BundleError)
    try:
        kind = sniff(data, str(path))
    except ImageFormatError as e:
        if "CUDA C++ source" in str(e):
            raise BundleError(f"{path}: CUDA C++ source, which a bundle compiles from a file named "
                              f"{', '.join(SOURCE_SUFFIXES[:-1])} or {SOURCE_SUFFIXES[-1]}: rename it") from None
        raise BundleError(f"{e} (a bundle takes these, CUDA sources named .cu and Triton cache entries)"
                          if str(e).endswith("a cubin or a fatbin") else str(e)) from None
    _add_image(part, data, kind, str(path), False)
    return False


def _is_text(item: Any) -> bool:
    """Whether a bundle input is source or PTX text rather than a path: several lines, or one
    line of code (``__global__``, a PTX ``.entry`` with its parameters) that names no file."""
    return isinstance(item, str) and ("\n" in item or bool(_ONE_LINE_CODE.search(item)) and not os.path.lexists(item))


_ONE_LINE_CODE = re.compile(r"__global__|\.entry\s+[\w$]+\s*\(")


def _is_ptx_text(text: str) -> bool:
    """Whether bundle input text is PTX (a ``.version`` directive, no ``__global__``), not CUDA C++."""
    return "__global__" not in text and bool(re.search(r"^[ \t]*\.version[ \t]+\d", text, re.M))


def _is_source(item: Any) -> bool:
    """Whether a bundle input is CUDA C++ that NVRTC compiles (a .cu file, or source text)."""
    from nbjit.toolchain.request import SOURCE_SUFFIXES

    if _is_text(item):
        return not _is_ptx_text(item)
    return isinstance(item, (str, os.PathLike)) and Path(item).suffix.lower() in SOURCE_SUFFIXES


def _source_image_name(item: Any) -> str:
    """The image an unnamed CUDA source makes: named after its file, "kernel" for text (as
    ``_compile`` names it, from the label ``kernel.cu``)."""
    return "kernel" if _is_text(item) else _image_name(Path(item))


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
    from nbjit.read.cubin import inspect_cubin
    from nbjit.read.fatbin import inspect_fatbin, undecoded
    from nbjit.read.ptx import inspect_ptx

    if naming and not part.name:
        part.name = _image_name(Path(label))
    try:
        if kind == "fatbin":
            found, lto = [], []
            for e in inspect_fatbin(data, source=label).entries:
                if e.kind == "ltoir":
                    lto.append(str(e.arch))
                    continue  # linked, never loaded: a bundle holds what loads
                if e.payload is None:
                    raise BundleError(f"{label}: entry {e.index} ({e.arch}) is {undecoded(e)}")
                found.append((e.kind, e.arch, e.payload))
            if not found and lto:
                raise BundleError(f"{label}: holds no cubin and no PTX, only LTO-IR ({', '.join(lto)}), which no "
                                  "driver loads: link it into a cubin first (nvcc -dlink, or nbjit.link_image) and "
                                  "bundle that")
        elif kind == "cubin":
            found = [("cubin", inspect_cubin(data, source=label).arch, data)]
        else:
            text = data.rstrip(b"\0")
            target = inspect_ptx(text, source=label).arch
            try:
                found = [("ptx", Arch.parse(target, virtual=True), text)]
            except ValueError:
                raise BundleError(f"{label}: its .target {target!r} names no architecture (as sm_90 does)") from None
    except (ImageFormatError, ValueError) as e:
        msg = str(e)  # (nbjit's readers name the file themselves: once is enough)
        raise BundleError(msg if msg.startswith(label) else f"{label}: {msg}") from None
    for k, a, payload in found:
        _put(part, k, a, payload, label)
    part.sources.append({"name": os.path.basename(label), "kind": kind, "sha256": hashlib.sha256(data).hexdigest()})


def _put(part: _Part, kind: str, arch: Arch, payload: bytes, label: str) -> None:
    for k, a, _ in part.entries:
        if k == kind and a == arch:
            first = part.labels[(k, a)]
            if first == label:
                raise BundleError(f"{label}: given twice for image {part.name!r}")
            raise BundleError(f"{label}: image {part.name!r} has a {kind} for {arch} already, from {first}: one "
                              f"{kind} per architecture in an image")
    part.entries.append((kind, arch, payload))
    part.labels[(kind, arch)] = label


def _compile(part: _Part, source: Any, name: str | None, how: dict) -> None:
    """A CUDA source compiled by NVRTC: a cubin for each of ``archs``, PTX for each of ``ptx``."""
    from nbjit.cache.sources import program_name
    from nbjit.toolchain.identity import _toolchain_fingerprint
    from nbjit.toolchain.nvrtc import compile_image, nvrtc_version
    from nbjit.toolchain.request import source_text

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
        try:
            img = compile_image(text, name=label, name_expressions=exprs, headers=how["headers"],
                                include_paths=include_paths, options=how["options"], arch=a, output=output,
                                cache=how["cache"])
        except CompileFailure as e:
            # (__nv_name_map: NVRTC's words for a name expression the source does not declare)
            if exprs and "__nv_name_map" in e.log and how.get("cuda_images", 0) > 1 \
                    and not isinstance(how["name_expressions"], Mapping):
                hint = (f"The name expressions ({', '.join(map(repr, exprs))}) go to every CUDA source of the "
                        f"bundle unless given per image: name_expressions={{{part.name!r}: [...], ...}}, or on "
                        "the command line --expr IMAGE=EXPR.")
                raise CompileFailure(e.name, e.source, e.options, e.log, e.producer,
                                     "\n".join(filter(None, (e.hint, hint))), e.shown_options) from None
            raise
        for k, v in img.lowered_names.items():
            if part.lowered.setdefault(k, v) != v:
                raise BundleError(f"{label}: name expression {k!r} is {part.lowered[k]} for one architecture and {v} "
                                  f"for {a}")
        part.decls.update(img.declarations)
        part.kept.update(img.sources)
        _add_image(part, img.data, img.kind, f"{label}[{a}]", False)
        part.sources.pop()  # the source itself is recorded once, below
    major, minor = nvrtc_version()
    part.producer = f"NVRTC {major}.{minor}"
    part.toolchain = _toolchain_fingerprint()
    opts = how["options"]
    part.options = (opts,) if isinstance(opts, str) else tuple(str(o) for o in opts)
    record = {"name": os.path.basename(label), "kind": "cuda", "sha256": hashlib.sha256(text.encode()).hexdigest()}
    if part.kept:  # (compiled with -lineinfo or -G: the source travels, as a member of its own)
        record["program"] = program_name(text, label)
    part.sources.append(record)
    _keep(part, {})  # (its headers: members of their own too)


def _keep(part: _Part, sources: Mapping[str, str]) -> None:
    """``sources`` (an image's, ``{placeholder: text}``) kept in ``part``, and a record in its
    manifest for each source and header kept that has none yet."""
    from nbjit.cache.sources import kept_kind

    part.kept.update(sources)
    recorded = {s.get("program") for s in part.sources}
    for program, text in part.kept.items():
        if program not in recorded:
            part.sources.append({"name": os.path.basename(program), "kind": kept_kind(program, text),
                                 "program": program,
                                 "sha256": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()})


def _add_triton(part: _Part, path: Path, naming: bool) -> None:
    """A Triton kernel compiled ahead of time: its cubin and/or PTX, the C types of its IR and
    its metadata (kept whole in the manifest, for Triton's launch rules)."""
    from nbjit.loading.triton import read_triton

    try:
        art = read_triton(path)
    except NbjitLoadError as e:
        raise BundleError(str(e)) from None
    if naming:
        part.name = _image_name(Path(art.meta.name))
    meta_file = path if path.suffix == ".json" else path / f"{art.meta.name}.json"
    if meta_file.is_file():
        try:
            part.triton = json.loads(read_regular(meta_file, 1 << 24), parse_constant=bundle_archive._no_constant)
        except (OSError, ValueError, RecursionError) as e:
            raise BundleError(f"{meta_file}: unreadable Triton metadata: {e}") from None
    for f in (art.cubin, art.ptx):
        if f is None:
            continue
        data = art.ptx_text if f == art.ptx and art.ptx_text else read_regular(f)
        _add_image(part, data, "cubin" if f == art.cubin else "ptx", str(f), False)
    part.decls.update(art.declarations())


def _is_numba(item: Any) -> bool:
    """Whether a bundle input is a ``@cuda.jit`` kernel: its dispatcher, or ``(dispatcher,
    signature)``."""
    from nbjit.toolchain.numba_kernels import is_dispatcher

    return is_dispatcher(item) or (isinstance(item, tuple) and len(item) == 2 and is_dispatcher(item[0])
                                   and not is_dispatcher(item[1]))


def _numba_pair(item: Any) -> tuple[Any, Any]:
    """(dispatcher, signature) of a ``@cuda.jit`` input; a dispatcher alone gives the one
    signature it was compiled for (``@cuda.jit("void(float32[::1])")`` on a machine with a GPU)."""
    if isinstance(item, tuple):
        return item
    sigs = list(getattr(item, "overloads", {}) or ())
    if len(sigs) != 1:
        name = item.py_func.__name__
        raise BundleError(f"@cuda.jit kernel {name!r}: give the signature to compile it for, as ({name}, "
                          f"'void(float32[::1], float32)'){' (it has several: one image each)' if sigs else ''}")
    return item, sigs[0]


def _add_numba(part: _Part, item: Any, how: dict, naming: bool) -> None:
    """A ``@cuda.jit`` kernel compiled by its own Numba: PTX for each of ``archs``, assembled
    into a cubin by nvJitLink, and PTX for each of ``ptx``; its arguments as Numba passes them."""
    from nbjit.toolchain.nvjitlink import assemble_cached
    from nbjit.toolchain.numba_kernels import NumbaKernel

    dispatcher, signature = _numba_pair(item)
    try:
        kernel = NumbaKernel(dispatcher, signature)
    except NbjitLoadError as e:
        raise BundleError(str(e)) from None
    py = kernel.py
    if naming and not part.name:
        part.name = _image_name(Path(py.__name__))
    label = f"{py.__module__}.{py.__qualname__}"
    if not how["archs"] and not how["ptx"]:
        raise BundleError(f"{kernel.what}: say what to compile it for: archs=['sm_80', 'sm_90', ...] and/or "
                          "ptx='compute_80'")
    variant = next((a for a in (*how["archs"], *how["ptx"]) if a.variant), None)
    if variant is not None:
        raise BundleError(f"{kernel.what}: Numba compiles for a compute capability (sm_90), not for {variant}")
    jobs = [(a, "cubin") for a in how["archs"]] + [(a, "ptx") for a in how["ptx"]]
    ptx = {}
    # oldest chip first: Numba compiles the device functions a kernel calls once per process, for
    # the chip of the first compile, and what an older chip runs a newer one runs too
    for a in sorted({a.cc for a, _ in jobs}):
        try:
            ptx[a] = kernel.ptx(a, how["cache"])
        except NbjitLoadError as e:
            raise BundleError(str(e)) from None
    made = ptx[jobs[0][0].cc]  # (each compile tags the name anew, _ZN...B2v1B..., _ZN...B2v2B...: one name for all)
    for a, output in jobs:
        this = ptx[a.cc]
        text = this.ptx.replace(this.kernel, made.kernel)
        data = text.encode() if output == "ptx" else assemble_cached(text, a, name=f"{label}[{a}]", cache=how["cache"])
        _add_image(part, data, output, f"{label}[{a}]", False)
        part.sources.pop()  # the kernel itself is recorded once, below
    part.numba[made.kernel] = made.args
    part.lowered[py.__name__] = made.kernel  # (module["axpy"] and module.axpy find it, as a name expression)
    part.producer = f"{made.host} {_version_of(made.host)}"
    part.options = tuple(f"{k}={v}" for k, v in made.options)
    part.sources.append({"name": label, "kind": "numba", "signature": str(signature),
                         "sha256": hashlib.sha256(made.ptx.encode()).hexdigest()})


def _version_of(distribution: str) -> str:
    import importlib.metadata
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"
