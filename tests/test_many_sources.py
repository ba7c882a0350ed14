"""compile_many: independent sources compiled at once, through the cache, in order."""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import nbjit
from nbjit import CompileFailure, NbjitCompileError
from nbjit.toolchain.nvrtc import compile_image
from nbjit.toolchain import many_sources
from nbjit.toolchain.many_sources import compile_many

from conftest import DATA, alive, children, endless_source, wait_compiling  # noqa: E402

ROOT = str(DATA.parents[1])


def src(i: int) -> str:
    return f'extern "C" __global__ void k{i}(float* o) {{ o[threadIdx.x] = {i}.0f; }}\n'


def test_images_in_order_through_the_cache():
    images = compile_many([src(i) for i in range(6)], arch="sm_90", workers=3)
    assert [img.info.entries[0].name for img in images] == [f"k{i}" for i in range(6)]
    assert all(img.kind == "cubin" and img.arch == "sm_90" for img in images)
    # the same entries compile_image finds afterwards (the same cache keys)
    again = compile_image(src(4), arch="sm_90")
    assert again.data == images[4].data


def test_an_item_without_an_architecture_is_for_the_current_device(tmp_path, monkeypatch):
    """As ``compile_image``: an item that names no ``arch`` compiles for the current device's
    (asked once), one that names one for that."""
    from nbjit.gpu.host import current_host
    asked = []
    monkeypatch.setattr(current_host(), "current_cc", lambda: asked.append(1) or (8, 6))
    images = compile_many([src(0), src(1), {"source": src(2), "arch": "sm_90"}], cache=nbjit.Cache(tmp_path),
                          processes=False)
    assert [str(img.arch) for img in images] == ["sm_86", "sm_86", "sm_90"] and asked == [1]


def test_items_are_sources_paths_or_argument_dicts():
    tmpl = (DATA / "src/nvrtc_tmpl.cu").read_text()
    hdr = {"scale.cuh": (DATA / "src/scale.cuh").read_text()}
    images = compile_many([src(0), DATA / "src/spill.cu",
                           {"source": tmpl, "name": "tmpl.cu", "headers": hdr, "name_expressions": ["fill<float>"]}],
                          arch="sm_80")
    assert images[1].name == "spill.cu" and {e.name for e in images[1].info.entries} >= {"spills", "tiled"}
    assert "fill<float>" in images[2].lowered_names and images[2].name == "tmpl.cu"
    assert all(img.arch == "sm_80" for img in images)
    assert compile_many([], arch="sm_90") == []


def test_runs_in_threads():
    seen = set()

    class Spy(str):  # a source whose encoding records the thread compiling it
        def encode(self, *a, **k):
            seen.add(threading.current_thread().name)
            return str.encode(self, *a, **k)

    compile_many([Spy(src(10 + i)) for i in range(4)], arch="sm_90", workers=2)
    assert seen and all(n.startswith("nbjit-compile") for n in seen)


def test_errors_name_the_source_that_failed():
    with pytest.raises(NbjitCompileError, match=r"source 1 \(bad\.cu\) failed \(and 1 more: item 2\): bad\.cu: "
                                                r"NVRTC") as e:
        compile_many([src(20), {"source": "not C++ at all", "name": "bad.cu"}, "also bad"], arch="sm_90")
    assert isinstance(e.value.__cause__, CompileFailure)
    with pytest.raises(NbjitCompileError, match="item 0 is a dict without 'source'"):
        compile_many([{"name": "x.cu"}], arch="sm_90")
    with pytest.raises(NbjitCompileError, match="workers must be an int >= 1, not 0"):
        compile_many([src(0)], arch="sm_90", workers=0)


def test_return_exceptions_gives_each_sources_result_in_its_place(tmp_path):
    got = compile_many([src(32), {"source": "not C++ at all", "name": "bad.cu"}, src(33)], arch="sm_90",
                       cache=nbjit.Cache(tmp_path), return_exceptions=True)
    assert [type(g).__name__ for g in got] == ["Image", "CompileFailure", "Image"]
    assert "bad.cu" in str(got[1]) and got[2].info.entries[0].name == "k33"
    mods = nbjit.compile_many([src(32), "also bad"], arch="sm_90", lazy=True, cache=nbjit.Cache(tmp_path),
                              return_exceptions=True)
    assert mods[0].kernels == ("k32",) and isinstance(mods[1], CompileFailure)
    with pytest.raises(NbjitCompileError, match="return_exceptions must be True or False, not 1"):
        compile_many([src(32)], arch="sm_90", return_exceptions=1)


def test_modules_lazily_without_a_gpu():
    mods = nbjit.compile_many([src(30), src(31)], arch="sm_90", lazy=True)
    assert [m.kernels for m in mods] == [("k30",), ("k31",)]


# ------------------------------------------------------------------ the process route

def _pool():
    from nbjit.toolchain import workers as _workers
    from nbjit.toolchain.many_sources import _WORKER, _WORKER_INIT
    return _workers.pool(_WORKER, _WORKER_INIT)


def test_process_route_compiles_in_workers_in_order(tmp_path):
    pool = _pool()
    before = pool.calls
    srcs = [src(40 + i) for i in range(5)]
    images = compile_many(srcs, arch="sm_90", cache=nbjit.Cache(tmp_path), workers=2, processes=True)
    assert pool.calls - before == 5  # each compiled in a worker process
    assert [img.info.entries[0].name for img in images] == [f"k{40 + i}" for i in range(5)]
    # the same bytes and facts as a compile in this process, and the same cache entries
    here = compile_image(srcs[3], arch="sm_90", cache=nbjit.Cache(tmp_path / "other"))
    assert here.data == images[3].data and here.info == images[3].info and here.typed == images[3].typed
    assert compile_image(srcs[3], arch="sm_90", cache=nbjit.Cache(tmp_path)).data == images[3].data
    assert len(nbjit.Cache(tmp_path).entries()) == 5


def test_process_route_workers_write_the_entry_files(tmp_path, monkeypatch):
    """A worker encodes the entry and writes its file (whole: a temporary file renamed), the
    caller holding the key's lock; the caller writes none itself."""
    import nbjit.cache.store as cache_mod
    from nbjit.read.image import content_digest
    here = []
    real = cache_mod._write_file
    monkeypatch.setattr(cache_mod, "_write_file", lambda *a: here.append(a) or real(*a))
    srcs = [src(45 + i) for i in range(3)]
    images = compile_many(srcs, arch="sm_90", cache=nbjit.Cache(tmp_path), workers=2, processes=True)
    assert here == []
    files = sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and p.name != "CACHEDIR.TAG")
    # no temporary or lock file left: the entries, and where the call index filed them, each
    # source's call and the state it is filed in (none where this process's probes saw a change);
    # and the directory's marker
    entries = [f for f in files if f.endswith(".nbjit")]
    calls = [f for f in files if f.endswith(".call")]
    assert len(entries) == 3 and len(calls) in (0, 3) and len(files) == 3 + len(calls) + bool(calls)
    assert not calls or "toolchain-state.json" in files
    for img, s in zip(images, srcs):
        assert img.__dict__["digest"] == content_digest(img.data)  # hashed once, in the worker
        # a fresh cache reads the file, with its facts (no ELF parsed again)
        again = compile_image(s, arch="sm_90", cache=nbjit.Cache(tmp_path))
        assert again.data == img.data and again.info == img.info and again.typed == img.typed


def test_process_route_a_cache_it_cannot_write_is_given_up_once(tmp_path):
    (tmp_path / "file").write_text("")
    c = nbjit.Cache(tmp_path / "file" / "cache")  # (root ignores permissions: a path under a file)
    with pytest.warns(nbjit.NbjitWarning, match="cannot write") as w:
        images = compile_many([src(47 + i) for i in range(3)], arch="sm_90", cache=c, workers=2, processes=True)
    assert len([x for x in w if issubclass(x.category, nbjit.NbjitWarning)]) == 1 and c.path is None
    assert [img.info.entries[0].name for img in images] == ["k47", "k48", "k49"]


def test_process_route_publishes_to_the_remote_tier(tmp_path):
    pytest.importorskip("fsspec")
    shared = tmp_path / "shared"
    shared.mkdir()
    images = compile_many([src(57), src(58)], arch="sm_90", cache=nbjit.Cache(tmp_path / "a", remote=shared),
                          workers=2, processes=True)
    assert sorted(p.name for p in shared.rglob("*") if p.is_file()) == \
        sorted(f.name for f, _, _ in nbjit.Cache(tmp_path / "a").entries())
    assert [compile_image(s, arch="sm_90", cache=nbjit.Cache(tmp_path / "b", remote=shared)).data
            for s in (src(57), src(58))] == [i.data for i in images]


def test_process_route_a_worker_takes_the_key_lock_and_reads_what_its_holder_made(tmp_path):
    """The worker takes the key's lock itself: while another process holds it, it waits, then
    reads the entry that process made (it compiles nothing)."""
    import dataclasses
    import time
    from nbjit.toolchain import nvrtc as C
    from nbjit.toolchain import request
    s = src(98)
    key = C._key(request._request(s, None, (), None, (), (), "sm_90", "auto"))
    compile_image(s, arch="sm_90", cache=nbjit.Cache(tmp_path / "elsewhere"))
    planted = dataclasses.replace(nbjit.Cache(tmp_path / "elsewhere").read(key), log="made by the lock's holder")
    c = nbjit.Cache(tmp_path / "c")
    pool = _pool()
    compile_many([src(99)], arch="sm_90", cache=c, processes=True)  # (a worker ready)
    before, out = pool.calls, []
    with c._key_lock(key):  # as another process making it holds it
        t = threading.Thread(target=lambda: out.append(compile_many([s], arch="sm_90", cache=c, processes=True)))
        t.start()
        deadline = time.monotonic() + 30
        while pool._busy == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.2)  # (the worker waits for the lock)
        c.write(key, planted)
    t.join(60)
    assert out and out[0][0].log == "made by the lock's holder" and pool.calls - before == 1


def test_process_route_hits_the_cache_without_workers(tmp_path):
    pool = _pool()
    srcs = [src(50 + i) for i in range(4)]
    first = compile_many(srcs, arch="sm_90", cache=nbjit.Cache(tmp_path), workers=2, processes=True)
    before = pool.calls
    # a fresh Cache object on the same directory: each found on disk, no worker asked
    again = compile_many(srcs, arch="sm_90", cache=nbjit.Cache(tmp_path), workers=2, processes=True)
    assert pool.calls == before
    assert [a.data for a in again] == [f.data for f in first]


def test_process_route_errors_name_the_source(tmp_path):
    with pytest.raises(NbjitCompileError, match=r"source 2 \(bad\.cu\) failed: bad\.cu: NVRTC") as e:
        compile_many([src(60), src(61), {"source": "not C++ at all", "name": "bad.cu"}], arch="sm_90",
                     cache=nbjit.Cache(tmp_path), workers=2, processes=True)
    cause = e.value.__cause__
    assert isinstance(cause, CompileFailure) and "not C++" in cause.source and cause.log  # pickled back whole
    # the others were compiled and cached
    assert compile_many([src(60), src(61)], arch="sm_90", cache=nbjit.Cache(tmp_path), processes=False)


def test_process_route_replaces_a_worker_that_died(tmp_path):
    pool = _pool()
    compile_many([src(70), src(71)], arch="sm_90", cache=nbjit.Cache(tmp_path), workers=2, processes=True)
    with pool._lock:
        victims = list(pool._idle)
    assert victims
    for w in victims:
        w.proc.kill()
        w.proc.wait()
    before = pool.calls
    images = compile_many([src(72), src(73)], arch="sm_90", cache=nbjit.Cache(tmp_path), workers=2, processes=True)
    assert pool.calls - before == 2 and [i.info.entries[0].name for i in images] == ["k72", "k73"]


def test_workers_load_neither_numba_nor_nbjits_driver_stage():
    from nbjit.toolchain import workers as _workers
    from nbjit.toolchain.many_sources import _WORKER_INIT
    probe = _workers.Pool("builtins:eval", _WORKER_INIT)
    try:
        done, mods = probe.try_call(("sorted(m for m in __import__('sys').modules if m.split('.')[0] in "
                                     "('numba', 'numba_cuda_mlir', 'numpy') or m in ('nbjit.gpu.driver', "
                                     "'nbjit.loading.module', 'nbjit.launch.kernel'))",), 1, wait=True)
        assert done and mods == []
        done, main = probe.try_call(("__import__('sys').modules['__main__'].__dict__.get('__file__')",), 1, wait=True)
        assert done and main is None  # the caller's script is not run again there
    finally:
        probe.close()


def test_a_cold_process_route_compiles_a_few_in_threads_until_workers_are_ready(tmp_path, monkeypatch):
    """processes=None, no worker started yet: at most PROCESS_INLINE (and the CPUs) compile in
    the call's threads at once; the other sources wait for a worker or a free thread."""
    import os
    from nbjit.toolchain import workers as _workers
    from nbjit.toolchain import nvrtc as compiler
    monkeypatch.setattr(_workers, "_POOLS", {})  # a pool of its own: cold
    lock, now, most, here = threading.Lock(), [0], [0], []
    real = compiler._run_nvrtc

    def counting(req):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
            here.append(req.name)
        try:
            return real(req)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(compiler, "_run_nvrtc", counting)
    try:
        images = compile_many([src(90 + i) for i in range(10)], arch="sm_90", cache=nbjit.Cache(tmp_path), workers=8)
        pool = _pool()
        assert [img.info.entries[0].name for img in images] == [f"k{90 + i}" for i in range(10)]
        assert 1 <= most[0] <= min(many_sources.PROCESS_INLINE, len(os.sched_getaffinity(0)))
        assert len(here) + pool.calls == 10
    finally:
        _pool().close()


def test_pool_slots_let_a_caller_run_it_while_workers_start():
    from nbjit.toolchain import workers as _workers
    probe = _workers.Pool("builtins:eval")
    slots = _workers.Slots(1)
    try:
        assert probe.try_call(("1 + 1",), 1, slots=slots) == (False, slots) and slots.free == 0
        got = []
        t = threading.Thread(target=lambda: got.append(probe.try_call(("2 + 2",), 1, slots=slots)))
        t.start()  # no slot left: it waits for the worker
        t.join(60)
        assert got == [(True, 4)] and slots.free == 0
        probe.release(slots)
        assert slots.free == 1 and probe.try_call(("3 + 3",), 1, slots=slots) == (True, 6)
    finally:
        probe.close()


def test_workers_that_cannot_start_leave_the_callers_to_run_it():
    from nbjit.toolchain import workers as _workers
    probe = _workers.Pool("nbjit.no_such_module:f")
    try:
        assert probe.try_call((), 1, wait=True) == (False, None) and "exited" in probe.broken
        assert probe.try_call((), 1, wait=True) == (False, None) and probe.workers() == 0  # none started again
    finally:
        probe.close()


def test_route_choice():
    pool = _pool()
    before = pool.calls
    compile_many([src(80 + i) for i in range(3)], arch="sm_90", workers=3)  # fewer than PROCESS_ROUTE_MIN: threads
    assert pool.calls == before
    with pytest.raises(NbjitCompileError, match="processes must be True, False or None, not 'yes'"):
        compile_many([src(0)], arch="sm_90", processes="yes")


def test_a_starter_that_fails_leaves_the_pool_broken_never_waited_on(monkeypatch):
    """Starting a worker that raises something other than OSError (no sys.executable, say)
    breaks the pool: a caller waiting for a worker is answered (it runs the target itself)."""
    from nbjit.toolchain import workers as _workers

    def no_start(*a, **k):
        raise TypeError("expected str, bytes or os.PathLike object, not NoneType")
    monkeypatch.setattr(_workers, "_Worker", no_start)
    probe = _workers.Pool("builtins:eval")
    got = []
    try:
        t = threading.Thread(target=lambda: got.append(probe.try_call(("1 + 1",), 1, wait=True)), daemon=True)
        t.start()
        t.join(30)
        assert got == [(False, None)] and "NoneType" in probe.broken
    finally:
        probe.close()


def test_a_call_interrupted_before_its_answer_drops_that_worker(monkeypatch):
    """Ctrl-C while a caller waits for a worker's answer: that worker is not used again (its
    answer may still come and would be taken for the next call's)."""
    from nbjit.toolchain import workers as _workers
    probe = _workers.Pool("builtins:eval")
    try:
        assert probe.try_call(("1 + 1",), 1, wait=True) == (True, 2)
        read, calls = _workers._read, []

        def interrupted(f):
            if not calls:
                calls.append(1)
                raise KeyboardInterrupt
            return read(f)
        monkeypatch.setattr(_workers, "_read", interrupted)
        with pytest.raises(KeyboardInterrupt):
            probe.try_call(("2 + 2",), 1, wait=True)
        assert probe.try_call(("3 + 3",), 1, wait=True) == (True, 6)
        assert probe.try_call(("'a' * 2",), 1, wait=True) == (True, "aa")
        with pytest.raises(ZeroDivisionError):  # the target's own error: the worker stays
            probe.try_call(("1 / 0",), 1, wait=True)
        assert probe.try_call(("4 + 4",), 1, wait=True) == (True, 8)
    finally:
        probe.close()


# ------------------------------------------------------------------ the process route, workers ready

def _ready_pool(tmp_path, count: int = 2):
    """The pool with ``count`` workers ready (started by a call of its own)."""
    compile_many([src(200 + i) for i in range(count)], arch="sm_90", cache=nbjit.Cache(tmp_path / "warm"),
                 workers=count, processes=True)
    return _pool()


def test_ready_workers_are_fed_from_the_calling_thread(tmp_path, monkeypatch):
    """Workers ready: each source is planned (its key computed) and sent by the calling thread
    itself, no thread per source; the images come back in order, each compiled in a worker."""
    from nbjit.toolchain import nvrtc as compiler
    pool = _ready_pool(tmp_path)
    seen, real = set(), compiler._key
    monkeypatch.setattr(compiler, "_key",
                        lambda req, walk=None: seen.add(threading.current_thread().name) or real(req, walk))
    before = pool.calls
    images = compile_many([src(210 + i) for i in range(5)], arch="sm_90", cache=nbjit.Cache(tmp_path / "c"),
                          workers=4)
    assert seen == {threading.current_thread().name}
    assert pool.calls - before == 5 and [i.info.entries[0].name for i in images] == [f"k{210 + i}" for i in range(5)]


def test_one_source_twice_in_a_call_is_compiled_once(tmp_path):
    pool = _ready_pool(tmp_path)
    before = pool.calls
    images = compile_many([src(220), src(221), src(220)], arch="sm_90", cache=nbjit.Cache(tmp_path / "c"),
                          workers=4, processes=True)
    assert pool.calls - before == 2 and images[0].data == images[2].data and images[0] is not images[2]
    assert [i.info.entries[0].name for i in images] == ["k220", "k221", "k220"]


def test_a_source_without_kernels_warns_naming_the_callers_line(tmp_path):
    _ready_pool(tmp_path)
    for _ in ("compiled in a worker", "found on disk"):
        with pytest.warns(nbjit.NbjitWarning, match="compiled no kernel") as w:
            compile_many(["__device__ int f(int x) { return x + 230; }\n", src(231)], arch="sm_90",
                         cache=nbjit.Cache(tmp_path / "c"), workers=4, processes=True)
        assert [x.filename for x in w if issubclass(x.category, nbjit.NbjitWarning)] == [__file__]


def test_a_worker_that_dies_during_a_request_is_replaced(tmp_path, monkeypatch):
    from nbjit.toolchain import workers as _workers
    pool = _ready_pool(tmp_path)
    real, killed = _workers._Worker.send, []

    def send_and_kill(worker, args):
        real(worker, args)
        if not killed:  # the first request's worker dies before it replies
            killed.append(worker)
            worker.proc.kill()
    monkeypatch.setattr(_workers._Worker, "send", send_and_kill)
    before = pool.calls
    images = compile_many([src(240 + i) for i in range(3)], arch="sm_90", cache=nbjit.Cache(tmp_path / "c"),
                          workers=2, processes=True)
    assert killed and killed[0].proc.poll() is not None
    assert pool.calls - before == 3 and [i.info.entries[0].name for i in images] == ["k240", "k241", "k242"]
    assert pool._busy == 0 and killed[0] not in pool._idle


def test_a_call_interrupted_while_workers_compile_drops_those_workers(tmp_path, monkeypatch):
    """Ctrl-C while the calling thread waits for replies: the workers whose replies were not
    read are closed (never given another request), the others kept; the next call works."""
    from nbjit.toolchain import workers as _workers
    pool = _ready_pool(tmp_path, 3)
    real, sent = _workers._read, []
    monkeypatch.setattr(_workers._Worker, "send", lambda w, args, send=_workers._Worker.send: sent.append(w) or
                        send(w, args))

    def interrupted(f):
        raise KeyboardInterrupt
    monkeypatch.setattr(_workers, "_read", interrupted)
    with pytest.raises(KeyboardInterrupt):
        compile_many([src(250 + i) for i in range(3)], arch="sm_90", cache=nbjit.Cache(tmp_path / "c"), workers=3,
                     processes=True)
    monkeypatch.setattr(_workers, "_read", real)
    assert sent and pool._busy == 0 and not any(w in pool._idle for w in sent)
    assert all(w.proc.wait(10) is not None for w in sent)
    images = compile_many([src(250 + i) for i in range(3)], arch="sm_90", cache=nbjit.Cache(tmp_path / "c"),
                          workers=3, processes=True)
    assert [i.info.entries[0].name for i in images] == ["k250", "k251", "k252"]


def test_workers_that_cannot_start_leave_compile_many_to_compile_here(tmp_path, monkeypatch):
    """processes=True, and no worker can start (its module is missing): the sources are
    compiled in this process's threads instead, none lost."""
    from nbjit.toolchain import workers as _workers
    monkeypatch.setattr(_workers, "_POOLS", {})
    monkeypatch.setattr(many_sources, "_WORKER", "nbjit.no_such_module:f")
    images = compile_many([src(260 + i) for i in range(4)], arch="sm_90", cache=nbjit.Cache(tmp_path), workers=4,
                          processes=True)
    assert [i.info.entries[0].name for i in images] == [f"k{260 + i}" for i in range(4)]
    assert _workers.pool(many_sources._WORKER, many_sources._WORKER_INIT).broken


def test_a_last_request_that_cannot_be_sent_is_that_sources_error_and_the_worker_stays(tmp_path):
    """The last pending source's request does not pickle: that source fails with nbjit's error
    naming it, the others compile, and the worker it was to go to is given back, not lost."""
    pool = _ready_pool(tmp_path)

    def unpicklable(text):
        class Local(str):  # (a class defined in a function does not pickle)
            pass
        return Local(text)
    with pytest.raises(NbjitCompileError, match=r"source 1 \(kernel\.cu\) failed: .*pickle"):
        compile_many([src(270), unpicklable(src(271))], arch="sm_90", cache=nbjit.Cache(tmp_path / "c"), workers=1,
                     processes=True)
    assert pool._busy == 0
    images = compile_many([src(272), src(273)], arch="sm_90", cache=nbjit.Cache(tmp_path / "c"), workers=2,
                          processes=True)
    assert [i.info.entries[0].name for i in images] == ["k272", "k273"]


def test_items_with_their_own_caches_need_no_default_cache(tmp_path, monkeypatch):
    """Every item brings its cache: the default one (here unusable) is never made."""
    _ready_pool(tmp_path)
    monkeypatch.setenv("NBJIT_CACHE_MAX_BYTES", "junk")
    monkeypatch.setattr(nbjit.cache.store, "_DEFAULT", [])  # (none made yet: made from the environment on first use)
    images = compile_many([{"source": src(280 + i), "cache": nbjit.Cache(tmp_path / "c")} for i in range(3)],
                          arch="sm_90", workers=2, processes=True)
    assert [i.info.entries[0].name for i in images] == ["k280", "k281", "k282"]


def test_an_unknown_argument_is_refused_before_anything_compiles(tmp_path):
    cache = nbjit.Cache(tmp_path / "c")
    with pytest.raises(NbjitCompileError, match=r"compile_many: item 1: no argument 'bogus' \(compile_image takes "
                                                r"name, name_expressions, .*pch\)"):
        compile_many([src(290), {"source": src(291), "bogus": 1}], arch="sm_90", cache=cache)
    with pytest.raises(NbjitCompileError, match=r"compile_many: the call: no argument 'bogus'"):
        compile_many([src(292)], arch="sm_90", cache=cache, bogus=3)
    assert cache.entries() == []


# ------------------------------------------------------------------ processes: a caller killed or interrupted

CALLER = """
import sys
from nbjit import Cache
from nbjit.toolchain import many_sources
from nbjit.toolchain.many_sources import compile_many
sources = [open(p).read() for p in sys.argv[3:]]
try:
    compile_many(sources, arch="sm_90", cache=Cache(sys.argv[1]), processes=sys.argv[2] == "processes",
                 workers=len(sources))
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def _caller(tmp_path, route: str, count: int) -> subprocess.Popen:
    """A process calling compile_many on ``count`` sources NVRTC never finishes, on ``route``."""
    paths = []
    for i in range(count):
        paths.append(tmp_path / f"endless{i}.cu")
        paths[-1].write_text(endless_source(i))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", CALLER, str(tmp_path / "cache"), route, *map(str, paths)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _until(done, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _free(lock) -> bool:
    """Whether the lock file ``lock`` can be locked now."""
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_a_killed_caller_takes_its_workers_with_it(tmp_path):
    """SIGKILL to a caller whose workers are compiling: they end with it (they held its
    stderr, so that `python x.py 2>&1 | tee log` never saw its end of file, and the keys'
    locks, so that other processes waited 300 s); the locks are free at once."""
    p = _caller(tmp_path, "processes", 2)
    workers: list[int] = []
    try:
        wait_compiling(tmp_path / "cache", 2, lambda: children(p.pid))
        workers = children(p.pid)
        assert len(workers) == 2
        p.kill()
        p.communicate(timeout=60)  # its stderr ends: no worker holds it
        assert _until(lambda: not any(map(alive, workers))), [w for w in workers if alive(w)]
        locks = list((tmp_path / "cache").rglob("*.lock"))
        assert len(locks) == 2
        # nobody holds them: the next process takes them without waiting (a worker's last
        # thread may still be ending as its first shows it gone: a moment)
        assert _until(lambda: all(map(_free, locks))), locks
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for w in workers:
            try:
                os.kill(w, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("count", [1, 2])
def test_ctrl_c_stops_compile_many_in_threads_at_once(tmp_path, count):
    """Ctrl-C while NVRTC compiles in the caller's threads (processes=False; one source: on
    the calling thread): KeyboardInterrupt at once, and the process exits (it waited for the
    compiles, which take hours here)."""
    p = _caller(tmp_path, "threads", count)
    try:
        wait_compiling(tmp_path / "cache", count, lambda: [p.pid])
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert (p.returncode, out) == (0, "interrupted\n"), err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_dead_workers_error_says_what_it_wrote_to_its_own_stderr():
    """A worker's stderr is its own (a file the error quotes), not its caller's."""
    from nbjit.toolchain import workers as _workers
    probe, ask = _workers.Pool("builtins:exec"), _workers.Pool("builtins:eval")
    try:
        mine = os.fstat(2)
        assert ask.try_call(("(lambda s: (s.st_dev, s.st_ino))(__import__('os').fstat(2))",), 1, wait=True) != \
            (True, (mine.st_dev, mine.st_ino))
        with pytest.raises(_workers.WorkerDied, match=r"exited \(status 3\); it said: .*the worker's last words"):
            probe.try_call(("import os, sys; print(\"the worker's last words\", file=sys.stderr, flush=True); "
                            "os._exit(3)",), 1, wait=True)
    finally:
        probe.close()
        ask.close()
