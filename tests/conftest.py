"""Shared fixtures: paths to the committed compiler outputs, the `gpu` marker's skip, and the
Numba host the suite runs under.

The host is nbjit's (``nbjit.gpu.host``), chosen as the session starts, before any test module
imports a Numba: ``NBJIT_HOST=numba-cuda-mlir python -m pytest -m gpu`` runs the GPU suite
under numba-cuda-mlir (the ``cuda`` fixture, ``host_cuda()`` and ``HOST_CUDA`` give its
``cuda`` module: its arrays, streams and ``@cuda.jit``); without it, numba-cuda where it is
installed, else numba-cuda-mlir."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"

# What a subprocess's code or a spawned worker runs for the host's `cuda` module (it inherits NBJIT_HOST)
HOST_CUDA = "from nbjit.gpu.host import current_host as _host; cuda = _host().module('cuda')"

# y += a x in place and out = a x: the two kernels the framework bridges' GPU tests make ops of
AXPY_SCALE = r"""
extern "C" __global__ void axpy(float *y, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
extern "C" __global__ void scale(float *out, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i];
}
"""
_OP_NUMBERS = iter(range(10**6))


def fresh(stem: str) -> str:
    """A PyTorch op name no test registered before (torch keeps ops for the life of the process)."""
    return f"nbjit_test::{stem}_{next(_OP_NUMBERS)}"


def numel(x):
    """An op's ``fill`` rule: a tensor's element count."""
    return x.numel()


def blocks(n):
    """An op's grid rule: 256-thread blocks covering ``n`` items."""
    return (n + 255) // 256


def host_cuda():
    """The ``cuda`` module of the Numba host nbjit serves (``numba.cuda`` or
    ``numba_cuda_mlir.cuda``), imported."""
    from nbjit.gpu.host import current_host
    return current_host().module("cuda")


def pytest_configure(config):
    from nbjit.gpu.host import current_host
    _run_cache(config)
    current_host()  # chosen now (NBJIT_HOST, else the first installed), not by a test module's imports


def _run_cache(config) -> None:
    """The default cache of this run, a directory of its own, set before anything is collected:
    module-scoped fixtures compile before a test's own cache (``_private_cache``) is set, and a
    compile remembers the toolchain's identity in the default cache's directory
    (``toolchain-ids.json``) whichever cache it uses. Never the user's ``~/.cache/nbjit``."""
    import tempfile
    before = os.environ.get("NBJIT_CACHE_DIR")
    os.environ["NBJIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="nbjit-test-cache-")

    def undo():
        shutil.rmtree(os.environ["NBJIT_CACHE_DIR"], ignore_errors=True)
        if before is None:
            del os.environ["NBJIT_CACHE_DIR"]
        else:
            os.environ["NBJIT_CACHE_DIR"] = before
    config.add_cleanup(undo)


def pytest_report_header(config):
    from nbjit.gpu.host import current_host
    return f"nbjit host: {current_host().name} (NBJIT_HOST=numba-cuda-mlir or numba-cuda chooses)"


def missing_dependencies() -> list[str]:
    """nbjit-core's own dependencies (pyproject.toml's ``dependencies``) that cannot be
    imported here: a suite run with nbjit on PYTHONPATH rather than installed (the GPU
    machine's image lacks three) fails tests of C++ kernels and compressed fatbins."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: not checked
        return []
    import importlib.util
    import re
    deps = tomllib.loads((DATA.parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.match(r"[A-Za-z0-9_.-]+", d)[0] for d in deps]
    return [n for n in names if importlib.util.find_spec(n.replace("-", "_")) is None]


def pytest_terminal_summary(terminalreporter):
    missing = missing_dependencies()
    if missing:  # (a summary line: shown under -q too, where the header is not)
        terminalreporter.write_line(f"nbjit's dependencies missing here: {', '.join(missing)} (tests that need them "
                                    "fail: pip install them)", yellow=True)


@functools.lru_cache(maxsize=None)
def gpu_available() -> tuple[bool, str]:
    from nbjit.gpu.host import current_host
    name = current_host().name
    try:
        if host_cuda().is_available():
            return True, ""
        return False, f"no CUDA GPU: {name}'s cuda.is_available() is false"
    except Exception as e:  # the host missing or its driver lookup failed
        return False, f"no CUDA GPU: {name}: {type(e).__name__}: {e}"


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if "gpu" in it.keywords]
    if not gpu_items:
        return
    ok, why = gpu_available()
    if not ok:
        skip = pytest.mark.skip(reason=why)
        for it in gpu_items:
            it.add_marker(skip)


def scaling_ratio(fn, small, big, rounds: int = 5) -> float:
    """How many times longer ``fn(big)`` takes than ``fn(small)``: CPU time of this thread
    (not wall time, so other processes on a busy machine do not count), the best of
    ``rounds`` for each, the two sizes taking turns, the garbage collector off."""
    import gc
    import time
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, x in enumerate((small, big)):
            gc.collect()
            gc.disable()
            try:
                t0 = time.thread_time()
                fn(x)
                best[i] = min(best[i], time.thread_time() - t0)
            finally:
                gc.enable()
    return best[1] / max(best[0], 1e-4)


def assert_linear(fn, make, n: int, factor: int = 8, rounds: int = 5) -> None:
    """``fn(make(factor * n))`` takes at most ~2.5x ``factor`` times ``fn(make(n))``: a
    linear reader passes with room for noise, a quadratic one (``factor**2``: 64x at the
    default) cannot. A failing measurement is taken once more before it counts (a
    timer's noise is transient, a quadratic reader's cost is not)."""
    small, big = make(n), make(factor * n)
    limit = 2.5 * factor
    ratios = []
    for _ in range(2):
        ratios.append(scaling_ratio(fn, small, big, rounds))
        if ratios[-1] < limit:
            return
    raise AssertionError(f"{factor}x the input took {ratios} x the time (linear: about {factor}x, "
                         f"limit {limit:g}x, quadratic: {factor * factor}x)")


@pytest.fixture
def data() -> Path:
    return DATA


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own default cache directory: tests never share or pollute one (what
    runs outside a test, a module's fixtures, uses the run's: ``_run_cache``)."""
    from nbjit.cache.store import set_default_cache
    monkeypatch.setenv("NBJIT_CACHE_DIR", str(tmp_path_factory.mktemp("nbjit-cache")))
    set_default_cache(None)
    yield
    set_default_cache(None)


@pytest.fixture
def cpu_entry(monkeypatch):
    """Kernels handed to compiled callers (njit code, nbjit.jax.call) get a C entry made on this
    CPU from their image (function handle 0; with no driver its launch refuses with a status,
    after the argument checks), as a loaded kernel gets its own. Returns {name: CEntry}."""
    from nbjit.gpu import extension
    from nbjit.launch import entry as entry_module
    from nbjit.launch.arguments import ArgPacker
    from nbjit.launch.entry import CEntry, arguments_digest, entry_args, entry_facts, entry_launcher
    if extension.extension() is None:
        pytest.skip("nbjit's C extension is not built")
    made = {}

    def entry(k, tail=0):
        if k.name not in made:
            info = k.info
            packer = ArgPacker(info.signature, k.name)
            facts = entry_facts(info, k.name, (0, 0, 232448, 1024), tail)
            launcher = entry_launcher(info, packer, packer.c_layout, 0, facts, tail)
            args = entry_args(info, k.name, tail)
            points = extension.extension().entry_points()
            made[k.name] = CEntry(points["launch"], points["pack"], points["synchronize"], id(launcher),
                                  info.param_size, args, k.name, launcher, arguments_digest(args))
        return made[k.name]
    monkeypatch.setattr(entry_module, "kernel_entry", entry)
    return made


@pytest.fixture
def no_zstd(monkeypatch):
    """As if zstandard were not installed."""
    _without(monkeypatch, "zstandard")


@pytest.fixture
def no_lz4(monkeypatch):
    """As if lz4 were not installed."""
    _without(monkeypatch, "lz4", "lz4.block")


def _without(monkeypatch, *names: str) -> None:
    import builtins
    real = builtins.__import__

    def fake(name, *a, **k):
        if name in names:
            raise ImportError(f"No module named {name!r}", name=name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)


@pytest.fixture(scope="module")
def cuda():
    """The host's ``cuda`` module (numba-cuda's unless NBJIT_HOST names another)."""
    return host_cuda()


@pytest.fixture(scope="module")
def nb_types():
    """The host's Numba types (``numba.types`` or numba-cuda-mlir's), for kernel signatures."""
    from nbjit.gpu.host import current_host
    return current_host().module("types")


@pytest.fixture(scope="module")
def kernels():
    """nvcc's test kernels loaded (GPU tests only)."""
    import nbjit
    return nbjit.load(DATA / "nvcc/kernels_sm90.ptx")


def expected_path() -> str:
    """The C launcher, unless it is switched off or several GPUs make nbjit check devices
    (then every launch takes the Python path)."""
    from nbjit.gpu import extension as extension_mod
    from nbjit.gpu import driver as _driver
    if extension_mod.extension() is None or _driver.multi_gpu():
        return "python"
    return "c"


@pytest.fixture
def counted(monkeypatch):
    """Counts real NVRTC compiles (nbjit.toolchain.nvrtc._run_nvrtc calls)."""
    from nbjit.toolchain import nvrtc as compiler
    calls = []
    real = compiler._run_nvrtc

    def spy(*a, **k):
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr(compiler, "_run_nvrtc", spy)
    return calls


@pytest.fixture
def fake_device(monkeypatch):
    """Loading without a GPU: a context, module and functions that are only numbers (the
    driver's own parameter check is tested on the GPU)."""
    import types

    from nbjit.loading import module
    from nbjit.gpu import driver as _driver
    from nbjit.gpu.host import current_host
    ctx = types.SimpleNamespace(device=types.SimpleNamespace(id=0, compute_capability=(9, 0)), handle=7)
    monkeypatch.setattr(current_host(), "current_context", lambda: ctx)
    monkeypatch.setattr(current_host(), "current_cc", lambda: (9, 0))
    monkeypatch.setattr(_driver, "current_context_key", lambda: 7)
    monkeypatch.setattr(_driver, "driver_version", lambda: 13000)
    monkeypatch.setattr(_driver, "load_module", lambda data, what, kind: _driver.Loaded(1, ""))
    monkeypatch.setattr(_driver, "unload_module", lambda handle: None)
    monkeypatch.setattr(_driver, "get_function", lambda handle, name: 2)
    monkeypatch.setattr(_driver, "param_info", lambda func: None)
    monkeypatch.setattr("nbjit.launch.launchers._MULTI", [False])
    return module


class DevArray:
    """A device array as Numba's, numba-cuda-mlir's and CuPy's look to nbjit (no GPU): CAI,
    shape, strides, dtype; the packing tests read its address from ``ptr``."""

    def __init__(self, ptr, shape, dtype, strides=None):
        import numpy as np
        self.ptr, self.shape, self.dtype = ptr, tuple(shape), np.dtype(dtype)
        c, s = [], self.dtype.itemsize
        for n in reversed(self.shape):
            c.append(s)
            s *= n
        self.strides = tuple(strides) if strides is not None else tuple(reversed(c))
        self._given = strides

    @property
    def __cuda_array_interface__(self):
        d = {"data": (self.ptr, False), "shape": self.shape, "typestr": self.dtype.str, "strides": self._given,
             "version": 3}
        if self.dtype.fields:
            d["descr"] = self.dtype.descr
        return d


def endless_source(tag: int = 0) -> str:
    """CUDA C++ that NVRTC compiles for hours (a recursion instantiated 2**40 times, inlined):
    a compile to interrupt. ``tag``: sources of different cache keys."""
    return ("template <int N> struct F { static __device__ __forceinline__ float go(float x) "
            "{ return F<N - 1>::go(x * 1.0001f + N) + F<N - 2>::go(x); } };\n"
            "template <> struct F<0> { static __device__ __forceinline__ float go(float x) { return x; } };\n"
            "template <> struct F<1> { static __device__ __forceinline__ float go(float x) { return x + 1; } };\n"
            f'extern "C" __global__ void k(float* p) {{ p[0] = F<40>::go(p[1]) + {tag}; }}\n')


def cpu_seconds(pid: int) -> float:
    """CPU time process ``pid`` has used (Linux: /proc), all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_compiling(cache_dir, locks: int, pids, timeout: float = 120.0) -> None:
    """Until ``locks`` compiles hold their keys' locks in ``cache_dir`` and each of ``pids()``
    has then used a second of CPU more: NVRTC runs (a signal sent before, while Python still
    ran, would stop any code). Raises TimeoutError past ``timeout`` seconds."""
    import time
    from pathlib import Path
    deadline = time.monotonic() + timeout
    while len(list(Path(cache_dir).rglob("*.lock"))) < locks:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {locks} compiles started in {timeout} s")
        time.sleep(0.05)
    start = {p: cpu_seconds(p) for p in pids()}
    while not all(cpu_seconds(p) > t + 1.0 for p, t in start.items()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the compiles used no CPU in {timeout} s")
        time.sleep(0.05)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, ValueError):
                pass
    return out


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture(scope="session")
def nvtx_tool(tmp_path_factory):
    """An NVTX tool that records ranges (tests/data/nvtx/record_ranges.c), built with the
    system compiler; processes load it through NVTX_INJECTION64_PATH, as Nsight Systems' is."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the NVTX tool")
    lib = tmp_path_factory.mktemp("nvtx") / "librecord_ranges.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(DATA / "nvtx/record_ranges.c")], check=True)
    return lib


def run_recorded(tool, tmp_path, code: str, **env) -> tuple[str, list[str]]:
    """``code`` run in a fresh process under the NVTX ``tool``: (its output, the ranges it
    recorded, "push DOMAIN MESSAGE" and "pop DOMAIN")."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "ranges.log"
    env = {**os.environ, "NVTX_INJECTION64_PATH": str(tool), "NVTX_RECORD": str(log), **env,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(DATA.parent.parent), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout, log.read_text().splitlines() if log.exists() else []
