"""The compile cache (nbjit.cache.store) with real NVRTC compiles: keys, corruption, concurrency."""
from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from nbjit import NbjitWarning, compile_image
from nbjit.cache.entries import FORMAT_VERSION, CacheEntry, _checksum
from nbjit.cache.store import Cache, default_cache
from nbjit.cache.entries import cache_key
from nbjit.read.image import content_digest, content_hash

from conftest import DATA  # noqa: E402
SRC = 'extern "C" __global__ void k(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] = SCALE * i; }\n'
TMPL = (DATA / "src/nvrtc_tmpl.cu").read_text()
HDR = {"scale.cuh": (DATA / "src/scale.cuh").read_text()}


def build(cache, **kw):
    args = dict(name="k.cu", options=["-DSCALE=2"], arch="sm_90")
    args.update(kw)
    return compile_image(args.pop("source", SRC), cache=cache, **args)


def test_hit_in_process_and_on_disk(tmp_path, counted):
    c = Cache(tmp_path)
    a = build(c)
    b = build(c)
    assert len(counted) == 1 and a.data == b.data
    d = build(Cache(tmp_path))  # a fresh object: from disk
    assert len(counted) == 1 and d.data == a.data and d.lowered_names == a.lowered_names
    assert len(Cache(tmp_path).entries()) == 1


def test_a_disk_hit_hands_on_the_payload_digest_it_checked(tmp_path, counted):
    """Reading an entry hashes the payload once: its digest (what the module registry names
    bytes by) comes with the entry, and is the payload's own."""
    a = build(Cache(tmp_path))
    assert "digest" not in a.__dict__  # made here: the digest is computed when asked for
    b = build(Cache(tmp_path))
    assert b.__dict__["digest"] == content_digest(b.data) == a.digest and len(counted) == 1
    entry = Cache(tmp_path).read(Cache(tmp_path).entries()[0][0].stem)
    assert entry.payload_digest == content_digest(entry.payload)


@pytest.mark.parametrize("fields", [
    {"source": "__global__ void k() {}\n\t\u00e9\u4e2d\U0001f600", "n": [1, -2, 3.5, 1e300, None, True, False],
     "nested": {"z": [{"b": 1, "a": [2]}], "a": ""}},
    {"options": [], "headers": [["h.cuh", "x\"y\\"]], "arch": "sm_90a", "big": 2 ** 70},
])
def test_keys_are_the_canonical_json_of_their_fields(fields):
    """The key encoder (json's C encoder, made once) writes what json.dumps with sorted keys
    and no spaces writes, so keys do not change with how they are encoded."""
    from nbjit.cache.entries import _KEY_JSON
    from nbjit.cache.entries import KEY_SCHEMA_VERSION
    versions = {"format": FORMAT_VERSION, "schema": KEY_SCHEMA_VERSION}
    want = json.dumps({**versions, **fields}, sort_keys=True, separators=(",", ":"))
    assert _KEY_JSON({**versions, **fields}) == want
    assert cache_key(fields) == content_digest(want.encode())
    with pytest.raises(TypeError, match="not JSON serializable"):
        cache_key({"source": object()})


@pytest.mark.parametrize("change", [
    {"source": SRC.replace("SCALE * i", "SCALE * i + 1")},
    {"name": "other.cu"},
    {"options": ["-DSCALE=3"]},
    {"options": ["-DSCALE=2", "--use_fast_math"]},
    {"arch": "sm_90a"},
    {"arch": "compute_90"},
    {"output": "ptx"},
    {"headers": {"unused.cuh": "// a"}},
])
def test_every_key_component_is_a_miss(tmp_path, counted, change):
    c = Cache(tmp_path)
    build(c)
    build(c, **change)
    assert len(counted) == 2


def test_header_text_and_name_are_keyed(tmp_path, counted):
    c = Cache(tmp_path)
    kw = dict(source=TMPL, headers=HDR, name_expressions=["fill<float>"])
    build(c, **kw)
    build(c, **{**kw, "headers": {"scale.cuh": HDR["scale.cuh"] + "\n// changed\n"}})
    build(c, **{**kw, "name_expressions": ["fill<int>"]})
    assert len(counted) == 3


def test_include_file_contents_are_keyed(tmp_path, counted):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "s.cuh").write_text("#define SCALE 2\n")
    src = '#include "s.cuh"\n' + SRC
    c = Cache(tmp_path / "c")
    build(c, source=src, options=[], include_paths=[str(inc)])
    build(c, source=src, options=[], include_paths=[str(inc)])
    (inc / "s.cuh").write_text("#define SCALE 5\n")  # the same path, new contents
    build(Cache(tmp_path / "c"), source=src, options=[], include_paths=[str(inc)])
    assert len(counted) == 2


def test_toolchain_and_format_are_keyed(tmp_path, counted, monkeypatch):
    c = Cache(tmp_path)
    build(c)
    monkeypatch.setattr("nbjit.toolchain.identity._FINGERPRINTS",
                        {"nvrtc": {"libs": [["/other/libnvrtc.so.13", 1, 2]], "env": []}})
    build(c)
    assert len(counted) == 2
    monkeypatch.setattr("nbjit.cache.entries.FORMAT_VERSION", FORMAT_VERSION + 1)
    build(Cache(tmp_path))
    assert len(counted) == 3


def test_equivalent_spellings_are_hits(tmp_path, counted):
    c = Cache(tmp_path)
    build(c, options=["-D", "SCALE=2", " -lineinfo "])
    build(c, options=["--define-macro=SCALE=2", "--generate-line-info"])
    assert len(counted) == 1


def entry_file(cache: Cache) -> Path:
    (f,) = [e[0] for e in cache.entries()]
    return f


@pytest.mark.parametrize("damage", ["flip", "truncate", "magic", "version", "empty", "other_key"])
def test_corrupt_entries_are_rebuilt_with_one_warning(tmp_path, counted, damage):
    good = build(Cache(tmp_path))
    f = entry_file(Cache(tmp_path))
    raw = bytearray(f.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x40
    elif damage == "truncate":
        raw = raw[: len(raw) - 100]
    elif damage == "magic":
        raw[:6] = b"XXXXXX"
    elif damage == "version":
        raw[8:12] = (FORMAT_VERSION + 7).to_bytes(4, "little")
    elif damage == "empty":
        raw = bytearray()
    else:  # a valid entry of another key copied over this one
        other = build(Cache(tmp_path / "o"), options=["-DSCALE=9"])
        raw = bytearray(entry_file(Cache(tmp_path / "o")).read_bytes())
        assert other.data != good.data
    f.write_bytes(bytes(raw))
    with pytest.warns(NbjitWarning, match="corrupt") as w:
        again = build(Cache(tmp_path))
    assert len([x for x in w if issubclass(x.category, NbjitWarning)]) == 1
    assert again.data == good.data and counted[-1] is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build(Cache(tmp_path)).data == good.data  # replaced by a good entry


def test_read_only_directory_works_without_disk(tmp_path, counted):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if os.access(ro / "x", os.W_OK) or os.geteuid() == 0:
        # root ignores permission bits: use a path under a regular file instead
        (tmp_path / "file").write_text("")
        ro = tmp_path / "file" / "cache"
    c = Cache(ro)
    with pytest.warns(NbjitWarning, match="cannot write") as w:
        a = build(c)
        b = build(c, options=["-DSCALE=4"])
    assert len([x for x in w if issubclass(x.category, NbjitWarning)]) == 1
    assert a.kind == b.kind == "cubin" and c.path is None


def test_the_suite_writes_nothing_into_the_users_cache(tmp_path):
    """A run of tests leaves ~/.cache/nbjit and $XDG_CACHE_HOME/nbjit alone: test_bundle.py's
    module-scoped fixture compiles before any test's own cache is set, and a compile remembers
    the toolchain's identity (toolchain-ids.json) in the default cache's directory; that once
    was the user's."""
    import site
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NBJIT_CACHE", "PYTEST_"))}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / "xdg"), PYTHONUSERBASE=site.getuserbase(),
               PYTHONPATH=os.pathsep.join(filter(None, [str(DATA.parents[1]), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_bundle.py"],
                       cwd=DATA.parents[1], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 1) and " passed" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []


def test_environment_selects_location(tmp_path, monkeypatch):
    from nbjit.cache.store import set_default_cache
    monkeypatch.setenv("NBJIT_CACHE_DIR", str(tmp_path / "here"))
    set_default_cache(None)
    assert default_cache().path == tmp_path / "here"
    monkeypatch.delenv("NBJIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    set_default_cache(None)
    assert default_cache().path == tmp_path / "xdg" / "nbjit"
    monkeypatch.setenv("NBJIT_CACHE", "0")
    set_default_cache(None)
    assert default_cache().path is None
    build(default_cache())
    assert not (tmp_path / "xdg" / "nbjit").exists()
    monkeypatch.setenv("NBJIT_CACHE", "1")
    monkeypatch.setenv("NBJIT_CACHE_MAX_BYTES", "12345")
    set_default_cache(None)
    assert default_cache().max_bytes == 12345


def test_size_limit_prunes_least_recently_used(tmp_path):
    c = Cache(tmp_path, max_bytes=None)
    keys = [cache_key({"n": i}) for i in range(5)]
    for i, k in enumerate(keys):
        c.write(k, CacheEntry("cubin", "sm_90", bytes([i]) * 1000))
        os.utime(c.file(k), (1000 + i, 1000 + i))
    c.read(keys[0])  # used now: the newest
    size = c.entries()[0][1]
    assert c.prune(3 * size) == 2
    left = {e[0].stem for e in c.entries()}
    assert left == {keys[0], keys[3], keys[4]}


def test_an_older_nbjits_call_files_are_not_entries_and_go_with_prune_and_clear(tmp_path):
    """Call files (``<digest>.call``: an older nbjit's call index, which nothing reads now) are
    not counted as entries; ``prune`` and ``clear`` remove them, and only them besides entries."""
    c = Cache(tmp_path, max_bytes=None)
    keys = [cache_key({"n": i}) for i in range(3)]
    for i, k in enumerate(keys):
        c.write(k, CacheEntry("cubin", "sm_90", bytes([i]) * 1000))
        d = cache_key({"call": i})
        (tmp_path / d[:2]).mkdir(exist_ok=True)
        (tmp_path / d[:2] / f"{d}.call").write_text(k)
    (tmp_path / keys[0][:2] / "notes.call").write_text("mine")  # (not a name nbjit makes)
    assert len(c.entries()) == 3 and c.info()["entries"] == 3
    assert c.prune(1 << 30) == 0 and not list(tmp_path.glob("*/*[0-9a-f].call"))
    assert len(c.entries()) == 3 and (tmp_path / keys[0][:2] / "notes.call").exists()
    d = cache_key({"call": 9})
    (tmp_path / d[:2]).mkdir(exist_ok=True)
    (tmp_path / d[:2] / f"{d}.call").write_text(keys[1])
    assert c.clear() == 3 and not list(tmp_path.glob("*/*[0-9a-f].call"))


def test_a_hit_marks_an_entry_used_at_most_hourly(tmp_path):
    c = Cache(tmp_path, max_bytes=None)
    k = cache_key({"n": "touch"})
    c.write(k, CacheEntry("cubin", "sm_90", b"x" * 100))
    recent = time.time() - 60
    os.utime(c.file(k), (recent, recent))
    assert Cache(tmp_path).read(k) is not None
    assert c.file(k).stat().st_mtime == pytest.approx(recent)  # used a minute ago: no write on this hit
    os.utime(c.file(k), (1000, 1000))
    assert Cache(tmp_path).read(k) is not None
    assert c.file(k).stat().st_mtime > recent


WORKER = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[2])
    from nbjit.cache.store import Cache
    from nbjit import compile_image
    out = {}
    for i in range(20):
        img = compile_image('extern "C" __global__ void k%d(float* x) { x[0] = %d.0f; }' % (i, i),
                            name="k%d.cu" % i, arch="sm_90", cache=Cache(sys.argv[1]))
        out[i] = img.data.hex()
    print(json.dumps(out))
''')


def test_many_processes_one_fresh_cache(tmp_path):
    cache = tmp_path / "shared"
    root = str(Path(__file__).resolve().parent.parent)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(cache), root], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(8)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert all(r == results[0] for r in results)  # byte-identical outputs everywhere
    c = Cache(cache)
    assert len(c.entries()) == 20
    from nbjit.cache.entries import _decode
    for f, _, _ in c.entries():
        entry, why = _decode(f.read_bytes(), f.stem)
        assert entry is not None, why
    assert not list(cache.glob("??/.tmp-*"))


KILLED = textwrap.dedent('''
    import os, sys, time
    sys.path.insert(0, sys.argv[2])
    import nbjit.cache.store as cache_mod
    real_replace = os.replace
    def slow_replace(a, b):
        if str(b).endswith(".nbjit"):  # (an entry's file, not the toolchain's remembered identities)
            print("WRITTEN", flush=True)
            time.sleep(60)
        real_replace(a, b)
    os.replace = slow_replace
    from nbjit import compile_image
    compile_image('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }', arch="sm_90",
                  cache=cache_mod.Cache(sys.argv[1]))
''')


def test_writer_killed_mid_write_leaves_nothing_read(tmp_path, counted):
    cache = tmp_path / "c"
    root = str(Path(__file__).resolve().parent.parent)
    p = subprocess.Popen([sys.executable, "-c", KILLED, str(cache), root], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "WRITTEN"  # the temporary file is complete, not yet renamed
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    assert list(cache.glob("??/.tmp-*")) and not Cache(cache).entries()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        img = compile_image('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }', arch="sm_90",
                            cache=Cache(cache))
    assert img.kind == "cubin" and len(counted) == 1 and len(Cache(cache).entries()) == 1
    # the next scan (a prune, or a write when one is due) reclaims the killed writer's file: its process is gone
    assert Cache(cache).prune() == 0
    assert not list(cache.glob("??/.tmp-*")) and len(Cache(cache).entries()) == 1


def test_cli_cache_commands(tmp_path):
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path)}
    root = str(Path(__file__).resolve().parent.parent)
    src = tmp_path / "k.cu"
    src.write_text(SRC)
    run = lambda *a: subprocess.run([sys.executable, "-m", "nbjit", *a], capture_output=True, text=True, env=env,
                                    cwd=root, timeout=300)
    r = run("compile", str(src), "--arch", "sm_90", "-D", "SCALE=2", "-o", str(tmp_path / "k.cubin"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "k.cubin").read_bytes()[:4] == b"\x7fELF"
    r = run("compile", str(src), "--arch", "compute_90", "--ptx", "-D", "SCALE=2", "-o", str(tmp_path / "k.ptx"))
    assert r.returncode == 0 and b".version" in (tmp_path / "k.ptx").read_bytes()
    info = run("cache", "info").stdout
    assert "entries:  2" in info and str(tmp_path) in info
    assert len(run("cache", "list").stdout.strip().splitlines()) == 2
    listed = run("cache", "list").stdout
    assert "cubin sm_90 NVRTC" in listed and "ptx compute_90 NVRTC" in listed and "corrupt" not in listed
    assert "removed 1 entry" in run("cache", "prune", "--max-bytes", "4000").stdout
    assert "removed 1 entry" in run("cache", "clear").stdout
    assert "entries:  0" in run("cache", "info").stdout
    r = run("compile", str(src), "--arch", "sm_90", "-o", str(tmp_path / "x.cubin"))
    assert r.returncode == 2 and 'k.cu(1): error: identifier "SCALE" is undefined' in r.stderr


# ---------------------------------------------------------------- hardening

from nbjit import NbjitCacheError  # noqa: E402
from nbjit.cache.store import set_default_cache  # noqa: E402

KEY = cache_key({"test": 1})
ENTRY = CacheEntry("cubin", "sm_90", b"\x7fELF payload", {"f<int>": "_Z1fIiEvv"}, "log", "test")


@pytest.mark.parametrize("key", ["../../escape", "/abs/path", "ab\0cd", KEY.upper(), KEY[:-1], 12])
def test_keys_that_are_not_digests_are_refused(tmp_path, key):
    with pytest.raises(NbjitCacheError, match="not a cache key"):
        Cache(tmp_path).read(key)
    with pytest.raises(NbjitCacheError, match="not a cache key"):
        Cache(tmp_path).write(key, ENTRY)
    assert not any(tmp_path.parent.glob("escape*"))


def test_entries_respect_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        Cache(tmp_path).write(KEY, ENTRY)
    finally:
        os.umask(old)
    f = Cache(tmp_path).file(KEY)
    assert f.stat().st_mode & 0o777 == 0o644  # readable by a team that shares the cache


def test_a_fifo_or_a_link_to_dev_zero_is_a_miss(tmp_path):
    c = Cache(tmp_path)
    f = c.file(KEY)
    f.parent.mkdir(parents=True)
    os.mkfifo(f)
    t0 = time.time()
    assert c.read(KEY) is None and time.time() - t0 < 5  # never waits for a writer
    f.unlink()
    f.symlink_to("/dev/zero")
    assert c.read(KEY) is None


@pytest.mark.parametrize("desc", [
    [1, 2], "text", {"key": KEY, "payload_bytes": 3}, {"kind": "shared-library", "arch": "sm_90"},
    {"kind": "cubin", "arch": 90}, {"kind": "cubin", "arch": "sm_90", "lowered_names": [1]},
    "DEEP", "TRAILING", "NOT UTF-8",
])
def test_descriptions_that_are_not_entries_are_misses(tmp_path, desc):
    """A checksummed file whose description is not one of nbjit's is rebuilt, never raised."""
    import struct
    payload = b"abc"
    if desc == "DEEP":
        raw_desc = b"[" * 100_000 + b"]" * 100_000
    elif desc == "TRAILING":  # a whole entry's description, and more after it
        raw_desc = json.dumps({"key": KEY, "payload_bytes": len(payload), "kind": "cubin", "arch": "sm_90"}).encode() \
            + b" {}"
    elif desc == "NOT UTF-8":
        raw_desc = b'{"key": "\xff"}'
    else:
        if isinstance(desc, dict) and "kind" in desc:
            desc = {"key": KEY, "payload_bytes": len(payload), **desc}
        raw_desc = json.dumps(desc).encode()
    body = raw_desc + payload
    raw = struct.pack("<8sII32s", b"NBJITC\x00\x01", FORMAT_VERSION, len(raw_desc),
                      _checksum(raw_desc, content_hash(payload)))
    c = Cache(tmp_path)
    f = c.file(KEY)
    f.parent.mkdir(parents=True)
    f.write_bytes(raw + body)
    with pytest.warns(NbjitWarning, match="corrupt"):
        assert c.read(KEY) is None
    with pytest.warns(NbjitWarning, match="rebuilding"):
        made = c.get_or_create(KEY, lambda: ENTRY)
    assert made == ENTRY and Cache(tmp_path).read(KEY) == ENTRY


def test_a_lost_temporary_file_is_a_failed_write_not_the_end_of_the_cache(tmp_path, monkeypatch):
    """Another process's clear() removed the file being written: that write is lost, and the
    disk cache stays on (it was given up for good before)."""
    c = Cache(tmp_path)
    real = os.replace

    def gone(a, b):
        os.unlink(a)
        return real(a, b)

    monkeypatch.setattr(os, "replace", gone)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c.write(KEY, ENTRY)
    monkeypatch.setattr(os, "replace", real)
    assert c.path == tmp_path
    c.write(KEY, ENTRY)
    assert Cache(tmp_path).read(KEY) == ENTRY


def test_temporary_files_are_counted_and_reclaimed(tmp_path):
    c = Cache(tmp_path)
    c.write(KEY, ENTRY)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    left = tmp_path / KEY[:2] / f".tmp-{dead}-abcdef012345"
    left.write_bytes(b"\0" * 5000)
    mine = tmp_path / KEY[:2] / f".tmp-{os.getpid()}-123456789abc"
    mine.write_bytes(b"\0" * 10)
    info = c.info()
    assert info["temporary_files"] == 2 and info["bytes"] == c.file(KEY).stat().st_size + 5010
    assert c.prune() == 0  # under the limit: only the dead writer's file goes
    assert not left.exists() and mine.exists()
    assert c.clear() == 1 and mine.exists()  # a live writer keeps its file


@pytest.fixture(scope="module")
def small_bundle(tmp_path_factory):
    """A kernel bundle's bytes (a file whose name ends as an entry's)."""
    from nbjit import build_bundle
    p = tmp_path_factory.mktemp("bundle") / "k.nbjit"
    build_bundle(DATA / "nvcc/kernels_sm_80.cubin", p)
    return p.read_bytes()


def test_only_the_files_nbjit_makes_are_the_caches(tmp_path, small_bundle):
    """In a directory that is not a cache, prune and clear removed the user's files that merely
    end as nbjit's (build.lock, .tmp-notes, kernels.nbjit, query.call, notes.pch) and list
    showed a bundle as a corrupt entry: only the names nbjit makes count, and clear refuses a
    directory without nbjit's marker (CACHEDIR.TAG) unless it is an older nbjit's cache."""
    d = tmp_path / "mine"
    (d / "ab").mkdir(parents=True)
    (d / "pch").mkdir()
    mine = [d / "ab" / n for n in ("build.lock", ".tmp-notes", "kernels.nbjit", "query.call")] + [d / "pch/notes.pch"]
    for f in mine:
        f.write_bytes(small_bundle)
    (d / "notes.txt").write_text("mine")
    c = Cache(d)
    assert c.entries() == [] and c.info()["bytes"] == c.info()["pch_files"] == c.info()["temporary_files"] == 0
    assert c.prune(0) == 0
    with pytest.raises(NbjitCacheError, match=r"mine is not an nbjit cache: it has no CACHEDIR.TAG of nbjit's, no "
                                              r"cache entry, and files nbjit does not make \('notes.txt'\); clear "
                                              r"removes nothing there"):
        c.clear()
    run = lambda *a: subprocess.run([sys.executable, "-m", "nbjit", "cache", *a], capture_output=True, text=True,
                                    env={**os.environ, "NBJIT_CACHE_DIR": str(d)}, timeout=60)
    r = run("list")
    assert r.returncode == 0 and r.stdout == "", r.stdout
    r = run("clear")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "not an nbjit cache" in r.stderr
    assert all(f.read_bytes() == small_bundle for f in mine) and not (d / "CACHEDIR.TAG").exists()
    # a cache nbjit makes is marked with its first shard, and cleared of nbjit's files only
    fresh = Cache(tmp_path / "fresh")
    fresh.write(KEY, ENTRY)
    assert (tmp_path / "fresh/CACHEDIR.TAG").read_bytes().startswith(b"Signature: 8a477f597d28d172789f06886806bc55\n")
    (tmp_path / "fresh/notes.txt").write_text("mine")
    stranger = tmp_path / "fresh" / KEY[:2] / ("0" * 64 + ".nbjit")  # (a key's name in another key's shard)
    stranger.write_bytes(b"mine")
    assert fresh.clear() == 1 and stranger.exists() and (tmp_path / "fresh/notes.txt").exists()
    # an older nbjit's cache (no marker): known by its entries, and marked; an empty one, or one
    # of nothing but what nbjit makes, holds nothing to refuse
    older = Cache(tmp_path / "older")
    older.write(KEY, ENTRY)
    (tmp_path / "older/CACHEDIR.TAG").unlink()
    (tmp_path / "older/notes.txt").write_text("mine")
    assert older.clear() == 1 and (tmp_path / "older/CACHEDIR.TAG").exists()
    (tmp_path / "bare/pch").mkdir(parents=True)
    (tmp_path / "bare/toolchain-state.json").write_text("[]")
    assert Cache(tmp_path / "bare").clear() == 0 and Cache(tmp_path / "none").clear() == 0


def test_limits_that_make_no_sense(tmp_path, monkeypatch):
    with pytest.raises(NbjitCacheError, match="byte count"):
        Cache(tmp_path).prune(-5)
    monkeypatch.setenv("NBJIT_CACHE_MAX_BYTES", "abc")
    set_default_cache(None)
    with pytest.raises(NbjitCacheError, match="NBJIT_CACHE_MAX_BYTES='abc' is not a byte count"):
        default_cache()
    monkeypatch.setenv("NBJIT_CACHE_MAX_BYTES", "100")
    set_default_cache(None)
    c = default_cache()
    Cache(c.path, max_bytes=None).write(KEY, ENTRY)
    assert c.max_bytes == 100 and c.prune() == 1  # without a size: the configured limit
    set_default_cache(None)


@pytest.mark.parametrize("kwargs,msg", [
    ({"path": 123}, "a cache's path must be a directory (str or path) or None (memory only), not int"),
    ({"max_bytes": -1}, "max_bytes must be a byte count >= 0 or a size such as '1G' (or None: no limit), not -1"),
    ({"max_bytes": "lots"}, "max_bytes must be a byte count >= 0 or a size such as '1G' (or None: no limit), not "
                            "'lots'"),
    ({"max_bytes": True}, "max_bytes must be a byte count >= 0 or a size such as '1G' (or None: no limit), not True"),
    ({"lock_timeout": -3}, "lock_timeout must be seconds >= 0, not -3"),
    ({"lock_timeout": float("nan")}, "lock_timeout must be seconds >= 0, not nan")])
def test_cache_settings_that_make_no_sense(tmp_path, kwargs, msg):
    with pytest.raises(NbjitCacheError) as e:
        Cache(**{"path": tmp_path, **kwargs})
    assert str(e.value) == msg


def test_set_default_cache_takes_a_cache_or_a_directory(tmp_path):
    try:
        set_default_cache(tmp_path / "d")
        c = default_cache()
        assert isinstance(c, Cache) and c.path == tmp_path / "d"
        mine = Cache(tmp_path / "e")
        set_default_cache(mine)
        assert default_cache() is mine
        with pytest.raises(NbjitCacheError, match="takes an nbjit.Cache, a directory or None, not int"):
            set_default_cache(5)
        assert default_cache() is mine  # a refused one changes nothing
    finally:
        set_default_cache(None)


# ---------------------------------------------------------------- compile once, however many ask

ONCE = textwrap.dedent(r'''
    import sys, time
    sys.path.insert(0, sys.argv[3])
    import nbjit.toolchain.nvrtc as C
    from nbjit.cache.store import Cache
    real = C._run_nvrtc
    def counted(req):
        with open(sys.argv[2], "a") as f:
            f.write("compiled\n")
        if len(sys.argv) > 4:  # the holder that will be killed: announce, then hang
            print("LOCKED", flush=True)
            time.sleep(120)
        time.sleep(0.3)  # long enough for the others to arrive and wait
        return real(req)
    C._run_nvrtc = counted
    img = C.compile_image('extern "C" __global__ void once(float* x) { x[0] = 42.0f; }', arch="sm_90",
                          cache=Cache(sys.argv[1]))
    print(len(img.data), flush=True)
''')


def test_many_processes_compile_once(tmp_path):
    cache, marker = tmp_path / "c", tmp_path / "marker"
    root = str(Path(__file__).resolve().parent.parent)
    procs = [subprocess.Popen([sys.executable, "-c", ONCE, str(cache), str(marker), root], stdout=subprocess.PIPE,
                              text=True) for _ in range(16)]
    sizes = {p.communicate(timeout=300)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert marker.read_text().count("compiled") == 1  # NVRTC ran once; 15 processes read its entry
    assert len(sizes) == 1 and len(Cache(cache).entries()) == 1


def test_a_killed_lock_holder_blocks_nobody(tmp_path):
    cache, marker = tmp_path / "c", tmp_path / "marker"
    root = str(Path(__file__).resolve().parent.parent)
    holder = subprocess.Popen([sys.executable, "-c", ONCE, str(cache), str(marker), root, "hang"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "LOCKED"  # it holds the key's lock, compiling
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", ONCE, str(cache), str(marker), root], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert time.time() - t0 < 60  # no wait for the dead holder (the OS dropped its lock)
    assert marker.read_text().count("compiled") == 2


def test_a_lock_held_too_long_is_given_up(tmp_path):
    import fcntl
    c = Cache(tmp_path, lock_timeout=0.2)
    f = c.file(KEY)
    f.parent.mkdir(parents=True)
    with open(f.with_suffix(".lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process compiling forever
        t0 = time.time()
        assert c.get_or_create(KEY, lambda: ENTRY) == ENTRY
        assert time.time() - t0 < 5


# ------------------------------------------------------------------ archives for fleets


def test_export_import_round_trip_needs_no_compiler(tmp_path, counted):
    src = Cache(tmp_path / "a")
    images = [build(src, options=[f"-DSCALE={i}"]) for i in range(3)]
    assert src.export_archive(tmp_path / "c.tar.gz") == 3
    dst = Cache(tmp_path / "b")
    got = dst.import_archive(tmp_path / "c.tar.gz")
    assert got == (3, []) and got.present == 0
    got = dst.import_archive(tmp_path / "c.tar.gz")
    assert got == (0, []) and got.present == 3  # already there
    added, refused = got
    assert pickle.loads(pickle.dumps(got)).present == 3 and (added, refused) == (0, [])
    compiles = len(counted)
    again = [build(Cache(tmp_path / "b"), options=[f"-DSCALE={i}"]) for i in range(3)]
    assert len(counted) == compiles and [a.data for a in again] == [a.data for a in images]


def tar_with(path, members):
    import io
    import tarfile
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_import_verifies_every_member(tmp_path):
    good = Cache(tmp_path / "a")
    build(good)
    f = entry_file(good)
    raw = f.read_bytes()
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 1
    other = "0" * 64
    tar_with(tmp_path / "x.tar.gz", [
        (f.name, raw),                                     # good
        ("../../evil.nbjit", raw),                         # a path out of the cache
        (f"sub/{f.name}", raw),                            # not a bare entry name
        (other + ".nbjit", raw),                           # a valid entry under another key
        ("f" * 64 + ".nbjit", bytes(flipped)),             # damaged
        ("notes.txt", b"hello"),
    ])
    dst = Cache(tmp_path / "b")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        added, refused = dst.import_archive(tmp_path / "x.tar.gz")
    assert added == 1 and len(refused) == 5
    assert any("does not belong to this key" in r for r in refused)
    assert any("checksum" in r for r in refused)
    assert sum("not a cache entry" in r for r in refused) == 3
    assert [e[0].name for e in dst.entries()] == [f.name]
    assert not (tmp_path / "evil.nbjit").exists()


@pytest.mark.parametrize("content", [b"", b"not a tar at all" * 100, None])
def test_import_of_something_else_is_a_cache_error(tmp_path, content):
    from nbjit import NbjitCacheError
    p = tmp_path / "x.tar.gz"
    if content is None:
        os.mkfifo(p)  # never waited on
    else:
        p.write_bytes(content)
    with pytest.raises(NbjitCacheError, match="x.tar.gz"):
        Cache(tmp_path / "c").import_archive(p)
    with pytest.raises(NbjitCacheError, match="off"):
        Cache(None).export_archive(tmp_path / "y.tar.gz")


def test_cli_export_import(tmp_path):
    build(Cache(tmp_path / "a"))
    run = lambda cache, *a: subprocess.run([sys.executable, "-m", "nbjit", "cache", *a], capture_output=True,
                                           text=True, env={**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / cache)},
                                           timeout=60)
    r = run("a", "export", str(tmp_path / "c.tar.gz"))
    assert r.returncode == 0 and r.stdout.startswith("exported 1 entry to"), r.stderr
    r = run("b", "import", str(tmp_path / "c.tar.gz"))
    assert r.returncode == 0 and r.stdout.startswith("imported 1 new entry into"), r.stderr
    assert len(Cache(tmp_path / "b").entries()) == 1
    tar_with(tmp_path / "bad.tar.gz", [("notes.txt", b"x")])
    r = run("b", "import", str(tmp_path / "bad.tar.gz"))
    assert r.returncode == 1 and "refused notes.txt: not a cache entry" in r.stderr
    for args in (["export"], ["info", "f.tar.gz"], ["import", str(tmp_path / "missing.tar.gz")]):
        r = run("b", *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_import_of_a_truncated_archive_is_a_cache_error(tmp_path):
    from nbjit import NbjitCacheError
    c = Cache(tmp_path / "a")
    build(c)
    c.export_archive(tmp_path / "c.tar.gz")
    raw = (tmp_path / "c.tar.gz").read_bytes()
    (tmp_path / "t.tar.gz").write_bytes(raw[: len(raw) // 3])
    with pytest.raises(NbjitCacheError, match="t.tar.gz: a damaged cache archive") as e:
        Cache(tmp_path / "b").import_archive(tmp_path / "t.tar.gz")
    assert Cache(tmp_path / "b").entries() == [] and "imported" not in str(e.value)


def test_a_damaged_archive_says_how_many_entries_came_before_the_damage(tmp_path):
    """Entries before the damage are imported (each is checked whole as it streams): the error
    says how many (it said only that the archive was damaged, with entries already in)."""
    from nbjit import NbjitCacheError
    c = Cache(tmp_path / "a")
    for i in range(6):
        build(c, options=[f"-DSCALE={i + 2}"])
    c.export_archive(tmp_path / "c.tar.gz")
    raw = (tmp_path / "c.tar.gz").read_bytes()
    seen = set()
    for cut in range(len(raw) // 4, len(raw) - 64, len(raw) // 16):
        (tmp_path / "t.tar.gz").write_bytes(raw[:cut])
        b = Cache(tmp_path / f"b{cut}")
        with pytest.raises(NbjitCacheError, match="t.tar.gz: a damaged cache archive") as e:
            b.import_archive(tmp_path / "t.tar.gz")
        n = len(b.entries())
        seen.add(n)
        assert all(b.read(f.stem) is not None for f, _, _ in b.entries())  # each one whole
        if n:
            assert str(e.value).endswith("; 1 entry before it was imported, checked whole" if n == 1 else
                                         f"; {n} entries before it were imported, each checked whole")
        else:
            assert "imported" not in str(e.value)
    assert max(seen) >= 2


# ------------------------------------------------------------------ signed archives (#25 item 11)

ARCHIVE_KEY = "k3y-for-this-fleet-only-0123456789"


def poisoned(tmp_path) -> tuple[Cache, str, bytes]:
    """A cache with a compiled entry, and the bytes of an entry that is valid for the same key
    but carries another kernel's cubin: what an attacker would ship."""
    good = Cache(tmp_path / "a")
    build(good)
    key = entry_file(good).stem
    other = build(Cache(tmp_path / "other"), source=SRC.replace("SCALE * i", "SCALE + 7"))
    from nbjit.cache.entries import _encode
    return good, key, _encode(key, CacheEntry("cubin", "sm_90", other.data, producer="NVRTC"))


def test_an_archive_is_trusted_like_code_unless_a_key_is_set(tmp_path, monkeypatch):
    good, key, evil = poisoned(tmp_path)
    tar_with(tmp_path / "evil.tar.gz", [(key + ".nbjit", evil)])
    # without a key an entry that verifies is imported: its key is a digest of the inputs, not of the output
    trusting = Cache(tmp_path / "trusting")
    assert trusting.import_archive(tmp_path / "evil.tar.gz") == (1, [])
    assert build(Cache(tmp_path / "trusting")).data != build(good).data
    # with a key, the unsigned archive is refused whole, and nothing is imported
    monkeypatch.setenv("NBJIT_CACHE_ARCHIVE_KEY", ARCHIVE_KEY)
    fleet = Cache(tmp_path / "fleet")
    with pytest.raises(NbjitCacheError, match="evil.tar.gz: not signed") as e:
        fleet.import_archive(tmp_path / "evil.tar.gz")
    assert ARCHIVE_KEY not in str(e.value) and fleet.entries() == []
    # signed with another key: refused
    assert good.export_archive(tmp_path / "other-key.tar.gz", archive_key="another-fleet's-key-0123456") == 1
    with pytest.raises(NbjitCacheError, match="signed with another key"):
        fleet.import_archive(tmp_path / "other-key.tar.gz")
    # signed with this key: imported, and the compile is a hit with the real image
    assert good.export_archive(tmp_path / "ours.tar.gz") == 1
    assert fleet.import_archive(tmp_path / "ours.tar.gz") == (1, [])
    assert build(Cache(tmp_path / "fleet")).data == build(good).data
    # a signed archive with the poisoned entry put in, before its signature or after it: refused
    import tarfile
    with tarfile.open(tmp_path / "ours.tar.gz") as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar]
    for spliced in ([(key + ".nbjit", evil), members[1]], [members[0], members[1], (key + ".nbjit", evil)]):
        tar_with(tmp_path / "spliced.tar.gz", spliced)
        with pytest.raises(NbjitCacheError, match="spliced.tar.gz"):
            Cache(tmp_path / "again").import_archive(tmp_path / "spliced.tar.gz")
        assert Cache(tmp_path / "again").entries() == []
    # an importer without a key takes a signed archive as any other
    monkeypatch.delenv("NBJIT_CACHE_ARCHIVE_KEY")
    assert Cache(tmp_path / "keyless").import_archive(tmp_path / "ours.tar.gz") == (1, [])


def test_archive_keys_that_make_no_sense(tmp_path, monkeypatch):
    c = Cache(tmp_path / "c")
    build(c)
    keyfile = tmp_path / "key"
    keyfile.write_text(ARCHIVE_KEY + "\n")  # as `echo KEY > key` writes it
    assert c.export_archive(tmp_path / "a.tar.gz", archive_key_file=keyfile) == 1
    assert Cache(tmp_path / "d").import_archive(tmp_path / "a.tar.gz", archive_key=ARCHIVE_KEY) == (1, [])
    for kwargs, msg in [(dict(archive_key="short"), "at least 16"),
                        (dict(archive_key_file=tmp_path / "missing"), "cannot read the archive key file"),
                        (dict(archive_key_file=tmp_path), "cannot read the archive key file"),
                        (dict(archive_key=ARCHIVE_KEY, archive_key_file=keyfile), "not both"),
                        (dict(archive_key=12345678901234567890), "bytes or text")]:
        with pytest.raises(NbjitCacheError, match=msg) as e:
            c.export_archive(tmp_path / "b.tar.gz", **kwargs)
        assert ARCHIVE_KEY not in str(e.value)
    monkeypatch.setenv("NBJIT_CACHE_ARCHIVE_KEY", "tooshort")
    with pytest.raises(NbjitCacheError, match="NBJIT_CACHE_ARCHIVE_KEY is 8 bytes") as e:
        c.import_archive(tmp_path / "a.tar.gz")
    assert "tooshort" not in str(e.value)
    monkeypatch.setenv("NBJIT_CACHE_ARCHIVE_KEY_FILE", str(keyfile))
    with pytest.raises(NbjitCacheError, match="both"):
        c.import_archive(tmp_path / "a.tar.gz")
    monkeypatch.delenv("NBJIT_CACHE_ARCHIVE_KEY")
    assert Cache(tmp_path / "e").import_archive(tmp_path / "a.tar.gz") == (1, [])
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize("variable", ["NBJIT_CACHE_ARCHIVE_KEY", "NBJIT_CACHE_ARCHIVE_KEY_FILE"])
@pytest.mark.parametrize("value", ["", "  \n"])
def test_an_archive_key_set_but_empty_is_an_error_not_unsigned(tmp_path, monkeypatch, variable, value):
    """``NBJIT_CACHE_ARCHIVE_KEY="$(cat unreadable)"`` is empty: an error on export and
    import, never unsigned archives made or poisoned ones taken."""
    good, key, evil = poisoned(tmp_path)
    tar_with(tmp_path / "evil.tar.gz", [(key + ".nbjit", evil)])
    monkeypatch.setenv(variable, value)
    fleet = Cache(tmp_path / "fleet")
    with pytest.raises(NbjitCacheError, match=f"{variable} is set but empty"):
        fleet.import_archive(tmp_path / "evil.tar.gz")
    assert fleet.entries() == []
    with pytest.raises(NbjitCacheError, match=f"{variable} is set but empty"):
        good.export_archive(tmp_path / "out.tar.gz")
    assert not (tmp_path / "out.tar.gz").exists()
    r = subprocess.run([sys.executable, "-m", "nbjit", "cache", "import", str(tmp_path / "evil.tar.gz")],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "cli"), variable: value})
    assert r.returncode == 2 and "set but empty" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_environment_key_is_stripped_as_a_key_file_is(tmp_path, monkeypatch):
    """A key from the environment with a trailing newline (``"$(cat key; echo)"``) is the
    key file's key."""
    c = Cache(tmp_path / "c")
    build(c)
    keyfile = tmp_path / "key"
    keyfile.write_text(ARCHIVE_KEY + "\n")
    assert c.export_archive(tmp_path / "a.tar.gz", archive_key_file=keyfile) == 1
    monkeypatch.setenv("NBJIT_CACHE_ARCHIVE_KEY", ARCHIVE_KEY + "\n")
    assert Cache(tmp_path / "d").import_archive(tmp_path / "a.tar.gz") == (1, [])


def test_cli_signed_export_import(tmp_path):
    build(Cache(tmp_path / "a"))
    keyfile = tmp_path / "key"
    keyfile.write_text(ARCHIVE_KEY)
    run = lambda cache, *a: subprocess.run([sys.executable, "-m", "nbjit", "cache", *a], capture_output=True,
                                           text=True, env={**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / cache)},
                                           timeout=60)
    r = run("a", "export", str(tmp_path / "s.tar.gz"), "--key-file", str(keyfile))
    assert r.returncode == 0 and r.stdout.startswith("exported 1 entry to"), r.stderr
    r = run("a", "export", str(tmp_path / "u.tar.gz"))
    assert r.returncode == 0, r.stderr
    r = run("b", "import", str(tmp_path / "u.tar.gz"), "--key-file", str(keyfile))
    assert r.returncode == 2 and "not signed" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert ARCHIVE_KEY not in r.stderr + r.stdout
    r = run("b", "import", str(tmp_path / "s.tar.gz"), "--key-file", str(keyfile))
    assert r.returncode == 0 and r.stdout.startswith("imported 1 new entry into"), r.stderr
    r = run("b", "info", "--key-file", str(keyfile))
    assert r.returncode == 2 and "--key-file applies to" in r.stderr


# ------------------------------------------------------------------ writes scan rarely (#25 item 13)


def entry_archive(path, n, size=200, tag=""):
    """An archive of ``n`` made-up entries of ``size`` payload bytes (no compiler)."""
    import io
    import tarfile
    from nbjit.cache.entries import _encode
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            k = cache_key({"i": i, "tag": tag})
            raw = _encode(k, CacheEntry("cubin", "sm_90", bytes([i % 256]) * size))
            info = tarfile.TarInfo(k + ".nbjit")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return path


def test_import_is_linear(tmp_path):
    """Importing 1,000 entries took 58 s: every write scanned the whole cache."""
    from conftest import assert_linear
    fresh = iter(range(1 << 20))
    assert_linear(lambda a: Cache(tmp_path / f"c{next(fresh)}").import_archive(a),
                  lambda n: entry_archive(tmp_path / f"a{n}.tar", n, tag=str(n)), 25)


def test_writes_scan_the_cache_rarely_and_keep_its_limit(tmp_path, monkeypatch):
    scans = []
    real = Cache._scan
    monkeypatch.setattr(Cache, "_scan", lambda self, *a, **k: scans.append(1) or real(self, *a, **k))
    c = Cache(tmp_path / "big")  # the default limit, 1 GiB
    assert c.import_archive(entry_archive(tmp_path / "a.tar", 1000)) == (1000, [])
    assert len(scans) <= 3  # at random, about once per 100 MiB written: 1000 scans before
    # a small limit: the cache stays under it, each scan pruning it to 90%
    limit = 50_000
    small = Cache(tmp_path / "small", max_bytes=limit)
    scans.clear()
    for i in range(200):
        small.write(cache_key({"w": i}), CacheEntry("cubin", "sm_90", b"x" * 1000))
        assert small.info()["bytes"] <= limit
    assert 40 <= small.info()["entries"] <= limit // 1000
    # other processes' writes (unknown here) are found within a tenth of the limit written
    other = Cache(tmp_path / "small", max_bytes=None)
    for i in range(100):
        other.write(cache_key({"o": i}), CacheEntry("cubin", "sm_90", b"y" * 1000))
    assert small.info()["bytes"] > 2 * limit
    for i in range(limit // 10 // 1000 + 1):
        small.write(cache_key({"s": i}), CacheEntry("cubin", "sm_90", b"z" * 1000))
    assert small.info()["bytes"] <= limit


# ------------------------------------------------------------------ archive bombs (#25 item 14)


def gz(path, *parts):
    import gzip
    with gzip.open(path, "wb", compresslevel=1) as f:
        for p in parts:
            f.write(p)
    return path


def tar_header(name, size, type_=b"0", **fields):
    import tarfile
    info = tarfile.TarInfo(name)
    info.size, info.type = size, type_
    for k, v in fields.items():
        setattr(info, k, v)
    return info.tobuf(tarfile.USTAR_FORMAT)


def bounded(fn):
    """fn()'s result or exception, and the most memory Python allocated meanwhile."""
    import tracemalloc
    tracemalloc.start()
    try:
        try:
            return fn(), tracemalloc.get_traced_memory()[1]
        except Exception as e:
            return e, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_entry_too_large_for_memory_is_streamed(tmp_path):
    """A 64 KiB .tar.gz of one member: an entry header and 64 MiB of zeros (1 MB of gzip made
    1 GiB, a MemoryError): copied through a MiB at a time, then refused by its checksum."""
    import struct
    key = cache_key({"bomb": 1})
    desc = json.dumps({"key": key, "kind": "cubin", "arch": "sm_90", "payload_bytes": 64 << 20}).encode()
    head = struct.pack("<8sII32s", b"NBJITC\x00\x01", FORMAT_VERSION, len(desc), b"\0" * 32)
    size = len(head) + len(desc) + (64 << 20)
    zeros = b"\0" * (1 << 20)
    p = gz(tmp_path / "z.tar.gz", tar_header(key + ".nbjit", size), head, desc, *[zeros] * 64, b"\0" * 2048)
    c = Cache(tmp_path / "c")
    got, peak = bounded(lambda: c.import_archive(p))
    assert got == (0, [f"{key}.nbjit: checksum mismatch"]) and peak < 16 << 20, (got, peak)
    assert c.entries() == [] and c.temporary_files() == []


@pytest.mark.parametrize("what", ["long name", "long link", "pax header", "global pax headers", "gnu sparse",
                                  "pax sparse", "nested long names"])
def test_archive_bombs_are_cache_errors_in_bounded_memory(tmp_path, what):
    import tarfile
    key = cache_key({"bomb": what})
    huge = 1_500_000_000
    if what == "long name":  # a GNU long name claiming 1.5 GB, 1 MiB of it there
        parts = [tar_header("././@LongLink", huge, tarfile.GNUTYPE_LONGNAME), b"a" * (1 << 20)]
    elif what == "long link":
        parts = [tar_header("././@LongLink", huge, tarfile.GNUTYPE_LONGLINK), b"a" * (1 << 20)]
    elif what == "pax header":
        parts = [tar_header("pax", huge, tarfile.XHDTYPE), b"9 a=b\n" * 1000]
    elif what == "global pax headers":  # each 520 KB, a new key in every 13 bytes: all kept, copied to each member
        parts = []
        for h in range(20):
            records = b"".join(b"13 k%07d=\n" % (h * 40000 + i) for i in range(40000))
            parts.append(tar_header("g", len(records), tarfile.XGLTYPE) + records + b"\0" * (-len(records) % 512))
    elif what == "gnu sparse":  # a 1 KB member that would read as 1 GiB of holes
        h = bytearray(tar_header(key + ".nbjit", 0, tarfile.GNUTYPE_SPARSE))
        h[483:495] = b"%011o\0" % ((1 << 30) - 1)
        h[148:156] = b"        "
        h[148:156] = b"%06o\0 " % sum(h)
        parts = [bytes(h), b"\0" * 1024]
    elif what == "pax sparse":
        info = tarfile.TarInfo(key + ".nbjit")
        info.pax_headers = {"GNU.sparse.map": "0,0", "GNU.sparse.realsize": str((1 << 30) - 1),
                            "GNU.sparse.name": key + ".nbjit"}
        parts = [info.tobuf(tarfile.PAX_FORMAT), b"\0" * 1024]
    else:  # long names each naming the next: a chain deeper than Python's stack
        link = tar_header("././@LongLink", 100, tarfile.GNUTYPE_LONGNAME) + b"n" * 100 + b"\0" * 412
        parts = [link * 5000, b"\0" * 1024]
    p = gz(tmp_path / "bomb.tar.gz", *parts)
    c = Cache(tmp_path / "c")
    t0 = time.thread_time()
    got, peak = bounded(lambda: c.import_archive(p))
    assert isinstance(got, NbjitCacheError) and "bomb.tar.gz" in str(got), got
    assert peak < 16 << 20 and time.thread_time() - t0 < 10, (peak, got)
    assert c.entries() == [] and c.temporary_files() == []


def test_an_archive_is_read_in_time_proportional_to_its_size(tmp_path):
    """A member that would reach past 1032 times the archive's size decompressed (gzip's
    most) is refused before it is read or skipped (a 3 KB .tar.bz2 claiming 4 GiB was
    decompressed whole: 16 s, 30 s with a key); with a key, a member larger than an entry is
    refused without being hashed; a file of zeros (an empty archive to tarfile) is none."""
    import bz2
    import tarfile
    from nbjit import NbjitCacheError
    size = 16 << 20
    bomb = tmp_path / "bomb.tar.bz2"
    bomb.write_bytes(bz2.compress(tar_header("x.nbjit", size) + bytes(size + 1024)))
    assert len(bomb.read_bytes()) * 1032 + (1 << 20) < size
    with tarfile.open(bomb) as tar:
        assert tar.getmember("x.nbjit").size == size  # (what tarfile would read)
    c = Cache(tmp_path / "c")
    for key in (None, "k" * 32):
        with pytest.raises(NbjitCacheError, match=r"bomb.tar.bz2: member x.nbjit claims 16777216 bytes: the archive "
                                                  r"would expand to more than 1032 times its size"):
            c.import_archive(bomb, archive_key=key)
    big = tmp_path / "big.tar"  # a plain archive whose member claims 1 GiB + 1, 1 MiB of it there
    big.write_bytes(tar_header("0" * 64 + ".nbjit", (1 << 30) + 1) + bytes(1 << 20))
    with pytest.raises(NbjitCacheError, match=r"big.tar: member 0{64}.nbjit of 1073741825 bytes, more than an entry "
                                              r"can be, so not a cache archive nbjit signed"):
        c.import_archive(big, archive_key="k" * 32)
    (tmp_path / "zeros.tar").write_bytes(bytes(10240))
    with pytest.raises(NbjitCacheError, match=r"zeros.tar: a file of zeros, so not a cache archive"):
        c.import_archive(tmp_path / "zeros.tar")
    assert c.entries() == [] and c.temporary_files() == []
    empty = tmp_path / "empty.tar.gz"  # (an empty cache's export is one)
    Cache(tmp_path / "none").export_archive(empty)
    assert c.import_archive(empty) == (0, [])


def test_a_damaged_xz_archive_is_a_cache_error(tmp_path):
    """xz's error is no OSError: it escaped as a bare LZMAError."""
    import lzma
    from nbjit import NbjitCacheError
    raw = bytearray(lzma.compress(entry_archive(tmp_path / "e.tar", 20, size=5000).read_bytes()))
    raw[len(raw) // 2] ^= 0xFF
    (tmp_path / "e.tar.xz").write_bytes(bytes(raw))
    with pytest.raises(NbjitCacheError, match=r"e.tar.xz: a damaged cache archive \(Corrupt input data\)"):
        Cache(tmp_path / "c").import_archive(tmp_path / "e.tar.xz")


def test_many_refusals_are_listed_up_to_a_thousand(tmp_path):
    tar_with(tmp_path / "x.tar.gz", [(f"n{i}.txt", b"") for i in range(1100)])
    added, refused = Cache(tmp_path / "c").import_archive(tmp_path / "x.tar.gz")
    assert added == 0 and len(refused) == 1001 and refused[-1].startswith("... and 100 more members")


# ------------------------------------------------------------------ lock files (#25 item 20)


def test_a_lock_file_that_is_a_link_is_never_followed(tmp_path):
    c = Cache(tmp_path / "c")
    lock = c.file(KEY).with_suffix(".lock")
    lock.parent.mkdir(parents=True)
    lock.symlink_to(tmp_path / "outside")
    assert c.get_or_create(KEY, lambda: ENTRY) == ENTRY
    assert not (tmp_path / "outside").exists() and Cache(tmp_path / "c").read(KEY) == ENTRY
    c.clear()  # a link among the lock files is removed, never followed
    assert not lock.is_symlink() and not (tmp_path / "outside").exists()


def test_lock_files_do_not_pile_up(tmp_path):
    """100 compiles with max_bytes=0 left 100 .lock files and no entry."""
    c = Cache(tmp_path, max_bytes=0)
    for i in range(100):
        c.get_or_create(cache_key({"lock": i}), lambda: ENTRY)
    assert list(tmp_path.glob("??/*")) == []
    # one a killed process left (nobody holds it) goes at the next prune
    stale = Cache(tmp_path).file(KEY).with_suffix(".lock")
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.touch()
    Cache(tmp_path).prune()
    assert not stale.exists()


def test_clear_keeps_a_held_lock(tmp_path):
    """clear() unlinked the lock of a process making an entry, so a second one made it too."""
    import fcntl
    c = Cache(tmp_path, lock_timeout=0.3)
    c.write(cache_key({"other": 1}), ENTRY)
    lock = c.file(KEY).with_suffix(".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process making KEY's entry
        assert c.clear() == 1
        assert lock.exists() and os.stat(lock).st_ino == os.fstat(held.fileno()).st_ino
        made = []
        assert c.get_or_create(KEY, lambda: made.append(time.monotonic()) or ENTRY) == ENTRY
        assert made  # made only once the holder's lock was given up on: it still held


def test_a_waiter_for_a_removed_lock_takes_the_new_one(tmp_path, monkeypatch):
    """The holder removes its lock file as it finishes; a process that opened it before then
    locks a file nobody else can find, so it takes the one at the path."""
    c = Cache(tmp_path)
    lock = c.file(KEY).with_suffix(".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    real_open = os.open
    removed = []

    def open_then_remove(path, *a, **k):
        fd = real_open(path, *a, **k)
        if str(path).endswith(".lock") and not removed:
            removed.append(path)
            os.unlink(path)  # its holder finished right after we opened it
        return fd

    import nbjit.cache.store as cache_mod
    monkeypatch.setattr(cache_mod.os, "open", open_then_remove)
    with c._key_lock(KEY):
        assert removed and lock.exists()  # the lock it holds is the one at the path
    assert not lock.exists()


@pytest.mark.parametrize("call", ["info", "clear", "prune", "entries"])
def test_an_unreadable_cache_is_an_error_not_empty(tmp_path, monkeypatch, call):
    """On an unreadable cache info, clear and prune reported 0 entries (simulated: the tests
    may run as root, whom permissions do not stop)."""
    c = Cache(tmp_path)
    c.write(KEY, ENTRY)
    import nbjit.cache.store as cache_mod
    real = os.scandir

    def refused(path="."):
        if str(path) == str(tmp_path):
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(cache_mod.os, "scandir", refused)
    with pytest.raises(NbjitCacheError, match=f"cannot read the cache directory {tmp_path}: Permission denied"):
        getattr(c, call)()
    c.write(cache_key({"more": 1}), ENTRY)  # a write's own scan gives up quietly: the cache is still used


def test_a_read_only_cache_cannot_be_cleared_silently(tmp_path, monkeypatch):
    c = Cache(tmp_path)
    c.write(KEY, ENTRY)
    import nbjit.cache.store as cache_mod
    monkeypatch.setattr(cache_mod.os, "unlink", lambda *a, **k: (_ for _ in ()).throw(
        OSError(30, "Read-only file system")))
    with pytest.raises(NbjitCacheError, match="cannot remove .*: Read-only file system"):
        c.clear()
    with pytest.raises(NbjitCacheError, match="Read-only file system"):
        c.prune(0)


def test_an_entry_carries_its_facts(tmp_path, monkeypatch):
    """get_or_create reads the facts of an entry once: as it is made, or where the entry
    keeps none this nbjit reads (written without, or by other code), then keeps them (the
    file rewritten); a hit hands them back decoded, reading nothing again."""
    from nbjit import inspect_cubin
    from nbjit.cache import facts as _facts
    cubin = (DATA / "nvcc/kernels_sm_90.cubin").read_bytes()
    entry = CacheEntry("cubin", "sm_90", cubin, producer="nvcc")
    derived = []

    def derive(e):
        derived.append(e.payload == cubin)
        return _facts.Facts({}, inspect_cubin(e.payload, source="k.cubin"), {})

    info = inspect_cubin(cubin, source="k.cubin")
    key = cache_key({"facts": 1})
    made = Cache(tmp_path).get_or_create(key, lambda: entry, derive)
    assert made.facts.info == info and derived == [True]
    hit = Cache(tmp_path).get_or_create(key, lambda: entry, derive)  # from the file: decoded, not derived
    assert hit.facts.info == info and hit.facts == made.facts and derived == [True]
    # an entry without facts (an nbjit before them), and one whose facts other code read
    plants = (lambda c: c.write(key, entry), lambda c: monkeypatch.setattr(_facts, "stamp", lambda: "other"))
    for n, plant in enumerate(plants, start=2):
        plant(Cache(tmp_path))
        assert Cache(tmp_path).read(key).facts is None
        again = Cache(tmp_path).get_or_create(key, lambda: entry, derive)
        assert again.facts.info == info and len(derived) == n
        assert Cache(tmp_path).read(key).facts == again.facts  # kept: the next process derives nothing
    assert derived == [True] * 3
    # without a way to read them, an entry comes as it is; where they cannot be read, they are not kept
    monkeypatch.undo()
    Cache(tmp_path).write(key, entry)
    assert Cache(tmp_path).get_or_create(key, lambda: entry).facts is None
    c = Cache(tmp_path)
    assert c.get_or_create(key, lambda: entry, lambda e: None).facts is None and Cache(tmp_path).read(key).facts is None


def test_a_size_limit_may_be_written_with_a_unit(tmp_path):
    assert Cache(tmp_path, max_bytes="1G").max_bytes == 1 << 30
    assert Cache(tmp_path, max_bytes="512k").max_bytes == 512 << 10
    with pytest.raises(NbjitCacheError, match="a size such as '1G'"):
        Cache(tmp_path, max_bytes="lots")
