"""Every example script runs as a new user runs it (marker `gpu`): a fresh process, from the
repository root, exit status 0 (each checks its own results against numpy). The Dask examples
have their own tests: dask_multi_gpu.py in test_gpu_multi.py (needing dask-cuda),
dask_numba_arrays.py here under each host (needing dask and distributed)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import DATA  # noqa: E402

pytestmark = pytest.mark.gpu
ROOT = DATA.parent.parent
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py")
                  if p.name not in ("dask_multi_gpu.py", "dask_numba_arrays.py"))


def _env() -> dict:
    """This environment, with the repository first on the import path (as running from a checkout)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def skip_without_cccl(name: str) -> None:
    """The examples that include CUB need CCCL's headers beside CUDA's."""
    if name in ("python_operator_in_cub", "cg_solver_graph", "tune_reduction"):
        from nbjit.toolchain.identity import cccl_include_dir
        if cccl_include_dir() is None:
            pytest.skip("no CCCL headers beside CUDA's (pip install nvidia-cuda-cccl; nbjit's cu13 extra brings them)")


def skip_without_framework(name: str) -> None:
    """The PyTorch example needs PyTorch; the JAX one, JAX with its CUDA backend."""
    import importlib.util
    if name == "torch_compile_op" and importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed")
    if name == "jax_jit_call":
        if importlib.util.find_spec("jax") is None:
            pytest.skip("JAX is not installed")
        import jax
        if jax.default_backend() != "gpu":
            pytest.skip(f"JAX runs on {jax.default_backend()} here (its CUDA backend is not installed)")


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(script, cuda, tmp_path):
    if script.stem == "tma_tiles" and cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("TMA needs sm_90")
    if script.stem == "triton_softmax" and cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("the Triton fixture is built for sm_90")
    skip_without_cccl(script.stem)
    skip_without_framework(script.stem)
    env = {**_env(), "NBJIT_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, f"{script.name}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert r.stdout.strip(), f"{script.name} printed nothing"


@pytest.mark.parametrize("name", ["mix_with_cuda_jit", "numba_fast_launch", "graph_replay", "cg_solver_graph"])
def test_example_runs_with_numba_cuda_mlir(name, cuda, tmp_path):
    """The examples of @cuda.jit beside nbjit, with numba-cuda-mlir's @cuda.jit, arrays and
    streams (NBJIT_HOST=numba-cuda-mlir: the example imports it, nbjit serves it)."""
    import importlib.util
    if importlib.util.find_spec("numba_cuda_mlir") is None:
        pytest.skip("numba-cuda-mlir is not installed")
    skip_without_cccl(name)
    env = {**_env(), "NBJIT_CACHE_DIR": str(tmp_path / "cache"), "NBJIT_HOST": "numba-cuda-mlir"}
    r = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"{name}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert r.stdout.strip(), f"{name} printed nothing"
    if name == "mix_with_cuda_jit":
        assert "(numba-cuda-mlir's @cuda.jit)" in r.stdout, r.stdout


@pytest.mark.parametrize("host", ["numba-cuda", "numba-cuda-mlir"])
def test_dask_example_with_the_hosts_arrays_and_streams(host, cuda, tmp_path):
    """examples/dask_numba_arrays.py under each host: a LocalCluster of two spawned worker
    processes (two threads each) on this GPU launches the kernel compiled once on the client on
    the host's device arrays and streams; the result equals numpy's (the example checks it).
    Under numba-cuda-mlir, its arrays and context in every worker, and numba-cuda imported
    nowhere (installed or not)."""
    import importlib.util
    for need in ("dask", "distributed", {"numba-cuda": "numba_cuda", "numba-cuda-mlir": "numba_cuda_mlir"}[host]):
        if importlib.util.find_spec(need) is None:
            pytest.skip(f"{need} is not installed")
    env = {**_env(), "NBJIT_CACHE_DIR": str(tmp_path / "cache"), "NBJIT_HOST": host}
    r = subprocess.run([sys.executable, str(ROOT / "examples/dask_numba_arrays.py"), "--n", "6000007", "--chunk",
                        "500000", "--workers", "2", "--threads", "2"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=480)
    assert r.returncode == 0, f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert "13 chunks of 500,000 values, 6,000,007 in all" in r.stdout and "equal to numpy's" in r.stdout, r.stdout
    package = "numba_cuda_mlir." if host == "numba-cuda-mlir" else "numba.cuda."
    workers = [line for line in r.stdout.splitlines() if line.startswith("worker ")]
    assert len(workers) == 2, r.stdout
    for line in workers:
        assert f"arrays {package}" in line and f"kernel loaded into {package}" in line, r.stdout
    if host == "numba-cuda-mlir":
        assert all(line.endswith("numba-cuda imported: no") for line in workers), r.stdout
        assert "client: numba-cuda imported: no" in r.stdout, r.stdout


def test_tma_example_refuses_rows_that_break_a_rule(cuda):
    if cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("TMA needs sm_90")
    r = subprocess.run([sys.executable, str(ROOT / "examples/tma_tiles.py"), "100", "70"], cwd=ROOT,
                       capture_output=True, text=True, timeout=240, env=_env())
    assert r.returncode == 2 and "stride of 280 bytes" in r.stderr and "Traceback" not in r.stderr, r.stderr
