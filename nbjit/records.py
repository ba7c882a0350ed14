"""Records and patterns that cost next to nothing at import.

Records: nbjit's result and parameter classes, made as ``dataclasses.dataclass`` makes them
(the same fields, ``__init__``, ``repr``, equality, hashing, frozen-ness and ``__post_init__``;
``dataclasses.fields``, ``replace``, ``asdict`` and ``is_dataclass`` work on them), without
generating and compiling Python source for each class.

``dataclass`` compiles each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__`` from text: 0.3-0.5 ms a class, and a bundle's first kernel
makes about twenty of these classes (measured: 16 ms of dataclasses against 0.5 ms of records
on the 2-core development machine). Here each method is a closure over the class's field
table, made in microseconds. The ``Field`` objects that ``dataclasses.fields`` returns are
made when it first asks for them. Only what nbjit uses is offered: ``frozen`` and ``eq``;
fields with a default, a ``default_factory``, ``repr=False``, ``compare=False``; no
``order``, ``slots``, ``kw_only``, ``InitVar`` or ``ClassVar`` (refused, so a new use is
noticed).

Patterns: regular expressions compiled on first use (``Pattern``)."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import MISSING, Field, FrozenInstanceError, field

__all__ = ["Pattern", "field", "record"]


_FIELD = dataclasses._FIELD  # (what dataclasses.fields() looks for in a Field: a field proper)
_setattr = object.__setattr__


def record(cls: type | None = None, /, *, frozen: bool = True, eq: bool = True):
    """``@record`` / ``@record(frozen=False, eq=False)``: ``cls`` made a dataclass (as
    ``@dataclass(frozen=frozen, eq=eq)`` would make it)."""
    def wrap(c: type) -> type:
        return _make(c, frozen, eq)
    return wrap if cls is None else wrap(cls)


def _fields_of(cls: type) -> tuple[dict[str, tuple], dict[str, Field]]:
    """``cls``'s fields, its bases' first, each ``(default, default_factory, repr, compare,
    hash)``: what ``_make`` needs, read without making the ``Field`` objects (those are made
    when ``__dataclass_fields__`` is first read: ``_Fields``); and the ``Field`` objects the
    class body gave. Refuses what ``record`` does not offer, and what dataclasses refuse."""
    out: dict[str, tuple] = {}
    given: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        table = base.__dict__.get("__dataclass_fields__")
        if table is None:
            continue
        if type(table) is _Fields:
            out.update(table.table)
        else:  # (a dataclass base)
            out.update((n, (f.default, f.default_factory, f.repr, f.compare, f.hash)) for n, f in table.items())
    for name, kind in cls.__dict__.get("__annotations__", {}).items():
        text = kind if isinstance(kind, str) else getattr(kind, "__name__", "")
        if text.startswith(("ClassVar", "InitVar", "typing.ClassVar", "dataclasses.InitVar", "KW_ONLY")):
            raise TypeError(f"{cls.__name__}.{name}: record() takes plain fields only")
        value = cls.__dict__.get(name, MISSING)
        if isinstance(value, Field):
            f = value
            if f.kw_only is True or f.init is False:
                raise TypeError(f"{cls.__name__}.{name}: record() takes no kw_only or init=False fields")
            if f.default is not MISSING and f.default_factory is not MISSING:
                raise ValueError(f"{cls.__name__}.{name}: cannot give both default and default_factory")
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
            given[name] = f
            value = f.default
            out[name] = (value, f.default_factory, f.repr, f.compare, f.hash)
        else:  # (a plain default stays the class attribute it is)
            out[name] = (value, MISSING, True, True, None)
        if value is not MISSING and value.__class__.__hash__ is None:
            raise ValueError(f"{cls.__name__}.{name}: mutable default {type(value)} is not allowed: "
                             "use default_factory")
    return out, given


class _Fields:
    """A record's ``__dataclass_fields__`` until it is first read (``dataclasses.fields``,
    ``replace``, ``asdict``, ``is_dataclass``): then the ``Field`` objects are made, as
    ``dataclass`` makes them, and replace it. A package's first kernel from a bundle reads
    none."""

    __slots__ = ("cls", "table", "given")

    def __init__(self, cls: type, table: dict[str, tuple], given: dict[str, Field]):
        self.cls, self.table, self.given = cls, table, given

    def __get__(self, obj, owner=None) -> dict[str, Field]:
        cls = self.cls
        out: dict[str, Field] = {}
        for base in reversed(cls.__mro__[1:]):
            out.update(getattr(base, "__dataclass_fields__", {}))
        for name, kind in cls.__dict__.get("__annotations__", {}).items():
            f = self.given.get(name)
            if f is None:
                f = field(default=self.table[name][0])
            f.name, f.type, f._field_type = name, kind, _FIELD
            if f.kw_only is MISSING:
                f.kw_only = False
            out[name] = f
        type.__setattr__(cls, "__dataclass_fields__", out)
        return out


def _make(cls: type, frozen: bool, eq: bool) -> type:
    fields, given = _fields_of(cls)  # {name: (default, default_factory, repr, compare, hash)}
    table = _Table(fields)
    cls.__init__ = _named(cls, "__init__", _init(cls.__qualname__, fields, table, getattr(cls, "__post_init__", None)))
    if "__repr__" not in cls.__dict__:
        cls.__repr__ = _named(cls, "__repr__", _repr(table.shown))
    if eq and "__eq__" not in cls.__dict__:
        cls.__eq__ = _named(cls, "__eq__", _eq(table.compared))
    if "__hash__" not in cls.__dict__ or (eq and cls.__dict__["__hash__"] is None):
        if eq and frozen:
            cls.__hash__ = _named(cls, "__hash__", _hash(table.hashed))
        elif eq:
            cls.__hash__ = None  # (as dataclasses: equal by value and mutable, so unhashable)
    if frozen:
        _freeze(cls, fields)
    cls.__dataclass_fields__ = _Fields(cls, fields, given)
    cls.__match_args__ = table.names
    if "__doc__" not in cls.__dict__ or cls.__doc__ is None:
        cls.__doc__ = f"{cls.__name__}({', '.join(table.names)})"
    return cls


class _Table:
    """What a record's methods read, from its fields in one pass (a record's making is on a
    bundle's route): the names, the defaults and factories, the required names, those shown,
    compared and hashed."""

    __slots__ = ("names", "defaults", "factories", "required", "shown", "compared", "hashed")

    def __init__(self, fields: dict[str, tuple]):
        self.names = tuple(fields)
        self.defaults, self.factories = {}, {}
        required, shown, compared, hashed = [], [], [], []
        after_default = False
        for n, (default, factory, in_repr, in_eq, in_hash) in fields.items():
            if default is not MISSING:
                self.defaults[n] = default
            if factory is not MISSING:
                self.factories[n] = factory
            if default is MISSING and factory is MISSING:
                if after_default:  # (as dataclasses: no required field after a default)
                    raise TypeError(f"non-default argument {n!r} follows default argument")
                required.append(n)
            else:
                after_default = True
            if in_repr:
                shown.append(n)
            if in_eq:
                compared.append(n)
            if in_eq if in_hash is None else in_hash:
                hashed.append(n)
        self.required, self.shown = tuple(required), tuple(shown)
        self.compared, self.hashed = tuple(compared), tuple(hashed)


def _init(qual: str, fields: dict, table: _Table, post_init):
    """The record's ``__init__``: the usual call (positional, each required field given) on a
    short path; keywords, defaults, factories and the errors dataclasses gives otherwise."""
    names, defaults, factories, required = table.names, table.defaults, table.factories, table.required
    count, n_required = len(names), len(required)
    takes = f"{count + 1}" if n_required == count else f"from {n_required + 1} to {count + 1}"
    # each field's default in the fields' own order (None for a required one, which every call
    # this serves gives, and for one a factory makes, made below), and where the factories are
    template = {n: defaults.get(n) for n in names}
    made = tuple((i, n, factories[n]) for i, n in enumerate(names) if n in factories)

    def __init__(self, *args, **kwargs):
        k = len(args)
        if not kwargs and n_required <= k <= count:
            if k == count:
                d = dict(zip(names, args))
            else:
                d = template.copy()
                d.update(zip(names, args))
                for i, n, make in made:
                    if i >= k:
                        d[n] = make()
            _setattr(self, "__dict__", d)
            if post_init is not None:
                post_init(self)
            return
        if len(args) > count:
            raise TypeError(f"{qual}.__init__() takes {takes} positional arguments but "
                            f"{len(args) + 1} were given")
        d = dict(zip(names, args))
        if kwargs:
            for k in kwargs:
                if k in d:
                    raise TypeError(f"{qual}.__init__() got multiple values for argument {k!r}")
                if k not in fields:
                    raise TypeError(f"{qual}.__init__() got an unexpected keyword argument {k!r}")
            d.update(kwargs)
        if len(d) < count:
            missing = [n for n in required if n not in d]
            if missing:
                raise TypeError(f"{qual}.__init__() missing {len(missing)} required positional "
                                f"argument{'s' if len(missing) > 1 else ''}: "
                                + ", ".join(repr(n) for n in missing))
            for n, v in defaults.items():
                d.setdefault(n, v)
            for n, make in factories.items():
                if n not in d:
                    d[n] = make()
        if len(args) < count:
            d = {n: d[n] for n in names}  # (the fields' own order, as dataclasses sets them)
        _setattr(self, "__dict__", d)
        if post_init is not None:
            post_init(self)

    return __init__


def _repr(shown: tuple[str, ...]):
    active: set = set()

    def __repr__(self):
        key = id(self)  # (as dataclasses: a record that holds itself is shown as ...)
        if key in active:
            return "..."
        active.add(key)
        try:
            d = self.__dict__
            return f"{type(self).__qualname__}(" + ", ".join(f"{n}={d[n]!r}" for n in shown) + ")"
        finally:
            active.discard(key)

    return __repr__


def _eq(compared: tuple[str, ...]):
    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        a, b = self.__dict__, other.__dict__
        return tuple(a[n] for n in compared) == tuple(b[n] for n in compared)

    return __eq__


def _hash(hashed: tuple[str, ...]):
    def __hash__(self):
        d = self.__dict__
        return hash(tuple(d[n] for n in hashed))

    return __hash__


def _freeze(cls: type, fields: dict) -> None:
    """``cls``'s fields made read-only, as ``dataclass(frozen=True)`` makes them."""
    for name in ("__setattr__", "__delattr__"):
        if name in cls.__dict__:
            raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")

    def __setattr__(self, name, value):
        if type(self) is cls or name in fields:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        _setattr(self, name, value)

    def __delattr__(self, name):
        if type(self) is cls or name in fields:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        object.__delattr__(self, name)

    cls.__setattr__ = _named(cls, "__setattr__", __setattr__)
    cls.__delattr__ = _named(cls, "__delattr__", __delattr__)


def _named(cls: type, name: str, f):
    f.__qualname__ = f"{cls.__qualname__}.{name}"
    f.__module__ = cls.__module__
    return f


class Pattern:
    """A regular expression compiled on first use, then used as ``re.compile`` made it
    (``.search``, ``.finditer``, ``.pattern``...): compiling a module's patterns at import is
    most of importing it, and most are for inputs a given process never reads."""

    __slots__ = ("_args", "_compiled")

    def __init__(self, pattern: str | bytes, flags: int = 0):
        self._args = (pattern, flags)
        self._compiled = None

    def __getattr__(self, name: str):
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = re.compile(*self._args)
        return getattr(compiled, name)
