"""One architecture type and one "runs on" rule (nbjit.arch), as one table."""
from __future__ import annotations

import pytest

from nbjit.arch import Arch
from nbjit.fatbin import select_entry


@pytest.mark.parametrize("text,number,variant,virtual", [
    ("sm_90", 90, "", False), ("sm_90a", 90, "a", False), ("compute_100f", 100, "f", True),
    ("compute_90", 90, "", True), ("90", 90, "", False), ("SM_120", 120, "", False),
])
def test_parse_and_str(text, number, variant, virtual):
    a = Arch.parse(text)
    assert (a.number, a.variant, a.virtual) == (number, variant, virtual)
    assert Arch.parse(str(a)) == a
    assert Arch.parse((number // 10, number % 10)).number == number and Arch.parse(number).number == number


@pytest.mark.parametrize("bad", ["sm_", "sm90x", "gfx942", "", "sm_9", (9,), 3.5, None])
def test_not_architectures(bad):
    with pytest.raises(ValueError):
        Arch.parse(bad)


# code built for            sm_80  sm_86  sm_89  sm_90  sm_100 sm_103 sm_120 sm_121
RULE = {
    "sm_80":              (1,     1,     1,     0,     0,     0,     0,     0),
    "sm_86":              (0,     1,     1,     0,     0,     0,     0,     0),
    "sm_90":              (0,     0,     0,     1,     0,     0,     0,     0),
    "sm_90a":             (0,     0,     0,     1,     0,     0,     0,     0),
    "sm_100":             (0,     0,     0,     0,     1,     1,     0,     0),
    "sm_100a":            (0,     0,     0,     0,     1,     0,     0,     0),
    "sm_100f":            (0,     0,     0,     0,     1,     1,     0,     0),
    "sm_120f":            (0,     0,     0,     0,     0,     0,     1,     1),
    "compute_80":         (1,     1,     1,     1,     1,     1,     1,     1),
    "compute_90":         (0,     0,     0,     1,     1,     1,     1,     1),
    "compute_90a":        (0,     0,     0,     1,     0,     0,     0,     0),
    "compute_100f":       (0,     0,     0,     0,     1,     1,     0,     0),
    "compute_120":        (0,     0,     0,     0,     0,     0,     1,     1),
}
DEVICES = [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0), (12, 1)]


@pytest.mark.parametrize("arch", list(RULE))
def test_runs_on_table(arch):
    got = tuple(int(Arch.parse(arch).runs_on(d)) for d in DEVICES)
    assert got == RULE[arch], arch


@pytest.mark.parametrize("arch", list(RULE))
def test_fatbin_choice_and_loader_follow_the_same_rule(arch):
    """A fatbin entry is chosen exactly where the rule says it runs (the loader's check and
    the fatbin choice once disagreed on compute_100f for sm_120)."""
    from dataclasses import replace

    from nbjit.fatbin import FatbinEntry
    a = Arch.parse(arch)
    e = FatbinEntry(0, "ptx" if a.virtual else "cubin", a.number, a.variant == "a", a.variant == "f", None, 0, 0, 0,
                    False, (9, 0) if a.virtual else None, b"")
    assert str(e.target) == arch
    for d, ok in zip(DEVICES, RULE[arch]):
        assert (select_entry([e], d) is not None) == bool(ok), (arch, d)
        assert replace(e).target.runs_on(d) == bool(ok)


def test_pick_is_the_rule_fatbins_and_bundles_share():
    from nbjit.arch import pick
    a = Arch.parse
    entries = [("cubin", a("sm_86")), ("cubin", a("sm_80")), ("cubin", a("sm_89a")), ("ptx", a("compute_80")),
               ("ptx", a("compute_90a")), ("ptx", a("compute_100f")), ("cubin", a("sm_100f")), ("cubin", a("sm_89"))]
    assert pick(entries, "sm_89") == 2  # this very chip, its arch-specific build first
    assert pick(entries, "sm_87") == 0  # else the newest SASS that runs on it
    assert pick(entries, "sm_90") == 4  # else the newest PTX it can JIT (compute_90a: only on 9.0)
    assert pick(entries, (10, 3)) == 6  # family SASS within its family
    assert pick(entries, 120) == 3  # compute_100f is not for 12.x; compute_80 is
    assert pick(entries, "sm_75") is None
    assert pick([("cubin", a("sm_90")), ("cubin", a("sm_90"))], "sm_90") == 0  # the earlier of two alike
