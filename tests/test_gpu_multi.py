"""Several GPUs (marker `gpu`; skipped unless at least two are visible): a module belongs to
one context, another device loads its own copy on first use, arrays must live on the
kernel's device."""
from __future__ import annotations


import sys

import numpy as np
import pytest

import nbjit
from nbjit import NbjitArgumentError

pytestmark = pytest.mark.gpu
from conftest import DATA  # noqa: E402

AXPY = ('extern "C" __global__ void axpy(float* y, const float* x, float a, int n) '
        '{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a * x[i] + y[i]; }')


@pytest.fixture(scope="module")
def two(cuda):
    if len(cuda.gpus) < 2:
        pytest.skip("needs two GPUs")
    return cuda


def test_each_device_gets_its_own_module(two):
    cuda = two
    with cuda.gpus[0]:
        m0 = nbjit.load(DATA / "nvcc/kernels_sm90.ptx")
        k = m0["k_basic"]
        x0 = cuda.to_device(np.arange(256, dtype=np.float32))
        y0 = cuda.to_device(np.zeros(256, np.float32))
        k[1, 256](y0, x0, 2.0, 256)
        np.testing.assert_array_equal(y0.copy_to_host(), 2 * np.arange(256, dtype=np.float32))
    with cuda.gpus[1]:
        m1 = nbjit.load(DATA / "nvcc/kernels_sm90.ptx")
        assert m1 is not m0 and m1.device == 1 and m0.device == 0
        x1 = cuda.to_device(np.arange(256, dtype=np.float32))
        y1 = cuda.to_device(np.zeros(256, np.float32))
        k[1, 256](y1, x1, 3.0, 256)  # the device-0 kernel launches its device-1 twin
        np.testing.assert_array_equal(y1.copy_to_host(), 3 * np.arange(256, dtype=np.float32))
        assert m0.on_current_device() is m1
        with pytest.raises(NbjitArgumentError, match="device 0"):
            m1["k_basic"][1, 256](y0, x1, 1.0, 256)  # an array of device 0 for a device-1 kernel


def test_the_several_gpu_path_on_one_gpu(cuda, monkeypatch):
    """The launch path nbjit takes where several GPUs are visible (Python packing, a device
    check per pointer, twin look-up), run on this one GPU: plain, bound, extended and
    Triton launches with NULL scratch tails."""
    import warnings

    from nbjit import NbjitWarning
    monkeypatch.setattr("nbjit.launch.launchers._MULTI", [True])
    k = nbjit.compile('extern "C" __global__ void axpy(float* y, const float* x, float a, int n) '
                      '{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a * x[i] + y[i]; }',
                      name="multi_path.cu")["axpy"]
    n = 1000
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    y = cuda.to_device(np.ones(n, np.float32))
    cfg = k[(n + 127) // 128, 128, 0]
    assert cfg.path == "python"
    cfg(y, x, 2.0, n)
    k.bind((n + 127) // 128, 128, y, x, 1.0, n)()
    k.launch((n + 127) // 128, 128, y, x, 1.0, n, cooperative=True)
    cuda.synchronize()
    np.testing.assert_allclose(y.copy_to_host(), 4 * np.arange(n, dtype=np.float32) + 1)
    with pytest.raises(NbjitArgumentError, match="float64"):
        cfg(cuda.device_array(n, np.float64), x, 2.0, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NbjitWarning)
        tk = nbjit.load_triton(DATA / "triton/add_kernel")
    out = cuda.device_array(n, np.float32)
    tk[(n + 1023) // 1024](x, y, out, n, np.float32(0.5))
    cuda.synchronize()
    np.testing.assert_allclose(out.copy_to_host(), 0.5 * np.arange(n) + y.copy_to_host())


def launch_on_device(shipped: bytes, device: int) -> tuple[int, list[float]]:
    """A spawned child: unpickle first, pick the device afterwards (as a worker that learns
    its local rank late), then launch: the kernel loads on that device."""
    import pickle

    from nbjit.gpu.host import current_host
    cuda = current_host().module("cuda")  # (the parent's host: the worker inherits NBJIT_HOST)
    kernel = pickle.loads(shipped)
    cuda.select_device(device)
    x = cuda.to_device(np.arange(100, dtype=np.float32))
    y = cuda.to_device(np.ones(100, np.float32))
    kernel[1, 128](y, x, 2.0, 100)
    return kernel.module.device, y.copy_to_host().tolist()


def test_unpickled_kernel_loads_on_the_device_chosen_later(two):
    import multiprocessing
    import pickle
    from concurrent.futures import ProcessPoolExecutor

    k = nbjit.compile(AXPY, name="axpy.cu")["axpy"]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = list(pool.map(launch_on_device, [pickle.dumps(k)] * 2, [1, 0]))
    assert [dev for dev, _ in runs] == [1, 0]
    for _, y in runs:
        assert y == [1 + 2 * i for i in range(100)]


def test_dask_example_on_every_gpu(cuda, monkeypatch):
    """The core of examples/dask_multi_gpu.py on a LocalCUDACluster of every visible GPU."""
    pytest.importorskip("cupy")
    pytest.importorskip("dask_cuda")
    import importlib

    from dask_cuda import LocalCUDACluster
    from distributed import Client

    # importable by name here and in the workers (spawned with this sys.path), as a script's
    # own module would be
    monkeypatch.syspath_prepend(str(DATA.parent.parent / "examples"))
    ex = importlib.import_module("dask_multi_gpu")
    kernel = nbjit.compile(ex.SRC)["poly"]
    with LocalCUDACluster() as cluster, Client(cluster) as client:
        client.run(forbid_nvrtc_and_watch)
        r = ex.run(client, 8_000_000 + 7, 500_000, kernel, timeout=120)
    assert r["chunks"] == 17
    assert set(r["per_gpu"]) == {str(i) for i in range(len(cuda.gpus))}, r


def forbid_nvrtc_and_watch() -> None:
    """On a worker: compiling is an error (the kernel was compiled on the client); a worker
    stuck for a minute prints where."""
    import faulthandler

    from nbjit.toolchain import nvrtc as compiler

    def no_nvrtc(*a, **k):
        raise AssertionError("NVRTC ran on a worker")
    compiler._run_nvrtc = no_nvrtc
    faulthandler.dump_traceback_later(60, exit=False, file=sys.stderr)
