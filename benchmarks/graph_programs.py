"""Graph programs on the GPU host, in one run (needs a GPU):

1. Conjugate gradients (examples/cg_solver_graph.py) three ways: an eager Python loop, one
   iteration replayed per iteration (nbjit.capture), and one while_loop graph; wall time and
   host time per iteration, a small grid (launch cost dominates) and a large one.
2. Updating one node of a 100-node graph: ``node.set_args`` (nbjit's C path),
   ``node.set_grid``, ``disable``/``enable``, against cuda.bindings' own
   ``cuGraphExecKernelNodeSetParams`` (the floor a user reaches without nbjit) and against
   capturing the 100 launches again (``with g.update():``).
3. Saved graphs: ``g.save``; in a fresh process, ``load_graph`` and the first replay after
   ``import nbjit`` (the CUDA context made first, and timed apart); ``rebind`` per node.

    python benchmarks/graph_programs.py [--json results.json] [--plot chart.png] [--small 64] [--large 1024]
    python benchmarks/graph_programs.py --replot results.json --plot chart.png   # chart an earlier run
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import nbjit

ROOT = Path(__file__).resolve().parent.parent
cg = cuda = None  # the example's module (its kernels and its three ways) and its Numba: main() imports them
ADD = r'''extern "C" __global__ void add(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}'''


def per_call_us(fn, n: int = 20000, repeats: int = 5) -> float:
    """The median over ``repeats`` of the mean host time of ``n`` calls, in microseconds."""
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out)


def cg_rows(n: int, dot, step) -> list[dict]:
    s = cuda.stream()
    solve = cg.Solve(n, dot, s)
    rows = []
    for name, run in (("eager", cg.eager), ("replay", cg.replay)):
        run(solve)  # warm
        t0 = time.perf_counter()
        _x, iterations, syncs = run(solve)
        wall = time.perf_counter() - t0
        rows.append({"grid": n, "way": name, "iterations": iterations, "host_syncs": syncs, "wall_ms": wall * 1e3,
                     "us_per_iteration": wall / iterations * 1e6})
    g = cg.solve_graph(solve, step)
    for _ in range(2):  # (the second is timed)
        solve.start()
        s.synchronize()
        t0 = time.perf_counter()
        g.launch()
        t1 = time.perf_counter()
        _x, iterations = solve.result()
        wall = time.perf_counter() - t0
    rows.append({"grid": n, "way": "while_loop graph", "iterations": iterations, "host_syncs": 1,
                 "wall_ms": wall * 1e3, "us_per_iteration": wall / iterations * 1e6,
                 "host_us_per_iteration": (t1 - t0) / iterations * 1e6})
    return rows


def hundred_nodes(add, s, y, x, n):
    with nbjit.capture(s) as g:
        for _ in range(100):
            add[(n + 255) // 256, 256, s](y, x, 1.0, n)
    return g


def update_rows(add) -> dict:
    n = 1 << 14
    s = cuda.stream()
    x, y, y2 = (cuda.to_device(np.ones(n, np.float32)) for _ in range(3))
    g = hundred_nodes(add, s, y, x, n)
    node = g.nodes[50]
    out = {"set_args_us": per_call_us(lambda: node.set_args(y2, x, 2.0, n))}
    out["set_grid_us"] = per_call_us(lambda: node.set_grid((n + 255) // 256, 256))
    out["disable_enable_us"] = per_call_us(lambda: (node.disable(), node.enable())) / 2
    # the floor without nbjit: cuda.bindings' own call, parameters packed once beforehand
    from cuda.bindings import driver as cu
    vals = [ctypes.c_void_p(int(y2.__cuda_array_interface__["data"][0])),
            ctypes.c_void_p(int(x.__cuda_array_interface__["data"][0])), ctypes.c_float(2.0), ctypes.c_int(n)]
    ptrs = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in vals])
    p = cu.CUDA_KERNEL_NODE_PARAMS()
    p.func = cu.CUfunction(int(add.handle))
    p.gridDimX, p.gridDimY, p.gridDimZ = (n + 255) // 256, 1, 1
    p.blockDimX, p.blockDimY, p.blockDimZ = 256, 1, 1
    p.sharedMemBytes, p.kernelParams = 0, ctypes.addressof(ptrs)
    out["cuda_bindings_set_params_us"] = per_call_us(lambda: cu.cuGraphExecKernelNodeSetParams(g._exec, node.node, p))

    def recapture():
        with g.update():
            for _ in range(100):
                add[(n + 255) // 256, 256, s](y2, x, 1.0, n)
    out["recapture_100_nodes_us"] = per_call_us(recapture, n=200)
    out["set_args_vs_recapture"] = out["recapture_100_nodes_us"] / out["set_args_us"]
    g.launch()
    s.synchronize()
    return out


CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import nbjit
t1 = time.perf_counter()
from nbjit.gpu.host import current_host
cuda = current_host().module("cuda")
import numpy as np
n = 1 << 14
x, y = cuda.to_device(np.ones(n, np.float32)), cuda.to_device(np.zeros(n, np.float32))
cuda.synchronize()
t2 = time.perf_counter()
load_graph = nbjit.load_graph  # (its modules imported)
t2b = time.perf_counter()
g = load_graph(sys.argv[1], bindings={"x": x, "y": y})
t2c = time.perf_counter()
g.launch()
cuda.synchronize()
t3 = time.perf_counter()
assert (y.copy_to_host() == 100).all()
y2 = cuda.to_device(np.zeros(n, np.float32))
cuda.synchronize()
times = []
for i in range(200):
    t = time.perf_counter()
    g.rebind(y=(y2 if i % 2 == 0 else y))
    times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"import_nbjit_ms": (t1 - t0) * 1e3, "context_and_arrays_ms": (t2 - t1) * 1e3,
                  "load_graph_and_first_replay_ms": (t3 - t2) * 1e3, "of_which_imports_ms": (t2b - t2) * 1e3,
                  "of_which_building_ms": (t2c - t2b) * 1e3, "of_which_first_replay_ms": (t3 - t2c) * 1e3,
                  "rebind_us_per_node": times[len(times) // 2] / 100 * 1e6}))
"""


def saved_rows(add) -> dict:
    n = 1 << 14
    s = cuda.stream()
    x, y = cuda.to_device(np.ones(n, np.float32)), cuda.to_device(np.zeros(n, np.float32))
    g = hundred_nodes(add, s, y, x, n)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "hundred.nbjit"
        t0 = time.perf_counter()
        g.save(path, bindings={"x": x, "y": y})
        out = {"save_ms": (time.perf_counter() - t0) * 1e3, "file_bytes": path.stat().st_size}
        runs = [json.loads(subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True,
                                          check=True).stdout.strip().splitlines()[-1]) for _ in range(3)]
    for k in runs[0]:
        out[k] = statistics.median(r[k] for r in runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--small", type=int, default=64, help="the small CG grid's side (launch cost dominates)")
    ap.add_argument("--large", type=int, default=1024, help="the large CG grid's side (the GPU's work dominates)")
    ap.add_argument("--plot", help="write a chart (PNG; needs matplotlib)")
    ap.add_argument("--replot", help="chart the results of an earlier --json run (no GPU needed)")
    a = ap.parse_args()
    if a.replot:
        try:
            results = json.loads(Path(a.replot).read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"--replot {a.replot}: cannot read it as this benchmark's --json output: {e}") from None
        plot(results, a.plot or "graph_programs.png")
        return
    global cg, cuda
    sys.path.insert(0, str(ROOT / "examples"))
    import cg_solver_graph as cg  # (it needs a GPU)
    cuda = cg.cuda
    dot = nbjit.compile(cg.DOT, name="cg_dot.cu")["dot"]
    step = nbjit.from_numba(cg.next_step_on_gpu, "void(float64[::1], int32[::1], float64, int32, uint64)")
    cg.eager(cg.Solve(8, dot, cuda.stream()))  # compile and load before timing
    add = nbjit.compile(ADD, name="bench_add.cu")["add"]
    name = cuda.get_current_device().name
    results = {"gpu": name.decode() if isinstance(name, bytes) else str(name),
               "cg": cg_rows(a.small, dot, step) + cg_rows(a.large, dot, step),
               "node_updates": update_rows(add), "saved": saved_rows(add)}
    print(f"{'grid':>6} {'way':18} {'iterations':>10} {'syncs':>6} {'wall ms':>9} {'us/iteration':>13}")
    for r in results["cg"]:
        print(f"{r['grid']:>6} {r['way']:18} {r['iterations']:>10} {r['host_syncs']:>6} {r['wall_ms']:>9.2f} "
              f"{r['us_per_iteration']:>13.2f}" + (f"  (host {r['host_us_per_iteration']:.3f} us/iteration)"
                                                    if "host_us_per_iteration" in r else ""))
    u = results["node_updates"]
    print(f"one node of 100: set_args {u['set_args_us']:.2f} us, set_grid {u['set_grid_us']:.2f} us, "
          f"disable/enable {u['disable_enable_us']:.2f} us; cuda.bindings' cuGraphExecKernelNodeSetParams "
          f"{u['cuda_bindings_set_params_us']:.2f} us; re-capture {u['recapture_100_nodes_us']:.1f} us "
          f"({u['set_args_vs_recapture']:.0f}x set_args)")
    v = results["saved"]
    print(f"saved 100-node graph: save {v['save_ms']:.1f} ms ({v['file_bytes']} bytes); fresh process: import "
          f"nbjit {v['import_nbjit_ms']:.1f} ms, context + arrays {v['context_and_arrays_ms']:.1f} ms, "
          f"load_graph + first replay {v['load_graph_and_first_replay_ms']:.1f} ms "
          f"(imports {v['of_which_imports_ms']:.1f}, load and build {v['of_which_building_ms']:.1f}, "
          f"first replay {v['of_which_first_replay_ms']:.1f}); rebind {v['rebind_us_per_node']:.2f} us per node")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    if a.plot:
        plot(results, a.plot)


def plot(results: dict, path: str) -> None:
    """Host time per CG iteration for each way and grid, and a node update against re-capture."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot: matplotlib is not installed (pip install matplotlib)") from None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    grids = sorted({r["grid"] for r in results["cg"]})
    ways = ["eager", "replay", "while_loop graph"]
    colors = {"eager": "#d62728", "replay": "#4fa3e0", "while_loop graph": "#1f77b4"}
    for k, way in enumerate(ways):
        vals = [next(r["us_per_iteration"] for r in results["cg"] if r["grid"] == g and r["way"] == way) for g in grids]
        bars = left.bar([i + (k - 1) * 0.27 for i in range(len(grids))], vals, 0.27, label=way, color=colors[way])
        left.bar_label(bars, fmt="%.0f", fontsize=7)
    left.set_xticks(range(len(grids)), [f"{g}x{g} grid" for g in grids])
    left.set_ylabel("wall microseconds per CG iteration")
    left.set_title("CG solve: one host sync per iteration vs one per solve", fontsize=9)
    left.legend(fontsize=8)
    u = results["node_updates"]
    names = ["set_args", "set_grid", "disable/enable", "cuda.bindings SetParams", "re-capture 100 nodes"]
    vals = [u["set_args_us"], u["set_grid_us"], u["disable_enable_us"], u["cuda_bindings_set_params_us"],
            u["recapture_100_nodes_us"]]
    bars = right.barh(names, vals, color=["#1f77b4"] * 3 + ["#888888", "#d62728"])
    right.bar_label(bars, fmt="%.2f", fontsize=7)
    right.set_xscale("log")
    right.invert_yaxis()
    right.set_xlabel("host microseconds (log scale)")
    right.set_title("changing one node of a 100-node graph", fontsize=9)
    fig.suptitle(f"Graph programs on {results['gpu']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
