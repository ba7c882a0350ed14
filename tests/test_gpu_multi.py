"""Several GPUs (marker `gpu`; skipped unless at least two are visible): a module belongs to
one context, another device loads its own copy on first use, arrays must live on the
kernel's device."""
from __future__ import annotations


import numpy as np
import pytest

import nbjit
from nbjit import NbjitArgumentError

pytestmark = pytest.mark.gpu
from conftest import DATA  # noqa: E402


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
    from nbjit import kernel as K
    monkeypatch.setattr(K, "_MULTI", [True])
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
