"""examples/bundle_package as a user installs it: its wheel (the bundle as package data) in a
fresh virtual environment that has nbjit and what loading needs (numpy, itanium-demangler),
but no NVRTC, no cuda-bindings, no CUDA headers and no numba. The kernels load lazily and
describe themselves there; tests/test_gpu_bundle.py launches them. The example's README
installs numba-cuda besides (nbjit-core's `numba` extra, for the context and arrays its snippet
uses): its snippet's imports are checked against what that install command brings.

nbjit goes into the environment as its wheel, nbjit-core without an extra, installed by pip
(with the ``nbjit`` command, which must inspect the installed bundle), where NBJIT_WHEELS names
a directory holding that wheel (.ci/run's packaging leg builds it); else as the files its wheel
installs (the package directory): building nbjit's own wheel needs setuptools >= 77, which the
test environment need not have, and reaching PyPI for it would make the test depend on the
network. numpy and itanium-demangler are linked in from this environment through a .pth file
naming a directory that holds only them, so nothing else of this environment is importable."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

import nbjit
from nbjit import inspect_bundle
from nbjit.toolchain.identity import _toolchain_fingerprint

from conftest import DATA  # noqa: E402

ROOT = DATA.parent.parent
EXAMPLE = ROOT / "examples" / "bundle_package"
BUNDLE = EXAMPLE / "src" / "nbjit_demo_kernels" / "kernels.nbjit"

SCRIPT = r"""
import json, sys
import nbjit_demo_kernels as demo
import nbjit
from nbjit.gpu.host import current_host

mod = demo.kernels(lazy=True)
rows = demo.numba_kernels(lazy=True)
out = {"module": repr(mod), "bundle_type": type(demo.BUNDLE).__name__, "kernels": sorted(mod.kernels),
       "params": {k: [p.ctype for p in mod[k].params] for k in ("axpy", "scale<float>", "scale<double>")},
       "numba_params": [p.ctype for p in rows.scale_rows.params],
       "images": {i.name: [str(a) for a in i.archs] for i in nbjit.inspect_bundle(demo.BUNDLE).images},
       "host": current_host().name}
missing = []
for name in ("cuda.bindings.nvrtc", "numba", "numba_cuda", "numba_cuda_mlir", "llvmlite", "cuda.bindings.driver"):
    try:
        __import__(name)
    except ImportError:
        missing.append(name)
out["missing"] = missing
out["nbjit_from"] = nbjit.__file__
out["demo_from"] = demo.__file__
out["sys_path"] = sys.path
out["numba_modules"] = sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "numba_cuda", "llvmlite"))
print(json.dumps(out))
"""


def test_committed_bundle_is_small_and_complete():
    info = inspect_bundle(BUNDLE)
    assert BUNDLE.stat().st_size < 100_000
    assert [i.name for i in info.images] == ["axpy", "scale_rows"]
    img = info.image("axpy")
    assert img.archs == ("sm_80", "sm_90", "sm_100", "sm_120", "compute_80")
    assert set(img.lowered_names) == {"scale<float>", "scale<double>"}
    assert img.sources[0]["name"] == "axpy.cu"
    import hashlib
    assert img.sources[0]["sha256"] == hashlib.sha256((EXAMPLE / "kernels" / "axpy.cu").read_bytes()).hexdigest(), \
        "kernels/axpy.cu changed: run examples/bundle_package/build_bundle.py"
    rows = info.image("scale_rows")
    assert rows.archs == img.archs and rows.sources[0]["name"] == "numba_kernels.scale_rows"
    assert rows.sources[0]["kind"] == "numba" and [a.text for a in list(rows.numba.values())[0]] == \
        ["array(float32, 2d, A)", "array(float32, 1d, C)"]


def _can_build_wheels() -> bool:
    """Whether this environment's setuptools builds wheels itself (from 70.1) or has ``wheel``."""
    import importlib.metadata
    import importlib.util
    try:
        text = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return False
    version = tuple(int(x) for x in text.split(".")[:2] if x.isdigit())
    return version >= (70, 1) or importlib.util.find_spec("wheel") is not None


def _module_dir(name: str) -> Path:
    import importlib
    return Path(importlib.import_module(name).__file__).parent


# what a Numba brings: never in the example's environment
NUMBA_TOPS = ("numba", "numba_cuda", "numba_cuda_mlir", "llvmlite")


def _link_site_without_numba(deps: Path) -> None:
    """Links in ``deps`` to everything of this environment's site-packages but Numba, nbjit and
    this example (PyTorch, CuPy stay: the GPU leg's arrays), where ``deps`` has none of that name."""
    import site
    for root in site.getsitepackages():
        if not Path(root).is_dir():
            continue
        for entry in Path(root).iterdir():
            top = entry.name.split("-")[0].split(".")[0].lower()
            if top in NUMBA_TOPS or top in ("nbjit", "nbjit_core", "nbjit_demo_kernels", "__pycache__") or \
                    entry.suffix == ".pth" or (deps / entry.name).exists():
                continue
            (deps / entry.name).symlink_to(entry)


def _bundle_venv(tmp_path: Path, everything: bool) -> tuple[Path, Path, bool]:
    """A fresh virtual environment with the example's wheel and nbjit-core (its wheel where
    NBJIT_WHEELS names a directory holding it, else its files), and of this environment
    numpy, itanium-demangler and cuda-bindings (``everything``: all but Numba); (python,
    site-packages, whether nbjit-core came as its wheel)."""
    src = tmp_path / "src"  # (an in-tree build would leave build/ and egg-info behind)
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    dist = tmp_path / "dist"
    # with this environment's setuptools where it builds wheels (offline, seconds); else as pip
    # builds any package, in an isolated environment with setuptools from the index
    local = ["--no-build-isolation", "--no-index"] if _can_build_wheels() else []
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *local, "--quiet", "-w", str(dist),
                            str(src)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    wheel, = dist.glob("nbjit_demo_kernels-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read("nbjit_demo_kernels/kernels.nbjit") == BUNDLE.read_bytes()
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=120)
    wheels = os.environ.get("NBJIT_WHEELS")
    core = sorted(Path(wheels).glob("nbjit_core-*.whl")) if wheels else []
    assert core or not wheels, f"no nbjit_core wheel in NBJIT_WHEELS={wheels}"
    if core:  # nbjit-core's wheel, no extra: pip installs it into the environment, its command too
        subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                        "--quiet", str(core[-1])], check=True, capture_output=True, timeout=300)
    else:
        shutil.copytree(Path(nbjit.__file__).parent, site / "nbjit", ignore=shutil.ignore_patterns("__pycache__"))
    deps = tmp_path / "deps"  # not this environment's site-packages: links to what the example may use
    deps.mkdir()
    import cuda.bindings
    import cuda.pathfinder
    for d in (_module_dir("numpy"), _module_dir("itanium_demangler"), *(
            Path(m.__file__).parent for m in (cuda.bindings, cuda.pathfinder))):
        target = deps / d.relative_to(d.parent.parent) if d.parent.name == "cuda" else deps / d.name
        target.parent.mkdir(exist_ok=True)
        target.symlink_to(d)
        libs = d.parent / f"{d.name}.libs"  # (numpy's bundled libraries, where the wheel has them)
        if libs.is_dir():
            (deps / libs.name).symlink_to(libs)
    if everything:
        _link_site_without_numba(deps)
    (site / "deps.pth").write_text(f"{deps}\n")
    return py, site, bool(core)


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CUDA_", "NBJIT_"))}
    env.update(PYTHONNOUSERSITE="1", NBJIT_CACHE_DIR=str(tmp_path / "cache"))
    return env


def test_wheel_installs_and_loads_without_a_compiler_or_a_numba(tmp_path):
    py, site, core = _bundle_venv(tmp_path, everything=False)
    env = _env(tmp_path)
    run = subprocess.run([str(py), "-c", SCRIPT], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    assert out["missing"] == ["numba", "numba_cuda", "numba_cuda_mlir", "llvmlite"], out  # (cuda-bindings is there)
    assert out["numba_modules"] == [] and out["host"] == "bare"
    assert out["nbjit_from"].startswith(str(site)) and out["demo_from"].startswith(str(site))
    assert not any(p.startswith(str(Path(nbjit.__file__).parent.parent)) for p in out["sys_path"][1:])
    assert out["module"].endswith("kernels.nbjit:axpy (fatbin): loads on first use>")
    assert out["kernels"] == sorted(["axpy", "_Z5scaleIfEvPT_S0_i", "_Z5scaleIdEvPT_S0_i"])
    assert out["params"] == {"axpy": ["float", "const float*", "float*", "int"],
                             "scale<float>": ["float*", "float", "int"], "scale<double>": ["double*", "double", "int"]}
    assert out["numba_params"] == ["array(float32, 2d, A)", "array(float32, 1d, C)"]
    archs = ["sm_80", "sm_90", "sm_100", "sm_120", "compute_80"]
    assert out["images"] == {"axpy": archs, "scale_rows": archs}
    if core:  # the installed command reads the installed bundle (a shell pipes it to head: it stays quiet)
        shown = subprocess.run(f"'{py.parent}/nbjit' inspect '{site}/nbjit_demo_kernels/kernels.nbjit' | head -3",
                               shell=True, capture_output=True, text=True, env=env, timeout=120)
        assert shown.stderr == "" and shown.stdout.splitlines()[2].startswith("image axpy: from axpy.cu (cuda)"), \
            shown.stdout + shown.stderr


GPU_SCRIPT = r"""
import json, sys
import numpy as np
import torch
import nbjit
from nbjit_demo_kernels import kernels, numba_kernels
from nbjit.gpu.host import current_host

rng = np.random.default_rng(7)
m = rng.standard_normal((70, 90), dtype=np.float32)
f = rng.standard_normal(70, dtype=np.float32)
rows = numba_kernels().scale_rows
got = {}
for layout in ("C", "F", "strided"):
    t = torch.from_numpy(m).cuda()
    t = t.t().contiguous().t() if layout == "F" else t[:, ::2] if layout == "strided" else t
    want = (t.cpu().numpy() * f[:, None])
    rows[(3, 6), (32, 16)](t, torch.from_numpy(f).cuda())
    torch.cuda.synchronize()
    got[layout] = bool(np.array_equal(t.cpu().numpy(), want))
x = torch.arange(1000, dtype=torch.float32, device="cuda")
y = torch.ones(1000, dtype=torch.float32, device="cuda")
kernels().axpy[4, 256](2.0, x, y, 1000)
got["axpy"] = bool(np.array_equal(y.cpu().numpy(), 2 * np.arange(1000, dtype=np.float32) + 1))
print(json.dumps({"host": current_host().name, "got": got,
                  "numba": sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "numba_cuda", "llvmlite"))}))
"""


@pytest.mark.gpu
def test_wheel_launches_on_torch_tensors_without_a_numba(cuda, tmp_path):
    pytest.importorskip("torch")
    py, _, _ = _bundle_venv(tmp_path, everything=True)
    run = subprocess.run([str(py), "-c", GPU_SCRIPT], capture_output=True, text=True, cwd=tmp_path,
                         env=_env(tmp_path), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out == {"host": "bare", "got": {"C": True, "F": True, "strided": True, "axpy": True}, "numba": []}


# the distribution each top-level import of the example's snippet comes from
_PROVIDERS = {"numpy": "numpy", "numba": "numba-cuda", "numba_cuda_mlir": "numba-cuda-mlir", "nbjit": "nbjit-core",
              "nbjit_demo_kernels": "nbjit-demo-kernels"}
_COMPILERS = ("nvidia-cuda-nvrtc", "cuda-toolkit", "nvidia-nvjitlink", "nvidia-nvvm")  # what "no NVRTC" leaves out


def _requirements(pyproject: Path, extras: set[str]) -> list[str]:
    import tomllib
    project = tomllib.loads(pyproject.read_text())["project"]
    return [*project.get("dependencies", []),
            *(r for e in sorted(extras) for r in project["optional-dependencies"][e])]


def test_readme_snippet_imports_what_its_install_brings():
    """The example's README installs nbjit-core from the checkout with an extra and the demo's
    wheel, then runs a snippet: every module the snippet imports comes with that install (no
    Numba of its own, no NVRTC the README says users need not have)."""
    import ast
    import re
    pytest.importorskip("tomllib", reason="reads pyproject.toml with tomllib (Python >= 3.11)")
    readme = (EXAMPLE / "README.md").read_text()
    install, = re.findall(r"^pip install (.*dist/nbjit_demo_kernels-\S+\.whl)$", readme, re.M)
    checkout, wheel = install.split()
    m = re.fullmatch(r"""["']?\.(?:\[([a-z0-9,]+)\])?["']?""", checkout)
    assert m, f"the install names nbjit-core from the checkout as '.' or '.[extras]', not {checkout}"
    extras = set((m[1] or "").split(",")) - {""}
    reqs = _requirements(ROOT / "pyproject.toml", extras) + _requirements(EXAMPLE / "pyproject.toml", set())
    names = {re.match(r"[A-Za-z0-9_.-]+", r)[0].lower().replace("_", "-") for r in reqs}
    brought = names | {"nbjit-core", "nbjit-demo-kernels"}
    snippet = readme.split("Use it", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    imported = {a.name.split(".")[0] for node in ast.walk(ast.parse(snippet))
                for a in (node.names if isinstance(node, ast.Import) else [])} | \
               {node.module.split(".")[0] for node in ast.walk(ast.parse(snippet))
                if isinstance(node, ast.ImportFrom) and node.module}
    assert imported >= {"nbjit_demo_kernels", "numpy"}, imported
    missing = sorted(f"{i} ({_PROVIDERS.get(i, '?')})" for i in imported if _PROVIDERS.get(i) not in brought)
    assert not missing, f"the snippet imports what `pip install {install}` does not bring: {', '.join(missing)}"
    compilers = [r for r in reqs if any(c in r for c in _COMPILERS) or re.search(r"\[(cu1[23])\]", r)]
    assert not compilers, f"the install brings a compiler the README says users need not have: {compilers}"


@pytest.mark.skipif(not (EXAMPLE / "build_bundle.py").exists(), reason="no example")
def test_build_script_rebuilds_the_committed_bundle(tmp_path):
    """The script regenerates the committed bytes (same NVRTC build and numba-cuda: the manifest
    names them)."""
    info = inspect_bundle(BUNDLE)
    if info.image("axpy").toolchain != _toolchain_fingerprint():
        pytest.skip("another NVRTC build made the committed bundle")
    import importlib.metadata
    made_by = info.image("scale_rows").producer
    try:
        here = f"numba-cuda {importlib.metadata.version('numba-cuda')}"
    except importlib.metadata.PackageNotFoundError:
        here = None
    if made_by != here:
        pytest.skip(f"{made_by} compiled the committed @cuda.jit kernel; this environment has {here}")
    copy = tmp_path / "ex"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(copy / "build_bundle.py")], check=True, capture_output=True, env=env,
                   timeout=300)
    assert (copy / "src/nbjit_demo_kernels/kernels.nbjit").read_bytes() == BUNDLE.read_bytes()
