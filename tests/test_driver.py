"""nbjit's driver layer where it needs no GPU: how driver errors are told, handles and
streams as the driver takes them, and what this process knows before using CUDA."""
from __future__ import annotations

import ctypes

import pytest

from nbjit import NbjitLaunchError, NbjitLoadError
from nbjit.gpu import driver as _driver


def test_sticky_errors_say_what_happened_and_what_to_do():
    for code in (700, 719):  # an illegal address; a launch that failed on the device
        text = _driver.error_text(code)
        assert str(code) in text and text.endswith(f"({_driver.STICKY_HINT})")
    assert "faulted" not in _driver.error_text(1)  # invalid value: nothing sticky about it


def test_a_lookup_fails_as_not_found_only_where_the_driver_did_not_find_it():
    assert _driver._not_found(500, "kernel 'k'") is None  # CUDA_ERROR_NOT_FOUND
    with pytest.raises(NbjitLoadError) as e:
        _driver._not_found(700, "kernel 'k'")
    assert str(e.value).startswith("looking up kernel 'k' failed: ") and _driver.STICKY_HINT in str(e.value)


def test_handles_as_ints():
    from cuda.bindings import driver as cu
    assert _driver.as_int(cu.CUdeviceptr(0x7F00_1000)) == 0x7F00_1000 == _driver.as_int(cu.CUcontext(0x7F00_1000))
    assert _driver.as_int(ctypes.c_void_p(0x1000)) == 0x1000  # numba-cuda's ctypes bindings (CUDA 12)
    assert _driver.as_int(ctypes.c_void_p(None)) == 0 and _driver.as_int(5) == 5


class _TorchLike:
    cuda_stream = 0x5000


class _Protocol:
    def __cuda_stream__(self):
        return (0, 0x6000)


class _CtypesStream:  # a Numba stream over its ctypes bindings
    handle = ctypes.c_void_p(0x7000)


def test_every_kind_of_stream_becomes_a_cuda_stream():
    from cuda.bindings import driver as cu
    own = cu.CUstream(0x4000)
    handle = type("NumbaStream", (), {"handle": own})()
    for stream, want in ((None, 0), (0, 0), (0x3000, 0x3000), (handle, 0x4000), (_TorchLike(), 0x5000),
                         (_Protocol(), 0x6000), (_CtypesStream(), 0x7000)):
        got = _driver.stream_handle(stream)
        assert type(got) is cu.CUstream and int(got) == want, stream
    assert _driver.stream_handle(handle) is own  # (a Numba stream's own CUstream, as it is)
    with pytest.raises(NbjitLaunchError, match="str is not a stream"):
        _driver.stream_handle("s")


def test_no_context_before_cuda_is_used():
    """Before any CUDA call (here: no GPU, or none made yet) nothing is current, and the
    current-context check asks the bindings, not C, until a context exists."""
    if _driver.current_context_key():
        pytest.skip("a context is current in this process")
    assert _driver.current_device() is None and _driver.context_key_source() in ("unset", "python")
