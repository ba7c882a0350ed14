"""GPU architectures (``sm_90``, ``sm_90a``, ``sm_100f``, ``compute_90``): one type, one
"runs on" rule. Pure data.

The rule (CUDA's compatibility rules for SASS and PTX):

* SASS ``sm_XY`` and family ``sm_XYf`` run on devices of the same major version X with a minor
  version of at least Y (``sm_80`` on sm_86; ``sm_100f`` on sm_103);
* ``a`` builds (``sm_90a``, ``compute_90a``) run only on exactly that chip;
* PTX ``compute_XY`` is JIT-compiled on any device of compute capability X.Y or newer;
* family PTX ``compute_XYf`` only within its family: same major, minor of at least Y.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from nbjit.records import record

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Arch", "ArchLike", "existence_problem", "pick"]


def _split(text: str) -> tuple[str, str, str] | None:
    """``(prefix, digits, variant)`` of ``text`` as ``re.fullmatch(r"(sm|compute)?_?(\\d+)([af]?)")``
    splits it, or None. Read by hand: compiling that pattern cost a bundle's first kernel
    0.2 ms."""
    prefix = "compute" if text.startswith("compute") else "sm" if text.startswith("sm") else ""
    rest = text[len(prefix):]
    if rest[:1] == "_":
        rest = rest[1:]
    variant = rest[-1:] if rest[-1:] in ("a", "f") else ""
    digits = rest[:len(rest) - len(variant)]
    return (prefix, digits, variant) if digits.isdecimal() else None


@record(eq=False)
class Arch:
    """An architecture: ``number`` (90 for compute capability 9.0), ``variant`` (``""``,
    ``"a"`` arch-specific, ``"f"`` family) and whether it is ``virtual`` (PTX, ``compute_``).

    ``str()`` gives its name (``"sm_90a"``), and an Arch compares equal to that exact text
    (``Arch(90) == "sm_90"``, not ``"SM_90"`` nor ``"90"``) and hashes as it does, so code
    written when architectures were text keeps working (``img.arch == "sm_90"``, a dict keyed
    by the text). It does not order: sort by ``.number`` or by ``str()``."""

    number: int
    variant: str = ""
    virtual: bool = False

    def __post_init__(self) -> None:
        if self.variant not in ("", "a", "f"):
            raise ValueError(f"architecture variant must be '', 'a' or 'f', not {self.variant!r}")
        if not 10 <= self.number <= 9999:
            raise ValueError(f"not an architecture number: {self.number!r}")
        object.__setattr__(self, "_text", f"{'compute' if self.virtual else 'sm'}_{self.number}{self.variant}")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Arch):
            return self._text == other._text  # (the text is one-to-one with the fields)
        if isinstance(other, str):
            return self._text == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._text)  # as the text's: equal to it, so hashed like it

    def __reduce__(self):
        return Arch, (self.number, self.variant, self.virtual)

    @classmethod
    def parse(cls, arch: "ArchLike", *, virtual: bool | None = None) -> "Arch":
        """``"sm_90a"``, ``"compute_100f"``, ``"90"``, ``90``, ``(9, 0)`` or an Arch.
        ``virtual`` overrides what the text says (a bare number is real unless told)."""
        if isinstance(arch, Arch):
            return arch if virtual is None or arch.virtual == virtual else cls(arch.number, arch.variant, virtual)
        if type(arch) is str or type(arch) is tuple:  # (an Arch is immutable: one per text, shared)
            try:
                got = _PARSED.get((arch, virtual))
            except TypeError:  # a tuple of something unhashable: refused below
                return _parse(arch, virtual)
            if got is None:
                got = _parse(arch, virtual)
                if len(_PARSED) < _PARSED_KEPT:
                    _PARSED[(arch, virtual)] = got
                    if type(got.virtual) is bool:  # (its own text's parse: the same Arch)
                        _PARSED[(got._text, None)] = got
            return got
        return _parse(arch, virtual)

    @property
    def major(self) -> int:
        return self.number // 10

    @property
    def minor(self) -> int:
        return self.number % 10

    @property
    def cc(self) -> tuple[int, int]:
        """The compute capability, e.g. (9, 0)."""
        return self.major, self.minor

    def real(self) -> "Arch":
        """The SASS architecture of the same chip and variant (``compute_90a`` -> ``sm_90a``)."""
        return Arch(self.number, self.variant, False)

    def __str__(self) -> str:
        return self._text

    def runs_on(self, device: "ArchLike") -> bool:
        """Whether code built for this architecture runs on a device of ``device``'s compute
        capability (see the module's rule)."""
        dev = Arch.parse(device).number
        if self.variant == "a":
            return dev == self.number
        if self.virtual and self.variant == "":
            return dev >= self.number
        return dev // 10 == self.major and dev >= self.number


ArchLike = Arch | str | int | tuple[int, int]

# The compute capabilities of the chips NVIDIA has shipped (CUDA 13's list; sm_101 was renamed
# sm_110). A number between them names no device; one above the last may be a newer chip.
SHIPPED = (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 107, 110, 120, 121)
# chips older CUDAs built for (Fermi, Kepler): they exist, a fatbin may hold their code, and a
# compiler says whether it still builds for them
RETIRED = (20, 21, 30, 32, 35, 37)
# CUDA has arch-specific ('a') builds from sm_90 on and family ('f') builds from sm_100 on.
VARIANTS_FROM = {"a": 90, "f": 100}


def existence_problem(arch: Arch, near: "Sequence[int]" = SHIPPED) -> str | None:
    """Why ``arch`` names no chip CUDA builds for (``sm_91``, ``sm_89a``, ``sm_90f``), or None
    where it names a shipped chip (a retired one too: ``sm_35``) or one newer than every
    shipped chip (a chip to come); the architectures it suggests are drawn from ``near`` (a
    compiler's own list: only what it compiles for)."""
    if arch.variant and arch.number < VARIANTS_FROM[arch.variant]:
        kind = "arch-specific ('a')" if arch.variant == "a" else "family ('f')"
        return f"{kind} builds exist from sm_{VARIANTS_FROM[arch.variant]}{arch.variant} on"
    if arch.number not in SHIPPED and arch.number not in RETIRED and arch.number < SHIPPED[-1]:
        prefix = "compute" if arch.virtual else "sm"
        near = ", ".join(f"{prefix}_{n}" for n in near if abs(n - arch.number) <= 10)
        return "no chip has that compute capability" + (f" (near it: {near})" if near else "")
    return None


def pick(entries: "Sequence[tuple[str, Arch]]", device: ArchLike) -> int | None:
    """The index of the entry a device runs among ``entries``, each ``(kind, arch)``, kind
    "cubin", "ptx" or another (never picked, e.g. "ltoir": it runs nowhere before a link):
    SASS for this very chip first (an arch-specific build before a generic one), then the
    newest SASS that runs on it, then the newest PTX it can JIT; the earlier entry where two
    are alike. None where none runs on it. (A fatbin's entries and a kernel bundle's are
    chosen by this one rule.)"""
    dev = Arch.parse(device).number
    best, best_key = None, None
    for i, (kind, a) in enumerate(entries):
        if kind not in ("cubin", "ptx") or not a.runs_on(dev):  # (LTO-IR runs nowhere before it is linked)
            continue
        if kind == "cubin":
            key = (2, a.variant == "a", 0, -i) if a.number == dev else (1, a.number, 0, -i)
        else:
            key = (0, a.number, a.variant == "a", -i)
        if best_key is None or key > best_key:
            best, best_key = i, key
    return best


def _parse(arch, virtual: bool | None) -> Arch:
    if isinstance(arch, tuple) and len(arch) == 2 and all(isinstance(x, int) for x in arch):
        return Arch(arch[0] * 10 + arch[1], "", bool(virtual))
    if isinstance(arch, int) and not isinstance(arch, bool):
        return Arch(arch, "", bool(virtual))
    m = _split(str(arch).strip().lower()) if isinstance(arch, str) else None
    if m is None:
        raise ValueError(f"not an architecture: {arch!r} (expected e.g. 'sm_90', 'sm_90a', 'compute_90' or (9, 0))")
    return Arch(int(m[1]), m[2], m[0] == "compute" if virtual is None else virtual)


# texts and (major, minor) pairs -> their Arch, parsed once each; a pair's parse is its text's
# too ((9, 0) and then "sm_90": a warm start's device, then its cache entry's arch)
_PARSED: dict = {}
_PARSED_KEPT = 1024
