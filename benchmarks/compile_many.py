#!/usr/bin/env python3
"""16 distinct CUDA C++ sources compiled with an empty cache: one at a time
(``compile_image`` in a loop) against ``compile_many`` (its default route: worker processes
from 4 compiles at once, threads below; --processes yes/no forces one), in fresh cache
directories, the best of --rounds each. The first compile_many call of the process, which
starts the worker processes (compiling in threads meanwhile), is timed apart and not among
the rounds. Prints the speed-up and the goal (0.7 x the CPUs this process may use) and
writes JSON (--json). No GPU needed (an explicit arch).

--set heavy: a second family of sources, each ~4x the compile of the default ("light")
one (18 kernels instead of 3). --sweep 2,4,8,16: compile_many's speed-up with each of these
worker counts too (after the rounds; the workers started by the first call serve them all).

    python benchmarks/compile_many.py [--sources 16] [--rounds 3] [--arch sm_90] [--processes auto|yes|no]
        [--set light|heavy] [--sweep 2,4,8,16] [--json out.json]

On the process route it also reports where the time goes, seen from this process (medians
over the rounds): its CPU per source (``parent_cpu_ms_per_source``: requests, keys, cache
look-ups, pickles, threads), when the first and the last request went to a worker
(``sent_first_ms``, ``sent_last_ms``), a source's time from its request to its reply read
(``in_worker_ms_median``/``_max``: the compile, its facts and cache file, against
``serial_ms_per_source``) and from the last reply to the call's return.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def source(i: int) -> str:
    """A source of realistic compile time (a few template instantiations), distinct per i."""
    return f"""
template <typename T, int N>
__device__ T poly(T x) {{ T s = 0; _Pragma("unroll") for (int k = 0; k < N; ++k) s = s * x + T(k + {i}); return s; }}
extern "C" __global__ void k{i}_f(float* y, const float* x, int n) {{
  int t = blockIdx.x * blockDim.x + threadIdx.x; if (t < n) y[t] = poly<float, 24>(x[t]) + __sinf(x[t]);
}}
extern "C" __global__ void k{i}_d(double* y, const double* x, int n) {{
  int t = blockIdx.x * blockDim.x + threadIdx.x; if (t < n) y[t] = poly<double, 24>(x[t]) * {i}.5;
}}
extern "C" __global__ void k{i}_i(int* y, const int* x, int n) {{
  int t = blockIdx.x * blockDim.x + threadIdx.x; if (t < n) y[t] = poly<int, 16>(x[t]) ^ {i};
}}
"""


def heavy_source(i: int) -> str:
    """A source ~4x the compile of ``source(i)``: 18 kernels, longer unrolled polynomials."""
    kernels = "\n".join(
        f"""extern "C" __global__ void k{i}_{t}{j}({ty}* y, const {ty}* x, int n) {{
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n) y[t] = poly<{ty}, {24 + 8 * j}>(x[t]) + poly<{ty}, {8 + j}>(x[t] * {ty}({i}));
}}""" for j in range(6) for t, ty in (("f", "float"), ("d", "double"), ("i", "int")))
    return f"""
template <typename T, int N>
__device__ T poly(T x) {{ T s = 0; _Pragma("unroll") for (int k = 0; k < N; ++k) s = s * x + T(k + {i}); return s; }}
{kernels}
"""


SETS = {"light": source, "heavy": heavy_source}


class Trace:
    """Where a compile_many call's time goes on the process route, seen from this process:
    when each request went to a worker and when its reply was read (nbjit's private
    ``_Worker.send`` and ``_Worker._reply``, wrapped), and this process's CPU time (all its
    threads) during the call."""

    def __init__(self):
        self.calls: list[tuple[float, float]] = []
        self.on = False
        try:
            from nbjit.toolchain import workers as _workers
        except ImportError:  # (no worker processes here)
            return
        trace = self
        if not hasattr(_workers._Worker, "send"):  # (an nbjit before the calling thread fed the workers)
            call = _workers._Worker.call

            def traced_call(worker, args):
                t = time.perf_counter()
                try:
                    return call(worker, args)
                finally:
                    if trace.on:
                        trace.calls.append((t, time.perf_counter()))
            _workers._Worker.call = traced_call
            return
        send, reply, sent = _workers._Worker.send, _workers._Worker._reply, {}

        def traced_send(worker, args):
            send(worker, args)
            if trace.on:
                sent[id(worker)] = time.perf_counter()

        def traced_reply(worker):
            try:
                return reply(worker)
            finally:
                t = sent.pop(id(worker), None)
                if trace.on and t is not None:  # (not a worker's "ready")
                    trace.calls.append((t, time.perf_counter()))
        _workers._Worker.send, _workers._Worker._reply = traced_send, traced_reply

    def run(self, sources: list, **kw) -> dict:
        """One ``compile_many(sources, **kw)`` call: its wall time and what the trace saw."""
        from nbjit.toolchain.many_sources import compile_many
        self.calls.clear()
        self.on = True
        cpu, t = time.process_time(), time.perf_counter()
        try:
            compile_many(sources, **kw)
        finally:
            end, cpu = time.perf_counter(), time.process_time() - cpu
            self.on = False
        row = {"s": end - t, "parent_cpu_ms_per_source": 1e3 * cpu / len(sources), "worker_calls": len(self.calls)}
        if self.calls:
            sent = sorted(c[0] - t for c in self.calls)
            spans = sorted(b - a for a, b in self.calls)
            row.update({"sent_first_ms": 1e3 * sent[0], "sent_last_ms": 1e3 * sent[-1],
                        "in_worker_ms_median": 1e3 * spans[len(spans) // 2], "in_worker_ms_max": 1e3 * spans[-1],
                        "last_reply_to_return_ms": 1e3 * (end - max(c[1] for c in self.calls))})
        return row


def _median(rows: list[dict], field: str):
    got = sorted(r[field] for r in rows if field in r)
    return got[len(got) // 2] if got else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sources", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--processes", choices=("auto", "yes", "no"), default="auto")
    ap.add_argument("--set", choices=tuple(SETS), default="light", help="the source family (heavy: ~4x the compile)")
    ap.add_argument("--sweep", default="", help="worker counts to time compile_many with too, e.g. 2,4,8,16")
    ap.add_argument("--json")
    a = ap.parse_args()
    sweep = [int(w) for w in a.sweep.split(",") if w.strip()]
    source = SETS[a.set]
    route = {"auto": {}, "yes": {"processes": True}, "no": {"processes": False}}[a.processes]
    from nbjit import Cache
    from nbjit.toolchain.nvrtc import compile_image
    from nbjit.toolchain.many_sources import compile_many

    trace = Trace()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    compile_image(source(999999), arch=a.arch, cache=Cache(tempfile.mkdtemp()))  # load NVRTC, headers, fingerprints
    with tempfile.TemporaryDirectory() as d:  # the process's first call: starts the workers where they are used
        t = time.perf_counter()
        compile_many([source(900000 + i) for i in range(a.sources)], arch=a.arch, cache=Cache(d),
                     workers=max([a.workers or cpus, *sweep]) if sweep else a.workers, **route)
        first = time.perf_counter() - t
    serial, parallel, rows = [], [], []
    for r in range(a.rounds):
        srcs = [source(1000 * r + i) for i in range(a.sources)]  # distinct per round: nothing cached
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            for s in srcs:
                compile_image(s, arch=a.arch, cache=Cache(d))
            serial.append(time.perf_counter() - t)
        srcs = [source(1000 * r + 500 + i) for i in range(a.sources)]
        with tempfile.TemporaryDirectory() as d:
            rows.append(trace.run(srcs, arch=a.arch, cache=Cache(d), workers=a.workers, **route))
            parallel.append(rows[-1]["s"])
    s, p = min(serial), min(parallel)
    swept = []
    for w in sweep:
        times, wrows = [], []
        for r in range(a.rounds):
            srcs = [source(1000 * r + 100_000 * w + i) for i in range(a.sources)]
            with tempfile.TemporaryDirectory() as d:
                wrows.append(trace.run(srcs, arch=a.arch, cache=Cache(d), workers=w, **route))
                times.append(wrows[-1]["s"])
        swept.append({"workers": w, "compile_many_s": times, "speedup": s / min(times), "goal": 0.7 * min(w, cpus),
                      "parent_cpu_ms_per_source": _median(wrows, "parent_cpu_ms_per_source"),
                      "sent_last_ms": _median(wrows, "sent_last_ms"),
                      "in_worker_ms_median": _median(wrows, "in_worker_ms_median"), "rounds": wrows})
    res = {"sources": a.sources, "set": a.set, "cpus": cpus, "workers": a.workers or cpus, "arch": a.arch,
           "processes": a.processes, "serial_s": serial, "compile_many_s": parallel, "first_call_s": first,
           "speedup": s / p, "goal": 0.7 * cpus, "sweep": swept,
           # where the time goes (medians over the rounds; see Trace): this process's CPU per source
           # (on the thread route it holds the compiles too), the last request's departure, a
           # source's time in a worker against one compile at a time
           "serial_ms_per_source": 1e3 * s / a.sources,
           "parent_cpu_ms_per_source": _median(rows, "parent_cpu_ms_per_source"),
           "sent_first_ms": _median(rows, "sent_first_ms"), "sent_last_ms": _median(rows, "sent_last_ms"),
           "in_worker_ms_median": _median(rows, "in_worker_ms_median"),
           "in_worker_ms_max": _median(rows, "in_worker_ms_max"),
           "last_reply_to_return_ms": _median(rows, "last_reply_to_return_ms"), "rounds": rows,
           "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None}
    print(f"{a.sources} {a.set} sources on {cpus} CPUs: one at a time {s:.2f} s, compile_many {p:.2f} s: "
          f"speed-up {s / p:.2f} (goal {0.7 * cpus:.1f}); the first call {first:.2f} s; "
          f"load average {res['load_average']}")
    if res["sent_last_ms"] is not None:
        print(f"  process route (medians): this process's CPU {res['parent_cpu_ms_per_source']:.2f} ms/source; "
              f"requests sent {res['sent_first_ms']:.1f} to {res['sent_last_ms']:.1f} ms after the call's start; "
              f"a source in a worker {res['in_worker_ms_median']:.1f} ms (slowest {res['in_worker_ms_max']:.1f})"
              f" against {res['serial_ms_per_source']:.1f} one at a time; last reply to return "
              f"{res['last_reply_to_return_ms']:.1f} ms")
    else:
        print(f"  thread route: this process's CPU (the compiles' too) {res['parent_cpu_ms_per_source']:.1f} ms/source")
    for r in swept:
        where = "" if r["sent_last_ms"] is None else (
            f"; CPU here {r['parent_cpu_ms_per_source']:.2f} ms/source, last sent at {r['sent_last_ms']:.1f} ms, "
            f"in a worker {r['in_worker_ms_median']:.1f} ms")
        print(f"  workers={r['workers']:<3} compile_many {min(r['compile_many_s']):.3f} s: speed-up {r['speedup']:.2f} "
              f"(goal {r['goal']:.1f}){where}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
