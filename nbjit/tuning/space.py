"""A tuning space: named choices (``{"BLOCK": [128, 256], "ITEMS": [1, 2, 4]}``), checked, and
its variants, one dict of choices each, in the order of the product. Choices are JSON scalars
(int, float, str, bool): they become template arguments, ``-D`` values, launch dimensions
and parts of an answer's cache key."""
from __future__ import annotations

import itertools
import math
import re
from typing import Any, Mapping

from nbjit.errors import NbjitTuneError

__all__ = ["Space", "variant_label"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_VARIANTS = 1 << 16


class Space:
    """The choices of a search, checked: each name an identifier, each list of choices
    non-empty, without repeats, of JSON scalars."""

    __slots__ = ("choices",)

    def __init__(self, space: Mapping[str, Any]) -> None:
        if not isinstance(space, Mapping) or not space:
            raise NbjitTuneError(f"tune: the space must be a non-empty dict of name -> choices, not {space!r}")
        out: dict[str, tuple] = {}
        for name, values in space.items():
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise NbjitTuneError(f"tune: space name {name!r} is not an identifier (it names a template argument, "
                                     "a macro or a launch setting)")
            if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
                raise NbjitTuneError(f"tune: space[{name!r}] must be a list of choices, not {values!r}")
            vals = tuple(values)
            if not vals:
                raise NbjitTuneError(f"tune: space[{name!r}] has no choices")
            for v in vals:
                if not isinstance(v, (int, float, str, bool)) or (isinstance(v, float) and not math.isfinite(v)):
                    raise NbjitTuneError(f"tune: space[{name!r}] holds {v!r}: choices are ints, finite floats, "
                                         "strings or bools")
            if len({(type(v), v) for v in vals}) != len(vals):
                raise NbjitTuneError(f"tune: space[{name!r}] repeats a choice: {list(vals)}")
            out[name] = vals
        if math.prod(len(v) for v in out.values()) > _MAX_VARIANTS:
            raise NbjitTuneError(f"tune: the space has {math.prod(len(v) for v in out.values())} variants, more "
                                 f"than {_MAX_VARIANTS}: narrow it")
        self.choices = out

    def __len__(self) -> int:
        return math.prod(len(v) for v in self.choices.values())

    def __repr__(self) -> str:
        return f"Space({self.to_json()!r})"

    def variants(self) -> list[dict]:
        """Every combination of choices, as dicts, in the product's order (the first name's
        choices change slowest)."""
        names = list(self.choices)
        return [dict(zip(names, combo)) for combo in itertools.product(*self.choices.values())]

    def to_json(self) -> dict:
        """The space as JSON data (names sorted): part of an answer's key."""
        return {name: list(self.choices[name]) for name in sorted(self.choices)}

    def holds(self, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` is one of this space's variants."""
        return set(config) == set(self.choices) and all(
            any(type(c) is type(config[n]) and c == config[n] for c in vals) for n, vals in self.choices.items())


def variant_label(config: Mapping[str, Any]) -> str:
    """``BLOCK=256 ITEMS=4``: how messages and reports name a variant."""
    return " ".join(f"{k}={v}" for k, v in config.items())
