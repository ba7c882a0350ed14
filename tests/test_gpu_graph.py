"""CUDA graphs for Numba users (marker `gpu`): a pipeline of @cuda.jit and nbjit kernels and
a copy captured once and replayed; what breaks a capture is an NbjitGraphError and leaves
the stream usable; re-captured arguments update the graph in place."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import nbjit
from nbjit import NbjitGraphError

# Numba's performance warnings (small grids, host arrays), either host's: by their text, so that no
# Numba module is imported to name the class
pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:(Grid size|Host array used):Warning")]

N = 1000
GRID, BLOCK = (N + 127) // 128, 128
AXPY = r'''extern "C" __global__ void axpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}'''


@pytest.fixture(scope="module")
def parts(cuda):
    @cuda.jit
    def twice(w, x):
        i = cuda.grid(1)
        if i < w.shape[0]:
            w[i] = 2 * x[i]

    @cuda.jit
    def add1(a):
        i = cuda.grid(1)
        if i < a.shape[0]:
            a[i] += 1

    axpy = nbjit.compile(AXPY, name="graph_axpy.cu")["axpy"]
    w = cuda.device_array(N, np.float32)
    x = cuda.to_device(np.arange(N, dtype=np.float32))
    twice[GRID, BLOCK](w, x)  # compile everything before any capture
    add1[GRID, BLOCK](w)
    axpy[GRID, BLOCK](w, x, 1.0, N)
    cuda.synchronize()
    return twice, add1, axpy


def usable(cuda, s, axpy):
    """The stream left capturing nothing, and launching works on it."""
    from nbjit.gpu import graphs
    from nbjit.gpu.driver import stream_handle
    assert graphs.capture_status(stream_handle(s)) == "none"
    y = cuda.to_device(np.zeros(N, np.float32))
    axpy[GRID, BLOCK, s](y, cuda.to_device(np.ones(N, np.float32)), 3.0, N)
    s.synchronize()
    assert y.copy_to_host()[0] == 3.0


def test_mixed_pipeline_captured_once_replayed_100_times(cuda, parts):
    twice, add1, axpy = parts
    s = cuda.stream()
    x = cuda.to_device(np.arange(N, dtype=np.float32))
    w = cuda.device_array(N, np.float32)
    y = cuda.to_device(np.zeros(N, np.float32))
    z = cuda.device_array(N, np.float32)
    from nbjit.gpu.host import current_host
    device_memset = current_host().module("driver").device_memset  # (numba-cuda's, or numba-cuda-mlir's)
    with nbjit.capture(s) as g:
        device_memset(w, 0, w.nbytes, stream=s)  # Numba's asynchronous memset
        twice[GRID, BLOCK, s](w, x)          # @cuda.jit
        axpy[GRID, BLOCK, s](y, w, 0.5, N)   # nbjit: y += x
        z.copy_to_device(y, stream=s)        # Numba's asynchronous device copy
        add1[GRID, BLOCK, s](z)              # @cuda.jit
    assert g.node_count == 5 and [n.name for n in g.nodes][1] == "axpy" and len(g.nodes) == 3
    s.synchronize()
    assert not y.copy_to_host().any()  # capturing ran nothing
    for _ in range(100):
        g.launch()
    s.synchronize()
    want = 100 * np.arange(N, dtype=np.float32)
    np.testing.assert_allclose(y.copy_to_host(), want)
    np.testing.assert_allclose(z.copy_to_host(), want + 1)
    other = cuda.stream()
    g.launch(other)  # any stream
    other.synchronize()
    np.testing.assert_allclose(y.copy_to_host(), want + np.arange(N))


@pytest.mark.parametrize("case", ["synchronous copy", "allocation", "host arrays to @cuda.jit", "synchronize"])
def test_what_breaks_a_capture(cuda, parts, case):
    twice, add1, axpy = parts
    s = cuda.stream()
    a = cuda.device_array(N, np.float32)
    with pytest.raises(NbjitGraphError, match="STREAM_CAPTURE") as e:
        with nbjit.capture(s):
            axpy[GRID, BLOCK, s](a, a, 1.0, N)
            if case == "synchronous copy":
                a.copy_to_host()
            elif case == "allocation":
                cuda.to_device(np.ones(N, np.float32))
            elif case == "host arrays to @cuda.jit":
                add1[GRID, BLOCK, s](np.zeros(N, np.float32))
            else:
                s.synchronize()
    assert str(e.value).startswith("capture on")
    usable(cuda, s, axpy)


def test_another_threads_default_stream_work(cuda, parts):
    twice, add1, axpy = parts
    s = cuda.stream()
    a = cuda.device_array(N, np.float32)
    ctx = cuda.current_context()
    errors = []

    def other():
        ctx.push()  # the same context, another thread, the legacy default stream
        try:
            axpy[GRID, BLOCK](a, a, 1.0, N)
            cuda.synchronize()
        except Exception as e:  # the driver refuses it while the capture is on
            errors.append(e)
        finally:
            ctx.pop()

    raised = None
    try:
        with nbjit.capture(s):
            axpy[GRID, BLOCK, s](a, a, 1.0, N)
            t = threading.Thread(target=other)
            t.start()
            t.join()
    except NbjitGraphError as e:
        raised = e
    # the legacy stream's work either was refused in the other thread or broke this capture
    assert raised is not None or any("STREAM_CAPTURE" in str(e) for e in errors), errors
    if raised is not None:
        assert "STREAM_CAPTURE" in str(raised)
    usable(cuda, s, axpy)


def test_the_default_stream_and_nesting_are_refused(cuda, parts):
    with pytest.raises(NbjitGraphError, match="default stream cannot be captured"):
        nbjit.capture(None)
    s = cuda.stream()
    with pytest.raises(NbjitGraphError, match="do not nest"):
        with nbjit.capture(s):
            with nbjit.capture(s):
                pass
    usable(cuda, s, parts[2])
    with pytest.raises(NbjitGraphError, match="capture mode"):
        nbjit.capture(s, mode="sometimes")


def test_update_with_new_arguments_in_place(cuda, parts):
    twice, add1, axpy = parts
    s = cuda.stream()
    y1, y2 = cuda.to_device(np.zeros(N, np.float32)), cuda.to_device(np.zeros(N, np.float32))
    x = cuda.to_device(np.ones(N, np.float32))
    with nbjit.capture(s) as g:
        axpy[GRID, BLOCK, s](y1, x, 2.0, N)
        add1[GRID, BLOCK, s](y1)
    g.launch()
    with g.update():  # the same work on other arrays and scalars
        axpy[GRID, BLOCK, s](y2, x, 5.0, N)
        add1[GRID, BLOCK, s](y2)
    g.launch()
    s.synchronize()
    assert g.instantiations == 1  # updated in place, not instantiated again
    np.testing.assert_allclose(y1.copy_to_host(), 3.0)
    np.testing.assert_allclose(y2.copy_to_host(), 6.0)
    with g.update():  # other work: instantiated anew
        add1[GRID, BLOCK, s](y2)
    g.launch()
    s.synchronize()
    assert g.instantiations == 2 and g.node_count == 1
    np.testing.assert_allclose(y2.copy_to_host(), 7.0)
    g.close()
    with pytest.raises(NbjitGraphError, match="this capture was closed"):
        g.launch()
