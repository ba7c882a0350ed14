"""nbjit's own device array (nbjit.gpu.memory), what the bare host gives for a device
variable or a scratch buffer: its __cuda_array_interface__ is what PyTorch, CuPy and Numba read
(no GPU needed here; its memory and copies on a GPU: tests/test_gpu_bare.py)."""
from __future__ import annotations

import numpy as np
import pytest

from nbjit import NbjitArgumentError
from nbjit.gpu.memory import DeviceArray
from nbjit.launch.arrays import array_element, device_pointer


def test_it_describes_its_memory_as_the_array_interface_says():
    a = DeviceArray(0x7000, (3, 4), np.float32, owner="keep")
    cai = a.__cuda_array_interface__
    assert cai == {"shape": (3, 4), "typestr": "<f4", "data": (0x7000, False), "strides": None,
                   "descr": [("", "<f4")], "stream": None, "version": 3}
    assert (a.ndim, a.size, a.nbytes, a.strides, len(a)) == (2, 12, 48, (16, 4), 3)
    assert repr(a) == "<nbjit DeviceArray (3, 4) float32 at 0x7000>" and a.owner == "keep"
    assert device_pointer(a) == 0x7000 and array_element(a) == ("f", 4, "float32")


def test_records_keep_their_fields():
    point = np.dtype([("x", np.float32), ("w", np.int32)])
    a = DeviceArray(0x100, (2,), point)
    assert np.dtype(a.__cuda_array_interface__["descr"]) == point and a.dtype == point


def test_values_of_another_shape_are_refused_before_any_copy():
    a = DeviceArray(0x100, (4,), np.int32)
    with pytest.raises(NbjitArgumentError, match=r"values of shape \(3,\) for an array of shape \(4,\)"):
        a.copy_from_host(np.arange(3))
    with pytest.raises(TypeError, match="len"):
        len(DeviceArray(0x100, (), np.int32))
