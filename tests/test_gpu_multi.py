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
