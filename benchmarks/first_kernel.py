#!/usr/bin/env python3
"""A fresh process's whole wall time to its first finished launch (imports included), for
nbjit from (a) a warm local cache, (b) a kernel bundle, (c) a cold cache; beside CuPy's
RawModule (warm disk cache), cuda.core's Program.compile(cache=FileStreamProgramCache),
a @cuda.jit(cache=True) kernel, the same process with Numba arrays and no nbjit call, and a
bare interpreter; and nbjit's bare host (NBJIT_HOST=bare: no Numba imported) on PyTorch tensors,
CuPy arrays and cuda.core buffers beside PyTorch alone and cuda.core's Program on the same tensors.
Variants take turns, process by process; each child also reports where
its time went (imports, context, arrays, nbjit's own call; wall and CPU time), so nbjit's
share is read from inside the process as well as from the paired walls, with the cyclic
collector's part of it (its passes over objects Numba's import left behind land in whatever
runs next: here, nbjit; "nbjit, bundle, Numba's due collector pass first" runs that pass
before nbjit's part, so that part is nbjit's own work alone). --vs DIR runs each nbjit variant
a second time with another checkout's nbjit, taking turns, for an A/B in one run.

"nbjit, bundle (by stage)" takes the bundle's route apart after its imports: reading and
checking the archive and manifest, checking the image's payloads into its fatbin, choosing
the entry, the driver's load (cuModuleLoadData: the driver's part, not nbjit's), typing the
kernel (with the driver's function and parameter queries), the launcher, the first launch.

    python benchmarks/first_kernel.py [--runs 9] [--vs DIR] [--pin CPUS] [--json out.json] [--plot out.png]  (GPU)
    python benchmarks/first_kernel.py --replot out.json --plot out.png   (chart an earlier run)
    python benchmarks/first_kernel.py --no-gpu [--runs 15]             (the bundle route's CPU side)

``--no-gpu`` runs what of the bundle route needs no GPU, in fresh processes that have imported
numpy and numba.cuda (as a Numba user's have): the imports, ``load_bundle(lazy=True)``, the
kernel's description, the loader's plan for an sm_90 device (what the driver would be handed)
and the first launch's typing and packing plan, in CPU and wall milliseconds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = (ROOT / "examples/bundle_package/kernels/axpy.cu").read_text()
BUNDLE = ROOT / "examples/bundle_package/src/nbjit_demo_kernels/kernels.nbjit"
N = 1 << 20

# timed(module, name, stage): each call of module.name (a stage, inclusive) timed into the
# child's dict `stages` (warm_stages.py's children use it too)
TIMED = """\
def timed(module, name, stage):
    \"\"\"Time each call of module.name (a stage of the route, inclusive) into stages[stage].\"\"\"
    f = getattr(module, name, None)
    if f is None:  # (renamed: that stage goes unmeasured, said in the output)
        stages[stage + " (not found)"] = 0.0
        return
    def call(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            stages[stage] = stages.get(stage, 0.0) + time.perf_counter() - t
    setattr(module, name, call)
"""

# Each child prints one JSON line: {"done": time.time() once the launch finished, "marks":
# {phase: wall seconds}, "cpu": {phase: CPU seconds}, "stages": {stage: wall seconds},
# "collector": {phase: [the cyclic collector's seconds, its passes of generation 0, 1, 2, the
# seconds of its passes of generations 1 and 2]}}.
PRELUDE = """\
import time
T = [time.time()]
C = [time.process_time()]
import gc, json, sys
marks, cpu, stages, collector = {}, {}, {}, {}
# the cyclic collector: its time so far, when this pass began, passes per generation, the time
# of its passes of generations 1 and 2
GC = [0.0, 0.0, [0, 0, 0], 0.0]
G = [(0.0, [0, 0, 0], 0.0)]
def _gc(phase, info):
    if phase == "start":
        GC[1] = time.perf_counter()
    else:
        dt = time.perf_counter() - GC[1]
        GC[0] += dt; GC[2][info["generation"]] += 1
        if info["generation"]:
            GC[3] += dt
gc.callbacks.append(_gc)
def mark(name):
    now, c = time.time(), time.process_time()
    marks[name] = now - T[-1]; cpu[name] = c - C[-1]; T.append(now); C.append(c)
    t, n, old = G[-1]
    collector[name] = [GC[0] - t] + [a - b for a, b in zip(GC[2], n)] + [GC[3] - old]
    G.append((GC[0], list(GC[2]), GC[3]))
def ON_CPU():
    \"\"\"The CPU this process ran on last (/proc/self/stat's field 39), or None.\"\"\"
    try:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None
""" + TIMED

NUMBA_ARRAYS = """\
import numpy as np
from numba import cuda
mark("import numpy + numba.cuda")
cuda.current_context()
mark("context")
x = cuda.to_device(np.ones(N, np.float32)); y = cuda.to_device(np.ones(N, np.float32))
mark("arrays")
"""

# the same, then the collector's pass that Numba's import and set-up left due (generation 1 holds
# more than 10 passes' worth of their survivors: the next ~500 allocations, whoever makes them,
# start a pass over Numba's objects), run here before nbjit's part, so that part is nbjit's alone
NUMBA_ARRAYS_SETTLED = NUMBA_ARRAYS.replace('mark("arrays")', 'gc.collect(1)\nmark("arrays")')

# nbjit's part: its import, the kernel ({get}) and the first launch, each marked
NBJIT = """\
import nbjit
mark("import nbjit")
k = {get}
mark("nbjit kernel")
k[(N + 255) // 256, 256](np.float32(2), x, y, N); cuda.synchronize()
mark("launch")
"""

# the bundle's route after its imports, stage by stage (the functions it goes through, timed)
BY_STAGE = """\
import nbjit
mark("import nbjit")
from nbjit.bundles import archive as archive
from nbjit.launch import kernel
from nbjit.loading import module
from nbjit.loading import plan as loader
from nbjit.gpu import driver as _driver
mark("import the route's modules")
timed(archive, "open_bundle", "read + check archive and manifest")
timed(archive, "records", "check the manifest's images")
timed(archive, "image_of", "check the image's payloads, its fatbin")
timed(module, "plan", "choose the entry (loader.plan)")
timed(_driver, "load_module", "driver: cuModuleLoadData")
timed(_driver, "get_function", "driver: cuModuleGetFunction")
timed(_driver, "param_info", "driver: cuFuncGetParamInfo")
timed(module, "_kernel_info", "type the kernel (merge)")
timed(kernel, "ArgPacker", "packing plan (ArgPacker)")
m = nbjit.load_bundle(BUNDLE, name="axpy")
mark("load_bundle")
k = m["axpy"]
mark("kernel (typed; driver queries)")
cfg = k[(N + 255) // 256, 256]
mark("launcher (C launcher built)")
cfg(np.float32(2), x, y, N)
mark("first launch (call)")
cuda.synchronize()
mark("sync")
"""

VARIANTS = {
    "bare interpreter": "",
    "Numba arrays, no kernel": NUMBA_ARRAYS + "cuda.synchronize()\nmark('sync')\n",
    "nbjit, warm cache": NUMBA_ARRAYS + NBJIT.format(get='nbjit.compile(SRC)["axpy"]'),
    "nbjit, bundle": NUMBA_ARRAYS + NBJIT.format(get='nbjit.load_bundle(BUNDLE, name="axpy")["axpy"]'),
    "nbjit, bundle (by stage)": NUMBA_ARRAYS + BY_STAGE,
    "nbjit, bundle, Numba's due collector pass first": NUMBA_ARRAYS_SETTLED + NBJIT.format(
        get='nbjit.load_bundle(BUNDLE, name="axpy")["axpy"]'),
    "nbjit, cold cache": NUMBA_ARRAYS + NBJIT.format(get='nbjit.compile(SRC)["axpy"]'),
    "Numba @cuda.jit(cache=True)": NUMBA_ARRAYS + """\
@cuda.jit(cache=True)
def axpy(a, x, y, n):
    i = cuda.grid(1)
    if i < n:
        y[i] = a * x[i] + y[i]
mark("define")
axpy[(N + 255) // 256, 256](np.float32(2), x, y, N); cuda.synchronize()
mark("launch")
""",
    "CuPy RawModule, warm cache": """\
import numpy as np
import cupy as cp
mark("import numpy + cupy")
x = cp.ones(N, cp.float32); y = cp.ones(N, cp.float32)
mark("context + arrays")
k = cp.RawModule(code=SRC).get_function("axpy")
mark("kernel")
k(((N + 255) // 256,), (256,), (np.float32(2), x, y, np.int32(N))); cp.cuda.Device().synchronize()
mark("launch")
""",
    "cuda.core Program, FileStreamProgramCache": """\
import numpy as np
from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
from cuda.core.utils import FileStreamProgramCache
mark("import numpy + cuda.core")
dev = Device(); dev.set_current(); s = dev.create_stream()
mark("context")
bx = dev.allocate(N * 4, stream=s); by = dev.allocate(N * 4, stream=s)
mark("arrays")
obj = Program(SRC, "c++", ProgramOptions(arch=f"sm_{dev.arch}")).compile("cubin", cache=FileStreamProgramCache(CACHE))
k = obj.get_kernel("axpy")
mark("kernel")
launch(s, LaunchConfig(grid=(N + 255) // 256, block=256), k, np.float32(2), bx, by, np.int32(N)); s.sync()
mark("launch")
""",
}
# The bare host (NBJIT_HOST=bare: no Numba imported, as where none is installed): the first kernel
# of a bundle on the arrays of a process that has PyTorch, CuPy or cuda.core, beside those
# libraries' own first kernel on the same arrays
TORCH_ARRAYS = """\
import numpy as np
import torch
mark("import numpy + torch")
torch.cuda.init(); torch.cuda.current_stream()
mark("context")
x = torch.ones(N, dtype=torch.float32, device="cuda"); y = torch.ones(N, dtype=torch.float32, device="cuda")
mark("arrays")
"""
NO_NUMBA_CHECK = "assert not any(m.split('.')[0] in ('numba', 'numba_cuda', 'llvmlite') for m in sys.modules)\n"
BARE_NBJIT = """\
import cuda.bindings.driver
mark("import cuda.bindings")
import nbjit
mark("import nbjit")
k = {get}
mark("nbjit kernel")
k[{launch}]({args}); {sync}
mark("launch")
""" + NO_NUMBA_CHECK
CORE_PROGRAM = """\
obj = Program(SRC, "c++", ProgramOptions(arch=f"sm_{dev.arch}")).compile("cubin", cache=FileStreamProgramCache(CACHE))
k = obj.get_kernel("axpy")
mark("kernel")
"""
VARIANTS.update({
    "torch only: tensors and one torch op": TORCH_ARRAYS + """\
y.add_(x, alpha=2); torch.cuda.synchronize()
mark("launch")
""",
    "cuda.core Program on torch tensors": TORCH_ARRAYS + """\
from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
from cuda.core.utils import FileStreamProgramCache
mark("import cuda.core")
dev = Device(); dev.set_current(); s = dev.create_stream()
""" + CORE_PROGRAM + """\
launch(s, LaunchConfig(grid=(N + 255) // 256, block=256), k, np.float32(2), x.data_ptr(), y.data_ptr(), np.int32(N))
s.sync()
mark("launch")
""",
    "nbjit bare, bundle, torch tensors": TORCH_ARRAYS + BARE_NBJIT.format(
        get='nbjit.load_bundle(BUNDLE, name="axpy")["axpy"]', launch="(N + 255) // 256, 256",
        args="np.float32(2), x, y, N", sync="torch.cuda.synchronize()"),
    "nbjit bare, bundle's @cuda.jit kernel, torch tensors": TORCH_ARRAYS + """\
m = x.reshape(1024, -1); f = torch.ones(1024, dtype=torch.float32, device="cuda")
""" + BARE_NBJIT.format(get='nbjit.load_bundle(BUNDLE, name="scale_rows")["scale_rows"]',
                        launch="(64, 64), (16, 16)", args="m, f", sync="torch.cuda.synchronize()"),
    "nbjit bare, bundle, CuPy arrays": """\
import numpy as np
import cupy as cp
mark("import numpy + cupy")
x = cp.ones(N, cp.float32); y = cp.ones(N, cp.float32)
mark("context + arrays")
mark("arrays")
""" + BARE_NBJIT.format(get='nbjit.load_bundle(BUNDLE, name="axpy")["axpy"]', launch="(N + 255) // 256, 256",
                        args="np.float32(2), x, y, N", sync="cp.cuda.Device().synchronize()"),
    "nbjit bare, bundle, cuda.core buffers": """\
import numpy as np
from cuda.core import Device
mark("import numpy + cuda.core")
dev = Device(); dev.set_current(); s = dev.create_stream()
mark("context")
bx = dev.allocate(N * 4, stream=s); by = dev.allocate(N * 4, stream=s); s.sync()
mark("arrays")
""" + BARE_NBJIT.format(get='nbjit.load_bundle(BUNDLE, name="axpy")["axpy"]',
                        launch="(N + 255) // 256, 256, s", args="np.float32(2), int(bx.handle), int(by.handle), N",
                        sync="s.sync()"),
})
BARE = {v for v in VARIANTS if v.startswith("nbjit bare")}
COLD = {"nbjit, cold cache"}

# --no-gpu: the bundle route's CPU side in a process that has imported what a Numba user's has
NO_GPU = """\
import numpy as np
from numba import cuda
mark("import numpy + numba.cuda")
before = set(sys.modules)
import nbjit
mark("import nbjit")
m = nbjit.load_bundle(BUNDLE, name="axpy", lazy=True)
mark("load_bundle(lazy=True)")
m["axpy"].params
mark("kernel described")
from nbjit.launch import arguments as args
from nbjit.loading import module
from nbjit.loading import plan as loader
p = loader.plan(m.image, (9, 0), 13000)
mark("plan for sm_90 (what the driver gets)")
info = module._kernel_info(m.name, "axpy", [(p.kind, p.info.entry("axpy"))], None, False, m.image.declarations,
                           {}, {})[0]
args.ArgPacker(info.signature, "axpy").pack((np.float32(2), 4096, 8192, N))
mark("typing + packing plan")
stages["modules"] = sorted(x for x in set(sys.modules) - before if x.startswith("nbjit"))
"""


def child(variant: str, work: Path, cold_dir: Path | None) -> tuple[str, str]:
    """The child's script, written to a file (Numba's cache=True needs a source file)."""
    cache = cold_dir if cold_dir is not None else work / "cache"
    head = (PRELUDE + f"SRC = {SRC!r}\nBUNDLE = {str(BUNDLE)!r}\nN = {N}\nCACHE = {str(work / 'cuda-core')!r}\n")
    body = VARIANTS[variant.split(VS)[0]]
    path = work / ("numba_axpy.py" if "cuda.jit" in variant else f"v{abs(hash(variant)) % 10**8}.py")
    path.write_text(head + body + "print(json.dumps({'done': time.time(), 'marks': marks, 'cpu': cpu, "
                                  "'stages': stages, 'collector': collector, 'on_cpu': ON_CPU()}))\n")
    return str(path), str(cache)


VS = " @ "  # "nbjit, bundle @ DIR": the variant with DIR's nbjit (--vs)


def run_once(variant: str, work: Path) -> dict:
    base, _, other = variant.partition(VS)
    cold = Path(tempfile.mkdtemp(dir=work)) if base in COLD else None
    script, cache = child(variant, work, cold)
    env = {**os.environ, "NBJIT_CACHE_DIR": cache, "CUPY_CACHE_DIR": str(work / "cupy"),
           "NUMBA_CACHE_DIR": str(work / "numba"), "PYTHONUNBUFFERED": "1", "PYTHONPATH": _pythonpath(other or None)}
    if base in BARE:
        env["NBJIT_HOST"] = "bare"
    t0 = time.time()
    pin = (lambda: os.sched_setaffinity(0, PIN)) if PIN else None
    r = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, timeout=300, preexec_fn=pin)
    if r.returncode != 0:
        raise SystemExit(f"{variant}: exit {r.returncode}\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return {"wall": out["done"] - t0, "marks": out["marks"], "cpu": out.get("cpu", {}), "stages": out.get("stages", {}),
            "collector": out.get("collector", {}), "on_cpu": out.get("on_cpu")}


IMPORTS = "import numpy + numba.cuda"  # the phase that stands for the host's speed (every nbjit variant has it)
PIN: set[int] = set()  # --pin: the CPUs every child runs on (none: where the kernel puts it)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9, help="processes per variant (they take turns)")
    ap.add_argument("--only", nargs="*", help="variants to run (default: all)")
    ap.add_argument("--no-gpu", action="store_true", help="only the bundle route's CPU side (no GPU needed)")
    ap.add_argument("--vs", metavar="DIR", help="also run each nbjit variant with the nbjit of DIR (a directory "
                    "holding an nbjit package: another checkout), taking turns with this one's")
    ap.add_argument("--pin", metavar="CPUS", help="run every child on these CPUs only (e.g. 3 or 2,3): the same "
                    "cores for every variant, where a host's cores run at different speeds")
    ap.add_argument("--json")
    ap.add_argument("--plot", metavar="FILE.png", help="write a chart of the table: each variant's process, where its "
                    "time went (needs matplotlib)")
    ap.add_argument("--replot", metavar="JSON", help="draw --plot from an earlier run's --json (no GPU needed)")
    a = ap.parse_args()
    if a.replot:
        return plot(json.loads(Path(a.replot).read_text()), a.plot or "first_kernel.png")
    if a.pin:
        try:
            PIN.update(int(c) for c in a.pin.split(","))
        except ValueError:
            raise SystemExit(f"--pin {a.pin}: not CPU numbers (e.g. 3 or 2,3)") from None
        if not PIN <= os.sched_getaffinity(0):
            raise SystemExit(f"--pin {a.pin}: this process may run on CPUs {sorted(os.sched_getaffinity(0))} only")
    # nbjit's bytecode, as pip's install writes it: where PYTHONDONTWRITEBYTECODE is set (the GPU
    # machine's image sets it) every process would otherwise compile nbjit's sources again (~80 ms)
    import compileall
    compileall.compile_dir(str(ROOT / "nbjit"), quiet=1)
    if a.vs:
        if not (Path(a.vs) / "nbjit" / "__init__.py").is_file():
            raise SystemExit(f"--vs {a.vs}: no nbjit package there")
        compileall.compile_dir(str(Path(a.vs) / "nbjit"), quiet=1)
    work = Path(tempfile.mkdtemp(prefix="nbjit-first-kernel-"))
    if a.no_gpu:
        return no_gpu(a, work)
    names = [v for v in VARIANTS if not a.only or v in a.only]
    if a.vs:
        # (the "by stage" variant times this tree's functions by their names: not another's)
        names = [x for v in names for x in ((v, f"{v}{VS}{os.path.abspath(a.vs)}")
                                            if v.startswith("nbjit") and "by stage" not in v else (v,))]
    for v in names:  # fill the warm caches (not counted)
        if v.split(VS)[0] not in COLD:
            run_once(v, work)
    results: dict[str, list] = {v: [] for v in names}
    for _ in range(a.runs):
        for v in names:
            results[v].append(run_once(v, work))
    base = statistics.median(r["wall"] for r in results.get("Numba arrays, no kernel", [{"wall": 0}]))
    print(f"fresh process to its first finished launch, {a.runs} processes each (taking turns); ms")
    print(f"{'variant':50}{'median':>8}{'min':>8}{'max':>8}{'- Numba':>9}  where the time went (medians)")
    table = {}
    for v in names:
        walls = [r["wall"] * 1e3 for r in results[v]]
        phases = _medians(results[v], "marks")
        med = statistics.median(walls)
        table[v] = {"median_ms": med, "min_ms": min(walls), "max_ms": max(walls), "phases_ms": phases,
                    "cpu_phases_ms": _medians(results[v], "cpu"), "stages_ms": _medians(results[v], "stages"),
                    "walls_ms": walls}
        extra = f"{med - base * 1e3:9.1f}" if base and v.startswith("nbjit") else f"{'':9}"
        print(f"{v:50}{med:8.1f}{min(walls):8.1f}{max(walls):8.1f}{extra}  "
              + ", ".join(f"{k} {t:.1f}" for k, t in phases.items()))
    for v in names:
        if v.startswith("nbjit"):
            own = [_own(r["marks"]) * 1e3 for r in results[v]]
            own_cpu = [_own(r["cpu"]) * 1e3 for r in results[v]]
            gc_ms = [_own({k: c[0] for k, c in r["collector"].items()}) * 1e3 for r in results[v]]
            gc_old_ms = [_own({k: c[4] for k, c in r["collector"].items()}) * 1e3 for r in results[v]]
            passes = [[sum(c[g] for k, c in list(r["collector"].items())[list(r["collector"]).index("arrays") + 1:])
                       for g in (1, 2, 3)] for r in results[v] if "arrays" in r["collector"]]
            table[v]["own_ms"], table[v]["own_cpu_ms"], table[v]["own_collector_ms"] = own, own_cpu, gc_ms
            table[v]["own_collector_passes"], table[v]["own_collector_old_ms"] = passes, gc_old_ms
            table[v]["on_cpu"] = [r.get("on_cpu") for r in results[v]]
            # the host's speed as a yardstick: nbjit's share per second of the same process's
            # import of numpy and numba.cuda (leases of the same machine differ by 1.5x in both)
            per_s = [o / (r["marks"][IMPORTS] * 1e3) * 1e3 for o, r in zip(own, results[v]) if r["marks"].get(IMPORTS)]
            table[v]["own_ms_per_s_of_numba_import"] = per_s
            binds = [r["marks"][BINDINGS] * 1e3 for r in results[v] if BINDINGS in r["marks"]]
            if binds:
                table[v]["bindings_import_ms"] = binds
                print(f"{v}: importing cuda.bindings.driver (the driver's bindings, a dependency's import; its own "
                      f"phase, not nbjit's share): median {statistics.median(binds):.1f} ms")
            print(f"nbjit's own share ({v}): everything after the arrays, median {statistics.median(own):.1f} ms "
                  f"[{min(own):.1f}-{max(own):.1f}], CPU {statistics.median(own_cpu):.1f} ms; of it the cyclic "
                  f"collector {statistics.median(gc_ms):.2f} ms (passes of generations 0/1/2, first process: "
                  f"{'/'.join(map(str, passes[0])) if passes else '-'}; generations 1-2: "
                  f"{statistics.median(gc_old_ms):.2f} ms)")
            if per_s:
                print(f"  per second of the same process's import of numpy + numba.cuda (the host's speed): median "
                      f"{statistics.median(per_s):.1f} ms [{min(per_s):.1f}-{max(per_s):.1f}]")
    if "nbjit, bundle (by stage)" in results:
        rs = results["nbjit, bundle (by stage)"]
        print("\nnbjit, bundle (by stage), medians in ms: phase wall / CPU")
        cpu = _medians(rs, "cpu")
        for k, t in _medians(rs, "marks").items():
            print(f"  {k:44}{t:8.2f}{cpu[k]:8.2f}")
        print("  within them (wall, inclusive):")
        for k, t in _medians(rs, "stages").items():
            print(f"    {k:42}{t:8.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(table, indent=2))
    if a.plot:
        plot(table, a.plot)


# the chart's parts of a process, in order: (label, colour, which of a child's phases it sums)
PARTS = (("interpreter start and exit", "#bbbbbb", None),
         ("imports (numpy + the library's stack)", "#7f7f7f", lambda k: k.startswith("import numpy")),
         ("CUDA context (and arrays)", "#2ca02c", lambda k: k.startswith("context")),
         ("arrays", "#98df8a", lambda k: k == "arrays"),
         ("the kernel: the library's part, first launch", "#d62728", lambda k: True))


def plot(table: dict, path: str) -> None:
    """A stacked bar per variant (A/B duplicates and the stage-by-stage variant left out): its
    median process split into the parts of ``PARTS``, nbjit's share written beside its bar."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot: matplotlib is not installed", file=sys.stderr)
        return
    names = [v for v in table if VS not in v and "by stage" not in v]
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(names) + 2.2))
    for i, v in enumerate(names):
        left, rest = 0.0, dict(table[v]["phases_ms"])
        split = []
        for label, color, pick in PARTS[1:]:
            ms = sum(rest.pop(k) for k in [k for k in rest if pick(k)])
            split.append((label, color, ms))
        start = max(table[v]["median_ms"] - sum(ms for _, _, ms in split), 0.0)
        for label, color, ms in [(PARTS[0][0], PARTS[0][1], start), *split]:
            ax.barh(i, ms, left=left, color=color, label=label if i == 0 else None)
            left += ms
        own = table[v].get("own_ms")
        note = f" {table[v]['median_ms']:.0f} ms" + (f" (nbjit's share {statistics.median(own):.1f} ms)" if own else "")
        ax.text(left, i, note, va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(table[v]["median_ms"] for v in names) * 1.35)
    ax.set_xlabel("ms from the process's start to its first finished launch (medians; lower is better)")
    ax.set_title("A fresh process's first kernel: where the time goes", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _pythonpath(root: str | None = None) -> str:
    """This checkout (or ``root``, --vs) first: the children measure its nbjit, installed or not."""
    return os.pathsep.join([root or str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


def _medians(runs: list, key: str) -> dict:
    """{phase: median ms} over the runs' ``key`` records (wall or CPU seconds)."""
    out = {}
    for k in runs[0][key]:
        vals = [r[key][k] for r in runs if isinstance(r[key].get(k), (int, float))]
        if vals:
            out[k] = statistics.median(vals) * 1e3
    return out


BINDINGS = "import cuda.bindings"  # the bare host's driver bindings (cuda.core and Numba import them too)


def _own(marks: dict) -> float:
    """nbjit's part of a child's phases: what comes after the arrays (nbjit's imports, its
    calls, the first launch and its synchronisation); not the import of the driver's bindings,
    which a bare process that has no cuda.core or Numba imports first (its own phase)."""
    keys = list(marks)
    return sum(marks[k] for k in keys[keys.index("arrays") + 1:] if k != BINDINGS) if "arrays" in keys else 0.0


def no_gpu(a, work: Path) -> None:
    """The bundle route's CPU side (``NO_GPU``), ``--runs`` fresh processes."""
    script = work / "no_gpu.py"
    script.write_text(PRELUDE + f"BUNDLE = {str(BUNDLE)!r}\nN = {N}\n" + NO_GPU
                      + "print(json.dumps({'marks': marks, 'cpu': cpu, 'stages': stages, 'collector': collector}))\n")
    env = {**os.environ, "NBJIT_CACHE_DIR": str(work / "cache"), "PYTHONUNBUFFERED": "1", "PYTHONPATH": _pythonpath()}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # (nbjit's is compiled; numpy's and Numba's as installed)
    runs = []
    for _ in range(a.runs):
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300,
                           preexec_fn=(lambda: os.sched_setaffinity(0, PIN)) if PIN else None)
        if r.returncode != 0:
            raise SystemExit(f"exit {r.returncode}\n{r.stderr[-3000:]}")
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    wall, cpu = _medians(runs, "marks"), _medians(runs, "cpu")
    cpu_min = {k: min(r["cpu"][k] for r in runs) * 1e3 for k in cpu}
    print(f"the bundle route without a GPU, {a.runs} fresh processes; ms (CPU: this process's CPU time)")
    coll = {k: statistics.median(r["collector"][k][0] for r in runs) * 1e3 for k in wall}
    print(f"  {'phase':42}{'wall':>9}{'CPU':>9}{'CPU min':>9}{'GC':>8}  (GC: the cyclic collector's part of the wall)")
    for k in wall:
        print(f"  {k:42}{wall[k]:9.2f}{cpu[k]:9.2f}{cpu_min[k]:9.2f}{coll[k]:8.2f}")
    after = list(wall)[1:]  # nbjit's part: after numpy and numba.cuda
    share = [sum(r["cpu"][k] for k in after) * 1e3 for r in runs]
    share_wall = [sum(r["marks"][k] for k in after) * 1e3 for r in runs]
    print(f"  {'nbjit (all but the first line)':42}{statistics.median(share_wall):9.2f}{statistics.median(share):9.2f}"
          f"{min(share):9.2f}")
    per_s = [w / r["marks"][IMPORTS] for w, r in zip(share_wall, runs)]  # (ms per second of that import)
    print(f"  nbjit's part per second of the same process's {IMPORTS} (the host's speed): median "
          f"{statistics.median(per_s):.1f} ms [{min(per_s):.1f}-{max(per_s):.1f}]")
    print(f"  nbjit's modules imported: {', '.join(runs[0]['stages']['modules'])}")
    if a.json:
        Path(a.json).write_text(json.dumps({"wall_ms": wall, "cpu_ms": cpu, "cpu_min_ms": cpu_min, "collector_ms": coll,
                                            "nbjit_cpu_ms": share, "nbjit_wall_ms": share_wall,
                                            "nbjit_ms_per_s_of_numba_import": per_s,
                                            "modules": runs[0]["stages"]["modules"]}, indent=2))


if __name__ == "__main__":
    main()
