#!/usr/bin/env python3
"""Host microseconds per asynchronous launch of one tiny kernel ``y = a*x + y`` (``float* y,
const float* x, float a, int n``), every route and argument form users take, beside the raw
floor and the peers, in one process and one table:

* floor: ``cuda.bindings`` ``cuLaunchKernel`` with a parameter array packed once (default
  stream and a Numba stream; the ratios divide by the lower of the two)
* per route (PTX file, nvcc cubin file, ``nbjit.compile`` default output, Triton ``add``):
  Numba arrays + numpy scalars + a Numba stream
* on the ``nbjit.compile`` route: Python scalars; CuPy arrays; torch tensors on a torch
  stream; int pointers; ``k[g, b, s](...)`` re-indexed per call; bound once; one launcher
  configured with NVTX ranges off and one with them on (``nbjit.nvtx``, no NVTX tool attached;
  their paired difference per round is printed), where the nvtx package is installed
* peers on the same kernel and inputs: cuda.core ``launch``, CuPy ``RawKernel``, Numba
  ``@cuda.jit`` dispatch, Triton's own launcher (where Triton and torch are installed)
* the same ``@cuda.jit`` kernel from a bundle on torch tensors (the route of a process without
  Numba: the same launcher, whichever host serves);
* the same ``@cuda.jit`` kernel through ``nbjit.from_numba`` (its arrays passed as Numba's
  5 + 2*ndim fields by nbjit's C launcher)
* where numba-cuda-mlir is installed beside numba-cuda (``--mlir auto``, the default; ``yes``
  / ``no``), twins of the rows that take Numba's arrays and streams, with numba-cuda-mlir's
  (its floor row on its stream, every route, the argument forms), its own ``@cuda.jit``
  dispatch as a peer, and its kernel through ``nbjit.from_numba`` (arrays passed as MLIR
  memrefs). nbjit serves numba-cuda here; what the twins time is the arrays and streams,
  which nbjit reads alike whichever host it serves
* ``--host numba-cuda-mlir``: the whole table with numba-cuda-mlir in Numba's place (its
  arrays, streams and ``@cuda.jit``; nbjit serving it; no numba-cuda imported), to set beside a
  numba-cuda run's ratios where the two cannot share a process (numba-cuda 0.30.4's
  ``@cuda.jit`` needs numpy < 2.5)

Each row: the best of ``--repeat`` rounds of ``--batch`` launches (synchronising between
rounds, never inside one); the rounds go over all rows in turn, so a drift of the machine
touches every row alike. The ``path`` column says which launch path an nbjit row took
(``c``: nbjit's C launcher, with how many calls it handed to the Python rules). Writes JSON
(``--json``) and a bar chart (``--plot FILE.png``, where matplotlib is installed).

    python benchmarks/launch_overhead.py [--batch 500] [--repeat 30] [--mlir auto|yes|no]
                                         [--host numba-cuda|numba-cuda-mlir] [--json out.json] [--plot out.png]
    python benchmarks/launch_overhead.py --replot out.json --plot out.png   # chart an earlier run
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

N = 1 << 10
GRID, BLOCK = (N + 255) // 256, 256
SRC = r'''
extern "C" __global__ void axpy(float* y, const float* __restrict__ x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''
DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


class Table:
    """Rows are timed interleaved: each round times every row once, so drifts of the machine
    (clocks, other tenants) fall on all rows alike; a row's figure is its best round."""

    def __init__(self, batch: int, repeat: int):
        self.rows: dict[str, dict] = {}
        self.samples: dict[str, list[float]] = {}  # every round's figure, per row (paired ratios)
        self.todo: list = []
        self.batch, self.repeat = batch, repeat

    def add(self, name: str, fn, sync, *, group: str, launcher=None, whole_batch: bool = False) -> None:
        """A row: ``fn()`` launches once (``whole_batch``: a batch's launches itself, in a
        compiled loop)."""
        if whole_batch:
            fn = _Batch(fn)
        self.todo.append((name, fn, sync, group, launcher))

    def skip(self, name: str, why: str) -> None:
        print(f"{name}: skipped ({why})", file=sys.stderr)

    def run(self) -> None:
        self.samples = {name: [] for name, *_ in self.todo}
        for _name, fn, sync, _group, launcher in self.todo:
            for _ in range(self.batch):  # warm up; the first sight of a dtype teaches the C path
                if isinstance(fn, _Batch):
                    fn.fn(1)
                    continue
                fn()
            sync()
            if launcher is not None:
                launcher.fallbacks = 0
        for _ in range(self.repeat):
            for name, fn, sync, _group, _launcher in self.todo:
                t0 = time.perf_counter()
                if isinstance(fn, _Batch):
                    fn.fn(self.batch)
                else:
                    for _ in range(self.batch):
                        fn()
                t1 = time.perf_counter()
                sync()
                self.samples[name].append((t1 - t0) / self.batch * 1e6)
        best = {name: min(v) for name, v in self.samples.items()}
        for name, _fn, _sync, group, launcher in self.todo:
            path = "-"
            if launcher is not None:
                path = launcher.path + (f", {launcher.fallbacks} fallbacks" if launcher.path == "c" else "")
            self.rows[name] = {"us": best[name], "group": group, "path": path}


class _Batch:
    """A row's function that launches ``n`` times itself: ``fn(n)``."""

    def __init__(self, fn):
        self.fn = fn


def main() -> None:
    ap = argparse.ArgumentParser(description="launch overhead, us per launch")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--plot", help="write a bar chart (PNG) of the table")
    ap.add_argument("--replot", metavar="JSON", help="draw --plot from an earlier run's --json (no GPU needed)")
    ap.add_argument("--mlir", choices=("auto", "yes", "no"), default="auto",
                    help="numba-cuda-mlir twins of the rows (auto: where it is installed)")
    ap.add_argument("--compiled", choices=("yes", "no"), default="yes",
                    help="the rows of launches from compiled code (@njit, a C loop, kernel.c_entry) and the "
                         "nogil threads' launch rate")
    ap.add_argument("--only", choices=("all", "compiled", "nvtx"), default="all",
                    help="compiled: the floor and the compiled-code rows alone (more rounds in the same time); "
                         "nvtx: the floor and the NVTX rows alone")
    ap.add_argument("--host", choices=("numba-cuda", "numba-cuda-mlir"), default="numba-cuda",
                    help="whose arrays, streams and @cuda.jit the rows use (nbjit serves it)")
    a = ap.parse_args()
    if a.replot:
        d = json.loads(Path(a.replot).read_text())
        plot(d["rows"], d["floor_us"], d["gpu"], a.plot or "launch_overhead.png")
        return

    torch = None
    if importlib.util.find_spec("torch"):
        import torch  # before Numba makes its context (see tests/test_gpu_interop.py)
    from cuda.bindings import driver as cu
    os.environ["NBJIT_HOST"] = a.host  # (nbjit serves it)
    if a.host == "numba-cuda-mlir":
        from numba_cuda_mlir import cuda
        from numba_cuda_mlir.numba_cuda import types
        who = "numba-cuda-mlir"
    else:
        from numba import cuda, types
        who = "Numba"

    import nbjit

    t = Table(a.batch, a.repeat)
    x = cuda.to_device(np.arange(N, dtype=np.float32))
    y = cuda.to_device(np.zeros(N, dtype=np.float32))
    xp, yp = x.__cuda_array_interface__["data"][0], y.__cuda_array_interface__["data"][0]
    s = cuda.stream()
    a32, n32 = np.float32(2.0), np.int32(N)
    sync = cuda.synchronize

    comp = nbjit.compile(SRC)["axpy"]

    # the floor: cuLaunchKernel with a parameter array packed once
    vals = [ctypes.c_uint64(yp), ctypes.c_uint64(xp), ctypes.c_float(2.0), ctypes.c_int32(N)]
    arr = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in vals])
    arr_addr = ctypes.addressof(arr)
    func = comp.handle
    launch = cu.cuLaunchKernel
    from nbjit.gpu.driver import stream_handle
    for label, h in (("default stream", cu.CUstream(0)), (f"{who} stream", stream_handle(s))):
        t.add(f"floor: cuLaunchKernel, pre-packed, {label}",
              lambda h=h: launch(func, GRID, 1, 1, BLOCK, 1, 1, 0, h, arr_addr, 0), sync, group="floor")

    if a.only == "compiled":
        return finish(a, t, cuda, compiled_rows(t, cuda, s, comp, x, y))
    if a.only == "nvtx":
        nvtx_rows(t, comp, (y, x, a32, n32), s, sync)
        return finish(a, t, cuda, None)

    # every route: Numba arrays + numpy scalars + a Numba stream
    routes = {
        "PTX file (nvcc)": nbjit.load(DATA / "nvcc/kernels_sm90.ptx")["k_basic"],
        "cubin file (nvcc)": nbjit.load(DATA / "nvcc/kernels_sm_90.cubin")["k_basic"],
        "nbjit.compile (cubin)": comp,
    }
    for route, k in routes.items():
        cfg = k[GRID, BLOCK, s]
        t.add(f"nbjit {route}: {who} arrays, numpy scalars, {who} stream", lambda cfg=cfg: cfg(y, x, a32, n32),
              sync, group="route", launcher=cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nbjit.NbjitWarning)
        tadd = nbjit.load_triton(DATA / "triton/add_kernel")
    out = cuda.device_array(N, np.float32)
    tl = tadd[(N + 1023) // 1024]
    tl(x, y, out, n32, a32, stream=s)
    t.add(f"nbjit Triton add (cubin): {who} arrays, numpy scalars, {who} stream",
          lambda: tl(x, y, out, n32, a32, stream=s), sync, group="route", launcher=tl.by_stream[s])

    # the nbjit.compile route, every argument form
    cfg0 = comp[GRID, BLOCK]
    t.add(f"nbjit.compile: {who} arrays, Python scalars", lambda: cfg0(y, x, 2.0, N), sync, group="form",
          launcher=cfg0)
    t.add("nbjit.compile: int pointers", lambda: cfg0(yp, xp, 2.0, N), sync, group="form", launcher=cfg0)
    t.add("nbjit.compile: k[g, b, s](...) re-indexed per call", lambda: comp[GRID, BLOCK, s](y, x, a32, n32), sync,
          group="form", launcher=comp[GRID, BLOCK, s])
    bound = comp.bind(GRID, BLOCK, y, x, 2.0, N, stream=s)
    t.add("nbjit.compile: bound once", bound, sync, group="form")
    from nbjit.launch.kernel import _LAUNCH

    def launched(pdl):  # kernel.launch's configured launcher (kept by the pdl asked for), to report its path
        comp.launch(GRID, BLOCK, y, x, a32, n32, stream=s, pdl=pdl)
        return comp._s.launchers[(_LAUNCH, GRID, BLOCK, s, 0, False, None, pdl)]
    t.add("nbjit.compile: kernel.launch(..., stream=s) keywords",
          lambda: comp.launch(GRID, BLOCK, y, x, a32, n32, stream=s), sync, group="form", launcher=launched(None))
    if cuda.get_current_device().compute_capability >= (9, 0):
        t.add("nbjit.compile: programmatic dependent launch, launch(..., pdl=True)",
              lambda: comp.launch(GRID, BLOCK, y, x, a32, n32, stream=s, pdl=True), sync, group="form",
              launcher=launched(True))
    else:
        t.skip("PDL row", "programmatic dependent launch needs sm_90")
    nvtx_rows(t, comp, (y, x, a32, n32), s, sync)
    cp = None
    if importlib.util.find_spec("cupy"):
        import cupy as cp
        cx, cy = cp.arange(N, dtype=cp.float32), cp.zeros(N, dtype=cp.float32)
        cs = cp.cuda.Stream(non_blocking=True)
        ccfg = comp[GRID, BLOCK, cs.ptr]
        t.add("nbjit.compile: CuPy arrays, CuPy stream", lambda: ccfg(cy, cx, a32, n32), cs.synchronize,
              group="form", launcher=ccfg)
    else:
        t.skip("CuPy rows", "CuPy is not installed")
    if torch is not None:
        tx = torch.arange(N, dtype=torch.float32, device="cuda")
        ty = torch.zeros(N, dtype=torch.float32, device="cuda")
        ts = torch.cuda.Stream()
        tcfg = comp[GRID, BLOCK, ts]
        t.add("nbjit.compile: torch tensors, torch stream", lambda: tcfg(ty, tx, a32, n32), ts.synchronize,
              group="form", launcher=tcfg)
    else:
        t.skip("torch rows", "PyTorch is not installed")

    # peers, same kernel and inputs
    try:
        from cuda.core import Device, LaunchConfig, ObjectCode
        from cuda.core import launch as core_launch
        dev = Device()
        dev.set_current()
        img = nbjit.compile_image(SRC)
        obj = ObjectCode.from_cubin(img.data) if img.kind == "cubin" else ObjectCode.from_ptx(img.data)
        ck = obj.get_kernel("axpy")
        cstream = dev.create_stream()
        conf = LaunchConfig(grid=GRID, block=BLOCK)
        t.add("cuda.core launch: int pointers, numpy scalars", lambda: core_launch(cstream, conf, ck, yp, xp, a32, n32),
              cstream.sync, group="peer")
    except Exception as e:  # report, do not hide, a missing or changed cuda.core
        t.skip("cuda.core", f"{type(e).__name__}: {e}")
    if cp is not None:
        rk = cp.RawKernel(SRC, "axpy")
        t.add("CuPy RawKernel: CuPy arrays, numpy scalars, CuPy stream",
              lambda: rk((GRID,), (BLOCK,), (cy, cx, a32, n32), stream=cs), cs.synchronize, group="peer")

    @cuda.jit
    def axpy_numba(yy, xx, aa, n):
        i = cuda.grid(1)
        if i < n:
            yy[i] = aa * xx[i] + yy[i]

    nk = axpy_numba[GRID, BLOCK, s]
    t.add(f"{who} @cuda.jit dispatch: {who} arrays, numpy scalars", lambda: nk(y, x, a32, n32), sync, group="peer")
    fk = nbjit.from_numba(axpy_numba, (types.float32[::1], types.float32[::1], types.float32, types.int32))
    fcfg = fk[GRID, BLOCK, s]
    t.add(f"nbjit.from_numba: the same @cuda.jit kernel, {who} arrays", lambda: fcfg(y, x, a32, n32), sync,
          group="route", launcher=fcfg)
    if torch is not None and a.host == "numba-cuda":
        # the same kernel from a bundle (what a process without Numba launches: the same launcher)
        import tempfile
        bundle = Path(tempfile.mkdtemp()) / "k.nbjit"
        cc = cuda.get_current_device().compute_capability
        nbjit.build_bundle({"axpy": (axpy_numba, "void(float32[::1], float32[::1], float32, int32)")}, bundle,
                           archs=f"sm_{cc[0]}{cc[1]}")
        bcfg = nbjit.load_bundle(bundle)["axpy_numba"][GRID, BLOCK, ts]  # (the Python function's name)
        t.add("a bundle's @cuda.jit kernel: torch tensors, torch stream", lambda: bcfg(ty, tx, a32, n32),
              ts.synchronize, group="route", launcher=bcfg)
    if a.host == "numba-cuda-mlir":
        pass  # (the table is its already)
    elif a.mlir == "yes" or (a.mlir == "auto" and importlib.util.find_spec("numba_cuda_mlir")):
        mlir_rows(t, comp, routes, tadd, launch, func, arr_addr)
    else:
        t.skip("numba-cuda-mlir rows", "numba-cuda-mlir is not installed" if a.mlir == "auto" else "--mlir no")
    if torch is not None and importlib.util.find_spec("triton"):
        try:
            sys.path.insert(0, str(DATA / "src"))
            import triton_kernels
            o = torch.empty_like(tx)
            tgrid = ((N + 1023) // 1024,)
            ak = triton_kernels.add_kernel[tgrid]
            t.add("Triton's own launcher (add): torch tensors, torch's current stream",
                  lambda: ak(tx, ty, o, N, 0.5, BLOCK=1024), torch.cuda.synchronize, group="peer")
        except Exception as e:  # a Triton without what the fixture kernels use
            t.skip("Triton launcher", f"{type(e).__name__}: {e}")
    else:
        t.skip("Triton launcher", "Triton or PyTorch is not installed")

    finish(a, t, cuda, compiled_rows(t, cuda, s, comp, x, y) if a.compiled == "yes" else None)


def nvtx_rows(t: Table, comp, args: tuple, s, sync) -> None:
    """The same launcher configured with NVTX ranges off (the default: nothing on the launch
    path) and on (each launch a range; no NVTX tool attached here, so the nvtx package's
    push and pop return at once)."""
    if not importlib.util.find_spec("nvtx"):
        t.skip("NVTX rows", "the nvtx package is not installed")
        return
    import nbjit
    before = comp[GRID, BLOCK, s]  # (configured before any switch: the launcher nbjit has without NVTX)
    t.add("nbjit.compile: k[g, b, s] configured once, before any NVTX switch", lambda: before(*args), sync,
          group="form", launcher=before)
    nbjit.nvtx(False)  # (the switch empties the launcher caches: what follows is configured afresh)
    off = comp[GRID, BLOCK, s]
    nbjit.nvtx(True)
    on = comp[GRID, BLOCK, s]  # (configured while on: within a range; it stays so after the switch)
    nbjit.nvtx(False)
    t.add("nbjit.compile: k[g, b, s] configured once, NVTX ranges off", lambda: off(*args), sync, group="form",
          launcher=off)
    t.add("nbjit.compile: k[g, b, s] configured once, NVTX ranges on", lambda: on(*args), sync, group="form")


def nvtx_cost(t: Table) -> dict:
    """The NVTX rows' paired differences per round, µs per launch (printed): ranges off minus
    the launcher configured before any switch, and on minus off; medians and quartiles."""
    before, off, on = ("nbjit.compile: k[g, b, s] configured once, before any NVTX switch",
                       *(f"nbjit.compile: k[g, b, s] configured once, NVTX ranges {w}" for w in ("off", "on")))
    if off not in t.rows or on not in t.rows:
        return {}
    out = {}
    for what, a, b in (("off_minus_before", before, off), ("on_minus_off", off, on)):
        d = sorted(y - x for x, y in zip(t.samples[a], t.samples[b]))
        q = [d[int(f * (len(d) - 1))] for f in (0.25, 0.5, 0.75)]
        print(f"NVTX ranges {what.replace('_', ' ')}: median {q[1]:+.3f} us per launch (quartiles {q[0]:+.3f} to "
              f"{q[2]:+.3f}, {len(d)} rounds)")
        out[what] = {"median_us": q[1], "quartiles_us": (q[0], q[2])}
    return out


def finish(a, t: Table, cuda, njit: dict | None) -> None:
    """Time the rows, print the table (and the compiled rows' ratios, the threads section), write
    --json and --plot."""
    t.run()
    base = min(r["us"] for r in t.rows.values() if r["group"] == "floor")
    width = max(len(k) for k in t.rows) + 2
    print(f"{'':{width}}{'us/launch':>10}{'x floor':>9}  path")
    for name, r in t.rows.items():
        r["ratio"] = r["us"] / base
        print(f"{name:{width}}{r['us']:10.2f}{r['ratio']:9.2f}  {r['path']}")
    compiled = compiled_ratios(t) if njit is not None else {}
    nvtx = nvtx_cost(t)
    threads = threads_section(cuda, njit) if njit is not None else None
    gpu = cuda.get_current_device().name
    gpu = gpu.decode() if isinstance(gpu, bytes) else str(gpu)
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": t.rows, "floor_us": base, "batch": a.batch, "repeat": a.repeat,
                                            "python": platform.python_version(), "gpu": gpu, "host": a.host,
                                            "njit_over_c_loop": compiled, "threads": threads,
                                            "nvtx_on_minus_off": nvtx}, indent=2))
    if a.plot:
        plot(t.rows, base, gpu, a.plot)


# ------------------------------------------------------------------ launching from compiled code

ARGS_SRC = r'''
extern "C" __global__ void one(float* y) { if (threadIdx.x == 1024) y[0] = 0; }
extern "C" __global__ void sixteen(float* y, int a1, int a2, int a3, int a4, int a5, int a6, int a7, int a8, int a9,
                                   int a10, int a11, int a12, int a13, int a14, int a15) {
    if (threadIdx.x == 1024) y[0] = a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 + a13 + a14 + a15;
}
'''
C_LOOP = r'''
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);
/* n launches of f with the parameters packed once at params: a C program's loop; where `vary` is
   not NULL, the loop writes its counter there before each launch (an argument that changes, as
   the @njit loops' last argument does) */
int launch_loop(void *launch, void *f, unsigned grid, unsigned block, void *stream, void **params, long n,
                int *vary) {
    launch_fn cuLaunchKernel = (launch_fn)launch;
    for (long i = 0; i < n; i++) {
        if (vary) *(volatile int *)vary = (int)i;
        int r = cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, stream, params, 0);
        if (r) return r;
    }
    return 0;
}
'''


def build_c(source: str):
    """``source`` built with the system compiler into a library (ctypes), or None where there is
    no compiler."""
    import shutil
    import subprocess
    import tempfile
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    d = Path(tempfile.mkdtemp())
    (d / "lib.c").write_text(source)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(d / "lib.so"), str(d / "lib.c")], check=True)
    return ctypes.CDLL(str(d / "lib.so"))


def c_loop():
    """The C loop (C_LOOP) built with the system compiler, or None where there is no compiler:
    ``launch_loop(cuLaunchKernel, f, grid, block, stream, params, n, vary)``."""
    lib = build_c(C_LOOP)
    if lib is None:
        return None
    lib.launch_loop.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p]
    return lib.launch_loop


def compiled_rows(t: Table, cuda, s, comp, x, y) -> dict:
    """Launching from compiled code on the same stream: the C loop of cuLaunchKernel (1, 4 and 16
    arguments, packed once; with 16 it rewrites the last per launch, as the @njit loop passes its
    counter there), nbjit kernels from an @njit loop (the same argument counts), the
    C entry through ctypes (one Python call per launch) and through a Numba cfunc's loop. Returns
    the njit function and its arguments for the threads section."""
    import nbjit
    from nbjit.gpu.driver import as_int, stream_handle
    loops = _njit_loops()
    mod = nbjit.compile(ARGS_SRC)
    kernels = {1: mod["one"], 4: comp, 16: mod["sixteen"]}
    yv, xv, sh = nbjit.device_view(y), nbjit.device_view(x), nbjit.StreamHandle(s)
    loop = c_loop()
    libcuda = ctypes.CDLL("libcuda.so.1")
    cu_launch = ctypes.cast(libcuda.cuLaunchKernel, ctypes.c_void_p).value
    stream = as_int(stream_handle(s))
    c_four = None
    for n, k in kernels.items():
        vals = [ctypes.c_uint64(yv.data)] + ([ctypes.c_uint64(xv.data), ctypes.c_float(2.0), ctypes.c_int32(N)]
                                             if n == 4 else [ctypes.c_int32(i) for i in range(1, n)])
        params = (ctypes.c_void_p * n)(*[ctypes.addressof(v) for v in vals])
        if loop is not None:
            f = as_int(k.handle)
            if n == 4:  # (the threads section runs this loop from threads too)
                c_four = lambda st, m, f=f, params=params, vals=vals: loop(cu_launch, f, GRID, BLOCK, st, params, m,
                                                                            None)
            vary = ctypes.addressof(vals[-1]) if n == 16 else None  # (the @njit loop's last argument is its counter)
            t.add(f"C loop: cuLaunchKernel, {n} argument{'s' * (n > 1)} packed once",
                  lambda m, f=f, params=params, vals=vals, vary=vary: loop(cu_launch, f, GRID, BLOCK, stream, params, m,
                                                                           vary),
                  s.synchronize, group="compiled", whole_batch=True)
        t.add(f"nbjit from @njit: k[g, b, s](...), {n} argument{'s' * (n > 1)}",
              lambda m, k=k, fn=loops[n]: fn(k, yv, xv, sh, m), s.synchronize, group="compiled", whole_batch=True)
    if loop is None:
        t.skip("C loop rows", "no C compiler (cc, gcc or clang)")
    entry_rows(t, comp.c_entry, yv, xv, stream, s)
    return {"fn": loops[4], "kernel": comp, "y": yv, "x": xv, "c_loop": c_four}


def _njit_loops() -> dict:
    """The @njit loops that launch 1-, 4- and 16-argument kernels ``m`` times."""
    import numba

    @numba.njit(nogil=True)
    def one(k, y, x, s, m):
        for _ in range(m):
            k[GRID, BLOCK, s](y)

    @numba.njit(nogil=True)
    def four(k, y, x, s, m):
        for _ in range(m):
            k[GRID, BLOCK, s](y, x, 2.0, N)

    @numba.njit(nogil=True)
    def sixteen(k, y, x, s, m):
        for i in range(m):
            k[GRID, BLOCK, s](y, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, i)
    return {1: one, 4: four, 16: sixteen}


def entry_rows(t: Table, e, yv, xv, stream: int, s) -> None:
    """kernel.c_entry through ctypes (a Python call per launch) and through a cfunc's loop."""
    import numba
    u64, i64 = ctypes.c_uint64, ctypes.c_int64
    proto = ctypes.CFUNCTYPE(ctypes.c_int, u64, u64, ctypes.c_int, u64, u64, i64, u64, i64)
    launch = proto(e.launch)
    vals = [u64(yv.data), u64(xv.data), ctypes.c_double(2.0), i64(N)]
    args = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in vals])
    dims = (i64 * 7)(GRID, 1, 1, BLOCK, 1, 1, 0)
    msg = ctypes.create_string_buffer(1024)
    a_args, a_dims, a_msg, kernel = ctypes.addressof(args), ctypes.addressof(dims), ctypes.addressof(msg), e.kernel
    keep = (vals, args, dims, msg, launch, e)
    t.add("kernel.c_entry through ctypes: one Python call per launch",
          lambda keep=keep: launch(kernel, a_dims, 0, stream, a_args, 4, a_msg, 1024), s.synchronize,
          group="compiled")

    @numba.cfunc("int32(int64)")
    def cloop(m):
        for _ in range(m):
            r = launch(kernel, a_dims, 0, stream, a_args, 4, a_msg, 1024)
            if r != 0:
                return r
        return 0
    run = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64)(cloop.address)
    t.add("kernel.c_entry from a Numba cfunc's loop", lambda m, keep=(keep, cloop): run(m), s.synchronize,
          group="compiled", whole_batch=True)


def compiled_ratios(t: Table) -> dict:
    """Per argument count, the @njit row over the C loop's (printed): best over best, and the
    median and quartiles of the rounds' own ratios (each round times both rows, one after the
    other: the run-to-run spread)."""
    out = {}
    for n in (1, 4, 16):
        args = f"{n} argument{'s' * (n > 1)}"
        c, j = f"C loop: cuLaunchKernel, {args} packed once", f"nbjit from @njit: k[g, b, s](...), {args}"
        if c in t.rows and j in t.rows:
            pairs = sorted(x / y for x, y in zip(t.samples[j], t.samples[c]))
            q = [pairs[int(f * (len(pairs) - 1))] for f in (0.25, 0.5, 0.75)]
            out[n] = {"best": t.rows[j]["us"] / t.rows[c]["us"], "median": q[1], "quartiles": (q[0], q[2])}
            print(f"@njit over the C loop, {args}: best/best {out[n]['best']:.3f}; rounds' ratios median {q[1]:.3f} "
                  f"(quartiles {q[0]:.3f} to {q[2]:.3f}, {len(pairs)} rounds)")
    return out


def threads_section(cuda, njit: dict, total: int = 1_000_000, threads: int = 4) -> dict:
    """``threads`` @njit(nogil=True) loops on their own streams launching ``total`` kernels in all,
    against one thread launching the same number; a Python thread counts meanwhile (the GIL is
    free). Returns the rates and the Python thread's counts."""
    import threading
    import nbjit
    k, y, x = njit["kernel"], njit["y"], njit["x"]
    fn = lambda h, m: njit["fn"](k, y, x, h, m)  # noqa: E731 (what each thread runs)
    streams = [cuda.stream() for _ in range(threads)]
    handles = [nbjit.StreamHandle(st) for st in streams]
    fn(handles[0], 10)

    def timed(run, parts: list) -> tuple[float, int]:
        ticks, stop = [0], threading.Event()

        def count():
            while not stop.is_set():
                ticks[0] += 1
        counter = threading.Thread(target=count)
        counter.start()
        workers = [threading.Thread(target=run, args=(h, m)) for h, m in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        t1 = time.perf_counter()
        stop.set()
        counter.join()
        for st in streams:
            st.synchronize()
        return t1 - t0, ticks[0]

    one_s, one_ticks = timed(fn, [(handles[0], total)])
    many_s, many_ticks = timed(fn, [(h, total // threads) for h in handles])
    out = {"launches": total, "threads": threads, "one_thread_per_s": total / one_s,
           "threads_per_s": total / many_s, "speedup": one_s / many_s, "python_ticks_one": one_ticks,
           "python_ticks_threads": many_ticks}
    print(f"\n@njit(nogil=True): {total} launches: 1 thread {out['one_thread_per_s']:,.0f}/s; {threads} threads on "
          f"{threads} streams {out['threads_per_s']:,.0f}/s ({out['speedup']:.2f}x); a Python thread counted "
          f"{one_ticks:,} / {many_ticks:,} meanwhile")
    if njit["c_loop"] is not None:  # the driver's own scaling: the C loop from the same threads (ctypes frees the GIL)
        c_one, _ = timed(njit["c_loop"], [(handles[0].handle, total)])
        c_many, _ = timed(njit["c_loop"], [(h.handle, total // threads) for h in handles])
        out.update(c_loop_one_thread_per_s=total / c_one, c_loop_threads_per_s=total / c_many,
                   c_loop_speedup=c_one / c_many)
        print(f"the C loop of cuLaunchKernel, the same: 1 thread {total / c_one:,.0f}/s; {threads} threads "
              f"{total / c_many:,.0f}/s ({c_one / c_many:.2f}x)")
    return out


def mlir_rows(t: Table, comp, routes: dict, tadd, launch, func, arr_addr) -> None:
    """numba-cuda-mlir's twins: its arrays and stream on the floor, every route and the
    argument forms; its @cuda.jit dispatch, and the same kernel through nbjit.from_numba."""
    from numba_cuda_mlir import cuda as mcuda

    import nbjit
    from nbjit.gpu.driver import stream_handle
    x = mcuda.to_device(np.arange(N, dtype=np.float32))
    y = mcuda.to_device(np.zeros(N, dtype=np.float32))
    out = mcuda.device_array(N, np.float32)
    s = mcuda.stream()
    a32, n32 = np.float32(2.0), np.int32(N)
    sync = mcuda.synchronize
    h = stream_handle(s)
    t.add("floor: cuLaunchKernel, pre-packed, numba-cuda-mlir stream",
          lambda: launch(func, GRID, 1, 1, BLOCK, 1, 1, 0, h, arr_addr, 0), sync, group="floor")
    for route, k in routes.items():
        cfg = k[GRID, BLOCK, s]
        t.add(f"nbjit {route}: numba-cuda-mlir arrays, numpy scalars, its stream",
              lambda cfg=cfg: cfg(y, x, a32, n32), sync, group="route", launcher=cfg)
    tl = tadd[(N + 1023) // 1024]
    tl(x, y, out, n32, a32, stream=s)
    t.add("nbjit Triton add (cubin): numba-cuda-mlir arrays, numpy scalars, its stream",
          lambda: tl(x, y, out, n32, a32, stream=s), sync, group="route", launcher=tl.by_stream[s])
    cfg0 = comp[GRID, BLOCK]
    t.add("nbjit.compile: numba-cuda-mlir arrays, Python scalars", lambda: cfg0(y, x, 2.0, N), sync, group="form",
          launcher=cfg0)
    t.add("nbjit.compile: k[g, b, s](...) re-indexed per call, numba-cuda-mlir arrays and stream",
          lambda: comp[GRID, BLOCK, s](y, x, a32, n32), sync, group="form", launcher=comp[GRID, BLOCK, s])
    t.add("nbjit.compile: bound once, numba-cuda-mlir arrays and stream",
          comp.bind(GRID, BLOCK, y, x, 2.0, N, stream=s), sync, group="form")
    # (kernel.launch's rows: no path column here; --host numba-cuda-mlir reports theirs)
    t.add("nbjit.compile: kernel.launch(..., stream=s) keywords, numba-cuda-mlir arrays and stream",
          lambda: comp.launch(GRID, BLOCK, y, x, a32, n32, stream=s), sync, group="form")
    if mcuda.get_current_device().compute_capability >= (9, 0):
        t.add("nbjit.compile: programmatic dependent launch, numba-cuda-mlir arrays and stream",
              lambda: comp.launch(GRID, BLOCK, y, x, a32, n32, stream=s, pdl=True), sync, group="form")

    @mcuda.jit
    def axpy_mlir(yy, xx, aa, n):
        i = mcuda.grid(1)
        if i < n:
            yy[i] = aa * xx[i] + yy[i]

    mk = axpy_mlir[GRID, BLOCK, s]
    mk(y, x, a32, n32)  # compiled before the timing (as the numba-cuda peer is at its warm-up)
    t.add("numba-cuda-mlir @cuda.jit dispatch: its arrays, numpy scalars", lambda: mk(y, x, a32, n32), sync,
          group="peer")
    from numba_cuda_mlir.numba_cuda import types
    fk = nbjit.from_numba(axpy_mlir, (types.float32[::1], types.float32[::1], types.float32, types.int32))
    fcfg = fk[GRID, BLOCK, s]
    t.add("nbjit.from_numba: the same numba-cuda-mlir @cuda.jit kernel, its arrays (memrefs)",
          lambda: fcfg(y, x, a32, n32), sync, group="route", launcher=fcfg)


def plot(rows: dict, base: float, gpu: str, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot: matplotlib is not installed", file=sys.stderr)
        return
    colors = {"floor": "#888888", "route": "#1f77b4", "form": "#4fa3e0", "peer": "#d62728", "compiled": "#2ca02c"}
    names = list(rows)
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(names) + 1.2))
    ax.barh(range(len(names)), [rows[n]["us"] for n in names], color=[colors[rows[n]["group"]] for n in names])
    for i, n in enumerate(names):
        ax.text(rows[n]["us"], i, f" {rows[n]['us']:.2f} ({rows[n]['ratio']:.2f}x)", va="center", fontsize=8)
    ax.axvline(base, color="black", linestyle="--", linewidth=1, label=f"floor {base:.2f} us")
    ax.axvline(1.3 * base, color="black", linestyle=":", linewidth=1, label="1.3x floor")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("CPU microseconds per launch (log scale; lower is better)")
    ax.set_title(f"Launch overhead on {gpu}:\nnbjit (blue; green: from compiled code), peers (red)", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
