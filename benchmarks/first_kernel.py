#!/usr/bin/env python3
"""A fresh process's whole wall time to its first finished launch (imports included), for
nbjit from (a) a warm local cache, (b) a kernel bundle, (c) a cold cache; beside CuPy's
RawModule (warm disk cache), cuda.core's Program.compile(cache=FileStreamProgramCache),
a @cuda.jit(cache=True) kernel, the same process with Numba arrays and no nbjit call, and a
bare interpreter. Variants take turns, process by process; each child also reports where
its time went (imports, context, arrays, nbjit's own call), so nbjit's share is read from
inside the process as well as from the paired walls.

    python benchmarks/first_kernel.py [--runs 9] [--json out.json]     (needs a GPU)
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

# Each child prints one JSON line: {"done": time.time() once the launch finished, phase: seconds}.
PRELUDE = """\
import time
T = [time.time()]
import json, sys
marks = {}
def mark(name):
    now = time.time(); marks[name] = now - T[-1]; T.append(now)
"""

NUMBA_ARRAYS = """\
import numpy as np
from numba import cuda
mark("import numpy + numba.cuda")
cuda.current_context()
mark("context")
x = cuda.to_device(np.ones(N, np.float32)); y = cuda.to_device(np.ones(N, np.float32))
mark("arrays")
"""

# nbjit's part: its import, the kernel ({get}) and the first launch, each marked
NBJIT = """\
import nbjit
mark("import nbjit")
k = {get}
mark("nbjit kernel")
k[(N + 255) // 256, 256](np.float32(2), x, y, N); cuda.synchronize()
mark("launch")
"""

VARIANTS = {
    "bare interpreter": "",
    "Numba arrays, no kernel": NUMBA_ARRAYS + "cuda.synchronize()\nmark('sync')\n",
    "nbjit, warm cache": NUMBA_ARRAYS + NBJIT.format(get='nbjit.compile(SRC)["axpy"]'),
    "nbjit, bundle": NUMBA_ARRAYS + NBJIT.format(get='nbjit.load_bundle(BUNDLE)["axpy"]'),
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
COLD = {"nbjit, cold cache"}


def child(variant: str, work: Path, cold_dir: Path | None) -> tuple[str, str]:
    """The child's script, written to a file (Numba's cache=True needs a source file)."""
    cache = cold_dir if cold_dir is not None else work / "cache"
    head = (PRELUDE + f"SRC = {SRC!r}\nBUNDLE = {str(BUNDLE)!r}\nN = {N}\nCACHE = {str(work / 'cuda-core')!r}\n")
    body = VARIANTS[variant]
    path = work / ("numba_axpy.py" if "cuda.jit" in variant else f"v{abs(hash(variant)) % 10**8}.py")
    path.write_text(head + body + "print(json.dumps({'done': time.time(), 'marks': marks}))\n")
    return str(path), str(cache)


def run_once(variant: str, work: Path) -> dict:
    cold = Path(tempfile.mkdtemp(dir=work)) if variant in COLD else None
    script, cache = child(variant, work, cold)
    env = {**os.environ, "NBJIT_CACHE_DIR": cache, "CUPY_CACHE_DIR": str(work / "cupy"),
           "NUMBA_CACHE_DIR": str(work / "numba"), "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    r = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"{variant}: exit {r.returncode}\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return {"wall": out["done"] - t0, "marks": out["marks"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9, help="processes per variant (they take turns)")
    ap.add_argument("--only", nargs="*", help="variants to run (default: all)")
    ap.add_argument("--json")
    a = ap.parse_args()
    names = [v for v in VARIANTS if not a.only or v in a.only]
    work = Path(tempfile.mkdtemp(prefix="nbjit-first-kernel-"))
    # nbjit's bytecode, as pip's install writes it: where PYTHONDONTWRITEBYTECODE is set (the GPU
    # machine's image sets it) every process would otherwise compile nbjit's sources again (~80 ms)
    import compileall
    compileall.compile_dir(str(ROOT / "nbjit"), quiet=1)
    for v in names:  # fill the warm caches (not counted)
        if v not in COLD:
            run_once(v, work)
    results: dict[str, list] = {v: [] for v in names}
    for _ in range(a.runs):
        for v in names:
            results[v].append(run_once(v, work))
    base = statistics.median(r["wall"] for r in results.get("Numba arrays, no kernel", [{"wall": 0}]))
    print(f"fresh process to its first finished launch, {a.runs} processes each (taking turns); ms")
    print(f"{'variant':44}{'median':>8}{'min':>8}{'max':>8}{'- Numba':>9}  where the time went (medians)")
    table = {}
    for v in names:
        walls = [r["wall"] * 1e3 for r in results[v]]
        phases = {k: statistics.median(r["marks"][k] for r in results[v]) * 1e3 for k in results[v][0]["marks"]}
        med = statistics.median(walls)
        table[v] = {"median_ms": med, "min_ms": min(walls), "max_ms": max(walls), "phases_ms": phases,
                    "walls_ms": walls}
        extra = f"{med - base * 1e3:9.1f}" if base and v.startswith("nbjit") else f"{'':9}"
        print(f"{v:44}{med:8.1f}{min(walls):8.1f}{max(walls):8.1f}{extra}  "
              + ", ".join(f"{k} {t:.1f}" for k, t in phases.items()))
    for v in names:
        if v.startswith("nbjit"):
            own = [(r["marks"].get("import nbjit", 0) + r["marks"].get("nbjit kernel", 0)
                    + r["marks"].get("launch", 0)) * 1e3 for r in results[v]]
            print(f"nbjit's own share ({v}): import + kernel + first launch, median {statistics.median(own):.1f} ms "
                  f"[{min(own):.1f}-{max(own):.1f}]")
    if a.json:
        Path(a.json).write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
