"""nbjit.tune on a GPU: a search times its variants and keeps the winner, whose results are
right and whose inputs are put back; a fresh process finds the answer with no timing; a
variant that does not compile or does not finish is reported and the search goes on; a
@cuda.jit kernel's block size and an @autotune launch function are tuned the same way."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import nbjit
from nbjit import NbjitTuneError
from test_tuning import SUM

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SPACE = {"BLOCK": [64, 96, 128, 256], "ITEMS": [1, 4]}


def search(x, out, n, spin=0, **kw):
    return nbjit.tune(nbjit.Template(SUM, "block_sum<{BLOCK}, {ITEMS}>", options=[f"-DSPIN={spin}"]), SPACE,
                      (x, out, n), key=[n], grid=lambda c: -(-n // (c["BLOCK"] * c["ITEMS"])),
                      block=lambda c: c["BLOCK"], **kw)


def test_a_search_times_the_variants_keeps_the_winner_and_puts_the_output_back(cuda):
    n = 1 << 20
    xh = np.random.default_rng(1).random(n, dtype=np.float32)
    x, out = cuda.to_device(xh), cuda.to_device(np.zeros(1, np.float32))
    best = search(x, out, n, repeat=5)
    by = {t.label: t for t in best.trials}
    assert by["BLOCK=96 ITEMS=1"].status == "failed" and "96 is refused" in by["BLOCK=96 ITEMS=1"].why
    timed = [t for t in best.trials if t.status == "timed"]
    assert len(timed) == 6 and best.timed == 6 and not best.from_cache
    assert best.ms == min(t.ms for t in timed) and best.config == min(timed, key=lambda t: t.ms).config
    assert all(t.spread[0] <= t.ms <= t.spread[1] for t in timed)
    assert out.copy_to_host()[0] == 0.0  # each variant added into it; the search put it back
    best(x, out, n)
    assert np.isclose(out.copy_to_host()[0], xh.sum(dtype=np.float64), rtol=1e-4)
    again = search(x, out, n)
    assert again.from_cache and again.timed == 0 and again.config == best.config and again.key == best.key
    assert list(again.config) == list(best.config) == ["BLOCK", "ITEMS"]  # (the space's order, found or searched)
    assert search(x, out, n, retune=True).timed == 6


def test_a_fresh_process_finds_the_answer_and_times_nothing(cuda, tmp_path):
    script = textwrap.dedent(f"""
        import json, sys, time
        import numpy as np
        from numba import cuda
        sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
        from test_gpu_tuning import search
        n = 1 << 18
        x, out = cuda.to_device(np.ones(n, np.float32)), cuda.to_device(np.zeros(1, np.float32))
        t0 = time.perf_counter()
        best = search(x, out, n, repeat=3)
        took = time.perf_counter() - t0
        best(x, out, n)
        print(json.dumps({{"timed": best.timed, "cached": best.from_cache, "config": best.config, "s": took,
                          "sum": float(out.copy_to_host()[0])}}))
    """)
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(json.loads(r.stdout.splitlines()[-1]))
    assert not runs[0]["cached"] and runs[0]["timed"] == 6
    assert runs[1]["cached"] and runs[1]["timed"] == 0 and runs[1]["config"] == runs[0]["config"]
    assert runs[0]["sum"] == runs[1]["sum"] == 1 << 18
    print(f"a fresh process's tune(): {runs[1]['s'] * 1e3:.2f} ms (the search: {runs[0]['s'] * 1e3:.0f} ms)")
    r = subprocess.run([sys.executable, "-m", "nbjit", "tune", "--list"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "block_sum<{BLOCK}, {ITEMS}>" in r.stdout


def test_a_variant_that_does_not_finish_is_reported_and_the_search_goes_on(cuda):
    n = 1 << 16
    x, out = cuda.to_device(np.ones(n, np.float32)), cuda.to_device(np.zeros(1, np.float32))
    best = search(x, out, n, spin=1, timeout=0.5, repeat=3)
    by = {t.label: t for t in best.trials}
    assert "did not finish within timeout=0.5 s" in by["BLOCK=64 ITEMS=1"].why
    assert by["BLOCK=128 ITEMS=1"].status == "timed" and best.config["BLOCK"] != 64
    cuda.synchronize()  # (the spinning kernel ends by itself)


def test_a_cuda_jit_kernels_block_size(cuda):
    @cuda.jit
    def scale(out, x, a):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = a * x[i]

    n = 1 << 20
    xh = np.arange(n, dtype=np.float32)
    x, y = cuda.to_device(xh), cuda.device_array(n, np.float32)
    k = nbjit.from_numba(scale, "void(float32[:], float32[:], float32)")
    best = nbjit.tune(k, {"block": [32, 128, 1024, 2048]}, (y, x, np.float32(3)), grid=lambda c: -(-n // c["block"]),
                      repeat=3)
    assert {t.label: t.status for t in best.trials} == {"block=32": "timed", "block=128": "timed",
                                                         "block=1024": "timed", "block=2048": "pruned"}
    assert best.kernel is k and best.block == (best.config["block"],)
    best(y, x, np.float32(3))
    assert np.array_equal(y.copy_to_host(), 3 * xh)


def test_autotune_searches_once_per_key(cuda):
    calls = []

    @nbjit.autotune({"BLOCK": [128, 256]}, key=lambda x, out, n: n, repeat=2)
    def total(x, out, n, *, stream, BLOCK):
        calls.append(BLOCK)
        nbjit.compile(SUM, name_expressions=[f"block_sum<{BLOCK}, 1>"])[
            f"block_sum<{BLOCK}, 1>"][-(-n // BLOCK), BLOCK, stream](x, out, n)

    n = 4096
    x, out = cuda.to_device(np.ones(n, np.float32)), cuda.to_device(np.zeros(1, np.float32))
    total(x, out, n)
    searched = len(calls)
    assert searched > 4 and out.copy_to_host()[0] == n  # (the search's launches were put back)
    total(x, out, n)
    assert len(calls) == searched + 1 and out.copy_to_host()[0] == 2 * n
    assert total.tuned(x, out, n).from_cache


def test_no_variant_that_runs_is_an_error_naming_each(cuda):
    x, out = cuda.to_device(np.ones(64, np.float32)), cuda.to_device(np.zeros(1, np.float32))
    with pytest.raises(NbjitTuneError, match=r"no variant could be timed:\n  BLOCK=96 ITEMS=1: failed: compile"):
        nbjit.tune(nbjit.Template(SUM, "block_sum<{BLOCK}, {ITEMS}>", options=["-DSPIN=0"]),
                   {"BLOCK": [96, 4096], "ITEMS": [1]}, (x, out, 64), grid=1, block=lambda c: c["BLOCK"])
