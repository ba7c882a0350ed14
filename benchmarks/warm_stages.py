#!/usr/bin/env python3
"""Where a fresh process's warm start (``compile_cache.py`` (b)) spends its time, stage by
stage: each stage's function wrapped with a timer (inclusive: a stage's time holds the
stages it calls; each wrapper adds ~1 µs), in fresh processes over a cache that holds the
entries. Each process times a first call and then a second of another source (another cubin,
nothing shared): the first call's extra time is Python code running for the first time in the
process, the second's the work itself.

    python benchmarks/warm_stages.py [--runs 15] [--stand-in] [--json out.json]

``--stand-in``: no GPU; the driver's calls answer at once (as ``compile_cache.py --stand-in``).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_cache import NBJIT, ROOT, SRC  # noqa: E402  (the same source and stand-ins)
from first_kernel import TIMED  # noqa: E402  (the stage timer)
from warm_floor import FILL, SECOND  # noqa: E402  (the second source, and how the cache is filled)

# (label, module, attribute): the stages timed, in the order a warm start reaches them
STAGES = [
    ("the host's current context (Numba's object)", "nbjit.gpu.host", "Host.current_context"),
    ("  the driver's current context", "nbjit.gpu.driver", "current_context_key"),
    ("the call's arguments and the memo", "nbjit.toolchain.nvrtc", "_called"),
    ("the job: request, includes, key", "nbjit.toolchain.nvrtc", "CompileCall.job"),
    ("  the toolchain's identity", "nbjit.toolchain.nvrtc", "_toolchain_fingerprint"),
    ("  the request", "nbjit.toolchain.nvrtc", "_request"),
    ("  what the source includes", "nbjit.toolchain.nvrtc", "includes_of"),
    ("  the key", "nbjit.toolchain.nvrtc", "_key"),
    ("the cache's look-up", "nbjit.cache.store", "Cache.lookup"),
    ("  reading the entry file", "nbjit.cache.store", "_read_entry"),
    ("  checking and decoding it", "nbjit.cache.store", "_decode"),
    ("    its facts", "nbjit.cache.facts", "read"),
    ("the image of the entry", "nbjit.toolchain.nvrtc", "_finish"),
    ("loading (plan, driver, module)", "nbjit.loading.compiling", "load_into"),
    ("  the loader's plan", "nbjit.loading.module", "plan"),
    ("  the driver's load", "nbjit.gpu.driver", "load_module"),
    ("the kernel (function, parameters, typing, state)", "nbjit.loading.module", "Module._make_state"),
    ("  the driver's function", "nbjit.gpu.driver", "get_function"),
    ("  the driver's parameters", "nbjit.gpu.driver", "param_info"),
]

assert NBJIT.count("src = sys.argv[1]") == 1, "compile_cache.py's child changed: this script's use of it must follow"
CHILD = NBJIT.split("src = sys.argv[1]")[0] + r'''
import importlib, os
STAGES = json.loads(os.environ["NBJIT_BENCH_STAGES"])
stages = {}
''' + TIMED + r'''
for label, modname, attr in STAGES:
    owner = importlib.import_module(modname)
    if "." in attr:
        cls, attr = attr.split(".")
        owner = getattr(owner, cls)
    getattr(owner, attr)  # (an AttributeError here: the stage was renamed, and STAGES must follow)
    timed(owner, attr, label)
out = {}
for call, src in (("first", sys.argv[1]), ("second", os.environ["NBJIT_BENCH_SECOND"])):
    stages.clear()
    t0 = time.perf_counter(); nbjit.compile(src)["saxpy"]; t1 = time.perf_counter()
    out[call] = {"whole call": t1 - t0, **stages}
print(json.dumps(out))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description="a fresh process's warm start, stage by stage")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--stand-in", action="store_true", help="no GPU: the driver's calls answer at once")
    ap.add_argument("--json")
    a = ap.parse_args()
    import compileall
    compileall.compile_dir(str(ROOT / "nbjit"), quiet=1)
    mode = "stand-in" if a.stand_in else "gpu"
    stages = json.dumps([list(s) for s in STAGES])
    runs = []
    with tempfile.TemporaryDirectory() as d:
        path = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        env = {**os.environ, "NBJIT_CACHE_DIR": d, "PYTHONPATH": path}
        subprocess.run([sys.executable, "-c", FILL, mode, SRC, SECOND], env=env, cwd=ROOT, check=True, timeout=600)
        child_env = {**env, "NBJIT_BENCH_STAGES": stages, "NBJIT_BENCH_SECOND": SECOND}
        for _ in range(a.runs):
            r = subprocess.run([sys.executable, "-c", CHILD, SRC, *(("stand-in",) if a.stand_in else ())],
                               capture_output=True, text=True, env=child_env, cwd=ROOT, timeout=600)
            if r.returncode != 0:
                raise RuntimeError(r.stderr)
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    labels = ["whole call"] + [s[0] for s in STAGES]
    table = {call: {k: statistics.median(r[call].get(k, 0.0) for r in runs) * 1e6 for k in labels}
             for call in ("first", "second")}
    print(f"{mode}: medians of {a.runs} fresh processes, µs (inclusive; indented: within the stage above)")
    print(f"{'stage':52}{'first':>9}{'second':>9}")
    for k in labels:
        print(f"{k:52}{table['first'][k]:9.1f}{table['second'][k]:9.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"medians_us": table, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
