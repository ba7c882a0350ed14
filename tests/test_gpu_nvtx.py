"""NVTX ranges around real launches (marker `gpu`): every route from Python, kernel[...],
kernel.launch, kernel.bind and a Triton kernel's grid, is one range named for the kernel and
its configuration in a process under a recording NVTX tool (conftest.nvtx_tool); switched
off, the same launches make none."""
from __future__ import annotations

import pytest

from conftest import DATA, HOST_CUDA, run_recorded

pytestmark = pytest.mark.gpu
pytest.importorskip("nvtx", reason="NVTX ranges need the nvtx package (nbjit-core's nvtx extra)")

LAUNCHES = f"""
    import numpy as np
    import nbjit
    {HOST_CUDA}
    mod = nbjit.compile('extern "C" __global__ void fill(float *y, float v, int n) {{'
                        ' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = v; }}')
    k = mod["fill"]
    y = cuda.device_array(1000, np.float32)
    s = cuda.stream()
    add = nbjit.load_triton("{DATA / 'triton' / 'add_kernel'}")
    x = cuda.to_device(np.ones(1000, np.float32))
    out = cuda.device_array(1000, np.float32)

    def launches(v):
        k[4, 256](y, v, 1000)
        k[(2, 2), 256, s, 64](y, v, 1000)
        k.launch(4, 256, y, v, 1000, stream=s)
        k.bind(4, 256, y, v, 1000)()
        add[(1,)](x, x, out, 1000, np.float32(0.5))
    launches(1.0)          # (configured while ranges are off)
    nbjit.nvtx(True)
    launches(2.0)
    nbjit.nvtx(False)
    launches(3.0)
    cuda.synchronize()
    print(y.copy_to_host()[0], out.copy_to_host()[0])
"""


def test_every_python_launch_is_one_range_while_switched_on(nvtx_tool, tmp_path):
    out, ranges = run_recorded(nvtx_tool, tmp_path, LAUNCHES)
    assert out.split() == ["3.0", "1.5"], out
    pushes = [r for r in ranges if r.startswith("push nbjit")]
    assert pushes == ["push nbjit fill grid=(4, 1, 1) block=(256, 1, 1)",
                      "push nbjit fill grid=(2, 2, 1) block=(256, 1, 1) shared=64",
                      "push nbjit fill grid=(4, 1, 1) block=(256, 1, 1)",
                      "push nbjit fill grid=(4, 1, 1) block=(256, 1, 1)",
                      "push nbjit add_kernel grid=(1, 1, 1) block=(128, 1, 1)"], ranges
    assert ranges.count("pop nbjit") == len(pushes)
