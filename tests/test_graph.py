"""Stream capture where it needs no GPU: which CUDA errors are told as capture errors,
whoever raised them (the captures themselves are tested on a GPU, in test_gpu_graph.py)."""
from __future__ import annotations

import pytest

from nbjit import NbjitGraphError, NbjitLaunchError
from nbjit.graphs.capture import Capture, _capture_code


def launch_error(code: int) -> NbjitLaunchError:
    e = NbjitLaunchError("launch of kernel 'k' failed")
    e.code = code  # (as a failed launch sets it)
    return e


def test_capture_errors_from_nbjit_numba_and_cuda_core():
    numba = pytest.importorskip("numba.cuda.cudadrv.driver")
    assert _capture_code(launch_error(900)) == 900
    assert _capture_code(numba.CudaAPIError(901, "cuMemcpy failed")) == 901
    # cuda.core's CUDAError names the error in its text
    assert _capture_code(RuntimeError("CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: operation not permitted")) == 906


def test_other_errors_are_not_capture_errors():
    numba = pytest.importorskip("numba.cuda.cudadrv.driver")
    assert _capture_code(launch_error(1)) is None
    assert _capture_code(numba.CudaAPIError(2, "out of memory")) is None
    coded = ValueError("a code that is not a CUresult")
    coded.code = 900
    assert _capture_code(coded) is None  # only nbjit's and the host's errors carry CUresults


def test_modes_and_the_default_stream_are_refused():
    with pytest.raises(NbjitGraphError, match="capture mode must be one of"):
        Capture(None, mode="everything")
    with pytest.raises(NbjitGraphError, match="the default stream cannot be captured"):
        Capture(None)


def test_conditional_nodes_are_added_with_edge_data_on_either_bindings():
    """cuda-bindings 13's cuGraphAddNode takes edge data, 12's cuGraphAddNode_v2 does (its
    cuGraphAddNode does not): the call nbjit adds a conditional node with takes five arguments."""
    pytest.importorskip("cuda.bindings")
    from nbjit.gpu import graphs
    fn = graphs.add_node_call()
    assert "dependencyData" in fn.__doc__.splitlines()[0], fn.__doc__.splitlines()[0]
