"""nbjit.tune without a GPU: the space, the targets' programs, compiling and pruning the
variants by what NVRTC made (real compiles for sm_90), the answer's key, the answer as a
cache entry (kept, found, exported, shared through a remote tier, listed and cleared), the
``nbjit tune`` command, and the errors a search asked wrongly gives."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import nbjit
from nbjit import NbjitTuneError
from nbjit.cache.remote import RemoteTier
from nbjit.cache.store import Cache
from nbjit.tuning.answers import Answer, answer_key, find, listed, remove, store, user_key
from nbjit.tuning.search import _Settings, prepare
from nbjit.tuning.space import Space
from nbjit.tuning.targets import Defines, Template, choice_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (SPIN=1: the variants of 64 threads spin ~2 s, for the GPU tests of a variant past its deadline)
SUM = textwrap.dedent(r"""
    #ifndef SPIN
    #define SPIN 0
    #endif
    template <int BLOCK, int ITEMS>
    __global__ void block_sum(const float* x, float* out, int n) {
      static_assert(BLOCK != 96, "96 is refused, to test a variant that does not compile");
      __shared__ float s[BLOCK];
      float acc = 0;
      int base = blockIdx.x * BLOCK * ITEMS + threadIdx.x;
      for (int i = 0; i < ITEMS; ++i) { int j = base + i * BLOCK; if (j < n) acc += x[j]; }
      s[threadIdx.x] = acc;
      __syncthreads();
      for (int w = BLOCK / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
      }
      if (threadIdx.x == 0) atomicAdd(out, s[0]);
      if (SPIN && blockIdx.x == 0 && threadIdx.x == 0 && BLOCK == 64) {
        long long t0 = clock64();
        while (clock64() - t0 < 4000000000LL) {}
      }
    }
""")

# WIDTH values live at once (each updated from others, four rounds): with few registers
# allowed, ptxas spills them
HUNGRY = textwrap.dedent(r"""
    extern "C" __global__ void hungry(float* y, const float* x, int n) {
      float v[WIDTH];
      #pragma unroll
      for (int i = 0; i < WIDTH; ++i) v[i] = x[i * n + threadIdx.x];
      #pragma unroll
      for (int r = 0; r < 4; ++r) {
        #pragma unroll
        for (int i = 0; i < WIDTH; ++i) v[i] = v[i] * v[(i + 1) % WIDTH] + v[(i + 3) % WIDTH];
      }
      #pragma unroll
      for (int i = 0; i < WIDTH; ++i) y[i * n + threadIdx.x] = v[i];
    }
""")


def rule(space, grid=1, block=None, shared=None):
    return _Settings(grid, block, shared, False, list((space if isinstance(space, Space) else Space(space)).choices))


# ------------------------------------------------------------------ the space and the targets


def test_a_space_is_every_combination_in_order():
    s = Space({"BLOCK": [64, 128], "ALGO": ["raking", "warp"], "FAST": [True]})
    assert len(s) == 4
    assert s.variants() == [{"BLOCK": 64, "ALGO": "raking", "FAST": True}, {"BLOCK": 64, "ALGO": "warp", "FAST": True},
                            {"BLOCK": 128, "ALGO": "raking", "FAST": True},
                            {"BLOCK": 128, "ALGO": "warp", "FAST": True}]
    assert s.to_json() == {"ALGO": ["raking", "warp"], "BLOCK": [64, 128], "FAST": [True]}
    assert s.holds({"BLOCK": 128, "ALGO": "warp", "FAST": True})
    assert not s.holds({"BLOCK": 256, "ALGO": "warp", "FAST": True})
    assert not s.holds({"BLOCK": 128, "ALGO": "warp", "FAST": 1})  # (1 == True, but not the choice)


@pytest.mark.parametrize("space, msg", [
    ({}, "non-empty dict"),
    ([("BLOCK", [1])], "non-empty dict"),
    ({"2x": [1]}, "not an identifier"),
    ({"BLOCK": 128}, "list of choices"),
    ({"BLOCK": "128"}, "list of choices"),
    ({"BLOCK": []}, "no choices"),
    ({"BLOCK": [1, 1]}, "repeats"),
    ({"BLOCK": [[1, 2]]}, "choices are ints"),
    ({"BLOCK": [float("nan")]}, "choices are ints"),
    ({f"C{i}": list(range(10)) for i in range(5)}, "more than 65536"),
])
def test_a_space_that_does_not_fit_is_refused(space, msg):
    with pytest.raises(NbjitTuneError, match=msg):
        Space(space)


def test_choices_are_written_as_cpp_reads_them():
    assert [choice_text(v) for v in (True, False, 256, 0.5, "cub::BLOCK_REDUCE_RAKING")] == \
        ["true", "false", "256", "0.5", "cub::BLOCK_REDUCE_RAKING"]
    t = Template(SUM, "block_sum<{BLOCK}, {ITEMS}>")
    assert t.expression({"BLOCK": 128, "ITEMS": 4}) == "block_sum<128, 4>"
    d = Defines(HUNGRY, "hungry", options=["-O3"], defines=["WIDTH"])
    assert d.options_for({"WIDTH": 8, "block": 64}) == ["-O3", "-DWIDTH=8"]


def test_a_templates_variants_share_programs_and_a_choice_it_does_not_take_shares_an_instantiation():
    t = Template(SUM, "block_sum<{BLOCK}, {ITEMS}>")
    configs = Space({"BLOCK": [64, 128, 256], "ITEMS": [1, 2], "grid": [10, 20]}).variants()
    programs = t.programs(configs, 4)
    assert len(programs) == 3  # 6 instantiations over at most 4 programs: 2 each
    assert sorted(i for p in programs for i in p.variants) == list(range(12))
    assert [p.args["name_expressions"] for p in programs] == [
        ["block_sum<64, 1>", "block_sum<64, 2>"], ["block_sum<128, 1>", "block_sum<128, 2>"],
        ["block_sum<256, 1>", "block_sum<256, 2>"]]
    assert all(len(p.variants) == 4 for p in programs)  # (each instantiation twice: grid=10, grid=20)
    d = Defines(HUNGRY, "hungry")
    assert [p.args["options"] for p in d.programs([{"WIDTH": 8}, {"WIDTH": 16}], 8)] == [["-DWIDTH=8"],
                                                                                          ["-DWIDTH=16"]]


@pytest.mark.parametrize("make, msg", [
    (lambda: Template(SUM, "block_sum<{BLOCK}, {0}>"), "each field names a choice"),
    (lambda: Template(SUM, "block_sum<{BLOCK"), "not a pattern"),
    (lambda: Template(SUM, ""), "kernel's name"),
    (lambda: Template(SUM, "block_sum<{BLOCK}>").check(["ITEMS"]), "no choice BLOCK"),
    (lambda: Defines(HUNGRY, "hungry", defines=["WIDTH"]).check(["W"]), "defines= names WIDTH"),
])
def test_a_target_that_does_not_fit_is_refused(make, msg):
    with pytest.raises(NbjitTuneError, match=msg):
        make()


# ------------------------------------------------------------------ compiling and pruning (no GPU)


def test_variants_compile_at_once_and_those_that_cannot_run_are_pruned_by_the_compilers_facts():
    space = Space({"BLOCK": [64, 96, 256, 2048], "ITEMS": [1, 4]})
    trials = prepare(Template(SUM, "block_sum<{BLOCK}, {ITEMS}>"), space,
                     rule(space, block=lambda c: c["BLOCK"], shared=lambda c: 232_000 if c["ITEMS"] == 4 else 0),
                     "sm_90", workers=2)
    by = {x.label: x for x in trials}
    # BLOCK=96 fails its static_assert in a program of two variants: each alone then says which
    assert by["BLOCK=96 ITEMS=1"].status == by["BLOCK=96 ITEMS=4"].status == "failed"
    assert "96 is refused" in by["BLOCK=96 ITEMS=1"].why and by["BLOCK=96 ITEMS=1"].why.startswith("compile failed")
    assert by["BLOCK=64 ITEMS=1"].status == by["BLOCK=256 ITEMS=1"].status == "waiting"
    assert by["BLOCK=64 ITEMS=1"].info.registers > 0 and by["BLOCK=64 ITEMS=1"].info.shared == 64 * 4
    assert "more than the 1024" in by["BLOCK=2048 ITEMS=1"].why
    # 232,000 bytes of dynamic shared memory and 1 KiB of static: over the 227 KiB a block may have
    assert by["BLOCK=256 ITEMS=4"].status == "pruned" and "cannot run" in by["BLOCK=256 ITEMS=4"].why
    assert "shared" in by["BLOCK=256 ITEMS=4"].why


def test_spills_and_a_low_occupancy_are_pruned_unless_allowed():
    space = Space({"WIDTH": [4, 64], "block": [1024]})
    target = Defines(HUNGRY, "hungry", options=["-maxrregcount=32"], defines=["WIDTH"])
    trials = {x.label: x for x in prepare(target, space, rule(space), "sm_90")}
    assert trials["WIDTH=4 block=1024"].status == "waiting"
    assert trials["WIDTH=64 block=1024"].status == "pruned" and "spills registers" in trials["WIDTH=64 block=1024"].why
    allowed = {x.label: x for x in prepare(target, space, rule(space), "sm_90", allow_spills=True)}
    assert allowed["WIDTH=64 block=1024"].status == "waiting"
    # 128 registers a thread: a block of 1024 threads needs twice an SM's registers; one of 256
    # runs two to an SM, 16 warps of the 64 it holds (occupancy 0.25)
    wide = Defines(HUNGRY, "hungry", options=["-maxrregcount=128"], defines=["WIDTH"])
    space = Space({"WIDTH": [64], "block": [256, 1024]})
    floor = prepare(wide, space, rule(space), "sm_90", allow_spills=True, min_occupancy=0.75)
    assert floor[0].info.registers == 128
    assert floor[0].status == "pruned" and "occupancy 0.250" in floor[0].why and "min_occupancy=0.75" in floor[0].why
    assert floor[1].status == "pruned" and "cannot run: its registers" in floor[1].why


# ------------------------------------------------------------------ the answer in the cache

DEVICE = {"name": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "driver": 13000}


def answer(config=None, ms=0.125, key=None):
    return Answer(config or {"BLOCK": 256}, ms, dict(DEVICE), "block_sum<{BLOCK}> in kernel.cu", key,
                  {"BLOCK": [128, 256]}, {"variants": 2, "timed": 2, "pruned": 0, "failed": 0}, "2026-12-06T00:00:00Z",
                  {}, {"BLOCK=128": 0.25, "BLOCK=256": 0.125})


def test_an_answers_key_names_the_gpu_the_driver_the_target_the_space_and_the_users_key():
    target = Template(SUM, "block_sum<{BLOCK}, {ITEMS}>").key_fields()
    space = {"BLOCK": [128, 256]}
    k = answer_key(DEVICE, target, space, "time", [1024])
    assert k == answer_key(dict(DEVICE), dict(target), dict(space), "time", [1024])
    others = [answer_key({**DEVICE, "name": "NVIDIA H200"}, target, space, "time", [1024]),
              answer_key({**DEVICE, "driver": 13010}, target, space, "time", [1024]),
              answer_key(DEVICE, Template(SUM + "\n", "block_sum<{BLOCK}, {ITEMS}>").key_fields(), space, "time",
                         [1024]),
              answer_key(DEVICE, Template(SUM, "block_sum<{BLOCK}, {ITEMS}>", options=["-O3"]).key_fields(), space,
                         "time", [1024]),
              answer_key(DEVICE, target, {"BLOCK": [128, 512]}, "time", [1024]),
              answer_key(DEVICE, target, space, "time", [2048])]
    assert len({k, *others}) == 7
    assert "/" not in json.dumps(target)  # no path of this machine: portable


def test_a_file_sources_key_holds_its_headers_contents_and_no_path(tmp_path):
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        (tmp_path / where / "k.cu").write_text('#include "ops.cuh"\n' + HUNGRY)
        (tmp_path / where / "ops.cuh").write_text("#define SCALE 2\n")
    a, b = (Defines(tmp_path / w / "k.cu", "hungry").key_fields() for w in ("a", "b"))
    assert a == b and str(tmp_path) not in json.dumps(a) and len(a["read"]) == 1
    (tmp_path / "b" / "ops.cuh").write_text("#define SCALE 3\n")
    assert Defines(tmp_path / "b" / "k.cu", "hungry").key_fields()["read"] != a["read"]


def test_a_users_key_is_json_data():
    assert user_key((1024, "f32", {"a": (1, 2.5)})) == [1024, "f32", {"a": [1, 2.5]}]
    for bad in (object(), {1: 2}, float("inf"), b"x"):
        with pytest.raises(NbjitTuneError, match="key="):
            user_key(bad)


def test_an_answer_is_kept_found_listed_and_removed(tmp_path):
    c = Cache(tmp_path / "c")
    k = answer_key(DEVICE, {"kind": "t"}, {"BLOCK": [128, 256]}, "time", None)
    assert find(c, k) is None
    store(c, k, answer())
    assert find(Cache(tmp_path / "c"), k) == answer()  # (a fresh Cache: read from its file)
    entry = Cache(tmp_path / "c").lookup(k)
    assert entry.kind == "tuning" and entry.arch == "sm_90" and entry.producer == "nbjit.tune"
    assert [(key, a.config) for key, a, _ in listed(c)] == [(k, {"BLOCK": 256})]
    store(c, k, answer({"BLOCK": 128}, 0.2), replace=True)
    assert find(Cache(tmp_path / "c"), k).config == {"BLOCK": 128}
    assert remove(c, [k]) == 1 and find(c, k) is None and listed(c) == []


def test_an_answer_travels_as_an_entry_in_an_archive_and_through_a_remote_tier(tmp_path):
    (tmp_path / "remote").mkdir()
    here = Cache(tmp_path / "here", remote=RemoteTier(str(tmp_path / "remote")))
    k = answer_key(DEVICE, {"kind": "t"}, {"BLOCK": [128, 256]}, "time", [7])
    store(here, k, answer(key=[7]))
    there = Cache(tmp_path / "there", remote=RemoteTier(str(tmp_path / "remote"), write=False))
    assert find(there, k) == answer(key=[7])  # from the remote tier, then kept on disk
    assert Cache(tmp_path / "there").lookup(k) is not None
    here.export_archive(tmp_path / "a.tar.gz")
    elsewhere = Cache(tmp_path / "elsewhere")
    assert elsewhere.import_archive(tmp_path / "a.tar.gz")[0] == 1
    assert find(elsewhere, k).config == {"BLOCK": 256}


def test_answers_and_compiled_kernels_live_side_by_side(tmp_path):
    c = Cache(tmp_path / "c")
    nbjit.compile_image(HUNGRY, options=["-DWIDTH=4"], arch="sm_90", cache=c)
    k = answer_key(DEVICE, {"kind": "t"}, {"BLOCK": [128, 256]}, "time", None)
    store(c, k, answer())
    assert len(c.entries()) == 2 and [key for key, _, _ in listed(c)] == [k]
    assert remove(c) == 1 and len(c.entries()) == 1  # (the compiled kernel stays)


# ------------------------------------------------------------------ nbjit tune


def nbjit_cli(*args, cache):
    env = {**os.environ, "NBJIT_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "nbjit", "tune", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60)


def test_the_command_lists_shows_and_clears_answers(tmp_path):
    c = Cache(tmp_path / "c")
    keys = [answer_key(DEVICE, {"kind": "t"}, {"BLOCK": [128, 256]}, "time", [n]) for n in (1, 2)]
    for n, k in zip((1, 2), keys):
        store(c, k, answer(key=[n]))
    r = nbjit_cli("--list", cache=tmp_path / "c")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["KEY", "GPU", "TARGET", "USER", "KEY", "ANSWER", "MS"] and len(lines) == 4
    assert "NVIDIA H100 80GB HBM3" in lines[2] and "BLOCK=256" in lines[2] and "[1]" in lines[2]
    r = nbjit_cli("--list", "--json", cache=tmp_path / "c")
    assert sorted((a["cache_key"], a["key"][0]) for a in json.loads(r.stdout)) == sorted(zip(keys, (1, 2)))
    r = nbjit_cli("--show", keys[0][:8], cache=tmp_path / "c")
    assert r.returncode == 0 and keys[0] in r.stdout and "BLOCK=256: 0.125 ms a launch" in r.stdout
    assert "2 variants, 2 timed, 0 pruned, 0 failed" in r.stdout and "0.25 ms  BLOCK=128" in r.stdout
    assert json.loads(nbjit_cli("--show", keys[1][:8], "--json", cache=tmp_path / "c").stdout)["cache_key"] == keys[1]
    r = nbjit_cli("--clear", keys[0][:8], cache=tmp_path / "c")
    assert r.returncode == 0 and r.stdout.strip() == f"removed 1 answer from {tmp_path / 'c'}"
    assert nbjit_cli("--clear", cache=tmp_path / "c").stdout.startswith("removed 1 answer")
    assert nbjit_cli("--list", cache=tmp_path / "c").stdout.startswith("no tuning answers in")


@pytest.mark.parametrize("args, msg", [
    ((), "one of --list, --show KEY, --clear"),
    (("--show", "zz"), "is not an answer's key"),
    (("--show", "abcdef"), "no tuning answer's key starts with abcdef"),
    (("--clear", "--json"), "--json applies to --list and --show"),
    (("--list", "--show", "abcd"), "not allowed with argument"),
])
def test_the_command_refuses_what_it_cannot_do_in_one_line(tmp_path, args, msg):
    r = nbjit_cli(*args, cache=tmp_path / "c")
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# ------------------------------------------------------------------ asked wrongly (no GPU reached)


@pytest.mark.parametrize("kw, msg", [
    ({"metric": "power"}, "metric 'power'"),
    ({"timeout": 0}, "timeout must be a number > 0"),
    ({"repeat": 0}, "repeat must be an int >= 1"),
    ({"min_occupancy": 2}, "min_occupancy must be a fraction"),
    ({"grid": None}, "give grid="),
])
def test_a_search_asked_wrongly_is_refused_before_anything_runs(kw, msg):
    kw = {"grid": 4, "block": 128, **kw}
    with pytest.raises(NbjitTuneError, match=msg):
        nbjit.tune(Template(SUM, "block_sum<{BLOCK}, {ITEMS}>"), {"BLOCK": [128], "ITEMS": [1]}, (), **kw)


def test_a_launch_function_takes_stream_and_no_launch_settings():
    def no_stream(x):
        pass

    def launch(x, *, stream, BLOCK):
        pass

    with pytest.raises(NbjitTuneError, match="must take stream="):
        nbjit.tune(no_stream, {"BLOCK": [1]})
    with pytest.raises(NbjitTuneError, match="block= apply to a kernel"):
        nbjit.tune(launch, {"BLOCK": [1]}, block=128)
    with pytest.raises(NbjitTuneError, match="the target must be"):
        nbjit.tune("block_sum", {"BLOCK": [1]})
    with pytest.raises(NbjitTuneError, match="choices are ints"):
        nbjit.autotune({"BLOCK": [None]})
    with pytest.raises(NbjitTuneError, match="key="):
        nbjit.autotune({"BLOCK": [1]}, key=object())


def test_a_launch_setting_that_is_no_dimension_names_the_variant():
    space = {"BLOCK": [128, 0]}
    r = rule(space, block=lambda c: c["BLOCK"])
    assert r.of({"BLOCK": 128}) == ((1,), (128,), 0)
    with pytest.raises(NbjitTuneError, match="block for BLOCK=0 is 0"):
        r.of({"BLOCK": 0})
    with pytest.raises(NbjitTuneError, match=r"grid= raised for BLOCK=128: ZeroDivisionError"):
        rule(space, grid=lambda c: 1 // 0, block=1).of({"BLOCK": 128})
    with pytest.raises(NbjitTuneError, match="shared for BLOCK=128 is -1"):
        rule(space, block=1, shared=-1).of({"BLOCK": 128})


# ------------------------------------------------------------------ answers shipped in a bundle


def test_a_bundle_ships_answers_and_a_process_that_loads_it_finds_them(tmp_path):
    from nbjit.cache.store import default_cache
    k = answer_key(DEVICE, {"kind": "t"}, {"BLOCK": [128, 256]}, "time", [3])
    store(default_cache(), k, answer(key=[3]))
    info = nbjit.build_bundle({"hungry": HUNGRY}, tmp_path / "k.nbjit", archs="sm_90", options=["-DWIDTH=4"],
                              tuning=[k])
    assert info.images[0].name == "hungry"
    script = textwrap.dedent(f"""
        import nbjit, json
        from nbjit.cache.store import default_cache
        from nbjit.tuning.answers import find
        nbjit.load_bundle({str(tmp_path / 'k.nbjit')!r}, lazy=True)
        a = find(default_cache(), {k!r})
        print(json.dumps(a.config))
    """)
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "fresh")}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"BLOCK": 256}
    with pytest.raises(nbjit.BundleError, match="no answer of nbjit.tune under key 00000"):
        nbjit.build_bundle({"hungry": HUNGRY}, tmp_path / "j.nbjit", archs="sm_90", options=["-DWIDTH=4"],
                           tuning=["0" * 64])


def test_an_altered_answer_in_a_bundle_is_refused(tmp_path):
    from nbjit.bundles.archive import install_answers, open_bundle
    from nbjit.bundles.build import bundle_bytes
    from nbjit.cache.entries import _encode
    from nbjit.cache.entries import CacheEntry
    k = answer_key(DEVICE, {"kind": "t"}, {"BLOCK": [128, 256]}, "time", [4])
    ptx = {"hungry": HUNGRY}
    image = CacheEntry("cubin", "sm_90", b"not an answer")
    data, _ = bundle_bytes(ptx, None, [(f"tuning/{k}.nbjit", _encode(k, image))], archs="sm_90",
                           options=["-DWIDTH=4"])
    with pytest.raises(nbjit.BundleError, match="is not a tuning answer"):
        install_answers(open_bundle(data))
    data, _ = bundle_bytes(ptx, None, [("tuning/abc.nbjit", b"x")], archs="sm_90", options=["-DWIDTH=4"])
    with pytest.raises(nbjit.BundleError, match="tuning/<64 hex digits>.nbjit"):
        install_answers(open_bundle(data))


def test_the_bundle_command_ships_answers_named_by_their_keys(tmp_path):
    c = Cache(tmp_path / "c")
    k = answer_key(DEVICE, {"kind": "t"}, {"BLOCK": [128, 256]}, "time", [5])
    store(c, k, answer(key=[5]))
    (tmp_path / "hungry.cu").write_text(HUNGRY.replace("WIDTH", "4"))
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "c")}
    r = subprocess.run([sys.executable, "-m", "nbjit", "bundle", str(tmp_path / "hungry.cu"), "--arch", "sm_90",
                        "--tuning", k[:6], "-o", str(tmp_path / "k.nbjit")], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    from nbjit.bundles.archive import open_bundle
    assert f"tuning/{k}.nbjit" in open_bundle(str(tmp_path / "k.nbjit")).manifest["members"]
    r = subprocess.run([sys.executable, "-m", "nbjit", "bundle", str(tmp_path / "hungry.cu"), "--arch", "sm_90",
                        "--tuning", "ffff", "-o", str(tmp_path / "j.nbjit")], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "no tuning answer's key starts with ffff" in r.stderr
    assert not (tmp_path / "j.nbjit").exists()
