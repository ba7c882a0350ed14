"""Sources that survive the cache, on a real GPU (marker `gpu`): a kernel compiled with line
information and loaded in a fresh process, from the cache, has its source written where its
loaded line table points (this user's ``sources`` directory under the cache), with the header
it read from an include directory, and runs."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import HOST_CUDA

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUN = f"""
import glob, os, sys
import numpy as np
import nbjit
{HOST_CUDA}
src = '#include "doubled.h"\\n'\\
      'extern "C" __global__ void twice(float *y, int n) {{\\n'\\
      '    int i = blockIdx.x * blockDim.x + threadIdx.x;\\n'\\
      '    if (i < n) y[i] = doubled(y[i]);\\n}}\\n'
k = nbjit.compile(src, name="twice.cu", options=["-lineinfo"], include_paths=[sys.argv[1]])["twice"]
y = cuda.to_device(np.ones(100, np.float32))
k[1, 128](y, 100)
print(y.copy_to_host()[0], sorted(os.path.basename(f) for f in
                                  glob.glob(os.path.join(os.environ["NBJIT_CACHE_DIR"], "sources", "*", "*"))))
"""


def test_a_loaded_kernels_source_is_where_its_line_table_points(tmp_path):
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "doubled.h").write_text("__device__ float doubled(float v) {\n    return v * 2.0f;\n}\n")
    for run in range(2):  # (compiled, then read from the cache in a fresh process, its sources gone)
        if run:
            shutil.rmtree(tmp_path / "cache" / "sources")
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(RUN), str(tmp_path / "include")], env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        value, files = r.stdout.split(" ", 1)
        assert value == "2.0" and files.strip() == "['doubled.h', 'twice.cu']", r.stdout
