#!/usr/bin/env python3
"""NVRTC precompiled headers on CCCL-heavy sources: the time of a compile that misses the
cache, in a fresh process over an empty cache each run, with and without a PCH.

Sources (--source, default both):

  reduce_sort  tests/data/src/cub_reduce_sort.cu: CUB BlockReduce + BlockRadixSort
  scan_tuple   tests/data/src/cub_scan_tuple.cu: CUB BlockLoad/BlockScan/BlockStore +
               WarpReduce with cuda::std functional/limits/tuple

Each process compiles, in this order:

  first          the process's first compile (NVRTC compiles the headers; with PCH on, it
                 also writes the PCH);
  new inst.      --n - 1 more, each a new instantiation (a template argument not compiled
                 before), with the PCH the first one made;
  new option     the first instantiation again with an option it was not compiled with
                 (-maxrregcount=64: a back-end option, which NVRTC does not compare for a PCH).

The same with pch=False is the "no PCH" row. --split-compile N adds a second pair of rows
with NVRTC's -split-compile=N on both sides (parallel NVVM optimisation, a speed-up of its
own). Each figure is the median over --runs processes (new inst.: over every such compile of
every run) of the wall time and of the process's CPU time (user + system, NVRTC's threads
included: steadier than wall time on a shared host); "sys" is the system part, where a warm
PCH's load shows (NVRTC maps the PCH file and the compile's writes copy its pages).

--phases runs one more process per row with NVRTC's -fdevice-time-trace and prints where a
new instantiation's time goes: the front end's header parsing, the rest of the front end
before instantiation (with a PCH: its load), the instantiation of the kernel, the front
end's wrap-up of the translation unit, NVVM and ptxas (ms, medians).

    python benchmarks/compile_pch.py [--runs 3] [--n 4] [--source reduce_sort|scan_tuple|all]
                                     [--split-compile 0] [--phases] [--json out.json]
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
SOURCES = {
    "reduce_sort": ("cub_reduce_sort.cu", "reduce_sort",
                    [("int", 128, 4), ("float", 128, 4), ("unsigned", 256, 2), ("double", 64, 3), ("short", 128, 8),
                     ("long long", 128, 2), ("float", 256, 4), ("int", 64, 8)]),
    "scan_tuple": ("cub_scan_tuple.cu", "scan_kernel",
                   [("int", 128, 4), ("float", 128, 4), ("unsigned", 256, 2), ("double", 64, 3), ("long long", 128, 2),
                    ("float", 256, 4), ("int", 64, 8), ("unsigned", 128, 8)]),
}
NEW_OPTION = "-maxrregcount=64"

CHILD = r'''
import json, os, resource, sys, time
from nbjit.toolchain.nvrtc import compile_image
from nbjit.cache.store import Cache
from nbjit.toolchain import pch
a = json.loads(sys.argv[1])
cache = Cache(a["cache"])
trace = a.get("trace")

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_stime, r.ru_minflt

def phases(path):
    with open(path) as f:
        d = json.load(f)
    ev = sorted((e for e in (d["traceEvents"] if isinstance(d, dict) else d) if e.get("ph") == "X"),
                key=lambda e: (e["ts"], -e["dur"]))
    fe = next(e for e in ev if e["name"] == "CUDA C++ Front-End")
    out = {"headers": 0.0, "instantiation": 0.0, "wrap_up": 0.0, "nvvm": 0.0, "ptxas": 0.0}
    end = -1
    for e in ev:  # the front end's direct parts
        if e is fe or e["ts"] < fe["ts"] or e["ts"] + e["dur"] > fe["ts"] + fe["dur"] or e["ts"] < end:
            continue
        end = e["ts"] + e["dur"]
        part = {"Processing Header File": "headers", "Generating Needed Template Instantiations": "instantiation",
                "Wrapping up translation unit": "wrap_up"}.get(e["name"])
        if part:
            out[part] += e["dur"] / 1000
    for e in ev:
        if e["name"] == "LibNVVM":
            out["nvvm"] += e["dur"] / 1000
        elif e["name"] == "Total PTXAS Time":
            out["ptxas"] += e["dur"] / 1000
    out["other_front_end"] = fe["dur"] / 1000 - out["headers"] - out["instantiation"] - out["wrap_up"]
    return out

rows = []
jobs = [(e, a["options"]) for e in a["exprs"]] + [(a["exprs"][0], a["options"] + [a["new_option"]])]
for e, opts in jobs:
    if trace:
        opts = opts + ["--fdevice-time-trace=" + trace]
    c0, s0, f0 = cpu()
    t = time.perf_counter()
    compile_image(a["src"], name=a["name"], name_expressions=[e], options=opts, arch="sm_90", cache=cache,
                  pch=a["pch"])
    wall = time.perf_counter() - t
    c1, s1, f1 = cpu()
    row = {"expr": e, "options": opts, "wall": wall, "cpu": c1 - c0, "sys": s1 - s0, "minflt": f1 - f0}
    if trace:
        row["phases"] = phases(trace + ".json")
        os.unlink(trace + ".json")
    rows.append(row)
print(json.dumps({"rows": rows, "stats": pch.STORE.stats}))
'''


def run(src: str, name: str, exprs: list[str], use: bool, options: list[str], traced: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        args = {"src": src, "name": name, "exprs": exprs, "pch": use, "options": options, "new_option": NEW_OPTION,
                "cache": d, "trace": os.path.join(d, "trace") if traced else None}
        r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True, env=env,
                           cwd=ROOT, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


COLUMNS = ("first", "new_inst", "new_option")


def column(runs: list[dict], col: str, what: str) -> float:
    if col == "first":
        vals = [r["rows"][0][what] for r in runs]
    elif col == "new_inst":
        vals = [x[what] for r in runs for x in r["rows"][1:-1]]
    else:
        vals = [r["rows"][-1][what] for r in runs]
    return statistics.median(vals)


def main() -> None:
    ap = argparse.ArgumentParser(description="NVRTC precompiled headers on CCCL-heavy sources")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=4, help="instantiations compiled per process (2..8)")
    ap.add_argument("--source", choices=[*SOURCES, "all"], default="all")
    ap.add_argument("--split-compile", type=int, default=0, metavar="N",
                    help="also measure with -split-compile=N on both sides (0: not)")
    ap.add_argument("--phases", action="store_true", help="one traced process per row: where the time goes")
    ap.add_argument("--json")
    a = ap.parse_args()
    n = max(2, min(a.n, 8))
    variants = {"": []}
    if a.split_compile:
        variants[f" -split-compile={a.split_compile}"] = [f"-split-compile={a.split_compile}"]
    out: dict = {"n": n, "runs": a.runs, "new_option": NEW_OPTION, "cpus": os.cpu_count(), "results": {}}
    for sname in (SOURCES if a.source == "all" else [a.source]):
        fname, kern, inst = SOURCES[sname]
        src = (ROOT / "tests/data/src" / fname).read_text()
        exprs = [f"{kern}<{t},{b},{i}>" for t, b, i in inst][:n]
        for vname, vopts in variants.items():
            runs: dict[str, list] = {"pch": [], "no_pch": []}
            for _ in range(a.runs):  # the two take turns, so a change in the host's load meets both
                runs["pch"].append(run(src, fname, exprs, True, vopts))
                runs["no_pch"].append(run(src, fname, exprs, False, vopts))
            res = {side: {col: {w: column(rs, col, w) for w in ("wall", "cpu", "sys")} for col in COLUMNS}
                   for side, rs in runs.items()}
            res["runs"] = runs
            if a.phases:
                res["phases"] = {}
                for side, use in (("pch", True), ("no_pch", False)):
                    tr = run(src, fname, exprs, use, vopts, traced=True)
                    res["phases"][side] = {k: statistics.median(x["phases"][k] for x in tr["rows"][1:-1])
                                           for k in tr["rows"][1]["phases"]}
            out["results"][sname + vname] = res
            report(sname + vname, n, a.runs, res)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


def report(title: str, n: int, runs: int, res: dict) -> None:
    p, q = res["pch"], res["no_pch"]
    print(f"\n== {title}: medians of {runs} fresh processes, {n} instantiations + 1 new option each (s); "
          f"PCH stats of the last: {res['runs']['pch'][-1]['stats']}")
    print(f"{'':12}{'first':>18}{'new inst.':>18}{'new option':>18}")
    print(f"{'':12}" + f"{'wall   cpu  (sys)':>18}" * 3)
    for label, side in (("pch=True", p), ("pch=False", q)):
        print(f"{label:12}" + "".join(f"{side[c]['wall']:7.2f}{side[c]['cpu']:6.2f} ({side[c]['sys']:.2f})"
                                      for c in COLUMNS))
    print(f"{'no PCH/PCH':12}" + "".join(f"{q[c]['wall'] / p[c]['wall']:7.2f}x{q[c]['cpu'] / p[c]['cpu']:5.2f}x"
                                         + " " * 5 for c in COLUMNS))
    if "phases" in res:
        keys = list(res["phases"]["pch"])
        print("new instantiation, traced (ms): " + ", ".join(keys))
        for side in ("pch", "no_pch"):
            print(f"  {side:8}" + "".join(f"{res['phases'][side][k]:9.0f}" for k in keys))


if __name__ == "__main__":
    main()
