"""What nbjit reads from an image, kept beside the image in a cache entry: a lossless JSON
form of the inspection results (``CubinInfo`` and the kernels, parameters and directives
in it) and of a source's C declarations, so that a warm cache hit parses no ELF and no
source. Facts carry their version (``FACTS_VERSION``); facts of another are not used."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from nbjit.arch import Arch
from nbjit.params.cdecl import CParam
from nbjit.params.signature import Directives, KernelInfo, KernelSignature, Param
from nbjit.read.cubin import CubinInfo, GlobalSymbol
from nbjit.records import field, record

_CLASSES = {c.__name__: c for c in (CubinInfo, GlobalSymbol, KernelInfo, KernelSignature, Param, Directives, CParam)}
_FIELDS = {name: tuple(f.name for f in dataclasses.fields(c)) for name, c in _CLASSES.items()}


class FactsError(ValueError):
    """Something in a facts record that this code does not write."""


@record
class Facts:
    """What nbjit read from a compiled image and its source, kept in its cache entry:
    ``declarations`` (the source's kernels' C declarations, ``{kernel: (origin, (CParam,
    ...))}``), ``info`` (the cubin's ``CubinInfo``; None for PTX), ``typed`` (``{kernel:
    KernelInfo}`` typed from both and the mangled names, as loading would type them) and
    ``resources`` (``{function: {"stack_frame", "spill_stores", "spill_loads": bytes}}`` as
    ptxas reported them in the compiler's log, where the options asked for its report;
    empty otherwise)."""

    declarations: Mapping[str, tuple]
    info: CubinInfo | None = None
    typed: Mapping[str, KernelInfo] = field(default_factory=dict)
    resources: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def keep(facts: Facts) -> dict:
    """``facts`` as the JSON data a cache entry's description holds, stamped with this code."""
    return {"stamp": stamp(), "info": encode(facts.info), "declarations": encode(dict(facts.declarations)),
            "typed": encode(dict(facts.typed)), "resources": {k: dict(v) for k, v in facts.resources.items()}}


def read(data: Any, kind: str) -> Facts | None:
    """The ``Facts`` in ``data`` (what ``keep`` made) for an image of ``kind``; None where there
    are none, they were read by other code (another stamp), or are not of the shape ``keep``
    writes: then they are to be read from the image again."""
    if not isinstance(data, dict) or data.get("stamp") != stamp() or data.get("declarations") is None:
        return None
    try:  # (the three in one call)
        got = decode({"declarations": data["declarations"], "info": data.get("info"), "typed": data.get("typed")})
        decls, info, typed = got["declarations"], got["info"], got["typed"]
    except (FactsError, TypeError, RecursionError):  # (TypeError: a record's fields its class does not take)
        return None
    resources = data.get("resources", {})
    if not isinstance(decls, dict) or not (info is None or isinstance(info, CubinInfo)) or \
            (info is None) != (kind != "cubin") or not isinstance(typed, dict) or \
            not all(isinstance(v, KernelInfo) for v in typed.values()) or not _resources(resources):
        return None
    return Facts(decls, info, typed, resources)


_RESOURCE_KEYS = {"stack_frame", "spill_stores", "spill_loads"}


def _resources(data: Any) -> bool:
    """Whether ``data`` is a ``Facts.resources`` as ``keep`` writes it."""
    return isinstance(data, dict) and all(
        isinstance(r, dict) and r.keys() == _RESOURCE_KEYS and all(type(v) is int for v in r.values())
        for r in data.values())


# What the facts of an image are: bump by hand where the readers, the declaration parser or
# the compiler's derivation (typing, ptxas's report) would make other facts of the same bytes,
# or where their encoding changes. Facts stamped with another version are read afresh from the
# image. tests/test_facts.py fails where the facts of its corpus (tests/data/expected/facts.json)
# change while this does not.
FACTS_VERSION = 1


def stamp() -> str:
    """Identifies what facts mean (``FACTS_VERSION``): facts of another are read afresh."""
    return _STAMP


_STAMP = f"facts:{FACTS_VERSION}"


def encode(obj: Any) -> Any:
    """``obj`` (the dataclasses above, tuples, dicts with string keys, str, int, float,
    bool, None) as JSON data: an instance as ``[class name, bit mask of the fields that
    are records, *fields]``, a tuple as
    ``["", *items]`` (of tuples of plain values, ``["2", *rows]``); ``FactsError`` for
    anything else."""
    if obj is None or isinstance(obj, (str, bool, int, float)):
        return obj
    if type(obj) is Arch:  # (as text: a CubinInfo's arch, decoded back to an Arch)
        return str(obj)
    if isinstance(obj, tuple):
        if obj and all(type(x) is tuple and all(type(y) in _PLAIN for y in x) for x in obj):
            return [_PAIRS, *(list(x) for x in obj)]  # a parameter's origin, say: decoded in one call
        return ["", *(encode(x) for x in obj)]
    name = type(obj).__name__
    if _CLASSES.get(name) is type(obj):
        fields = [encode(getattr(obj, f)) for f in _FIELDS[name]]
        # which fields hold records (bit i: field i), so that decoding visits only those
        nested = sum(1 << i for i, v in enumerate(fields) if type(v) in (list, dict))
        return [name, nested, *fields]
    if isinstance(obj, dict) and all(isinstance(k, str) for k in obj):
        return {k: encode(v) for k, v in obj.items()}
    raise FactsError(f"cannot keep a {name} as facts")


_PLAIN = (str, int, bool, float, type(None))
_PAIRS = "2"  # the tag of a tuple of tuples of plain values


def _plain_tuples(rows: list) -> tuple:
    try:
        return tuple(map(tuple, rows))
    except TypeError:  # a row that is not a list
        raise FactsError(f"not a facts record: {str(rows)[:80]}") from None


def _arch(text: Any) -> Arch:
    try:
        if type(text) is str:
            return Arch.parse(text)
    except ValueError:
        pass
    raise FactsError(f"not an architecture: {text[:80] if type(text) is str else type(text).__name__}")


def decode(data: Any) -> Any:
    """The object ``encode`` made ``data`` from; ``FactsError`` where ``data`` is not such."""
    t = type(data)
    if t is list and data and type(data[0]) is str:
        tag = data[0]
        if tag == _PAIRS:
            return _plain_tuples(data[1:])
        if not tag:
            return tuple([x if type(x) in _PLAIN else decode(x) for x in data[1:]])
        names = _FIELDS.get(tag)  # [class, mask of the fields that hold records, *fields]
        if names is not None and len(data) == len(names) + 2 and type(data[1]) is int and \
                0 <= data[1] < 1 << len(names):
            nested, vals = data[1], data[2:]
            while nested:  # only the fields the mask names are records
                i = (nested & -nested).bit_length() - 1
                vals[i] = decode(vals[i])
                nested &= nested - 1
            obj = object.__new__(_CLASSES[tag])  # frozen dataclasses without checks in __init__:
            obj.__dict__.update(zip(names, vals))  # their fields set directly, as unpickling does
            if tag == "CubinInfo":
                obj.__dict__["arch"] = _arch(obj.__dict__["arch"])
            return obj
    elif t is dict:
        return {k: v if type(v) in _PLAIN else decode(v) for k, v in data.items()}
    elif t in _PLAIN:
        return data
    raise FactsError(f"not a facts record: {str(data)[:80]}")
