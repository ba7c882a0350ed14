#!/usr/bin/env python3
"""Time to get a launchable kernel for a small CUDA C++ source, each measured in fresh
processes (imports and context creation excluded, everything after included):

  (a) cold: an empty cache, so NVRTC compiles;
  (b) warm: a fresh process over the cache (a) filled;
  (c) in-process repeat of the same call (median of 200 calls);

for nbjit.compile and, where they are installed (they need a GPU), the peers the same way:
cupy.RawModule (its own disk cache) and cuda.core's Program.compile(cache=FileStreamProgramCache)
followed by get_kernel (cuda.core >= 1.2.2).
``--stand-in``: nbjit alone, on a machine without a GPU, with the driver's calls (context,
load, function and parameter queries) replaced by stand-ins that return at once: everything
nbjit's own code does on these paths, none of the driver's time.
``--baseline DIR``: a row for another version of nbjit taking the same turns (DIR holds its
``nbjit`` package, e.g. ``git archive c7467a4 nbjit | tar -x -C DIR`` and its extension built
there: ``python setup.py build_ext --inplace`` in a checkout of that commit, the ``.so``
copied), with the paired difference of the warm starts, process by process (the host's speed
moves by more than a code change between runs; within one turn both meet the same).
``--stand-in`` with a baseline needs one laid out by stage (``nbjit.gpu.host``, ``nbjit.launch``).
Each process also times a fixed pure-Python workload right after (the host's speed at that
moment: building and sorting a dict, the best of 5), because on a shared machine
the same code's warm start moves with the host by a factor of two (1.0 ms here could be 1.4 ms
in a busy hour, nbjit and CuPy alike). Prints a table (median of --runs processes, the warm
range, the ratios, warm start in units of that reference) and writes JSON (--json) with every
run's figures.

    python benchmarks/compile_cache.py [--runs 5] [--json out.json] [--stand-in]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = r'''
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''

REFERENCE = r'''
def host_reference():
    """Seconds for a fixed pure-Python workload (best of 5): the host's speed right now.
    (Run after the measured calls, so that it changes neither their caches nor when the
    garbage collector runs; it touches nothing nbjit or CuPy use.)"""
    import time as _time
    best = None
    for _ in range(5):
        t = _time.perf_counter()
        d = {str(i): (i, i * 2, None) for i in range(300)}
        "".join(k for k, _ in sorted(d.items(), key=lambda kv: -kv[1][1]))
        dt = _time.perf_counter() - t
        best = dt if best is None or dt < best else best
    return best
'''

NBJIT = REFERENCE + r'''
import json, sys, time
import nbjit
nbjit.compile  # (import nbjit is lazy: this imports what compile needs, which counts as imports)
if sys.argv[2:] == ["stand-in"]:  # no GPU: the driver's calls answer at once (nbjit's code alone is timed)
    import types
    from nbjit.launch import launchers
    from nbjit.gpu import driver as _driver
    from nbjit.gpu.host import current_host
    ctx = types.SimpleNamespace(device=types.SimpleNamespace(id=0, compute_capability=(9, 0)), handle=7)
    current_host().current_context = lambda: ctx
    current_host().current_cc = lambda: (9, 0)
    _driver.current_context_key = lambda: 7
    _driver.driver_version = lambda: 13000
    _driver.load_module = lambda data, what, kind: _driver.Loaded(1, "")
    _driver.unload_module = lambda handle: None
    _driver.get_function = lambda handle, name: 2
    _driver.param_info = lambda func: None
    launchers._MULTI[0] = False
else:
    from numba import cuda
    cuda.current_context()
src = sys.argv[1]
t0 = time.perf_counter(); k = nbjit.compile(src)["saxpy"]; t1 = time.perf_counter()
ts = []
for _ in range(200):
    t = time.perf_counter(); nbjit.compile(src)["saxpy"]; ts.append(time.perf_counter() - t)
print(json.dumps({"first": t1 - t0, "repeat": sorted(ts)[len(ts) // 2], "reference": host_reference(),
                  "nbjit": nbjit.__file__, "ext": getattr(sys.modules.get("nbjit.gpu._launcher"), "__file__", None)}))
'''

CUPY = REFERENCE + r'''
import json, sys, time
import cupy as cp
cp.cuda.Device(0).use(); cp.zeros(1)
src = sys.argv[1]
t0 = time.perf_counter(); k = cp.RawModule(code=src).get_function("saxpy"); t1 = time.perf_counter()
ts = []
for _ in range(200):
    t = time.perf_counter(); cp.RawModule(code=src).get_function("saxpy"); ts.append(time.perf_counter() - t)
print(json.dumps({"first": t1 - t0, "repeat": sorted(ts)[len(ts) // 2], "reference": host_reference()}))
'''


CUDA_CORE = REFERENCE + r'''
import json, os, sys, time
from cuda.core import Device, Program, ProgramOptions
from cuda.core.utils import FileStreamProgramCache
dev = Device(0); dev.set_current()
src = sys.argv[1]
cache = FileStreamProgramCache(os.environ["NBJIT_BENCH_CUDA_CORE_CACHE"])  # (opened once, as a user would)


def get():
    opts = ProgramOptions(arch=f"sm_{dev.arch}")
    return Program(src, "c++", opts).compile("cubin", cache=cache).get_kernel("saxpy")


t0 = time.perf_counter(); k = get(); t1 = time.perf_counter()
ts = []
for _ in range(200):
    t = time.perf_counter(); get(); ts.append(time.perf_counter() - t)
print(json.dumps({"first": t1 - t0, "repeat": sorted(ts)[len(ts) // 2], "reference": host_reference()}))
'''


def run(code: str, env: dict, extra: tuple[str, ...] = (), cwd: Path = ROOT) -> dict:
    # (cwd: ``python -c`` puts the working directory first on sys.path, so it decides which nbjit imports)
    r = subprocess.run([sys.executable, "-c", code, SRC, *extra], capture_output=True, text=True, env=env, cwd=cwd,
                       timeout=600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure_once(code: str, env_key: str, extra: tuple[str, ...] = (), tree: Path = ROOT
                 ) -> tuple[float, float, float, float]:
    """(cold, warm, repeat, host reference during warm) seconds: two fresh processes over a
    fresh cache directory (nbjit imported from ``tree``)."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, env_key: d, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        a = run(code, env, extra, tree)
        b = run(code, env, extra, tree)
    for got in (a, b):  # (nbjit, and its extension where it is used, from the tree measured)
        for f in (got.get("nbjit"), got.get("ext")):
            if f is not None and not Path(f).resolve().is_relative_to(Path(tree).resolve()):
                raise RuntimeError(f"measuring {tree}, the process imported {f}: build its extension there, or "
                                   "set NBJIT_PURE_PYTHON=1 for both")
    return a["first"], b["first"], b["repeat"], b["reference"]


def summary(samples: list[tuple[float, float, float, float]]) -> dict:
    cold, warm, repeat, ref = (list(x) for x in zip(*samples))
    return {"cold": statistics.median(cold), "warm": statistics.median(warm),
            "repeat": statistics.median(repeat), "reference": statistics.median(ref),
            "warm_in_references": statistics.median(w / r for w, r in zip(warm, ref)),
            "runs": {"cold": cold, "warm": warm, "repeat": repeat, "reference": ref}}


def main() -> None:
    ap = argparse.ArgumentParser(description="compile-cache timings")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--stand-in", action="store_true", help="no GPU: nbjit alone, the driver's calls replaced by "
                    "stand-ins that answer at once")
    ap.add_argument("--baseline", type=Path, help="a directory holding another version's nbjit package: a row "
                    "for it in the same turns, and the paired difference")
    a = ap.parse_args()
    if a.baseline is not None and not (a.baseline / "nbjit" / "__init__.py").is_file():
        ap.error(f"--baseline {a.baseline}: no nbjit package there (a directory holding nbjit/)")
    # nbjit's bytecode, as pip's install writes it: the warm path imports modules after the clock
    # starts, and where PYTHONDONTWRITEBYTECODE is set (the GPU machine's image sets it) each
    # process would compile their sources again (~1 ms more on the 2-core machine)
    import compileall
    compileall.compile_dir(str(ROOT / "nbjit"), quiet=1)
    extra = ("stand-in",) if a.stand_in else ()
    routes = {"nbjit.compile": (NBJIT, "NBJIT_CACHE_DIR")}
    trees = {"nbjit.compile": ROOT}
    if a.baseline is not None:
        base = a.baseline.resolve()
        compileall.compile_dir(str(base / "nbjit"), quiet=1)
        routes["nbjit baseline"] = (NBJIT, "NBJIT_CACHE_DIR")
        trees["nbjit baseline"] = base
    if a.stand_in:
        print("driver stand-ins: nbjit's own code, no GPU, no driver time (the peers' rows need a GPU: skipped)")
    else:
        try:
            import cupy  # noqa: F401  (only to know whether CuPy's rows can run)
            routes["cupy.RawModule"] = (CUPY, "CUPY_CACHE_DIR")
        except ImportError:
            print("CuPy not installed: its rows are skipped")
        try:
            from cuda.core.utils import FileStreamProgramCache  # noqa: F401  (cuda.core >= 1.2.2)
            routes["cuda.core Program"] = (CUDA_CORE, "NBJIT_BENCH_CUDA_CORE_CACHE")
        except ImportError:
            print("cuda.core (>= 1.2.2, with FileStreamProgramCache) not installed: its rows are skipped")
    samples: dict[str, list] = {k: [] for k in routes}
    for turn in range(a.runs):  # the routes take turns, so a change in the host's load meets both
        order = list(routes.items())
        if a.baseline is not None and turn % 2:  # (the two versions of nbjit in either order)
            order[0], order[1] = order[1], order[0]
        for k, (code, env_key) in order:
            samples[k].append(measure_once(code, env_key, extra if k in trees else (), trees.get(k, ROOT)))
    rows = {k: summary(v) for k, v in samples.items()}
    print(f"medians of {a.runs} fresh processes each; warm's range in brackets; host reference: the fixed "
          "pure-Python workload's time in the warm process, and warm start in units of it")
    print(f"{'':18}{'(a) cold ms':>13}{'(b) warm ms':>13}{'':>15}{'(c) repeat us':>15}{'a/b':>8}"
          f"{'host ref us':>13}{'b / ref':>9}")
    for k, v in rows.items():
        w = v["runs"]["warm"]
        print(f"{k:18}{v['cold'] * 1e3:13.2f}{v['warm'] * 1e3:13.2f}{f'[{min(w) * 1e3:.2f}-{max(w) * 1e3:.2f}]':>15}"
              f"{v['repeat'] * 1e6:15.2f}{v['cold'] / v['warm']:8.0f}{v['reference'] * 1e6:13.1f}"
              f"{v['warm_in_references']:9.2f}")
    a_ = rows["nbjit.compile"]
    if a.baseline is not None:
        mine, theirs = samples["nbjit.compile"], samples["nbjit baseline"]
        pairs = [m[1] - t[1] for m, t in zip(mine, theirs)]
        print(f"nbjit.compile - baseline ({a.baseline}), warm, paired by turn: median "
              f"{statistics.median(pairs) * 1e3:+.3f} ms, this tree faster in {sum(p < 0 for p in pairs)} of "
              f"{len(pairs)}")
        rows["paired_warm_difference"] = {"median": statistics.median(pairs), "runs": pairs,
                                          "baseline": str(a.baseline.resolve())}
    for nb, b_ in rows.items():
        if nb not in ("nbjit.compile", "paired_warm_difference"):
            print(f"nbjit.compile / {nb}: cold {a_['cold'] / b_['cold']:.2f}, warm {a_['warm'] / b_['warm']:.3f}, "
                  f"repeat {a_['repeat'] / b_['repeat']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
