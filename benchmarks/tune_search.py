#!/usr/bin/env python3
"""nbjit.tune over examples/tune_reduction.py's CUB reduction template (block size x items
per thread x CUB's four reduction algorithms: 64 variants), each part in a fresh process
with its own empty cache:

1. one cold compile of one variant (``nbjit.compile`` of one instantiation, NVRTC's first
   use in the process included, as in the search);
2. the search: its whole time, its compile phase (``compile_many``, every variant) and its
   timing phase, against the goal: at most 3 x the cold compile + the timing phase;
3. the winner against exhaustive timing: every variant that ran, timed again with more
   repetitions (interleaved rounds), the winner's time over the best's (goal: <= 1.02);
4. a fresh process of the same cache: ``tune()``'s time with the answer found (goal:
   0 variants timed, <= 1 ms), with the CUDA context, the arrays and the module imports
   made before the clock starts;
5. the winner's speed-up over a default choice (256 threads, 1 item, warp reductions).

    python benchmarks/tune_search.py [--n 67108864] [--rounds 5] [--json out.json]

Needs a GPU and CCCL's headers (the nvidia-cuda-cccl wheel, which nbjit's cu13 extra brings).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COMMON = f"""
import json, sys, time
sys.path.insert(0, {str(ROOT / 'examples')!r})
import numpy as np
from numba import cuda
import nbjit
import tune_reduction as ex
n = int(sys.argv[1])
x = cuda.to_device(np.random.default_rng(0).random(n, dtype=np.float32))
out = cuda.to_device(np.zeros(1, np.float32))
key = ("float32", n.bit_length())
target = nbjit.Template(ex.SUM, "block_sum<{{BLOCK}}, {{ITEMS}}, {{ALGO}}>", program="block_sum.cu")
def search(**kw):
    return nbjit.tune(target, ex.SPACE, (x, out, n), key=key, grid=ex.grid_for(n), block=lambda c: c["BLOCK"], **kw)
cuda.synchronize()
"""

COLD = COMMON + """
t0 = time.perf_counter()
nbjit.compile(ex.SUM, name="block_sum.cu", name_expressions=["block_sum<256, 4, cub::BLOCK_REDUCE_RAKING>"])
print(json.dumps({"cold_compile_s": time.perf_counter() - t0}))
"""

SEARCH = COMMON + """
from nbjit.gpu.timing import TimingStream
from nbjit.tuning.timing import time_variant
rounds = int(sys.argv[2])
t0 = time.perf_counter()
best = search()
took = time.perf_counter() - t0
timed = [t for t in best.trials if t.status == "timed"]
# every variant that ran, again: interleaved rounds of 10 repetitions each, the median round per variant
stream = TimingStream()
again = {t.label: [] for t in timed}
for _ in range(rounds):
    for t in timed:
        k = t.kernel[0][t.kernel[1]]
        run = lambda h, k=k, t=t: k[t.grid, t.block, h, t.shared](x, out, n)
        again[t.label].append(time_variant(stream, run, timeout=10.0, repeat=10, rep_ms=2.0).ms)
stream.close()
med = {label: sorted(v)[len(v) // 2] for label, v in again.items()}
winner = " ".join(f"{k}={v}" for k, v in best.config.items())
best_label = min(med, key=med.get)
default = " ".join(f"{k}={v}" for k, v in ex.DEFAULT.items())
print(json.dumps({"search_s": took, "seconds": best.seconds, "counts": best.answer.counts,
                  "winner": winner, "winner_ms": best.ms, "winner_again_ms": med[winner],
                  "best_again": best_label, "best_again_ms": med[best_label],
                  "winner_over_best": med[winner] / med[best_label],
                  "default_ms": med.get(default), "speedup_over_default": (med.get(default) or 0) / med[winner],
                  "pruned": {t.label: t.why for t in best.trials if t.status == "pruned"},
                  "failed": {t.label: t.why for t in best.trials if t.status == "failed"}}))
"""

FOUND = COMMON + """
search()  # (the first look-up in the process: the device's name, the cache's directory)
t0 = time.perf_counter()
best = search()
warm = time.perf_counter() - t0
print(json.dumps({"lookup_ms": warm * 1e3, "timed": best.timed, "from_cache": best.from_cache}))
"""

FOUND_FIRST = COMMON + """
# (what tune() imports on its first call: a process that has launched or tuned has them)
import nbjit.launch.kernel, nbjit.loading.module, nbjit.cache.store
import nbjit.toolchain.nvrtc, nbjit.tuning.search, nbjit.gpu.timing
t0 = time.perf_counter()
best = search()
print(json.dumps({"first_lookup_ms": (time.perf_counter() - t0) * 1e3, "timed": best.timed,
                  "from_cache": best.from_cache}))
"""


def run(script: str, cache: str, *argv: str) -> dict:
    env = {**os.environ, "NBJIT_CACHE_DIR": cache, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise SystemExit(f"failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 26)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    out: dict = {"n": a.n}
    with tempfile.TemporaryDirectory() as cold, tempfile.TemporaryDirectory() as cache:
        out.update(run(COLD, cold, str(a.n)))
        out.update(run(SEARCH, cache, str(a.n), str(a.rounds)))
        out.update(run(FOUND_FIRST, cache, str(a.n)))
        out.update(run(FOUND, cache, str(a.n)))
    s = out["seconds"]
    budget = 3 * out["cold_compile_s"] + s["timing"]
    c = out["counts"]
    print(f"one cold compile of one variant      {out['cold_compile_s']:8.2f} s")
    print(f"the search ({c['variants']} variants: {c['timed']} timed, {c['pruned']} pruned, {c['failed']} failed)"
          f"  {out['search_s']:6.2f} s  (compile {s['compile']:.2f} s, timing {s['timing']:.2f} s)")
    print(f"  goal: <= 3 x cold compile + timing = {budget:.2f} s: {'met' if out['search_s'] <= budget else 'NOT met'}")
    print(f"winner {out['winner']}: {out['winner_again_ms'] * 1e3:.1f} us again; the best again "
          f"{out['best_again']}: {out['best_again_ms'] * 1e3:.1f} us; ratio {out['winner_over_best']:.4f} "
          f"(goal <= 1.02)")
    if out.get("default_ms"):
        print(f"default choice: {out['default_ms'] * 1e3:.1f} us; the winner is {out['speedup_over_default']:.2f}x "
              "faster")
    print(f"a fresh process: first tune() {out['first_lookup_ms']:.2f} ms, a second {out['lookup_ms']:.3f} ms, "
          f"{out['timed']} variants timed (goal: 0 timed, <= 1 ms)")
    try:
        from nbjit.gpu import driver, timing
        driver.init()
        out["gpu"] = timing.device_name(0)
    except Exception:
        pass
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
