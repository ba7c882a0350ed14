"""The Numba host (nbjit.gpu.host): which host serves, and what numba-cuda's host reads from
Numba's own objects, types and compiler (no GPU needed; the contexts are tested on a GPU,
in test_gpu_launch.py, and below; the choice in test_host_choice.py, numba-cuda-mlir's
host in test_mlir.py)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from nbjit.gpu import host as _host
from nbjit.gpu.host import HOSTS, Host, NumbaCuda, choose, current_host

numba_cuda = pytest.importorskip("numba.cuda")
from cuda.bindings import driver as cu  # noqa: E402
from numba import types  # noqa: E402
from numba.cuda.cudadrv.devicearray import DeviceNDArray  # noqa: E402
from numba.cuda.cudadrv.driver import CudaAPIError, MemoryPointer  # noqa: E402

from nbjit import NbjitLaunchError  # noqa: E402
from nbjit.launch.arrays import device_pointer  # noqa: E402


class Other(Host):
    name, package = "other", "other_numba.cuda"


def test_the_host_is_the_one_the_user_imported_else_the_first():
    first, other = NumbaCuda(), Other()
    assert choose((first, other), {"sys", "other_numba.cuda"}) is other
    assert choose((first, other), {"sys", "numba.cuda", "other_numba.cuda"}) is first
    assert choose((first, other), {"sys"}) is first


NUMBA_CUDA = HOSTS[0]  # numba-cuda's host, whichever serves (NBJIT_HOST may name numba-cuda-mlir's)


def test_the_current_host_is_chosen_once():
    import os
    h = current_host()
    assert h is current_host() and h in HOSTS and isinstance(NUMBA_CUDA, NumbaCuda)
    assert h.name == os.environ.get("NBJIT_HOST", "numba-cuda")  # (numba-cuda is installed here)


def memory(address: int, nbytes: int) -> MemoryPointer:
    """Numba's pointer object for device memory at ``address`` (made without a context)."""
    return MemoryPointer(None, cu.CUdeviceptr(address), nbytes)


def test_numba_arrays_and_pointers_give_their_address():
    """What the packer reads from Numba's own objects (the C path calls the same readers)."""
    ptr = memory(0x7F00_1000, 64)
    arr = DeviceNDArray((16,), (4,), np.dtype(np.float32), gpu_data=ptr)
    get = NUMBA_CUDA.pointer_getter
    assert get(DeviceNDArray)(arr) == get(MemoryPointer)(ptr) == 0x7F00_1000
    assert device_pointer(arr) == device_pointer(ptr) == 0x7F00_1000
    assert get(np.ndarray) is None and get(int) is None and _host.pointer_getter(np.ndarray) is None


def test_asking_about_other_arrays_imports_no_numba():
    """A type that is not Numba's is answered without importing Numba (a CuPy or torch user
    never pays for it)."""
    code = ("import sys, numpy as np\nfrom nbjit.gpu import host as _host\n"
            "print(_host.pointer_getter(np.ndarray), _host.error_code(ValueError()), 'numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "None None False\n"


def test_numbas_driver_errors_give_their_code():
    assert NUMBA_CUDA.error_code(CudaAPIError(901, "invalidated")) == 901
    assert _host.error_code(CudaAPIError(900, "unsupported")) == 900
    assert _host.error_code(ValueError("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")) is None
    launch_error = NbjitLaunchError("launch failed")
    launch_error.code = 900
    assert _host.error_code(launch_error) is None  # (nbjit's own errors are not the host's)


def test_numba_types_read_as_nbjit_passes_them():
    d = NUMBA_CUDA.describe_type
    assert d(types.float32[::1]) == ("array", np.dtype(np.float32), 1, "C", False)
    assert d(types.Array(types.int16, 3, "F", readonly=True)) == ("array", np.dtype(np.int16), 3, "F", True)
    assert d(types.complex64) == ("scalar", np.dtype(np.complex64))
    assert d(types.boolean) == ("scalar", np.dtype(np.bool_))
    assert d(types.UniTuple(types.float32, 2)) is None


def test_signatures_and_what_they_return():
    h = NUMBA_CUDA
    args, ret = h.kernel_types("void(float32[::1], int64)")
    assert args == (types.float32[::1], types.int64) and h.returns_nothing(ret)
    args, ret = h.kernel_types((types.float64,))
    assert args == (types.float64,) and h.returns_nothing(ret)
    assert not h.returns_nothing(h.kernel_types("float32(float32)")[1])
    with pytest.raises(Exception):  # noqa: B017 (Numba's own error: from_numba words it)
        h.kernel_types("not a signature (")


def scale(a, x):  # a @cuda.jit kernel's Python function, compiled by Numba's compiler
    a[0] *= x


def test_a_kernels_ptx_from_numbas_compiler():
    h = NUMBA_CUDA
    try:
        ptx = h.compile_ptx(scale, h.kernel_types("void(float32[::1], float32)")[0], (9, 0), fastmath=False,
                            lineinfo=False)
    except Exception as e:  # no NVVM in this environment
        pytest.skip(f"Numba cannot compile here: {type(e).__name__}: {e}")
    assert ".target sm_90" in ptx and ".entry" in ptx and "scale" in ptx
    fast = h.compile_ptx(scale, h.kernel_types("void(float32[::1], float32)")[0], (9, 0), fastmath=True,
                         lineinfo=False)
    assert "mul.ftz" in fast and "mul.ftz" not in ptx


@pytest.mark.gpu
def test_memory_from_the_host_and_a_view_of_it(cuda):
    h = current_host()
    assert h.current_context() is cuda.current_context()
    assert h.context_key(h.current_context()) == int(cu.cuCtxGetCurrent()[1])
    assert h.current_cc() == tuple(cuda.get_current_device().compute_capability)
    buf = h.allocate(64)
    assert buf.nbytes == 64 and buf.dtype == np.uint8
    view = h.array_view(device_pointer(buf), (16,), np.dtype(np.float32), buf)
    view.copy_to_device(np.arange(16, dtype=np.float32))
    assert buf.copy_to_host().view(np.float32).tolist() == list(range(16))
