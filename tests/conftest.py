"""Shared fixtures: paths to the committed compiler outputs, and the `gpu` marker's skip."""
from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"


@functools.lru_cache(maxsize=None)
def gpu_available() -> tuple[bool, str]:
    try:
        from numba import cuda
        if cuda.is_available():
            return True, ""
        return False, "no CUDA GPU: numba.cuda.is_available() is false"
    except Exception as e:  # numba-cuda missing or its driver lookup failed
        return False, f"no CUDA GPU: {type(e).__name__}: {e}"


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if "gpu" in it.keywords]
    if not gpu_items:
        return
    ok, why = gpu_available()
    if not ok:
        skip = pytest.mark.skip(reason=why)
        for it in gpu_items:
            it.add_marker(skip)


def best_times(fn, *inputs, rounds: int = 3) -> list[float]:
    """The best of ``rounds`` timings of ``fn`` on each input, with the garbage collector
    off (for tests that a reader scales linearly: a ratio, never an absolute time)."""
    import gc
    import time
    out = []
    for x in inputs:
        best = float("inf")
        for _ in range(rounds):
            gc.collect()
            gc.disable()
            try:
                t0 = time.perf_counter()
                fn(x)
                best = min(best, time.perf_counter() - t0)
            finally:
                gc.enable()
        out.append(best)
    return out


@pytest.fixture
def data() -> Path:
    return DATA


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own default cache directory: tests never share or pollute one."""
    from nbjit.cache import set_default_cache
    monkeypatch.setenv("NBJIT_CACHE_DIR", str(tmp_path_factory.mktemp("nbjit-cache")))
    set_default_cache(None)
    yield
    set_default_cache(None)


@pytest.fixture
def no_zstd(monkeypatch):
    """As if neither zstandard nor compression.zstd were installed."""
    import builtins
    real = builtins.__import__

    def fake(name, *a, **k):
        if name in ("zstandard", "compression"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)


@pytest.fixture(scope="module")
def cuda():
    from numba import cuda
    return cuda


@pytest.fixture(scope="module")
def kernels():
    """nvcc's test kernels loaded (GPU tests only)."""
    import nbjit
    return nbjit.load(DATA / "nvcc/kernels_sm90.ptx")


def expected_path() -> str:
    """The C launcher, unless it is switched off or several GPUs make nbjit check devices
    (then every launch takes the Python path)."""
    from nbjit import _driver
    if os.environ.get("NBJIT_PURE_PYTHON", "") not in ("", "0") or _driver.device_count() > 1:
        return "python"
    return "c"
