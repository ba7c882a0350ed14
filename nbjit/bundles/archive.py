"""A kernel bundle file read to load one of its images (``nbjit.load_bundle``): the archive's
and the manifest's checks, the image's payloads checked against their digests, and the fatbin
``Image`` the loader takes, its entries listed and its kernels typed from the manifest.

This is the route of a package's first kernel, so it defines no result types and imports no
reader it does not use: no PTX, cubin or fatbin reader, no compiler, no cache. The loader
then reads only the entry the device runs (the cubin's own facts, or the PTX it compiles).
``nbjit.bundles.build`` builds bundles and reads them whole (``read_bundle``) on the same checks.

What is checked when: the archive's structure (every member's name, flags and sizes) and the
whole manifest's, at once; the payloads of the image loaded, each against the archive's
CRC-32 and the manifest's size and SHA-256, before anything reaches the driver. All of the
image's entries are checked, not only the one this device runs: they go into the module's
fatbin, which a pickle carries to processes whose devices may run any of them and which load
it without the manifest. Other images' payloads are neither read nor checked (nothing of
them is loaded); ``read_bundle`` and ``nbjit inspect`` check every one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import struct
import types
import zipfile
import zlib
from typing import TYPE_CHECKING, Any

from nbjit.arch import Arch
from nbjit.errors import BundleError, ImageFormatError
from nbjit.read.fatbin import layout_fatbin, payload_arch
from nbjit.read.image import Image, sniff
from nbjit.files import read_regular

if TYPE_CHECKING:
    from nbjit.loading.module import Module

__all__ = ["load_bundle", "load_image", "open_bundle", "read_member", "read_json", "check_format", "Archive",
           "FORMAT", "VERSION", "MAX_BUNDLE_BYTES", "MAX_MEMBERS", "MAX_IMAGES", "MAX_MANIFEST_BYTES", "MANIFEST"]

FORMAT = "nbjit-bundle"
VERSION = 1  # the manifest's layout; a reader refuses a newer one
MAX_BUNDLE_BYTES = 1 << 30
MAX_MEMBERS = 4096
MAX_IMAGES = MAX_MEMBERS - 1  # each image has members of its own, beside the manifest
MAX_MANIFEST_BYTES = 64 << 20
MANIFEST = "manifest.json"
KINDS = ("cubin", "ptx")
_NAME_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.+-"
_HEX = "0123456789abcdef"
_LOCAL = struct.Struct("<4s2xH18xHH")  # a local file header: signature, flags, name and extra lengths
_CENTRAL = struct.Struct("<4s24xHHH12x")  # a central directory entry: signature, name, extra and comment lengths
_EOCD = struct.Struct("<4s6xHL6x")  # the end of central directory record: signature, entries, directory size
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_EOCD = struct.Struct("<4s28xQQ8x")  # its zip64 form: signature, entries, directory size


def load_bundle(bundle: Any, *, name: str | None = None, lazy: bool = False, keep_debug: bool = False) -> "Module":
    """Load one image of a bundle into the current Numba context, picking for the device the
    cubin built for it, else one that runs on it, else the PTX (``Arch`` rules). Needs no
    NVRTC and no CUDA headers; the image's payloads are checked against their digests before
    anything reaches the driver.

    Parameters
    ----------
    bundle: a path, the bundle's bytes, or ``importlib.resources.files(pkg) / "k.nbjit"``.
    name: the image to load; may be left out where the bundle holds one.
    lazy: load on first use instead (no GPU needed now), as ``nbjit.load`` takes it: the
        kernels describe themselves from the manifest's signatures meanwhile.
    keep_debug: as ``nbjit.load``.

    Raises
    ------
    BundleError: not a bundle, a damaged or altered one (named member), one made by a newer
    nbjit, one that breaks the format's rules; no image of that name (the message lists
    them). NbjitLoadError: no entry runs on this device, or the driver refused it.
    """
    archive = open_bundle(bundle)
    module = load_image(archive, pick(records(archive), name, archive.source), lazy=lazy, keep_debug=keep_debug)
    install_answers(archive)
    return module


def install_answers(archive: "Archive") -> int:
    """Put the tuning answers a bundle ships (members ``tuning/<key>.nbjit``, cache entry
    files of ``nbjit.tune``) in the default cache, where it has none under that key: in
    memory and on disk, so that ``nbjit.tune`` finds them here and times nothing. How many
    were put there."""
    n = 0
    for name in _listed_members(archive):
        if not name.startswith("tuning/"):
            continue
        from nbjit.cache.entries import _KEY, _decode  # (a bundle without answers needs no cache)
        from nbjit.cache.store import default_cache
        key = name[len("tuning/"):-len(".nbjit")] if name.endswith(".nbjit") else ""
        if not _KEY.fullmatch(key):
            raise BundleError(f"{archive.source}: member {name!r}: a tuning answer is tuning/<64 hex digits>.nbjit")
        entry, why = _decode(read_member(archive, name), key)
        if entry is None or entry.kind != "tuning":
            raise BundleError(f"{archive.source}: member {name!r} is not a tuning answer "
                              f"({why or 'an entry of kind ' + entry.kind})")
        cache = default_cache()
        if cache.lookup(key, warn=False) is None:
            cache.write(key, entry, refresh=True)
            n += 1
    return n


def load_image(archive: "Archive", rec: dict, *, lazy: bool = False, keep_debug: bool = False) -> "Module":
    """Image ``rec`` of a checked ``archive`` loaded (``load_bundle``'s second half)."""
    from nbjit.loading.module import load

    mod = load(image_of(archive, rec), lazy=lazy, keep_debug=keep_debug)
    if rec["numba"]:  # @cuda.jit kernels: their arguments as the manifest records them (records' fields too)
        mod._learn(numba=numba_args(rec, archive.source))
    return mod


# ------------------------------------------------------------------ the archive


class Archive:
    """A bundle's archive, checked: where it came from (``source``, for messages), its
    manifest (format and version checked) and its members, read on demand."""

    __slots__ = ("source", "manifest", "_members", "_data")

    def __init__(self, source: str, manifest: dict, members: dict, data: bytes):
        self.source = source
        self.manifest = manifest
        self._members = members  # name -> ZipInfo
        self._data = data  # the archive's bytes (its members are stored: read by slicing)

    @property
    def names(self) -> list[str]:
        """The members' names, manifest aside."""
        return [n for n in self._members if n != MANIFEST]

    def read(self, name: str) -> bytes:
        """Member ``name``'s bytes, checked against the archive's CRC-32 (as ``ZipFile.read``
        checks a stored member: its local header's signature and name, its extent, its CRC;
        read from the archive's bytes, without ``ZipFile``'s file objects)."""
        zi = self._members[name]
        data, at = self._data, zi.header_offset
        why = ""
        if at < 0 or at + _LOCAL.size > len(data):
            why = "its local header lies outside the archive"
        else:
            sig, flags, n, m = _LOCAL.unpack_from(data, at)
            start = at + _LOCAL.size + n + m
            if sig != b"PK\x03\x04":
                why = "bad magic number for its local header"
            elif flags & 0x1:
                why = "it is encrypted"
            elif _name(data[at + _LOCAL.size:at + _LOCAL.size + n], flags) != zi.orig_filename:
                why = "the names in its central directory entry and its local header differ"
            elif start + zi.compress_size > len(data):
                why = "it runs past the end of the archive"
            else:
                out = data[start:start + zi.compress_size]
                if zlib.crc32(out) == zi.CRC:
                    return out
                why = "bad CRC-32"
        raise BundleError(f"{self.source}: member {name!r} is damaged: {why}")


def _name(raw: bytes, flags: int) -> str | None:
    """A local header's member name as ``zipfile`` decodes it (UTF-8 where flag 0x800 says so,
    else code page 437), or None where it does not decode."""
    try:
        return raw.decode("utf-8" if flags & 0x800 else "cp437")
    except UnicodeDecodeError:
        return None


def open_bundle(bundle: Any, name: str | None = None) -> Archive:
    """A bundle's archive and manifest, read and checked (the payloads are read on demand):
    ``bundle`` is a path, its bytes (``name`` names them in messages) or an
    ``importlib.resources`` Traversable. ``BundleError`` for anything that is not a bundle
    of a format this nbjit reads."""
    data, src = _bytes_of(bundle)
    src = name or src
    archive = Archive(src, {}, _archive(data, src), data)
    m = read_json(archive.read(MANIFEST), f"{src}: {MANIFEST}", BundleError)
    check_format(m, FORMAT, VERSION, f"{src}: {MANIFEST}", "an nbjit bundle manifest", BundleError)
    if not isinstance(m.get("images"), list) or not m["images"]:
        raise BundleError(f"{src}: {MANIFEST}: no images")
    archive.manifest = m
    return archive


def read_json(raw: bytes, where: str, exc: type[Exception]) -> Any:
    """A JSON document nbjit wrote (no NaN or Infinity), or ``exc`` saying ``where`` it is not."""
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise exc(f"{where} is not JSON: {str(e)[:200]}") from None


def check_format(d: Any, fmt: str, newest: int, where: str, what: str, exc: type[Exception]) -> None:
    """``d`` is a document of format ``fmt`` in a version this nbjit reads (1 to ``newest``);
    else ``exc``: not one (``what`` it should be), or one a newer nbjit made (upgrade nbjit)."""
    if not isinstance(d, dict) or d.get("format") != fmt:
        raise exc(f"{where}: not {what} (its format is not {fmt!r})")
    version = d.get("version")
    if type(version) is not int or version < 1:
        raise exc(f"{where}: format version {version!r} is not one nbjit writes")
    if version > newest:
        raise exc(f"{where}: made by a newer nbjit (format {version}; this one reads {newest}): upgrade nbjit")


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


def _archive(data: bytes, src: str) -> dict:
    """The members of the ZIP archive in ``data`` by name (their ``ZipInfo``), after the
    format's checks on each member's name, flags and sizes (its bytes are read later, on demand)."""
    if not data.startswith(b"PK\x03\x04"):
        what = ""
        try:
            what = f" (it is a {sniff(data, src)}: load it with nbjit.load)"
        except ImageFormatError:
            pass
        raise BundleError(f"{src}: not an nbjit bundle (a ZIP archive of a manifest and images){what}")
    _count_members(data, src)  # (before ZipFile, which makes a ZipInfo of every entry)
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as e:
        raise BundleError(f"{src}: a damaged bundle (not a readable ZIP archive: {e})") from None
    members: dict = {}
    total = 0
    for zi in infos:
        name = zi.filename
        where = f"{src}: member {name!r}"
        if _escapes(name):
            raise BundleError(f"{where}: a name outside the archive (absolute, '..' or a drive); bundle members are "
                              "<image>/<arch>.cubin or .ptx")
        if name in members:
            raise BundleError(f"{where} appears twice")
        if zi.flag_bits & 0x41:  # (0x40: strong encryption)
            raise BundleError(f"{where} is encrypted; bundle members are stored as they are")
        if zi.flag_bits & 0x20:
            raise BundleError(f"{where} is compressed patched data; bundle members are stored as they are")
        if zi.compress_type != zipfile.ZIP_STORED:
            raise BundleError(f"{where} is compressed; bundle members are stored uncompressed (so cuobjdump reads "
                              "them as they are)")
        total += zi.file_size
        if zi.file_size != zi.compress_size or total > len(data):
            raise BundleError(f"{where} claims {zi.file_size} bytes, more than the archive holds")
        if name.endswith("/"):
            continue  # a directory entry, from a zip tool
        members[name] = zi
    manifest = members.get(MANIFEST)
    if manifest is None:
        raise BundleError(f"{src}: no {MANIFEST} (not an nbjit bundle)")
    if manifest.file_size > MAX_MANIFEST_BYTES:
        raise BundleError(f"{src}: {MANIFEST} has {manifest.file_size} bytes, more than nbjit reads "
                          f"({MAX_MANIFEST_BYTES})")
    return members


def _count_members(data: bytes, src: str) -> None:
    """Refuse an archive of more than ``MAX_MEMBERS`` members from its end records and central
    directory alone, found as ``zipfile`` finds them: the end-of-central-directory record's
    count (its zip64 form's where there is one), then the central directory's entries counted
    (``zipfile`` reads the directory to its claimed size, whatever the count says). Damage is
    left for ``zipfile`` to name."""
    at = len(data) - _EOCD.size
    if not (at >= 0 and data.startswith(b"PK\x05\x06", at) and data.endswith(b"\0\0")):
        at = data.rfind(b"PK\x05\x06", max(at - (1 << 16), 0))  # (after an archive comment of up to 64 KiB)
        if at < 0 or at + _EOCD.size > len(data):
            return
    _, count, cd_size = _EOCD.unpack_from(data, at)
    cd_end = at
    z = at - _ZIP64_LOCATOR.size - _ZIP64_EOCD.size  # zip64: its record, then its locator, before the end record
    if z >= 0 and data.startswith(b"PK\x06\x07", at - _ZIP64_LOCATOR.size) and data.startswith(b"PK\x06\x06", z):
        _, count, cd_size = _ZIP64_EOCD.unpack_from(data, z)
        cd_end = z
    if count > MAX_MEMBERS:
        raise BundleError(f"{src}: {count} members, more than a bundle has ({MAX_MEMBERS})")
    at, n = cd_end - cd_size, 0
    while 0 <= at < cd_end and at + _CENTRAL.size <= len(data):
        sig, name, extra, comment = _CENTRAL.unpack_from(data, at)
        if sig != b"PK\x01\x02":
            return
        n += 1
        if n > MAX_MEMBERS:
            raise BundleError(f"{src}: more than {MAX_MEMBERS} members in its central directory (its end record "
                              f"says {count}), more than a bundle has")
        at += _CENTRAL.size + name + extra + comment


def _no_constant(word: str):
    raise ValueError(f"{word} is not a JSON number")


def _escapes(name: str) -> bool:
    parts = name.replace("\\", "/").split("/")
    return name.startswith(("/", "\\")) or ".." in parts or (len(name) > 1 and name[1] == ":") or "\0" in name


def is_image_name(name: Any) -> bool:
    """Whether ``name`` may name an image (one safe path component): letters, digits, '_',
    '.', '+', '-', at most 128 of them, not starting with '.', '+' or '-'."""
    return isinstance(name, str) and 0 < len(name) <= 128 and not name.strip(_NAME_CHARS) and name[0] not in ".+-"


# ------------------------------------------------------------------ the manifest's images


def records(archive: Archive) -> list[dict]:
    """Every image of the manifest, checked (its fields, its entries' names, kinds,
    architectures, digests and sizes, its C declarations) as a dict of those values:
    ``name``, ``entries`` [(file, kind, Arch, sha256, size, resources, globals)] (the last two
    a cubin's own facts where the manifest records them, else None), ``name_expressions``,
    ``declarations``, ``sources``, ``options``, ``producer``, ``toolchain``, ``triton``,
    ``numba`` (the argument types of ``@cuda.jit`` kernels as JSON: ``numba_args`` reads them),
    ``kernels`` (the manifest's JSON, decoded by ``kernels``); each member in one image, and
    none outside them. Linear in the manifest's size: at most ``MAX_IMAGES`` images."""
    src = archive.source
    images = archive.manifest["images"]
    if len(images) > MAX_IMAGES:
        raise BundleError(f"{src}: {MANIFEST}: {len(images)} images, more than a bundle has ({MAX_IMAGES}: each has "
                          f"members of its own, and a bundle at most {MAX_MEMBERS})")
    out: list[dict] = []
    names: set = set()
    used: dict = {}  # member -> the image that lists it
    for i, d in enumerate(images):
        rec = _record(d, i, archive)
        name = rec["name"]
        if name in names:
            raise BundleError(f"{src}: {MANIFEST}: two images are called {name!r}")
        for e in rec["entries"]:
            other = used.setdefault(e[0], name)
            if other != name:
                raise BundleError(f"{src}: {MANIFEST}: member {e[0]!r} is listed by images {other!r} and {name!r} "
                                  "(each image has members of its own)")
        names.add(name)
        out.append(rec)
    listed = _listed_members(archive)
    extra = sorted(set(archive.names) - used.keys() - listed.keys())
    if extra:
        raise BundleError(f"{src}: member {extra[0]!r} is in no image of the manifest (the bundle was altered)")
    clash = sorted(used.keys() & listed.keys())
    if clash:
        raise BundleError(f"{src}: {MANIFEST}: member {clash[0]!r} is listed by an image and as a member of its own")
    return out


def _listed_members(archive: Archive) -> dict[str, tuple[str, int]]:
    """The manifest's ``members``: other files of the bundle than images' (a saved graph's
    description), each {name: {"sha256", "size"}}; as {name: (sha256, size)}."""
    m = archive.manifest.get("members", {})
    src = archive.source
    if not isinstance(m, dict) or len(m) > MAX_MEMBERS:
        raise BundleError(f"{src}: {MANIFEST}: members is an object {{name: {{sha256, size}}}}")
    out = {}
    for name, d in m.items():
        if not (isinstance(d, dict) and set(d) == {"sha256", "size"} and isinstance(d["sha256"], str)
                and len(d["sha256"]) == 64 and not d["sha256"].strip(_HEX) and type(d["size"]) is int
                and d["size"] >= 0) or name == MANIFEST:
            raise BundleError(f"{src}: {MANIFEST}: member {name!r}: not a member nbjit lists ({{sha256, size}})")
        out[name] = (d["sha256"], d["size"])
    return out


def read_member(archive: Archive, name: str) -> bytes | None:
    """A member the manifest lists under ``members`` (not an image's), checked against its
    size and SHA-256; None where the manifest lists none of that name."""
    want = _listed_members(archive).get(name)
    if want is None:
        return None
    if name not in archive.names:
        raise BundleError(f"{archive.source}: member {name!r} is listed by the manifest but missing")
    data = archive.read(name)
    if len(data) != want[1] or hashlib.sha256(data).hexdigest() != want[0]:
        raise BundleError(f"{archive.source}: member {name!r} does not match its SHA-256 in the manifest (the bundle "
                          "was altered)")
    return data


def _record(d: Any, i: int, archive: Archive) -> dict:
    if not isinstance(d, dict):
        raise BundleError(f"{archive.source}: {MANIFEST}: image {i} is {type(d).__name__}, not an object")
    name = d.get("name")
    if not is_image_name(name):
        raise BundleError(f"{archive.source}: {MANIFEST}: image {i}: {name!r} is not an image name (letters, digits, "
                          "'_', '.', '+', '-')")

    def bad(msg: str) -> BundleError:
        return image_error(archive.source, name, msg)

    entries = d.get("entries")
    if not isinstance(entries, list) or not entries:
        raise bad("no entries")
    got, seen, files = [], set(), set()
    for e in entries:
        entry = _entry(e, archive, bad)
        if entry[1:3] in seen or entry[0] in files:
            raise bad(f"two entries for {entry[1]} {entry[2]}")
        seen.add(entry[1:3])
        files.add(entry[0])
        got.append(entry)
    lowered = d.get("name_expressions", {})
    if not isinstance(lowered, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in lowered.items()):
        raise bad("name_expressions is not {expression: mangled name}")
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
    producer = d.get("producer")
    if producer is not None and not isinstance(producer, str):
        raise bad(f"producer is {type(producer).__name__}, not text")
    kernels = d.get("kernels", {})
    if not isinstance(kernels, dict):
        raise bad("kernels is not {name: kernel}")
    numba = d.get("numba", {})  # (read by numba_args, for the image used: only its own kernels need the ABI)
    if not isinstance(numba, dict):
        raise bad("numba is not {kernel: arguments}")
    return {"numba": numba, "name": name, "entries": got, "name_expressions": dict(lowered),
            "declarations": _declarations(d.get("declarations", {}), bad), "sources": tuple(sources),
            "options": tuple(options), "producer": producer, "toolchain": d.get("toolchain"), "triton": triton,
            "kernels": kernels}


def numba_args(rec: dict, src: str) -> dict:
    """The ``@cuda.jit`` kernels' arguments of image ``rec`` of bundle ``src``, as Numba passes
    them: ``{kernel: (NumbaArray | NumbaScalar, ...)}`` (empty for other images)."""
    if not rec["numba"]:
        return {}
    from nbjit.params import numba_abi  # (only for an image of @cuda.jit kernels)
    out = {}
    for k, v in rec["numba"].items():
        try:
            out[k] = numba_abi.from_json(v)
        except ValueError as e:
            raise image_error(src, rec["name"], f"numba: kernel {str(k)[:80]!r}: {e}") from None
    return out


def _entry(e: Any, archive: Archive, bad) -> tuple:
    if not isinstance(e, dict):
        raise bad(f"an entry is {type(e).__name__}, not an object")
    file, kind, arch, sha, size = (e.get(k) for k in ("file", "kind", "arch", "sha256", "size"))
    if kind not in KINDS:
        raise bad(f"entry {file!r}: kind {kind!r} is not 'cubin' or 'ptx'")
    try:
        a = Arch.parse(arch) if isinstance(arch, str) else None
    except ValueError:
        a = None
    if a is None or a.virtual != (kind == "ptx"):
        raise bad(f"entry {file!r}: {arch!r} is not a {'virtual (compute_XX)' if kind == 'ptx' else 'real (sm_XX)'} "
                  "architecture")
    if not isinstance(sha, str) or len(sha) != 64 or sha.strip(_HEX) or type(size) is not int:
        raise bad(f"entry {file!r}: no sha256 (64 hex digits) and size")
    if not isinstance(file, str) or file == MANIFEST or file not in archive._members:
        raise bad(f"entry {file!r}: the archive has no such member")
    resources, globals_ = e.get("resources"), e.get("globals")
    if resources is not None and not (kind == "cubin" and isinstance(resources, dict) and all(
            isinstance(r, dict) and all(type(v) is int for v in r.values()) for r in resources.values())):
        raise bad(f"entry {file!r}: resources is not {{kernel: {{resource: count}}}} of a cubin")
    if globals_ is not None and not (kind == "cubin" and isinstance(globals_, list) and all(
            isinstance(g, dict) and isinstance(g.get("name"), str) and type(g.get("size")) is int for g in globals_)):
        raise bad(f"entry {file!r}: globals is not a list of a cubin's {{name, size, ...}}")
    return file, kind, a, sha, size, resources, None if globals_ is None else tuple(globals_)


def image_error(src: str, image: str, msg: str) -> BundleError:
    """A ``BundleError`` about image ``image`` of the manifest of bundle ``src``."""
    return BundleError(f"{src}: {MANIFEST}: image {image!r}: {msg}")


def payload(archive: Archive, rec: dict, entry: tuple) -> bytes:
    """An entry's payload, checked against the archive's CRC-32 and the manifest's size and
    SHA-256, and its architecture against what the payload says of it (``payload_arch``: a
    cubin's ELF header, PTX's ``.target``), before anything reaches the driver."""
    file, kind, arch, sha, size = entry[:5]
    data = archive.read(file)
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
        raise image_error(archive.source, rec["name"], f"member {file!r}: its bytes do not match the manifest's size "
                          "and SHA-256 (the bundle is damaged or was altered)")
    own = payload_arch(kind, data)
    if own is not None and (own[0] != arch.number or own[1] not in (None, arch.variant)):
        said = f"{'sm' if kind == 'cubin' else 'compute'}_{own[0]}{own[1] or ''}"
        where = "its ELF header" if kind == "cubin" else "its .target"
        raise image_error(archive.source, rec["name"], f"member {file!r}: the manifest lists it for {arch}, but it is "
                          f"{kind} for {said} ({where}): the bundle was altered")
    return data


def _declarations(d: Any, bad) -> dict[str, tuple]:
    """The manifest's C declarations as an image carries them: {kernel: (label, (CParam, ...))}."""
    from nbjit.params.cdecl import CParam

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


def kernels(rec: dict, src: str) -> dict:
    """The image's kernels as the manifest of bundle ``src`` lists them, ``{name:
    KernelInfo}``: the signatures merged from every entry when the bundle was built
    (``KernelInfo.from_json``)."""
    from nbjit.params.signature import KernelInfo

    out = {}
    for k, d in rec["kernels"].items():
        try:
            info = KernelInfo.from_json(d)
            if info.name != k:
                raise ValueError(f"{k!r} lists kernel {info.name!r}")
        except ValueError as e:
            raise image_error(src, rec["name"], f"kernels: {e}") from None
        out[k] = info
    return out


def pick(recs: list[dict], name: str | None, src: str) -> dict:
    """The image called ``name``; the only one where ``name`` is None."""
    names = [r["name"] for r in recs]
    if name is None:
        if len(recs) == 1:
            return recs[0]
        raise BundleError(f"{src}: holds {len(names)} images ({', '.join(names)}): say which with name=")
    for r in recs:
        if r["name"] == name:
            return r
    raise BundleError(f"{src}: no image {name!r}; it holds {', '.join(names)}")


# ------------------------------------------------------------------ the image to load


def image_of(archive: Archive, rec: dict) -> Image:
    """Image ``rec`` of ``archive`` as the loader takes it (``fatbin_image``), each payload
    checked first, with the manifest's signatures of its kernels and what it records of each
    cubin."""
    typed = kernels(rec, archive.source)
    entries = [(kind, arch, payload(archive, rec, e), EntryFacts.of(arch, typed, res, glob))
               for e in rec["entries"] for _, kind, arch, _, _, res, glob in (e,)]
    img = fatbin_image(f"{archive.source}:{rec['name']}", entries, rec["name_expressions"], rec["declarations"],
                       typed)
    kept = [s for s in rec["sources"] if "program" in s and "member" in s]
    if kept:  # (an image compiled with line information: its source, which the loader writes where they point)
        img = dataclasses.replace(img, sources={s["program"]: _source_text(archive, rec, s) for s in kept})
    return img


def _source_text(archive: Archive, rec: dict, s: dict) -> str:
    """The CUDA C++ source an image keeps as member ``s["member"]``, checked."""
    data = read_member(archive, s["member"])
    if data is None or hashlib.sha256(data).hexdigest() != s.get("sha256"):
        raise image_error(archive.source, rec["name"], f"source {s['member']!r} is not the member the manifest "
                          "lists with its SHA-256")
    return data.decode("utf-8", "surrogatepass")


class EntryFacts:
    """What a kernel bundle's manifest records of one cubin entry: the parts of its
    ``CubinInfo`` a loaded module uses, so that loading it reads no ELF. ``arch``;
    ``entries``, the image's kernels (their signatures merged from every entry) with this
    cubin's own resources (made on first use: a device loads one entry of several);
    ``globals``, its module variables (``.name``, ``.size``, ...)."""

    __slots__ = ("arch", "globals", "_typed", "_resources", "_entries")

    def __init__(self, arch: Arch, typed: dict, resources: dict, globals_: tuple):
        self.arch = arch
        self.globals = tuple(types.SimpleNamespace(**g) for g in globals_)
        self._typed, self._resources = typed, resources
        self._entries: tuple | None = None

    @classmethod
    def of(cls, arch: Arch, typed: dict, resources: dict | None, globals_: tuple | None) -> "EntryFacts | None":
        """The facts of a cubin entry whose resources and globals the manifest records (and
        whose kernels it lists), else None (the loader reads the cubin)."""
        if resources is None or globals_ is None or not typed:
            return None
        return cls(arch, typed, resources, globals_)

    @property
    def entries(self) -> tuple:
        if self._entries is None:
            from nbjit.params.signature import RESOURCES, replace

            self._entries = tuple(replace(k, **{r: v for r, v in self._resources.get(name, {}).items()
                                                if r in RESOURCES}) for name, k in self._typed.items())
        return self._entries

    def entry(self, name: str):
        """The kernel called ``name`` (KeyError if none), as ``CubinInfo.entry``."""
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(name)

    def __repr__(self) -> str:
        return f"<EntryFacts {self.arch}: {len(self.entries)} kernels, from a bundle's manifest>"


def fatbin_image(label: str, entries: list[tuple], lowered: dict, declarations: dict,
                 typed: dict | None = None) -> Image:
    """A fatbin ``Image`` of an image's entries ``[(kind, Arch, payload, facts)]`` (facts: an
    ``EntryFacts`` or None) with its name expressions and C declarations, listing where each
    entry lies and what it holds (so the loader reads no container, and no cubin whose facts
    are given) and, where given, its kernels' signatures (so a module waiting for first use
    reads no payload). PTX first: a module unpickled elsewhere, without the manifest,
    describes its kernels from the first entry, and PTX has the types."""
    ordered = sorted(entries, key=lambda e: e[0] != "ptx")
    try:
        data, spans = layout_fatbin([e[:3] for e in ordered], source=label)
    except ImageFormatError as e:
        raise BundleError(str(e)) from None
    listed = tuple((e[0], e[1], offset, length, e[3]) for e, (offset, length) in zip(ordered, spans))
    return Image(data, "fatbin", label, None, dict(lowered), declarations=dict(declarations), typed=typed or {},
                 entries=listed)
