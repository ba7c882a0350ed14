"""The compile cache (nbjit.cache) with real NVRTC compiles: keys, corruption, concurrency."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

import nbjit.compiler as C
from nbjit import NbjitWarning, compile_image
from nbjit.cache import FORMAT_VERSION, Cache, CacheEntry, _checksum, cache_key, default_cache
from nbjit.image import content_digest, content_hash

from conftest import DATA  # noqa: E402
SRC = 'extern "C" __global__ void k(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] = SCALE * i; }\n'
TMPL = (DATA / "src/nvrtc_tmpl.cu").read_text()
HDR = {"scale.cuh": (DATA / "src/scale.cuh").read_text()}


@pytest.fixture
def counted(monkeypatch):
    """Counts real NVRTC compiles."""
    calls = []
    real = C._run_nvrtc

    def spy(*a, **k):
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr(C, "_run_nvrtc", spy)
    return calls


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
    from nbjit.cache import _KEY_JSON
    want = json.dumps({"format": FORMAT_VERSION, **fields}, sort_keys=True, separators=(",", ":"))
    assert _KEY_JSON({"format": FORMAT_VERSION, **fields}) == want
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
    monkeypatch.setattr(C, "_FINGERPRINTS", {"nvrtc": {"libs": [["/other/libnvrtc.so.13", 1, 2]], "env": []}})
    build(c)
    assert len(counted) == 2
    monkeypatch.setattr("nbjit.cache.FORMAT_VERSION", FORMAT_VERSION + 1)
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


def test_environment_selects_location(tmp_path, monkeypatch):
    from nbjit.cache import set_default_cache
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
    from nbjit.cache import Cache
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
    from nbjit.cache import _decode
    for f, _, _ in c.entries():
        entry, why = _decode(f.read_bytes(), f.stem)
        assert entry is not None, why
    assert not list(cache.glob("??/.tmp-*"))


KILLED = textwrap.dedent('''
    import os, sys, time
    sys.path.insert(0, sys.argv[2])
    import nbjit.cache as cache_mod
    real_replace = os.replace
    def slow_replace(a, b):
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
    # the write pruned the cache, which reclaimed the killed writer's file: its process is gone
    assert not list(cache.glob("??/.tmp-*"))


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
    assert "removed 1 entries" in run("cache", "prune", "--max-bytes", "4000").stdout
    assert "removed 1 entries" in run("cache", "clear").stdout
    assert "entries:  0" in run("cache", "info").stdout
    r = run("compile", str(src), "--arch", "sm_90", "-o", str(tmp_path / "x.cubin"))
    assert r.returncode == 2 and 'k.cu(1): error: identifier "SCALE" is undefined' in r.stderr


# ---------------------------------------------------------------- hardening

from nbjit import NbjitCacheError  # noqa: E402
from nbjit.cache import set_default_cache  # noqa: E402

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
    left = tmp_path / KEY[:2] / f".tmp-{dead}-abcdef"
    left.write_bytes(b"\0" * 5000)
    mine = tmp_path / KEY[:2] / f".tmp-{os.getpid()}-123456"
    mine.write_bytes(b"\0" * 10)
    info = c.info()
    assert info["temporary_files"] == 2 and info["bytes"] == c.file(KEY).stat().st_size + 5010
    assert c.prune() == 0  # under the limit: only the dead writer's file goes
    assert not left.exists() and mine.exists()
    assert c.clear() == 1 and mine.exists()  # a live writer keeps its file


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
    ({"max_bytes": -1}, "max_bytes must be a byte count >= 0 (or None: no limit), not -1"),
    ({"max_bytes": "1G"}, "max_bytes must be a byte count >= 0 (or None: no limit), not '1G'"),
    ({"max_bytes": True}, "max_bytes must be a byte count >= 0 (or None: no limit), not True"),
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
    import nbjit.compiler as C
    from nbjit.cache import Cache
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
    assert dst.import_archive(tmp_path / "c.tar.gz") == (3, [])
    assert dst.import_archive(tmp_path / "c.tar.gz") == (0, [])  # already there
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
    assert r.returncode == 0 and r.stdout.startswith("exported 1 entries"), r.stderr
    r = run("b", "import", str(tmp_path / "c.tar.gz"))
    assert r.returncode == 0 and r.stdout.startswith("imported 1 new entries"), r.stderr
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
    with pytest.raises(NbjitCacheError, match="t.tar.gz: a damaged cache archive"):
        Cache(tmp_path / "b").import_archive(tmp_path / "t.tar.gz")
    assert Cache(tmp_path / "b").entries() == []
