#!/usr/bin/env python3
"""Host microseconds per asynchronous launch of one tiny kernel ``y = a*x + y`` (``float* y,
const float* x, float a, int n``), every route and argument form users take, beside the raw
floor and the peers, in one process and one table:

* floor: ``cuda.bindings`` ``cuLaunchKernel`` with a parameter array packed once (default
  stream and a Numba stream; the ratios divide by the lower of the two)
* per route (PTX file, nvcc cubin file, ``nbjit.compile`` default output, Triton ``add``):
  Numba arrays + numpy scalars + a Numba stream
* on the ``nbjit.compile`` route: Python scalars; CuPy arrays; torch tensors on a torch
  stream; int pointers; ``k[g, b, s](...)`` re-indexed per call; bound once
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
        self.todo: list = []
        self.batch, self.repeat = batch, repeat

    def add(self, name: str, fn, sync, *, group: str, launcher=None) -> None:
        self.todo.append((name, fn, sync, group, launcher))

    def skip(self, name: str, why: str) -> None:
        print(f"{name}: skipped ({why})", file=sys.stderr)

    def run(self) -> None:
        best = {name: float("inf") for name, *_ in self.todo}
        for _name, fn, sync, _group, launcher in self.todo:
            for _ in range(self.batch):  # warm up; the first sight of a dtype teaches the C path
                fn()
            sync()
            if launcher is not None:
                launcher.fallbacks = 0
        for _ in range(self.repeat):
            for name, fn, sync, _group, _launcher in self.todo:
                t0 = time.perf_counter()
                for _ in range(self.batch):
                    fn()
                t1 = time.perf_counter()
                sync()
                best[name] = min(best[name], (t1 - t0) / self.batch * 1e6)
        for name, _fn, _sync, group, launcher in self.todo:
            path = "-"
            if launcher is not None:
                path = launcher.path + (f", {launcher.fallbacks} fallbacks" if launcher.path == "c" else "")
            self.rows[name] = {"us": best[name], "group": group, "path": path}


def main() -> None:
    ap = argparse.ArgumentParser(description="launch overhead, us per launch")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--plot", help="write a bar chart (PNG) of the table")
    ap.add_argument("--replot", metavar="JSON", help="draw --plot from an earlier run's --json (no GPU needed)")
    ap.add_argument("--mlir", choices=("auto", "yes", "no"), default="auto",
                    help="numba-cuda-mlir twins of the rows (auto: where it is installed)")
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

    t.run()
    base = min(r["us"] for r in t.rows.values() if r["group"] == "floor")
    width = max(len(k) for k in t.rows) + 2
    print(f"{'':{width}}{'us/launch':>10}{'x floor':>9}  path")
    for name, r in t.rows.items():
        r["ratio"] = r["us"] / base
        print(f"{name:{width}}{r['us']:10.2f}{r['ratio']:9.2f}  {r['path']}")
    gpu = cuda.get_current_device().name
    gpu = gpu.decode() if isinstance(gpu, bytes) else str(gpu)
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": t.rows, "floor_us": base, "batch": a.batch, "repeat": a.repeat,
                                            "python": platform.python_version(), "gpu": gpu, "host": a.host},
                                           indent=2))
    if a.plot:
        plot(t.rows, base, gpu, a.plot)


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
    colors = {"floor": "#888888", "route": "#1f77b4", "form": "#4fa3e0", "peer": "#d62728"}
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
    ax.set_title(f"Launch overhead on {gpu}: nbjit (blue) vs peers (red)", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
