"""The example scripts as a new user without a GPU meets them: the one that needs none runs;
each of the others stops with one line saying it needs a GPU (no traceback)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import DATA  # noqa: E402

ROOT = DATA.parent.parent
NEED_GPU = sorted(p for p in (ROOT / "examples").glob("*.py")
                  if p.name not in ("inspect_kernels.py", "dask_multi_gpu.py"))  # (the Dask one: test_gpu_multi.py)


def _run(scripts):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen([sys.executable, str(s)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for s in scripts]
    out = []
    for s, p in zip(scripts, procs):
        stdout, stderr = p.communicate(timeout=300)
        out.append((s, p.returncode, stdout, stderr))
    return out


def test_inspect_example_runs_without_a_gpu():
    (_, rc, out, err), = _run([ROOT / "examples/inspect_kernels.py"])
    assert rc == 0 and "stripped:" in out and "Traceback" not in err


def test_gpu_examples_without_a_gpu_say_so_in_one_line():
    from conftest import gpu_available
    if gpu_available()[0]:
        pytest.skip("this machine has a GPU (test_gpu_examples.py runs them)")
    assert len(NEED_GPU) >= 6
    for script, rc, out, err in _run(NEED_GPU):
        assert rc == 1, (script.name, rc)
        assert err.strip() == f"{script.name} needs a CUDA GPU and driver (examples/inspect_kernels.py runs " \
            "without one)", (script.name, err[-500:])
        assert out == ""
