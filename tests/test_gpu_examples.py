"""Every example script runs as a new user runs it (marker `gpu`): a fresh process, from the
repository root, exit status 0 (each checks its own results against numpy). The Dask example
has its own test (test_gpu_multi.py), needing dask-cuda."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import DATA  # noqa: E402

pytestmark = pytest.mark.gpu
ROOT = DATA.parent.parent
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if p.name != "dask_multi_gpu.py")


def _env() -> dict:
    """This environment, with the repository first on the import path (as running from a checkout)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(script, cuda, tmp_path):
    if script.stem == "tma_tiles" and cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("TMA needs sm_90")
    if script.stem == "triton_softmax" and cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("the Triton fixture is built for sm_90")
    if script.stem == "python_operator_in_cub":
        from nbjit.compiler import cccl_include_dir
        if cccl_include_dir() is None:
            pytest.skip("no CCCL headers beside CUDA's (pip install nvidia-cuda-cccl; nbjit's cu13 extra brings them)")
    env = {**_env(), "NBJIT_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, f"{script.name}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert r.stdout.strip(), f"{script.name} printed nothing"


@pytest.mark.parametrize("name", ["mix_with_cuda_jit", "numba_fast_launch", "graph_replay"])
def test_example_runs_with_numba_cuda_mlir(name, cuda, tmp_path):
    """The examples of @cuda.jit beside nbjit, with numba-cuda-mlir's @cuda.jit, arrays and
    streams (NBJIT_HOST=numba-cuda-mlir: the example imports it, nbjit serves it)."""
    import importlib.util
    if importlib.util.find_spec("numba_cuda_mlir") is None:
        pytest.skip("numba-cuda-mlir is not installed")
    env = {**_env(), "NBJIT_CACHE_DIR": str(tmp_path / "cache"), "NBJIT_HOST": "numba-cuda-mlir"}
    r = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"{name}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert r.stdout.strip(), f"{name} printed nothing"
    if name == "mix_with_cuda_jit":
        assert "(numba-cuda-mlir's @cuda.jit)" in r.stdout, r.stdout


def test_tma_example_refuses_rows_that_break_a_rule(cuda):
    if cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("TMA needs sm_90")
    r = subprocess.run([sys.executable, str(ROOT / "examples/tma_tiles.py"), "100", "70"], cwd=ROOT,
                       capture_output=True, text=True, timeout=240, env=_env())
    assert r.returncode == 2 and "stride of 280 bytes" in r.stderr and "Traceback" not in r.stderr, r.stderr
