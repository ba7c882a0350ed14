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


def test_inspect_example_says_in_one_line_what_it_cannot_read(tmp_path):
    """examples/inspect_kernels.py some.cubin once died with a UnicodeDecodeError traceback."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    script = str(ROOT / "examples/inspect_kernels.py")
    for given, said in ((DATA / "nvcc/kernels_sm_90.cubin", "a cubin, not PTX: read it with nbjit.inspect_image"),
                        (DATA / "nvcc/kernels_multi.fatbin", "a fatbin, not PTX"),
                        (tmp_path / "none.ptx", "cannot read"), (tmp_path, "cannot read")):
        r = subprocess.run([sys.executable, script, str(given)], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith("inspect_kernels.py: ") and said in r.stderr, r.stderr


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
