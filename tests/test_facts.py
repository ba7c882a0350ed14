"""Facts kept in cache entries (nbjit/cache/facts.py): a lossless round trip of what inspection
reads from every cubin fixture, and NVRTC entries that carry them, so that a warm hit reads
no ELF and no source; facts from other code, or none, are read afresh and kept."""
from __future__ import annotations

import json
from pathlib import Path
import os
import warnings

import pytest

from nbjit import compile_image, inspect_cubin
from nbjit.toolchain import nvrtc as compiler
from nbjit.cache import facts as _facts
from nbjit.read import cubin as cubin_mod
from nbjit.cache.store import Cache
from nbjit.params.declarations import source_declarations

from conftest import DATA  # noqa: E402

CUBINS = sorted(DATA.rglob("*.cubin"))
SRC = (DATA / "src/nvrtc_tmpl.cu").read_text()
HDR = {"scale.cuh": (DATA / "src/scale.cuh").read_text()}
PLAIN = 'extern "C" __global__ void axpy(float* y, const float* x, float a, int n) { y[n] += a * x[n]; }\n'


@pytest.mark.parametrize("path", CUBINS, ids=[p.name for p in CUBINS])
def test_every_cubin_fixture_round_trips_through_json(path):
    info = inspect_cubin(path.read_bytes(), source=path.name)
    back = _facts.decode(json.loads(json.dumps(_facts.encode(info))))
    assert back == info
    assert [type(e.signature.params) for e in back.entries] == [tuple] * len(back.entries)
    assert hash(back.entries[0].directives) == hash(info.entries[0].directives) if info.entries else True


def test_a_record_marks_the_fields_that_hold_records():
    info = inspect_cubin((DATA / "nvcc/kernels_sm_90.cubin").read_bytes())
    data = _facts.encode(info.entries[0])
    fields = data[2:]
    assert data[0] == "KernelInfo"
    assert data[1] == sum(1 << i for i, v in enumerate(fields) if isinstance(v, (list, dict)))
    assert data[1] and _facts.decode(data) == info.entries[0]


def test_tuples_of_plain_tuples_round_trip_in_one_record():
    origin = (("layout", "cubin"), ("ctype", "source"), (), ("n", 1, None, 2.5, True))
    data = _facts.encode(origin)
    assert data[0] == "2" and _facts.decode(json.loads(json.dumps(data))) == origin
    mixed = ((1, 2), ((3,),))  # not all plain inside: the general form
    assert _facts.encode(mixed)[0] == "" and _facts.decode(_facts.encode(mixed)) == mixed


def test_declarations_round_trip():
    decls = source_declarations((DATA / "src/tma.cu").read_text() + PLAIN)
    assert decls and _facts.decode(json.loads(json.dumps(_facts.encode(decls)))) == decls


@pytest.mark.parametrize("bad", [["NoSuchClass", 1], ["Param", 1, 2], {"x": object()}, ["", {1, 2}], 3j, [],
                                 ["2", ["a", "b"], 1],
                                 # the mask of record fields: an int naming fields the class has
                                 ["CParam", 16, "float", True, False, "y"], ["CParam", -1, "float", True, False, "y"],
                                 ["CParam", True, "float", True, False, "y"], ["CParam", "float", True, False, "y"]])
def test_what_is_not_a_facts_record_is_refused(bad):
    with pytest.raises((_facts.FactsError, TypeError)):
        _facts.decode(bad)


def test_what_cannot_be_kept_is_refused():
    with pytest.raises(_facts.FactsError, match="cannot keep a set"):
        _facts.encode({1, 2})


def test_a_warm_hit_reads_no_elf_and_no_source(tmp_path, monkeypatch):
    first = compile_image(SRC, name_expressions=["fill<float>"], headers=HDR, arch="sm_90", cache=Cache(tmp_path))
    assert first.info == inspect_cubin(first.data, source=first.name)

    def refuse(*a, **k):
        raise AssertionError("read again")
    for where in (cubin_mod, compiler):
        monkeypatch.setattr(where, "inspect_cubin", refuse)
    monkeypatch.setattr("nbjit.params.declarations.source_declarations", refuse)
    monkeypatch.setattr(compiler, "source_declarations", refuse)
    again = compile_image(SRC, name_expressions=["fill<float>"], headers=HDR, arch="sm_90", cache=Cache(tmp_path))
    assert again.info == first.info and again.declarations == first.declarations and again.data == first.data


def test_facts_of_other_code_are_read_afresh_and_kept(tmp_path, monkeypatch):
    c = Cache(tmp_path)
    img = compile_image(PLAIN, arch="sm_90", cache=c)
    (entry_file,) = [f for f, _, _ in c.entries()]
    monkeypatch.setattr(_facts, "stamp", lambda: "another nbjit")
    before = entry_file.stat().st_mtime_ns
    again = compile_image(PLAIN, arch="sm_90", cache=Cache(tmp_path))
    assert again.info == img.info and again.declarations == img.declarations
    assert entry_file.stat().st_mtime_ns != before  # rewritten with this code's facts
    again2 = compile_image(PLAIN, arch="sm_90", cache=Cache(tmp_path))
    assert again2.info == img.info


def test_a_read_only_cache_is_still_used_when_its_facts_are_old(tmp_path, monkeypatch):
    c = Cache(tmp_path)
    compile_image(PLAIN, arch="sm_90", cache=c)
    (entry_file,) = [f for f, _, _ in c.entries()]
    before = entry_file.read_bytes()
    monkeypatch.setattr(_facts, "stamp", lambda: "another nbjit")
    real_open = os.open

    def read_only(path, flags, *a):  # as a read-only file system (root ignores chmod)
        if flags & os.O_CREAT:
            raise PermissionError(13, "Read-only file system", str(path))
        return real_open(path, flags, *a)
    monkeypatch.setattr(os, "open", read_only)
    ro = Cache(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "cannot write" warning either
        img = compile_image(PLAIN, arch="sm_90", cache=ro)
    assert img.info is not None and ro.path == tmp_path  # the refresh failed quietly; the cache is kept
    assert entry_file.read_bytes() == before



def _plant(cache, key, entry, record, monkeypatch):
    """Write ``entry`` with the facts record ``record`` as it stands (what other code, or a
    record this code does not write, leaves in a checked entry)."""
    with monkeypatch.context() as m:
        m.setattr(_facts, "keep", lambda facts: record)
        cache.write(key, entry)


@pytest.mark.parametrize("facts", [{"declarations": ["", 1]}, {"declarations": {}, "info": ["", 1]},
                                   {"declarations": {}, "info": None}])
def test_facts_of_the_wrong_shape_are_read_afresh(tmp_path, facts, monkeypatch):
    c = Cache(tmp_path)
    good = compile_image(PLAIN, arch="sm_90", cache=c)
    (key,) = [f.stem for f, _, _ in c.entries()]
    entry = c.read(key)
    _plant(c, key, entry, {**facts, "stamp": _facts.stamp()}, monkeypatch)
    assert Cache(tmp_path).read(key).facts is None  # not what keep() writes: no facts
    again = compile_image(PLAIN, arch="sm_90", cache=Cache(tmp_path))
    assert again.info == good.info and again.declarations == good.declarations
    assert Cache(tmp_path).read(key).facts == entry.facts  # read afresh, and kept


@pytest.mark.parametrize("field, bad", [("typed", ["", 1]), ("typed", {"axpy": ["", 1]}), ("resources", ["", 1]),
                                        ("resources", {"axpy": {"stack_frame": "0"}}),
                                        ("resources", {"axpy": {"stack_frame": 0, "spill_stores": 0}})])
def test_typed_kernels_and_resources_of_the_wrong_shape_are_read_afresh(tmp_path, field, bad, monkeypatch):
    c = Cache(tmp_path)
    good = compile_image(PLAIN, arch="sm_90", options=["-Xptxas=-v"], cache=c)
    assert set(good.typed) == {"axpy"} and set(good.resources) == {"axpy"}
    (key,) = [f.stem for f, _, _ in c.entries()]
    entry = c.read(key)
    _plant(c, key, entry, {**_facts.keep(entry.facts), field: bad}, monkeypatch)
    again = compile_image(PLAIN, arch="sm_90", options=["-Xptxas=-v"], cache=Cache(tmp_path))
    assert again.typed == good.typed and again.info == good.info and again.resources == good.resources


def test_facts_kept_and_read_are_the_facts(tmp_path):
    """What an entry keeps is what reading it gives back, for a cubin and for PTX; a record
    for the other kind of image is none."""
    c = Cache(tmp_path)
    for output in ("cubin", "ptx"):
        img = compile_image(SRC, name_expressions=["fill<float>"], headers=HDR, arch="sm_90", output=output,
                            options=["-Xptxas=-v"], cache=c)
        f = _facts.Facts(img.declarations, img.info, img.typed, img.resources)
        record = json.loads(json.dumps(_facts.keep(f)))
        assert _facts.read(record, output) == f
        assert _facts.read(record, "ptx" if output == "cubin" else "cubin") is None
        assert _facts.read({**record, "stamp": "another nbjit"}, output) is None
        assert (img.info is None) == (output == "ptx") and img.declarations
        assert bool(img.resources) == (output == "cubin")  # ptxas's report: where ptxas ran


def test_a_warm_hit_types_its_kernels_as_loading_would(tmp_path, fake_device, monkeypatch):
    """The kernels kept typed in an entry are what merging the image, the source and the
    mangled name gives: a hit merges nothing, and a new declaration types afresh."""
    import nbjit
    from nbjit.params import signature

    kw = dict(name_expressions=["fill<float>"], headers=HDR, arch="sm_90")
    cold = nbjit.compile(SRC, cache=Cache(tmp_path), **kw)
    fake_device._registry(fake_device.current_host().current_context()).clear()
    warm = nbjit.compile(SRC, cache=Cache(tmp_path), **kw)
    assert warm is not cold and set(warm._live.typed) == set(warm.kernels) and len(warm.kernels) >= 2
    cold._live.typed.clear()  # typed by merging, as a module without the facts is
    for name in warm.kernels:
        assert warm._make_state(warm._live, name, name, None).info == cold._make_state(cold._live, name, name,
                                                                                       None).info

    def refuse(*a, **k):
        raise AssertionError("merged again")
    monkeypatch.setattr("nbjit.loading.module.merge", refuse)
    k = warm["fill<float>"]
    assert [p.ctype for p in k.params] == ["float*", "float", "int"]
    monkeypatch.setattr("nbjit.loading.module.merge", signature.merge)
    real = warm.image.lowered_names["fill<float>"]
    warm._learn(decls={real: ("source", ())})
    assert real not in warm._live.typed  # a new declaration: typed afresh (here it has no say: 0 parameters)


def test_facts_nested_deeper_than_encode_writes_are_not_read():
    """Data nested far deeper than ``encode`` writes (a damaged or crafted entry that passed
    its checksum): ``read`` gives no facts (the image is read afresh) instead of raising."""
    deep = 1
    for _ in range(5000):  # (deeper than any Python's recursion limit lets the decoder go)
        deep = ["", deep]
    record = {"stamp": _facts.stamp(), "info": None, "declarations": {"k": deep}, "typed": {}, "resources": {}}
    assert _facts.read(record, "ptx") is None


# ------------------------------------------------------------------ the facts' version
# tests/data/expected/facts.json: the facts of a fixed corpus (the cubin fixtures' inspection,
# the CUDA source fixtures' declarations, the typed entries of a cubin with its source's),
# made by this code. Where the readers, the declaration parser or the typing would make other
# facts of the same bytes, the corpus differs, and FACTS_VERSION must be bumped (facts kept by
# an older nbjit would be taken as this one's). Regenerate: python tests/test_facts.py --regenerate

CORPUS = DATA / "expected" / "facts.json"
CORPUS_CUBINS = ["nvcc/kernels_sm_90.cubin", "nvcc/kernels_sm_80.cubin", "nvcc/kernels_sm_90a.cubin",
                 "nvcc/kernels_G_sm_90.cubin", "nvcc/pdl_sm_90.cubin", "nvcc/cluster_sm90.cubin",
                 "triton/add_kernel/add_kernel.cubin"]
CORPUS_SOURCES = ["src/nvrtc_tmpl.cu", "src/spill.cu", "src/block_reduce_op.cu"]


def corpus() -> dict:
    """The facts this code makes of the corpus, as JSON data."""
    from nbjit.params.signature import typed_entries
    out = {"cubins": {}, "declarations": {}, "typed": {}}
    for name in CORPUS_CUBINS:
        out["cubins"][name] = _facts.encode(inspect_cubin((DATA / name).read_bytes(), source=Path(name).name))
    for name in CORPUS_SOURCES:
        out["declarations"][name] = _facts.encode(dict(source_declarations((DATA / name).read_text())))
    info = inspect_cubin((DATA / "nvcc/kernels_sm_90.cubin").read_bytes())
    decls = {k: ("source", v) for k, v in source_declarations((DATA / "src/kernels.cu").read_text()).items()}
    out["typed"] = _facts.encode({e.name: t for e, t in zip(info.entries, typed_entries(info.entries, "cubin", decls))})
    return json.loads(json.dumps(out))


def test_the_facts_version_is_bumped_where_the_facts_change():
    kept = json.loads(CORPUS.read_text())
    now = corpus()
    if kept["version"] != _facts.FACTS_VERSION:
        pytest.fail(f"FACTS_VERSION is {_facts.FACTS_VERSION}, the corpus was made at {kept['version']}: regenerate "
                    "it (python tests/test_facts.py --regenerate)")
    changed = [f"{part}/{name}" for part in now for name in now[part]
               if kept["facts"][part].get(name) != now[part][name]]
    assert not changed, (f"the facts of {', '.join(changed[:5])} changed: bump FACTS_VERSION in nbjit/cache/facts.py "
                         "and regenerate the corpus (python tests/test_facts.py --regenerate)")


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["--regenerate"]:
        CORPUS.write_text(json.dumps({"version": _facts.FACTS_VERSION, "facts": corpus()}, indent=1, sort_keys=True)
                          + "\n")
        print(f"wrote {CORPUS}")
