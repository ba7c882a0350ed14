"""The two distributions (issue #28): nbjit-core (the repository root: the `nbjit` import package,
no Numba among its base requirements and no upper bound on numpy) and nbjit (packaging/nbjit: a
metapackage with no code that requires nbjit-core[numba] of the same version, so that a bare
`pip install nbjit` gives numba-cuda while `pip install "nbjit-core[mlir]"` gives numba-cuda-mlir
alone). Read from both pyproject files, and from the METADATA of both wheels as built.

The wheels are built with pip (`pip wheel --no-deps`) into a temporary directory: with this
environment's setuptools where it is new enough (>= 77, for the license expression: offline,
seconds), else as pip builds any package, in an isolated environment with setuptools from the
index. Where NBJIT_WHEELS names a directory holding both wheels (.ci/run builds them), those are
read instead."""
from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import nbjit

tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "pyproject.toml"
META = ROOT / "packaging" / "nbjit" / "pyproject.toml"
NUMBAS = {"numba", "numba-cuda", "numba-cuda-mlir", "llvmlite"}
NUMBA_CUDA_EXTRAS = ("numba", "cu13", "cu12")  # nbjit-core's extras that choose numba-cuda


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req(text: str) -> tuple[str, frozenset, str, str | None]:
    """(name, extras, version specifier, the extra it belongs to or None) of a requirement as
    pyproject.toml or METADATA writes it."""
    body, _, marker = text.partition(";")
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?\s*(.*?)\s*", body)
    assert m, f"cannot read the requirement {text!r}"
    extras = frozenset(_canon(e.strip()) for e in (m[2] or "").split(",") if e.strip())
    extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
    return _canon(m[1]), extras, m[3].replace(" ", ""), extra and _canon(extra[1])


def _upper_bound(spec: str) -> bool:
    return any(s.startswith(("<", "==", "~=")) for s in spec.split(",") if s)


def _pyproject(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)["project"]


# ---------------------------------------------------------------- the pyproject files


def test_one_version():
    """nbjit.__version__ is the version: nbjit-core reads it, the metapackage repeats it and pins
    nbjit-core to it in every requirement."""
    with open(CORE, "rb") as f:
        core = tomllib.load(f)
    assert "version" not in core["project"] and "version" in core["project"]["dynamic"]
    assert core["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "nbjit.__version__"}
    meta = _pyproject(META)
    assert meta["version"] == nbjit.__version__, "packaging/nbjit/pyproject.toml's version is not nbjit.__version__"
    reqs = [_req(r) for r in meta["dependencies"]] + [_req(r) for v in meta["optional-dependencies"].values()
                                                      for r in v]
    for name, _, spec, _ in reqs:
        assert name == "nbjit-core" and spec == f"=={nbjit.__version__}", (name, spec)


def test_core_requires_no_numba_and_no_numpy_ceiling():
    core = _pyproject(CORE)
    assert core["name"] == "nbjit-core"
    base = [_req(r) for r in core["dependencies"]]
    names = {name for name, *_ in base}
    assert not names & NUMBAS, f"nbjit-core's base requirements name a Numba: {sorted(names & NUMBAS)}"
    numpy, = [spec for name, _, spec, _ in base if name == "numpy"]
    assert not _upper_bound(numpy), f"nbjit-core's base requirements bound numpy from above: numpy{numpy}"


def test_core_extras_choose_the_numba():
    extras = {k: [_req(r) for r in v] for k, v in _pyproject(CORE)["optional-dependencies"].items()}
    assert set(extras) >= {"numba", "cu13", "cu12", "mlir", "dask", "sass", "remote", "test", "docs"}
    for extra in NUMBA_CUDA_EXTRAS:  # numba-cuda, and numpy below 2.5 with it (np.row_stack)
        got = {name: (x, spec) for name, x, spec, _ in extras[extra]}
        assert "numba-cuda" in got, extra
        assert "<2.5" in got["numpy"][1].split(","), (extra, got["numpy"])
    for cuda in ("cu13", "cu12"):  # numba-cuda's own CUDA extra of the same name
        assert [x for name, x, *_ in extras[cuda] if name == "numba-cuda"] == [{cuda}], cuda
    mlir = {name for name, *_ in extras["mlir"]}
    assert "numba-cuda-mlir" in mlir and not mlir & {"numba", "numba-cuda", "numpy"}, mlir
    for extra in ("dask", "sass", "remote", "test", "docs"):  # these choose no Numba
        assert not {name for name, *_ in extras[extra]} & NUMBAS, extra


def test_metapackage_forwards_every_extra():
    core, meta = _pyproject(CORE), _pyproject(META)
    assert meta["name"] == "nbjit"
    assert [_req(r)[:2] for r in meta["dependencies"]] == [("nbjit-core", {"numba"})]
    assert set(meta["optional-dependencies"]) == set(core["optional-dependencies"]) - {"numba"}
    for extra, reqs in meta["optional-dependencies"].items():
        assert [_req(r)[:2] for r in reqs] == [("nbjit-core", {extra})], extra
    with open(META, "rb") as f:
        assert tomllib.load(f)["tool"]["setuptools"]["packages"] == [], "the metapackage has no code"
    assert (META.parent / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert meta["requires-python"] == core["requires-python"] and meta["license"] == core["license"]


# ---------------------------------------------------------------- the wheels as built


def _setuptools_builds() -> bool:
    import importlib.metadata
    try:
        text = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return False
    return tuple(int(x) for x in text.split(".")[:2] if x.isdigit()) >= (77, 0)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    given = os.environ.get("NBJIT_WHEELS")
    if given:
        dist = Path(given)
    else:
        tmp = tmp_path_factory.mktemp("packaging")
        # nbjit-core from a copy of what its wheel is built from (an in-tree build would leave
        # build/ and egg-info behind); the C extension compiles where there is a compiler
        core = tmp / "core"
        core.mkdir()
        for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
            shutil.copy2(ROOT / name, core / name)
        shutil.copytree(ROOT / "nbjit", core / "nbjit", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        meta = tmp / "meta"
        shutil.copytree(META.parent, meta, ignore=shutil.ignore_patterns("build", "*.egg-info"))
        dist = tmp / "dist"
        local = ["--no-build-isolation", "--no-index"] if _setuptools_builds() else []
        build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *local, "--quiet", "-w", str(dist),
                                str(core), str(meta)], capture_output=True, text=True, timeout=600)
        assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-3000:]
    core_whl, = dist.glob("nbjit_core-*.whl")
    meta_whl, = dist.glob("nbjit-*.whl")
    return {"nbjit-core": core_whl, "nbjit": meta_whl}


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        name, = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(zf.read(name).decode()), zf.namelist()


def test_metapackage_wheel(wheels):
    md, files = _metadata(wheels["nbjit"])
    v = nbjit.__version__
    assert (md["Name"], md["Version"]) == ("nbjit", v)
    assert wheels["nbjit"].name == f"nbjit-{v}-py3-none-any.whl"
    assert all(".dist-info/" in f for f in files), f"the metapackage's wheel holds code: {files}"
    reqs = [_req(r) for r in md.get_all("Requires-Dist")]
    assert [r for r in reqs if r[3] is None] == [("nbjit-core", {"numba"}, f"=={v}", None)], reqs
    extras = set(md.get_all("Provides-Extra"))
    assert extras == {"cu13", "cu12", "mlir", "dask", "sass", "remote", "nvtx", "test", "docs"}
    for extra in extras:
        assert [r for r in reqs if r[3] == extra] == [("nbjit-core", {extra}, f"=={v}", extra)], extra


def test_core_wheel(wheels):
    md, files = _metadata(wheels["nbjit-core"])
    assert (md["Name"], md["Version"]) == ("nbjit-core", nbjit.__version__)
    assert {"nbjit/__init__.py", "nbjit/cli/main.py", "nbjit/gpu/_launcher.c", "nbjit/py.typed", "nbjit/read/ptx.py",
            "nbjit/launch/kernel.py"} <= set(files)
    reqs = [_req(r) for r in md.get_all("Requires-Dist")]
    base = [r for r in reqs if r[3] is None]
    assert not {r[0] for r in base} & NUMBAS, f"numba-cuda outside an extra: {base}"
    numpy, = [r for r in base if r[0] == "numpy"]
    assert not _upper_bound(numpy[2]), f"numpy bounded from above outside an extra: {numpy}"
    for extra in NUMBA_CUDA_EXTRAS:
        names = {r[0]: r[2] for r in reqs if r[3] == extra}
        assert "numba-cuda" in names and "<2.5" in names["numpy"].split(","), (extra, names)
    mlir = {r[0] for r in reqs if r[3] == "mlir"}
    assert "numba-cuda-mlir" in mlir and not mlir & {"numba", "numba-cuda", "numpy"}, mlir
    with zipfile.ZipFile(wheels["nbjit-core"]) as zf:
        ep, = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        assert "nbjit = nbjit.cli.main:main" in zf.read(ep).decode()


def test_a_library_of_kernels_depends_on_nbjit_core():
    """examples/bundle_package (a library shipping kernels) leaves the Numba to its users."""
    example = _pyproject(ROOT / "examples" / "bundle_package" / "pyproject.toml")
    assert [_req(r)[:2] for r in example["dependencies"]] == [("nbjit-core", set())]
