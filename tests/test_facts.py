"""Facts kept in cache entries (nbjit/_facts.py): a lossless round trip of what inspection
reads from every cubin fixture, and NVRTC entries that carry them, so that a warm hit reads
no ELF and no source; facts from other code, or none, are read afresh and kept."""
from __future__ import annotations

import json
import os
import warnings

import pytest

from nbjit import _facts, compile_image, compiler, inspect_cubin
from nbjit import cubin as cubin_mod
from nbjit.cache import Cache
from nbjit._csource import source_declarations

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
    monkeypatch.setattr("nbjit._csource.source_declarations", refuse)
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


def test_the_stamp_is_the_digest_of_the_readers_as_they_are():
    """The stamp facts carry is a committed digest of the reader modules (no file system call
    on a warm start): it must be that of their text now, or facts an older reader wrote would
    be taken as this one's."""
    assert _facts.READERS_DIGEST == _facts.readers_digest(), \
        "a module that reads images changed: run `python -m nbjit._facts` to update READERS_DIGEST"
    assert _facts.stamp() == f"readers:{_facts.READERS_DIGEST}"


def test_the_readers_digest_changes_with_any_reader_but_not_its_own_line(tmp_path, monkeypatch):
    pkg = tmp_path / "nbjit"
    pkg.mkdir()
    here = os.path.dirname(_facts.__file__)
    for name in _facts._READERS:
        with open(os.path.join(here, name), "rb") as f:
            (pkg / name).write_bytes(f.read())
    monkeypatch.setattr(_facts, "_HERE", str(pkg))
    first = _facts.readers_digest()
    assert first == _facts.READERS_DIGEST
    facts_py = pkg / "_facts.py"
    facts_py.write_text(facts_py.read_text().replace(f'READERS_DIGEST = "{first}"', 'READERS_DIGEST = "0"'))
    assert _facts.readers_digest() == first  # its own line is not part of it
    cubin_py = pkg / "cubin.py"
    cubin_py.write_text(cubin_py.read_text() + "\n# edited\n")
    assert _facts.readers_digest() != first


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
    from nbjit import signature

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
    monkeypatch.setattr("nbjit.module.merge", refuse)
    k = warm["fill<float>"]
    assert [p.ctype for p in k.params] == ["float*", "float", "int"]
    monkeypatch.setattr("nbjit.module.merge", signature.merge)
    real = warm.image.lowered_names["fill<float>"]
    warm._learn(decls={real: ("source", ())})
    assert real not in warm._live.typed  # a new declaration: typed afresh (here it has no say: 0 parameters)


def _c_decoder():
    from nbjit import _native
    ext = _native.extension()
    if ext is None:
        pytest.skip("nbjit's C extension is not built (or NBJIT_PURE_PYTHON is set)")
    return lambda data: ext.decode_facts(data, _facts._SPECS, _facts._arch)


def _records():
    """The facts of every cubin fixture and of real declarations, as a cache entry keeps them."""
    out = [json.loads(json.dumps(_facts.encode(inspect_cubin(p.read_bytes(), source=p.name)))) for p in CUBINS]
    out.append(json.loads(json.dumps(_facts.encode(source_declarations((DATA / "src/tma.cu").read_text() + PLAIN)))))
    return out


def test_the_c_decoder_makes_what_the_python_one_makes():
    """nbjit._launch.decode_facts (what a warm start decodes with) gives the objects
    _facts.decode gives, for every cubin fixture's facts: equal, of the same classes, the
    same repr (every field, in order)."""
    c = _c_decoder()
    for data in _records():
        want, got = _facts.decode(data), c(data)
        assert got == want and repr(got) == repr(want)
        if isinstance(want, cubin_mod.CubinInfo):
            assert [type(e) for e in got.entries] == [type(e) for e in want.entries]
            assert type(got.arch) is type(want.arch) and [list(e.__dict__) for e in got.entries] == \
                [list(e.__dict__) for e in want.entries]


def _mutations(data, rng, n):
    """``n`` damaged copies of a facts record: a value replaced, an item dropped or added, a
    mask changed, a list made a dict, a str made a number, at random places."""
    import copy
    for _ in range(n):
        d = copy.deepcopy(data)
        # the containers in it, with their paths
        spots, todo = [], [d]
        while todo:
            x = todo.pop()
            if isinstance(x, list) and x:
                spots.append(x)
                todo.extend(v for v in x if isinstance(v, (list, dict)))
            elif isinstance(x, dict) and x:
                todo.extend(v for v in x.values() if isinstance(v, (list, dict)))
        spot = rng.choice(spots)
        i = rng.randrange(len(spot))
        what = rng.randrange(7)
        if what == 0:
            spot[i] = rng.choice([None, True, 0, -1, 1 << 70, 2.5, "", "2", "Param", "CubinInfo", [], {}, ["2", 1]])
        elif what == 1:
            del spot[i]
        elif what == 2:
            spot.insert(i, rng.choice([None, 1, "x", ["", 1]]))
        elif what == 3 and len(spot) > 1:
            spot[1] = rng.choice([0, 1, 3, 255, 1 << 20, -2, True, "1"])
        elif what == 4:
            spot[i] = {"k": spot[i]}
        elif what == 5:
            spot[i] = ("tuple", spot[i])
        else:
            spot[0] = rng.choice(["", "2", "KernelInfo", "Directives", "Nope", 7])
        yield d


def test_the_c_decoder_never_differs_on_damaged_facts():
    """On facts damaged at random (hostile or corrupt data that passed an entry's checksum),
    the C decoder either makes exactly what the Python decoder makes or declines
    (ValueError), after which the Python decoder decides: never another object, never a
    crash."""
    import random
    c = _c_decoder()
    rng = random.Random(26)
    declined = same = 0
    for data in _records():
        for d in _mutations(data, rng, 60):
            try:
                got = c(d)
            except ValueError:
                declined += 1
                continue
            want = _facts.decode(d)  # (where C succeeds, Python must too, with the same result)
            assert got == want and repr(got) == repr(want)
            same += 1
    assert declined > 100 and same > 100  # (both outcomes were met)


def test_a_warm_hit_reads_its_facts_with_the_c_decoder(tmp_path, monkeypatch):
    """The facts of a cache entry are read by the C decoder where it is built, and by the
    Python one where it declines or is not used: the same facts either way."""
    c = _c_decoder()
    img = compile_image(SRC, name_expressions=["fill<float>"], headers=HDR, arch="sm_90", cache=Cache(tmp_path))
    record = json.loads(json.dumps(_facts.keep(_facts.Facts(img.declarations, img.info, img.typed, img.resources))))
    calls = []

    def counting(data, specs, arch):
        calls.append(data)
        return c(data)

    monkeypatch.setattr(_facts, "_C_DECODER", [counting])
    via_c = _facts.read(record, "cubin")
    assert len(calls) == 1 and sorted(calls[0]) == ["declarations", "info", "typed"] and via_c is not None
    monkeypatch.setattr(_facts, "_C_DECODER", [False])
    assert _facts.read(record, "cubin") == via_c

    def declining(data, specs, arch):
        raise ValueError("not the facts encode writes")

    monkeypatch.setattr(_facts, "_C_DECODER", [declining])
    assert _facts.read(record, "cubin") == via_c


def test_facts_nested_deeper_than_encode_writes_are_not_read():
    """Data nested far deeper than ``encode`` writes (a damaged or crafted entry that passed
    its checksum): the C decoder declines it past a fixed depth, and ``read`` gives no facts
    (the image is read afresh) instead of raising, with the C decoder or without."""
    deep = 1
    for _ in range(5000):  # (deeper than any Python's recursion limit lets the Python decoder go)
        deep = ["", deep]
    deep = {"k": deep}
    shallow = json.loads('["", ' * 40 + '1' + ']' * 40)
    ext = _c_decoder()
    assert ext(shallow) == _facts.decode(shallow)
    with pytest.raises(ValueError):
        ext(json.loads('["", ' * 70 + '1' + ']' * 70))
    record = {"stamp": _facts.stamp(), "info": None, "declarations": deep, "typed": {}, "resources": {}}
    assert _facts.read(record, "ptx") is None
    before = _facts._C_DECODER[0]
    try:
        _facts._C_DECODER[0] = False
        assert _facts.read(record, "ptx") is None
    finally:
        _facts._C_DECODER[0] = before
