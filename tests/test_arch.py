"""One architecture type and one "runs on" rule (nbjit.arch), as one table."""
from __future__ import annotations

import pytest

from nbjit.arch import Arch
from nbjit.read.fatbin import select_entry


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

    from nbjit.read.fatbin import FatbinEntry
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


@pytest.mark.parametrize("text", ["sm_90", "sm_90a", "sm_100f", "compute_80", "compute_90a", "compute_100f"])
def test_an_arch_equals_its_exact_text_and_hashes_like_it(text):
    """Architectures are values; code written when they were text keeps comparing them to
    text (img.arch == "sm_90"), and equal things hash alike (a dict keyed by the text)."""
    import copy
    import pickle

    a = Arch.parse(text)
    assert a == text and text == a and not (a != text) and hash(a) == hash(text)
    assert {text: 1}[a] == 1 and {a: 1}[text] == 1 and a in {text} and text in {a}
    assert (a, a) == (text, text) and a in [text]
    assert a == Arch.parse(text.upper()) and a != text.upper() and a != str(a.number)  # exact text only
    assert a != a.number and a != (a.major, a.minor)  # nor a number: one hash cannot match both
    other = Arch(a.number, a.variant, not a.virtual)
    assert a != other and a != str(other) and len({a, other, text}) == 2
    for b in (pickle.loads(pickle.dumps(a)), copy.deepcopy(a), Arch(a.number, a.variant, a.virtual)):
        assert b == a and hash(b) == hash(a) and str(b) == text
    with pytest.raises(TypeError):
        sorted([a, other])  # (no order: sort by .number or str())


def test_architectures_cross_modules_as_values_and_json_keeps_text():
    import json
    from pathlib import Path

    from nbjit.cache import facts as _facts
    from nbjit.read.cubin import inspect_cubin
    from nbjit.read.fatbin import inspect_fatbin
    from nbjit.read.image import Image

    img = Image(b"\0", "cubin", arch="sm_90a")
    assert type(img.arch) is Arch and img.arch == "sm_90a" and img.arch == Arch(90, "a")
    assert Image(b"\0", "cubin").arch is None
    nv = Path(__file__).parent / "data" / "nvcc"
    info = inspect_cubin((nv / "kernels_sm_90a.cubin").read_bytes())
    assert type(info.arch) is Arch and info.arch == "sm_90a" and info.to_json()["arch"] == "sm_90a"
    data = json.loads(json.dumps(_facts.encode(info)))
    assert data[2] == "sm_90a"  # the cache entry's facts keep the text
    assert type(_facts.decode(data).arch) is Arch and _facts.decode(data) == info
    bad = [*data[:2], "sm_9x", *data[3:]]
    with pytest.raises(_facts.FactsError):
        _facts.decode(bad)
    fb = inspect_fatbin((nv / "lto_sm90_none.fatbin").read_bytes())
    assert [type(e.arch) for e in fb.entries] == [Arch, Arch]
    assert [(e.arch, e.arch_name, e.to_json()["arch"]) for e in fb.entries] == [
        ("sm_90", "sm_90", "sm_90"), ("compute_90", "lto_90", "lto_90")]
