"""Processes: `import nbjit` touches no CUDA, and a child forked after CUDA was used gets a
clear NbjitError (CUDA cannot be used there) instead of a driver error or a hang."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
import multiprocessing

import pytest

import nbjit
from nbjit.gpu import driver as _driver
from nbjit.gpu.host import current_host

fork_only = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
# forking on purpose (the child only raises and exits): Python 3.12 warns when threads exist
pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")


def test_import_loads_no_cuda_or_numba():
    # what the interpreter imported at start-up (a .pth file may import a `cuda` namespace) is not nbjit's
    code = ("import sys\n"
            "before = set(sys.modules)\n"
            "import nbjit\n"
            "bad = sorted(m for m in set(sys.modules) - before\n"
            "             if m.split('.')[0] in ('cuda', 'numba', 'cupy', 'torch', 'nvidia'))\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def in_child(fn, timeout: float = 60.0) -> tuple[int, str]:
    """Run ``fn`` in a forked child; its exit status and what it wrote (-9: it hung)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            msg, code = fn(), 0
        except BaseException as e:
            msg, code = f"{type(e).__name__}: {e}", 1
        os.write(w, str(msg).encode())
        os._exit(code)
    os.close(w)
    deadline = time.monotonic() + timeout
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            done = os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    with os.fdopen(r, "rb") as f:
        text = f.read().decode()
    return os.waitstatus_to_exitcode(done[1]), text


def expect_fork_error(call):
    def run():
        try:
            call()
        except nbjit.NbjitError as e:
            assert "forked" in str(e) and "spawn" in str(e), str(e)
            return type(e).__name__
        raise AssertionError("no NbjitError in the forked child")
    return run


@fork_only
def test_child_forked_after_cuda_use_gets_a_clear_error(monkeypatch):
    monkeypatch.setitem(_driver._STATE, "used", True)  # as after a load in this process
    for call in (current_host().current_context, lambda: _driver.get_function(object(), "k")):
        code, text = in_child(expect_fork_error(call))
        assert (code, text) == (0, "NbjitError"), text
    # the parent is not affected, and a forked child does not unload its parent's modules
    assert not _driver.forked()
    code, text = in_child(lambda: _driver.unload_module(object()) or _driver.forked())
    assert (code, text) == (0, "True")


@fork_only
def test_child_forked_before_cuda_use_is_free(monkeypatch):
    monkeypatch.setitem(_driver._STATE, "used", False)
    code, text = in_child(_driver.forked)
    assert (code, text) == (0, "False")


# ------------------------------------------------------------------ on a GPU

SAXPY = r'''extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}'''


def saxpy_in_worker(n: int) -> list[float]:
    """A spawned worker compiles, loads and launches on its own."""
    import numpy as np
    from nbjit.gpu.host import current_host
    cuda = current_host().module("cuda")  # (the parent's host: the worker inherits NBJIT_HOST)
    k = nbjit.compile(SAXPY).saxpy
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    y = cuda.to_device(np.ones(n, dtype=np.float32))
    k[1, 64](y, x, 2.0, n)
    return y.copy_to_host().tolist()


@pytest.mark.gpu
@fork_only
def test_gpu_forked_child_gets_nbjit_error_not_a_driver_error(cuda, kernels):
    import numpy as np
    k = kernels.k_basic
    y, x = cuda.to_device(np.zeros(64, np.float32)), cuda.to_device(np.ones(64, np.float32))
    k[1, 64](y, x, np.float32(1.0), 64)  # this process has used CUDA; the launcher is cached
    for call in (lambda: k[1, 64](y, x, np.float32(1.0), 64),  # the cached launcher
                 lambda: k[2, 32](y, x, np.float32(1.0), 64),  # a new one
                 lambda: kernels["k_basic"],
                 lambda: nbjit.load(kernels.image.data, name="again.ptx")):
        code, text = in_child(expect_fork_error(call))
        assert code == 0 and text in ("NbjitError", "NbjitLaunchError"), text
    k[1, 64](y, x, np.float32(1.0), 64)  # the parent goes on
    np.testing.assert_array_equal(y.copy_to_host(), 2.0)


@pytest.mark.gpu
def test_gpu_spawned_workers_just_work():
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(saxpy_in_worker, [40, 50]))
    for n, got in zip([40, 50], results):
        assert got == [1 + 2 * i for i in range(n)]


def run_shipped(shipped, n: int) -> tuple[list[float], list[str]]:
    """A spawned worker: kernels arrive pickled (or as cloudpickle bytes) and load here on
    first use, with NVRTC forbidden and an empty cache: compiled once, in the parent."""
    import numpy as np
    from nbjit.toolchain import nvrtc as compiler
    from nbjit.gpu.host import current_host
    cuda = current_host().module("cuda")  # (the parent's host: the worker inherits NBJIT_HOST)

    def no_nvrtc(*a, **k):
        raise AssertionError("NVRTC ran in the worker")
    compiler._run_nvrtc = no_nvrtc
    if isinstance(shipped, bytes):
        import cloudpickle
        shipped = cloudpickle.loads(shipped)
    kernel, module, triton, numba_kernel = shipped
    before = [repr(kernel), repr(module)]
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    y = cuda.to_device(np.ones(n, np.float32))
    kernel[1, 64](y, x, 2.0, n)  # y = 1 + 2x
    module.saxpy[1, 64](y, x, np.float32(1.0), n)  # y = 1 + 3x
    out = cuda.device_array(n, np.float32)
    triton[(n + 1023) // 1024](x, y, out, n, np.float32(0.5))  # out = 0.5x + y
    numba_kernel[1, 64](out)  # out += 1
    return out.copy_to_host().tolist(), before


def fresh_cache(path: str) -> None:
    os.environ["NBJIT_CACHE_DIR"] = path


@pytest.mark.gpu
def test_gpu_kernels_travel_to_spawned_workers(cuda, tmp_path):
    import pickle

    import cloudpickle
    import numpy as np
    from conftest import DATA

    @cuda.jit
    def add_one(a):
        i = cuda.grid(1)
        if i < a.size:
            a[i] += 1

    m = nbjit.compile(SAXPY)
    triton = nbjit.load_triton(DATA / "triton/add_kernel")
    shipped = (m.saxpy, m, triton, nbjit.from_numba(add_one, "void(float32[::1])"))
    want = [0.5 * i + 1 + 3 * i + 1 for i in range(50)]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=ctx, initializer=fresh_cache, initargs=(str(tmp_path),)) as pool:
        a = pool.submit(run_shipped, shipped, 50)  # multiprocessing's pickle
        b = pool.submit(run_shipped, cloudpickle.dumps(shipped), 50)
        for f in (a, b):
            got, before = f.result(timeout=300)
            np.testing.assert_allclose(got, want, rtol=1e-6)
            assert all("loads on first use" in r for r in before), before
    assert not list(tmp_path.iterdir())  # the workers wrote nothing to their cache
    # in this process, an unpickled kernel shares the module loaded from the same bytes
    k2 = pickle.loads(pickle.dumps(m.saxpy))
    x = cuda.to_device(np.arange(64, dtype=np.float32))
    y = cuda.to_device(np.zeros(64, np.float32))
    k2[1, 64](y, x, 2.0, 64)
    np.testing.assert_array_equal(y.copy_to_host(), 2 * np.arange(64, dtype=np.float32))
    assert k2.module._live is m._live and k2.module._owner is m and k2._s is m.saxpy._s
