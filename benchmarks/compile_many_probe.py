#!/usr/bin/env python3
"""What limits compile_many's speed-up: NVRTC alone in threads against processes, and nbjit's
compile_many by threads and by worker processes, on the benchmark's sources (no GPU needed).

For each raw NVRTC run (create, compile, read the cubin, destroy; cuda.bindings directly,
no nbjit) every compile records its wall time and, from Linux's schedstat, the time its
thread was on a CPU and waiting for one (run queue); what is left is time it slept, waiting
on a lock (a lock inside NVRTC, or the GIL). Threads that stay runnable but take longer per
compile, in processes as well, point at the hardware (turbo, hyper-threads, memory), not at
a lock; threads that sleep, where processes do not, point at a lock in the process.

nbjit: one at a time (compile_image in a loop), compile_many in threads, and compile_many in
worker processes (the first call, which starts the workers, and later calls), each into an
empty cache, with the time each compile spent outside nvrtcCompileProgram (the Python part,
GIL waits included).

    python benchmarks/compile_many_probe.py [--json out.json] [--counts 1,2,4,8,16]
        [--sources 32] [--rounds 3] [--arch sm_90]

Takes about a minute on 16 cores (each small source compiles in ~65 ms there).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from compile_many import source  # noqa: E402  (the benchmark's 16-source family)

_OPTS: list[bytes] = []


def _schedstat() -> tuple[float, float]:
    """(seconds on a CPU, seconds waiting for one) of the calling thread; zeros off Linux."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            a = f.read().split()
        return int(a[0]) / 1e9, int(a[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0


def _init(opts: list[bytes]) -> None:
    global _OPTS
    _OPTS = opts
    raw_compile(10 ** 7)  # load NVRTC and warm it (its first compile reads its builtins)


def raw_compile(i: int) -> tuple[float, float, float]:
    """One NVRTC compile of source(i) to a cubin: (wall, on-CPU, run-queue) seconds."""
    from cuda.bindings import nvrtc as N
    ok = N.nvrtcResult.NVRTC_SUCCESS
    t, (c, q) = time.perf_counter(), _schedstat()
    err, prog = N.nvrtcCreateProgram(source(i).encode(), b"kernel.cu", 0, [], [])
    assert err == ok, err
    try:
        res = N.nvrtcCompileProgram(prog, len(_OPTS), _OPTS)[0]
        assert res == ok, res
        _, size = N.nvrtcGetCUBINSize(prog)
        buf = bytearray(size)
        N.nvrtcGetCUBIN(prog, buf)
    finally:
        N.nvrtcDestroyProgram(prog)
    c2, q2 = _schedstat()
    return time.perf_counter() - t, c2 - c, q2 - q


def _summary(mode: str, n: int, walls: list[float], per: list[tuple[float, float, float]], base: float | None,
             **more) -> dict:
    w = min(walls)
    cw, cc, cq = (sum(x[k] for x in per) for k in range(3))
    return {"mode": mode, "n": n, "wall_s": w, "walls": walls, "speedup": (base / w) if base else 1.0,
            "compile_ms": 1e3 * cw / len(per), "cpu_ms": 1e3 * cc / len(per),
            "runq_pct": 100 * cq / cw if cw else 0.0, "blocked_pct": 100 * max(0.0, cw - cc - cq) / cw if cw else 0.0,
            **more}


def raw_threads(n: int, m: int, rounds: int, seed: int, base: float | None) -> dict:
    walls, per = [], []
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(raw_compile, range(10 ** 7 + 1, 10 ** 7 + 1 + n)))  # threads started and warm
        for r in range(rounds):
            t = time.perf_counter()
            got = list(pool.map(raw_compile, range(seed + r * m, seed + (r + 1) * m)))
            walls.append(time.perf_counter() - t)
            per += got
    return _summary("nvrtc threads", n, walls, per, base)


def raw_processes(n: int, m: int, rounds: int, seed: int, base: float | None) -> dict:
    ctx = multiprocessing.get_context("spawn")
    walls, per = [], []
    t = time.perf_counter()
    with ctx.Pool(n, initializer=_init, initargs=(_OPTS,)) as pool:
        pool.map(time.sleep, [0.05] * n, chunksize=1)  # every worker started and warm
        start = time.perf_counter() - t
        for r in range(rounds):
            t = time.perf_counter()
            got = pool.map(raw_compile, range(seed + r * m, seed + (r + 1) * m), chunksize=1)
            walls.append(time.perf_counter() - t)
            per += got
    return _summary("nvrtc processes", n, walls, per, base, start_s=start)


class _NvrtcClock:
    """Wraps cuda.bindings' nvrtcCompileProgram to add up, per thread, the time spent in it."""

    def __init__(self):
        from cuda.bindings import nvrtc as N
        self.N, self.real, self.local = N, N.nvrtcCompileProgram, threading.local()
        N.nvrtcCompileProgram = self

    def __call__(self, *a):
        t = time.perf_counter()
        try:
            return self.real(*a)
        finally:
            self.local.t = getattr(self.local, "t", 0.0) + time.perf_counter() - t

    def take(self) -> float:
        t = getattr(self.local, "t", 0.0)
        self.local.t = 0.0
        return t

    def close(self):
        self.N.nvrtcCompileProgram = self.real


def nbjit_runs(m: int, rounds: int, arch: str, workers: int, seed: int) -> list[dict]:
    import nbjit.toolchain.nvrtc as C
    from nbjit.toolchain import many_sources
    from nbjit import Cache
    real_image = C.compile_image
    clock = _NvrtcClock()
    outside: list[float] = []

    def timed_image(*a, **k):  # what compile_many calls per source, in its threads
        clock.take()
        t = time.perf_counter()
        try:
            return real_image(*a, **k)
        finally:
            outside.append(time.perf_counter() - t - clock.take())

    has_processes = "processes" in many_sources.compile_many.__code__.co_varnames
    out = []
    real_image(source(seed - 1), arch=arch, cache=Cache(tempfile.mkdtemp()))  # NVRTC loaded, headers found
    routes = [("one at a time", None), ("compile_many threads", False)]
    if has_processes:
        routes.append(("compile_many processes", True))
    base = None
    try:
        for label, processes in routes:
            walls, outs, first = [], [], None
            for r in range(rounds + (1 if processes else 0)):
                srcs = [source(seed + 100_000 * (len(out) + 1) + 1000 * r + i) for i in range(m)]
                outside.clear()
                C.compile_image = timed_image
                with tempfile.TemporaryDirectory() as d:
                    cache = Cache(d)
                    t = time.perf_counter()
                    if processes is None:
                        for s in srcs:
                            timed_image(s, arch=arch, cache=cache)
                    else:
                        kw = {"processes": processes} if has_processes else {}
                        many_sources.compile_many(srcs, arch=arch, cache=cache, workers=workers, **kw)
                    w = time.perf_counter() - t
                C.compile_image = real_image
                if processes and r == 0:
                    first = w  # the call that starts the workers
                    continue
                walls.append(w)
                if not processes:  # (in worker processes NVRTC's time is not seen here)
                    outs += outside
            w = min(walls)
            base = base or w
            res = {"mode": label, "n": 1 if processes is None else workers, "wall_s": w, "walls": walls,
                   "speedup": base / w, "outside_nvrtc_ms": 1e3 * statistics.mean(outs) if outs else None}
            if first is not None:
                res["first_call_s"] = first
            out.append(res)
    finally:
        C.compile_image = real_image
        clock.close()
    return out


def machine() -> dict:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    info = {"cpus": cpus, "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    try:
        text = Path("/proc/cpuinfo").read_text()
        names = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")]
        info["cpu_model"] = names[0] if names else None
        cores = {ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("core id")}
        phys = {ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("physical id")}
        info["threads_per_core"] = round(len(names) / max(1, len(cores) * max(1, len(phys))), 2)
    except OSError:
        pass
    try:
        from cuda.bindings import nvrtc as N
        _, a, b = N.nvrtcVersion()
        info["nvrtc"] = f"{a}.{b}"
    except Exception as e:  # reported, not fatal
        info["nvrtc"] = f"unavailable: {e}"
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="1,2,4,8,16", help="thread and process counts for raw NVRTC")
    ap.add_argument("--sources", type=int, default=32, help="compiles per raw NVRTC round")
    ap.add_argument("--nbjit-sources", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--workers", type=int, default=None, help="compile_many's workers (default: the CPUs)")
    ap.add_argument("--skip-raw", action="store_true")
    ap.add_argument("--skip-nbjit", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    global _OPTS
    info = machine()
    counts = [int(c) for c in a.counts.split(",") if c.strip()]
    try:
        from nbjit.toolchain.identity import cccl_include_dir, cuda_include_dir
        dirs = [d for d in (cuda_include_dir(), cccl_include_dir()) if d]
    except Exception:  # raw NVRTC does not need nbjit
        dirs = []
    _OPTS = [f"-arch={a.arch}".encode(), *(f"--include-path={d}".encode() for d in dirs)]
    t0 = time.perf_counter()
    print(f"{info['cpus']} CPUs ({info.get('cpu_model')}, {info.get('threads_per_core')} threads/core), "
          f"NVRTC {info['nvrtc']}, Python {info['python']}, load average {info['load_average']}")
    rows: list[dict] = []
    if not a.skip_raw:
        _init(_OPTS)
        base = None
        for n in counts:
            for f in (raw_threads, raw_processes):
                r = f(n, a.sources, a.rounds, 1000 * n + (0 if f is raw_threads else 500_000), base)
                base = base or r["wall_s"]
                r["speedup"] = base / r["wall_s"]
                rows.append(r)
                print(f"  {r['mode']:<16} {n:>3}: {r['wall_s']:.3f} s  x{r['speedup']:5.2f}  per compile "
                      f"{r['compile_ms']:6.1f} ms wall, {r['cpu_ms']:6.1f} ms CPU, run queue {r['runq_pct']:4.1f}%, "
                      f"asleep {r['blocked_pct']:4.1f}%" + (f"  (pool start {r['start_s']:.2f} s)"
                                                            if "start_s" in r else ""), flush=True)
    nb: list[dict] = []
    if not a.skip_nbjit:
        workers = a.workers or info["cpus"]
        nb = nbjit_runs(a.nbjit_sources, a.rounds, a.arch, workers, 7_000_000)
        for r in nb:
            extra = f"  (first call, starting the workers: {r['first_call_s']:.3f} s)" if "first_call_s" in r else ""
            o = r["outside_nvrtc_ms"]
            print(f"  nbjit {r['mode']:<24} {r['n']:>3}: {r['wall_s']:.3f} s  x{r['speedup']:5.2f}  outside NVRTC per "
                  f"compile {o if o is None else round(o, 1)} ms{extra}", flush=True)
    info["load_average_after"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    res = {"machine": info, "raw": rows, "nbjit": nb, "seconds": time.perf_counter() - t0,
           "sources": a.sources, "nbjit_sources": a.nbjit_sources, "rounds": a.rounds, "arch": a.arch}
    print(f"done in {res['seconds']:.0f} s; load average now {info['load_average_after']}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
