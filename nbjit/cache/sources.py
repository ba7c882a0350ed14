"""The CUDA C++ source of a kernel compiled with line information (``-lineinfo``, ``-G``),
kept with its cache entry and written where its line table points when it is loaded, so that
``cuda-gdb``, ``compute-sanitizer`` and Nsight Compute show source lines in any process.

NVRTC names the program's file in the line table as nbjit names the program. For such a
compile that name is a placeholder of fixed length: ``/nbjit-sources`` padded with slashes to
``PREFIX_BYTES``, then ``/<digest>/<file name>``, where ``<digest>`` is the first 16 hex digits
of the source's SHA-256. The placeholder is the same on every machine, so the cache entry stays
portable. A loader replaces the padded prefix with this user's directory, ``sources/`` under
the cache, padded with slashes to the same length (a path reads the same with any run of
slashes). Every offset in the image stays where it was. The source is written there under its
digest.

The headers it reads from the user's include directories are kept too. NVRTC is given each
such directory padded with slashes and a final ``/.`` to ``HEADER_DIR_BYTES`` (it names a
header as the directory it was given, then the name it was included by). After the compile,
each padded directory in the image is replaced, in place, by ``<placeholder prefix>/<digest>``,
where ``<digest>`` is that of the headers kept from that directory (their names and contents):
the line table then names none of the user's directories. The loader writes them under that
digest, each at its name in the directory."""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterable, Mapping

from nbjit.files import read_regular

__all__ = ["HEADER_DIR_BYTES", "PREFIX_BYTES", "header_dirs", "kept_kind", "kept_sources", "local_path", "merged",
           "portable", "program_name", "relocated", "sources_root", "wants_sources"]

MARK = "/nbjit-sources"
PREFIX_BYTES = 128  # the placeholder's prefix: MARK and slashes
_PREFIX = (MARK + "/" * (PREFIX_BYTES - len(MARK))).encode()
HEADER_DIR_BYTES = PREFIX_BYTES + 17  # a kept header directory's placeholder: the prefix, then /<16 hex digits>
MAX_KEPT_BYTES = 4 << 20  # the headers kept with one compile, at most, as JSON (a directory past it is not kept)
_LINE_INFO = frozenset({"-lineinfo", "-G"})  # (as normalize_options spells them)
_DIGEST = re.compile(r"[0-9a-f]{16}")


def wants_sources(options: Iterable[str]) -> bool:
    """Whether a compile with ``options`` (normalised) writes a line table."""
    return any(o in _LINE_INFO for o in options)


def program_name(source: str, name: str) -> str:
    """The program name NVRTC is given for ``source`` (named ``name``) compiled with line
    information: the placeholder path its line table will hold."""
    return f"{_PREFIX.decode()}/{_digest(source)}/{os.path.basename(name) or 'kernel.cu'}"


def kept_sources(program: str, source: str, headers: Mapping[str, str] | None = None,
                 swaps: Iterable[tuple[str, str]] = ()) -> dict:
    """What a cache entry keeps of its source and of the ``headers`` kept with it (their
    placeholder paths and texts, ``header_dirs``): its ``meta``, ``{"sources": {program: text}}``;
    for LTO-IR (whose paths nbjit cannot replace), also ``"swaps"``: the pairs ``portable``
    replaces in the linked cubin."""
    swaps = [list(s) for s in swaps]
    return {"sources": {program: source, **(headers or {})}, **({"swaps": swaps} if swaps else {})}


def kept_kind(program: str, text: str) -> str:
    """``"cuda"`` where ``program`` is the placeholder of the source ``text`` itself,
    ``"header"`` where it is a header kept with one (``header_dirs``)."""
    parts = _kept_file(program)
    return "cuda" if parts is not None and "/" not in parts[1] and parts[0] == _digest(text) else "header"


def header_dirs(dirs: Iterable[str], found: Iterable[tuple[str, str]]) -> tuple[dict[str, tuple[str, str]],
                                                                                dict[str, str]]:
    """For a compile with line information whose user include directories are ``dirs`` and
    which reads the headers ``found``, (path as opened, a directory NVRTC finds it through) as
    ``walk_includes`` found them: ``{directory: (what NVRTC is given instead, its
    placeholder)}`` for each directory that headers are found through, and ``{placeholder
    path: text}`` of each header kept, under its name below that directory. Left as they are
    (their lines name where NVRTC read them): a directory that is not ASCII or is longer than
    ``HEADER_DIR_BYTES - 2`` bytes; one through which a header is named with ``..``, ``.`` or
    a name that is not ASCII (NVRTC escapes it), or that is not UTF-8 text; and one whose
    headers would take the compile's past ``MAX_KEPT_BYTES`` (as JSON, as the entry keeps them)."""
    found = [(f, through, _absolute(through)) for f, through in found if through]
    swaps, kept, size = {}, {}, 0
    for d in dict.fromkeys(dirs):
        where = _absolute(d)
        if not where.isascii() or len(where) > HEADER_DIR_BYTES - 2:
            continue
        texts = _headers_through([(f, through) for f, through, a in found if a == where])
        more = _json_bytes(texts) if texts else 0
        if not texts or size + more > MAX_KEPT_BYTES:
            continue
        size += more
        placeholder, placed = _placed(texts)
        # (ending in "/.": NVRTC drops an include directory's trailing slash before adding its own)
        swaps[d] = (where + "/" * (HEADER_DIR_BYTES - 1 - len(where)) + ".", placeholder)
        kept.update(placed)
    return swaps, kept


def _headers_through(paths: list[tuple[str, str]]) -> dict[str, str] | None:
    """``{name below the directory: text}`` of the headers (path as the walk opened it, the
    directory it was found through, as spelled); None where any cannot be kept."""
    texts = {}
    for f, through in paths:
        base = through.rstrip("/")
        if base in ("", "."):  # (the source's own directory, the working directory)
            rel = f[2:] if f.startswith("./") else (None if os.path.isabs(f) else f)
        else:
            rel = f[len(base) + 1:] if f.startswith(base + "/") else None
        if rel is None or not rel.isascii() or not _relative_name(rel):  # (as NVRTC names it: no .., no escapes)
            return None
        try:
            texts[rel] = read_regular(f, MAX_KEPT_BYTES).decode()
        except (OSError, ValueError):  # (not readable, not a regular file, not UTF-8, too large)
            return None
    return texts


def merged(sources: Mapping[str, str], swaps: Iterable[tuple[str, str]]) -> tuple[dict[str, str],
                                                                                list[tuple[str, str]]]:
    """The kept sources and swaps of compiles linked into one image. Where two of them padded
    the same directory, each kept the headers it read through it under a placeholder of its
    own, but the linked image names that directory once: one placeholder for it, whose headers
    are all of theirs, the texts moved under it. Where the headers would pass
    ``MAX_KEPT_BYTES``, none is kept and no swap made (the image's paths stay as NVRTC read them)."""
    out, by_given = dict(sources), {}
    for given, placeholder in swaps:
        files = by_given.setdefault(given, {})
        for k in [k for k in out if k.startswith(placeholder + "/")]:
            files[k[len(placeholder) + 1:]] = out.pop(k)
    if sum(_json_bytes(files) for files in by_given.values()) > MAX_KEPT_BYTES:
        return out, []
    pairs = []
    for given, files in by_given.items():
        if files:
            placeholder, placed = _placed(files)
            pairs.append((given, placeholder))
            out.update(placed)
    return out, pairs


def _placed(texts: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The placeholder directory of the headers ``{name: text}`` (their digest's), and each
    header's placeholder path with its text."""
    placeholder = f"{_PREFIX.decode()}/{_set_digest(texts)}"
    return placeholder, {f"{placeholder}/{rel}": text for rel, text in texts.items()}


def _json_bytes(texts: Mapping[str, str]) -> int:
    """What the texts take in an entry's JSON description."""
    return sum(len(json.dumps(t)) for t in texts.values())


def portable(data: bytes, swaps: Iterable[tuple[str, str]]) -> bytes:
    """``data`` (what NVRTC, or nvJitLink from NVRTC's LTO-IR, made with the directories
    ``header_dirs`` gave it) naming each directory's placeholder instead: ``swaps`` are
    (directory as given, placeholder). The same length, every offset where it was. (PTX
    names a header's whole path; a cubin's line table its directory, ended by a NUL, and its
    name.) A pair that is not one ``header_dirs`` makes is skipped."""
    for given, placeholder in swaps:
        if not (len(given.encode()) == len(placeholder.encode()) == HEADER_DIR_BYTES and given.endswith("/.")
                and _kept_file(placeholder + "/x") is not None):
            continue
        data = re.sub(re.escape(given.encode()) + rb'(?=[/\0"])', placeholder.encode(), data)
    return data


def _absolute(d: str) -> str:
    """``d`` as an absolute path with one leading slash (``abspath`` keeps two)."""
    a = os.path.abspath(d)
    return "/" + a.lstrip("/") if a.startswith("//") else a


def _relative_name(rel: str) -> bool:
    """Whether ``rel`` names a file below a directory: UTF-8, no empty part, ``.``, ``..`` or NUL."""
    try:
        rel.encode()
    except UnicodeEncodeError:  # (a lone surrogate, from a crafted entry: no file can be named by it)
        return False
    return "\0" not in rel and all(p not in ("", ".", "..") for p in rel.split("/"))


def _set_digest(texts: Mapping[str, str]) -> str:
    """The first 16 hex digits of the SHA-256 of the headers ``{name: text}``."""
    h = hashlib.sha256()
    for rel in sorted(texts):
        h.update(f"{rel}\0{_digest(texts[rel], 64)}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def _digest(text: str, n: int = 16) -> str:
    """The first ``n`` hex digits of ``text``'s SHA-256."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def sources_root() -> str | None:
    """Where this user's sources are written: ``sources`` in the default cache's directory
    (``NBJIT_CACHE_DIR`` and the rest, as ``default_cache`` reads them), or None where the cache
    is in memory only."""
    from nbjit.cache.store import default_cache  # (deferred: a loader whose image names no source reads no cache)
    root = default_cache().path
    return None if root is None else os.path.join(os.path.abspath(str(root)), "sources")


def local_path(path: str) -> str:
    """Where a line table's file is here: a placeholder's in this user's ``sources_root()``,
    any other path as it is."""
    parts = _kept_file(path)
    root = sources_root() if parts is not None else None
    return path if root is None else os.path.join(root, *parts)


def _kept_file(program: str) -> tuple[str, str] | None:
    """(digest, name below it) of a placeholder ``program``; None for anything else: a name
    with ``..``, ``.``, an empty part or a NUL in it (what a crafted cache entry or bundle
    manifest could hold)."""
    prefix = _PREFIX.decode()
    if not program.startswith(prefix):
        return None
    digest, sep, name = program[PREFIX_BYTES:].lstrip("/").partition("/")
    if not sep or not _DIGEST.fullmatch(digest) or not _relative_name(name):
        return None
    return digest, name


def _verified(sources: Mapping[str, str]) -> list[tuple[str, str]]:
    """(``<digest>/<name>``, text) of each of ``sources`` that nbjit made for that text: a
    source alone under its own text's digest, or headers under the digest of all of them."""
    groups: dict[str, dict[str, str]] = {}
    for program, text in sources.items():
        parts = _kept_file(program) if isinstance(program, str) and isinstance(text, str) else None
        if parts is not None:
            groups.setdefault(parts[0], {})[parts[1]] = text
    out = []
    for digest, files in groups.items():
        (name, text), *more = files.items()
        if (not more and "/" not in name and _digest(text) == digest) or _set_digest(files) == digest:
            out += [(f"{digest}/{n}", t) for n, t in files.items()]
    return out


def relocated(data: bytes, sources: Mapping[str, str], root: str | None = None) -> bytes:
    """``data`` (a cubin, PTX or fatbin) with each placeholder prefix in its line tables
    pointing at ``root`` (default ``sources_root()``), and the texts of ``sources`` (an entry's
    ``kept_sources``) written there: each under its digest, and only where the placeholder
    is one nbjit makes for that text. ``data`` as it is where it names no placeholder, or where
    ``root`` is None or longer than the prefix (the lines then stay unresolved)."""
    if _PREFIX not in data:
        return data
    root = sources_root() if root is None else os.path.abspath(root)
    target = None if root is None else os.fsencode(root)
    if target is None or len(target) > PREFIX_BYTES:
        return data
    for rest, text in _verified(sources):
        _write(root, rest, text)
    return data.replace(_PREFIX, target + b"/" * (PREFIX_BYTES - len(target)))


def _write(root: str, rest: str, text: str) -> None:
    """``text`` at ``root/rest`` where it is not there already: written whole under a name of
    its own, then renamed (a reader never sees part of it), with the mode a new file gets (the
    umask applies, as to a cache entry); never through a link that leads out of ``root``. A
    directory that cannot be written leaves it unwritten."""
    data = text.encode("utf-8", "surrogatepass")
    path = os.path.join(root, rest)
    try:
        if read_regular(path, len(data) + 1) == data:
            return
    except (OSError, ValueError):
        pass
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        real_root = os.path.realpath(root)
        if os.path.commonpath([real_root, os.path.realpath(os.path.dirname(path))]) != real_root:
            return
        tmp = os.path.join(os.path.dirname(path), f".tmp-{secrets.token_hex(8)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except (OSError, ValueError):  # (ValueError: a name the file system cannot take)
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except (OSError, ValueError):
        try:
            os.unlink(tmp)
        except OSError:
            pass
