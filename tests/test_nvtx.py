"""NVTX ranges around launches (nbjit.launch.nvtx), on a CPU: the ranges a real NVTX tool
receives (tests/data/nvtx/record_ranges.c, loaded by NVTX through NVTX_INJECTION64_PATH as
Nsight Systems' is), the switch and its effect on configured launchers, NBJIT_NVTX=1, and the
refusals. Ranges around real launches: test_gpu_nvtx.py."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import nbjit
from nbjit import NbjitError
from nbjit.launch import nvtx
from nbjit.launch.config import LaunchConfig
from nbjit.launch.kernel import Launchers

pytest.importorskip("nvtx", reason="NVTX ranges need the nvtx package (nbjit-core's nvtx extra)")
from conftest import DATA, run_recorded  # noqa: E402

ROOT = DATA.parent.parent


RANGED = """
    import nbjit
    from nbjit.launch import nvtx
    from nbjit.launch.config import LaunchConfig
    nbjit.nvtx(True)
    launch = nvtx.ranged(lambda *a: print("launched", *a), "axpy", LaunchConfig.make((4, 2), 256, shared=128))
    launch(1, 2)
    def fails():
        raise ValueError("refused")
    try:
        nvtx.ranged(fails, "bad", LaunchConfig.make(1, 32))()
    except ValueError:
        print("raised")
    nbjit.nvtx(False)
    print(nvtx.ranged(print, "axpy", LaunchConfig.make(4, 256)) is print)
"""


def test_each_call_is_a_range_named_for_the_kernel_and_its_configuration(nvtx_tool, tmp_path):
    out, ranges = run_recorded(nvtx_tool, tmp_path, RANGED)
    assert out.split("\n")[:3] == ["launched 1 2", "raised", "True"], out
    assert ranges == ["push nbjit axpy grid=(4, 2, 1) block=(256, 1, 1) shared=128", "pop nbjit",
                      "push nbjit bad grid=(1, 1, 1) block=(32, 1, 1)", "pop nbjit"]  # (popped when it raises)


def test_nbjit_nvtx_1_switches_ranges_on_at_import(nvtx_tool, tmp_path):
    code = """
        import nbjit
        from nbjit.launch import nvtx
        from nbjit.launch.config import LaunchConfig
        print(nbjit.nvtx())
        nvtx.ranged(lambda: None, "k", LaunchConfig.make(1, 1))()
    """
    out, ranges = run_recorded(nvtx_tool, tmp_path, code, NBJIT_NVTX="1")
    assert out.strip() == "True" and ranges == ["push nbjit k grid=(1, 1, 1) block=(1, 1, 1)", "pop nbjit"]
    out, ranges = run_recorded(nvtx_tool, tmp_path / "off", code, NBJIT_NVTX="0")
    assert out.strip() == "False" and ranges == []


def test_off_launchers_are_the_launchers_themselves():
    assert not nbjit.nvtx()
    assert nvtx.ranged(print, "k", LaunchConfig.make(1, 1)) is print


def test_switching_empties_every_kernels_configured_launchers():
    """What kernel[...] configured before a switch is configured again after it (ranged or not)."""
    cache = Launchers()
    nvtx.watch(cache)
    group = cache.group()
    cache.keep((4, 256), print)
    group.keep("stream", print)
    assert nbjit.nvtx(False) is False and len(cache) == 2  # (no switch: kept)
    try:
        assert nbjit.nvtx(True) is True
        assert len(cache) == 0 and len(group) == 0
        cache.keep((4, 256), print)
    finally:
        nbjit.nvtx(False)
    assert len(cache) == 0


def test_refusals():
    with pytest.raises(NbjitError, match=r"on must be True, False or None, not str"):
        nbjit.nvtx("yes")
    code = "import sys; sys.modules['nvtx'] = None\nimport nbjit\nnbjit.nvtx(True)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1 and "NVTX ranges around launches need the nvtx package" in r.stderr, r.stderr
    assert "pip install" in r.stderr


def test_the_environment_switch_reads_off_words_and_needs_the_package():
    code = "import nbjit; print(nbjit.nvtx())"
    for value in ("off", "false", "no", "0", ""):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "NBJIT_NVTX": value, "PYTHONPATH": str(ROOT)})
        assert r.stdout.strip() == "False", (value, r.stderr)
    missing = "import sys; sys.modules['nvtx'] = None\n" + code
    r = subprocess.run([sys.executable, "-W", "always", "-c", missing], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "NBJIT_NVTX": "1", "PYTHONPATH": str(ROOT)})
    assert r.stdout.strip() == "False" and "NBJIT_NVTX=1: NVTX ranges around launches need the nvtx package" \
        in r.stderr, r.stderr
