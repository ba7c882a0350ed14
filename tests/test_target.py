"""What ``compile_image`` compiles for (nbjit/toolchain/nvrtc.py): the architecture named,
with no driver, numpy or Numba imported; else the current device's."""
from __future__ import annotations

import subprocess
import sys

import pytest

import nbjit
from nbjit.toolchain import nvrtc as compiler
from nbjit.gpu.host import current_host
from nbjit.arch import Arch
from nbjit.cache.store import Cache

from conftest import DATA  # noqa: E402

SRC = (DATA / "src/nvrtc_tmpl.cu").read_text()
HDR = {"scale.cuh": (DATA / "src/scale.cuh").read_text()}
AXPY = 'extern "C" __global__ void axpy(float* y, const float* x, float a, int n) { y[n] += a * x[n]; }\n'


def test_a_named_architecture_needs_no_driver(tmp_path):
    """Compiling for a named architecture imports neither the driver module nor numpy or
    Numba, in a fresh process."""
    code = f"""import sys, nbjit
img = nbjit.compile_image({AXPY!r}, arch="sm_80", cache=nbjit.Cache({str(tmp_path)!r}))
print(img.kind, img.arch, sorted(m for m in ("numpy", "numba", "nbjit.gpu.driver") if m in sys.modules))"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "cubin sm_80 []\n"


def test_without_one_the_current_device_is_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(current_host(), "current_cc", lambda: (8, 6))  # (a stand-in for a GPU's answer)
    assert current_host().device_arch() == Arch(86)
    img = nbjit.compile_image(SRC, headers=HDR, name_expressions=["fill<float>"], cache=Cache(tmp_path))
    assert img.arch == "sm_86" and img.kind == "cubin"
    named = nbjit.compile_image(SRC, headers=HDR, name_expressions=["fill<float>"], arch="sm_86",
                                cache=Cache(tmp_path))
    assert named.data == img.data and len(Cache(tmp_path).entries()) == 1
    assert nbjit.compile_image is compiler.compile_image


def test_a_named_architecture_asks_no_device(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the device was asked")
    monkeypatch.setattr(current_host(), "current_cc", refuse)
    assert nbjit.compile_image(AXPY, arch="compute_90", cache=Cache(tmp_path)).kind == "ptx"


def test_without_a_device_it_says_to_name_one():
    from conftest import gpu_available
    if gpu_available()[0]:
        pytest.skip("a GPU is present")
    with pytest.raises(nbjit.NbjitLoadError, match=r"give compile an explicit arch="):
        nbjit.compile_image(AXPY)
