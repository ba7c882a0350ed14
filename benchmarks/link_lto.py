#!/usr/bin/env python3
"""Python operators linked into C++ kernels (nbjit.compile(..., link=[(op, sig)])):

compile (no GPU needed: arch sm_90 given), each step a fresh process, median of --runs:
  (a) cold: an empty cache: Numba compiles the operator, NVRTC the template, nvJitLink links;
  (b) new operator: another Python operator into the same template (its C++ LTO-IR cached),
      in a fresh process, and one more in that process after it (Numba's first compile done);
  (c) warm: a fresh process over the cache (a) filled; (d) a repeated call in that process;
and the same template with the operator written in C++ (nbjit.compile_image, no link) cold and
warm. Rows for the block-reduction template of tests/data/src/block_reduce_op.cu, and for a CUB
BlockReduce where CCCL's headers are installed. Every process imports numpy and numba.cuda
before timing (a user's code that has a Python operator has them); the cold row's Numba part
includes Numba's first compile in a process.

SASS (no GPU; needs nvdisasm): each kernel's instructions with the Python operator linked and
with the same operator in C++ (same opcodes, no call left: LTO inlined it).

kernels (--gpu, needs a GPU): kernel time (CUDA events, median of --repeat launches) of the
block reduction and an element-wise transform with the operator linked from Python against
the same operator written in C++ and compiled with the template; LTO inlines the Python one.

    python benchmarks/link_lto.py [--runs 3] [--gpu] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TEMPLATES = (ROOT / "tests/data/src/block_reduce_op.cu").read_text()
PY_OP = 'extern "C" __device__ float op(float a, float b);\n' \
        "struct Op { __device__ float operator()(float a, float b) const { return op(a, b); } };\n"
CPP_OP = "struct Op { __device__ float operator()(float a, float b) const { return a + log1pf(expf(b)); } };\n"
CUB = r'''
#include <cub/block/block_reduce.cuh>
extern "C" __device__ float op(float a, float b);
struct Op { __device__ float operator()(const float& a, const float& b) const { return op(a, b); } };
template <typename F, int BLOCK>
__global__ void block_reduce(const float* in, float* out, int n, float init) {
    using R = cub::BlockReduce<float, BLOCK>;
    __shared__ typename R::TempStorage tmp;
    F f;
    float acc = init;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += gridDim.x * BLOCK) acc = f(acc, in[i]);
    float r = R(tmp).Reduce(acc, f);
    if (threadIdx.x == 0) out[blockIdx.x] = r;
}
'''
SOURCES = {"template": (PY_OP + TEMPLATES, "block_reduce<float, Op, 256>"),
           "cub": (CUB, "block_reduce<Op, 256>")}

CHILD = r'''
import json, math, statistics, sys, time
import numpy as np
from numba import cuda
import nbjit
nbjit.link_image, nbjit.compile_image  # (imports, not timed)
src, expr, which, kind, more = sys.argv[1:6]

def softplus_add(a, b):
    return a + math.log1p(math.exp(b))

def absmax(a, b):
    return max(abs(a), abs(b))

op = {"softplus_add": softplus_add, "absmax": absmax}[which]
if kind == "link":
    call = lambda: nbjit.link_image(src, [(op, "float32(float32, float32)", "op")], name_expressions=[expr],
                                    arch="sm_90")
else:
    call = lambda: nbjit.compile_image(src, name_expressions=[expr], arch="sm_90")
t0 = time.perf_counter(); call(); first = time.perf_counter() - t0
ts = []
for _ in range(50):
    t = time.perf_counter(); call(); ts.append(time.perf_counter() - t)
then = None
if more == "more":  # one more operator in this process, after Numba's first compile here
    def mul_add(a, b):
        return a * b + 1.0
    t0 = time.perf_counter()
    nbjit.link_image(src, [(mul_add, "float32(float32, float32)", "op")], name_expressions=[expr], arch="sm_90")
    then = time.perf_counter() - t0
print(json.dumps({"first": first, "repeat": statistics.median(ts), "then": then}))
'''


def child(src: str, expr: str, which: str, kind: str, cache: str, more: bool = False) -> dict:
    env = {**os.environ, "NBJIT_CACHE_DIR": cache,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", CHILD, src, expr, which, kind, "more" if more else "-"],
                       capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def compile_rows(name: str, runs: int) -> dict:
    src, expr = SOURCES[name]
    cpp = src.replace(PY_OP, CPP_OP) if name == "template" else \
        src.replace('extern "C" __device__ float op(float a, float b);',
                    "__device__ float op(float a, float b) { return a + log1pf(expf(b)); }")
    got: dict[str, list] = {k: [] for k in ("cold", "new operator", "warm", "repeat", "new op after",
                                            "C++ cold", "C++ warm", "C++ repeat")}
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as d2:
            got["cold"].append(child(src, expr, "softplus_add", "link", d)["first"])
            new = child(src, expr, "absmax", "link", d, more=True)
            got["new operator"].append(new["first"])
            got["new op after"].append(new["then"])
            w = child(src, expr, "softplus_add", "link", d)
            got["warm"].append(w["first"])
            got["repeat"].append(w["repeat"])
            got["C++ cold"].append(child(cpp, expr, "absmax", "compile", d2)["first"])
            w = child(cpp, expr, "absmax", "compile", d2)
            got["C++ warm"].append(w["first"])
            got["C++ repeat"].append(w["repeat"])
    return {k: {"median": statistics.median(v), "runs": v} for k, v in got.items()}


def add(a, b):
    return a + b


def softplus_add(a, b):
    return a + math.log1p(math.exp(b))


def absmax(a, b):
    return max(abs(a), abs(b))


OPERATORS = {add: "a + b", softplus_add: "a + log1pf(expf(b))", absmax: "fmaxf(fabsf(a), fabsf(b))"}
EXPRS = ["block_reduce<float, Op, 256>", "transform2<float, float, Op>"]


def _modules(op, build):
    """(Python operator linked, the same in C++) through ``build`` (nbjit.compile or a no-GPU
    stand-in that returns Images)."""
    cpp_src = f"struct Op {{ __device__ float operator()(float a, float b) const {{ return {OPERATORS[op]}; }} }};\n"
    py = build(PY_OP + TEMPLATES, name=f"{op.__name__}_py.cu", name_expressions=EXPRS,
               link=[(op, "float32(float32, float32)", "op")])
    return py, build(cpp_src + TEMPLATES, name=f"{op.__name__}_cpp.cu", name_expressions=EXPRS)


def sass_rows() -> list[dict]:
    """No GPU: each kernel's SASS (nvdisasm) with the Python operator linked and with it in C++."""
    import re

    import nbjit

    def build(src, link=None, **kw):
        if link is None:
            return nbjit.compile_image(src, arch="sm_90", **kw)
        return nbjit.link_image(src, link, arch="sm_90", **kw)

    def opcodes(img, expr) -> list[str]:
        text = nbjit.disassemble(img.data, kernel=img.lowered_names[expr])
        return re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text)

    rows = []
    for op in OPERATORS:
        py, cpp = _modules(op, build)
        for expr in EXPRS:
            a, b = opcodes(py, expr), opcodes(cpp, expr)
            rows.append({"operator": op.__name__, "kernel": expr.split("<")[0], "python_instructions": len(a),
                         "cpp_instructions": len(b), "same_opcodes": a == b,
                         "calls": sum(o.startswith("CALL") for o in a)})
    return rows


def kernel_rows(repeat: int) -> list[dict]:
    """Kernel time of the linked Python operator against the same operator in C++."""
    import numpy as np
    from numba import cuda

    import nbjit

    n = 1 << 26
    x = cuda.to_device(np.random.default_rng(0).standard_normal(n).astype(np.float32))
    y = cuda.to_device(np.random.default_rng(1).integers(-3, 4, n).astype(np.float32))
    out = cuda.device_array(n, np.float32)
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    blocks = sms * 8
    partial = cuda.device_array(blocks, np.float32)
    start, stop = cuda.event(), cuda.event()

    def timed(launch) -> float:
        for _ in range(5):
            launch()
        ts = []
        for _ in range(repeat):
            start.record()
            launch()
            stop.record()
            stop.synchronize()
            ts.append(cuda.event_elapsed_time(start, stop))
        return statistics.median(ts)

    rows = []
    for op in OPERATORS:
        m_py, m_cpp = _modules(op, nbjit.compile)
        for expr, args, grid in ((EXPRS[0], (x, partial, n, np.float32(0)), (blocks, 256)),
                                 (EXPRS[1], (out, x, y, n), ((n + 255) // 256, 256))):
            t = {}
            for label, m in (("python", m_py), ("c++", m_cpp)):
                k = m[expr]
                t[label] = timed(lambda k=k, g=grid, a=args: k[g](*a))
                t[label + "_result"] = (partial if expr == EXPRS[0] else out).copy_to_host()
            same = bool(np.allclose(t["python_result"], t["c++_result"], rtol=1e-5, atol=1e-6))
            rows.append({"operator": op.__name__, "kernel": expr.split("<")[0], "python_ms": t["python"],
                         "cpp_ms": t["c++"], "ratio": t["python"] / t["c++"], "same_results": same})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="fresh-process rounds for the compile table")
    ap.add_argument("--gpu", action="store_true", help="also time the kernels (needs a GPU)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compile table")
    ap.add_argument("--repeat", type=int, default=50, help="launches timed per kernel (median)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    out: dict = {}
    from nbjit.toolchain.sass import find_nvdisasm
    if find_nvdisasm() is not None:
        out["sass"] = sass_rows()
        print("SASS for sm_90 (no GPU), the operator linked from Python against the same in C++:")
        print(f"{'operator':14}{'kernel':14}{'python':>8}{'c++':>8}  same opcodes  calls left")
        for r in out["sass"]:
            print(f"{r['operator']:14}{r['kernel']:14}{r['python_instructions']:8}{r['cpp_instructions']:8}  "
                  f"{str(r['same_opcodes']):12}  {r['calls']}")
    else:
        print("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm): no SASS comparison")
    if not a.no_compile:
        from nbjit.toolchain.identity import cccl_include_dir
        names = ["template"] + (["cub"] if cccl_include_dir() else [])
        if "cub" not in names:
            print("CCCL's headers are not installed: the CUB rows are skipped")
        out["compile"] = {n: compile_rows(n, a.runs) for n in names}
        print(f"compile for sm_90, fresh processes, medians of {a.runs} (ms):")
        cols = list(next(iter(out["compile"].values())))
        print(f"{'source':10}" + "".join(f"{c:>14}" for c in cols))
        for n, rows in out["compile"].items():
            print(f"{n:10}" + "".join(f"{rows[c]['median'] * 1e3:14.2f}" for c in cols))
    if a.gpu:
        out["kernels"] = kernel_rows(a.repeat)
        print(f"\nkernel time (ms, median of {a.repeat}), Python operator linked vs the same operator in C++:")
        print(f"{'operator':14}{'kernel':14}{'python':>10}{'c++':>10}{'ratio':>8}  same results")
        for r in out["kernels"]:
            print(f"{r['operator']:14}{r['kernel']:14}{r['python_ms']:10.4f}{r['cpp_ms']:10.4f}{r['ratio']:8.3f}  "
                  f"{r['same_results']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
