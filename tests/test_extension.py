"""The one switch for nbjit's C extension (nbjit.gpu.extension): NBJIT_PURE_PYTHON, read once."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nbjit.gpu import extension as extension_mod


@pytest.fixture
def decide_again():
    """``extension_mod.extension()`` decided afresh in the test, and again after it."""
    extension_mod.extension.cache_clear()
    yield
    extension_mod.extension.cache_clear()


@pytest.mark.parametrize("value, off", [("1", True), ("yes", True), ("0", False), ("", False)])
def test_the_environment_variable_switches_it_off(monkeypatch, decide_again, value, off):
    monkeypatch.setenv("NBJIT_PURE_PYTHON", value)
    assert extension_mod.switched_off() is off
    if off:
        assert extension_mod.extension() is None
    else:
        try:
            from nbjit.gpu import _launcher as _launch
        except ImportError:  # not built here: nothing to use
            _launch = None
        assert extension_mod.extension() is _launch


def test_decided_once(monkeypatch, decide_again):
    monkeypatch.setenv("NBJIT_PURE_PYTHON", "1")
    assert extension_mod.extension() is None
    monkeypatch.setenv("NBJIT_PURE_PYTHON", "0")
    assert extension_mod.extension() is None  # (the first answer holds for the process)


def test_switched_off_kernels_index_and_launch_in_python():
    """Every user of the extension follows the one decision: the kernel's indexing, the
    launcher, the launch primitive (and the current context, asked of the bindings)."""
    code = ("import nbjit.launch.kernel as K, nbjit.launch.launchers as L, nbjit.gpu.driver as D\n"
            "print(K.Kernel.__base__.__name__, L._CLauncher, D.backend().name, D._c_context_getter())")
    env = {**os.environ, "NBJIT_PURE_PYTHON": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.stdout == "_PyIndexing None python False\n", r.stderr
