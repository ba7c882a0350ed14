#!/usr/bin/env python3
"""Host cost of an nbjit kernel called inside ``jax.jit`` (``nbjit.jax.call``, nbjit's one XLA
FFI handler), against FFI handlers written by hand for the same call, in one run: µs per
dispatch of a jitted function holding one such call, a loop of dispatches then one
``block_until_ready``, best of ``--repeat`` interleaved rounds. Rows:

* an empty FFI handler (returns at once: JAX's and XLA's own cost of a custom call)
* a handler written for this kernel alone: the buffers' addresses and the scalars into a
  parameter array, ``cuLaunchKernel`` on XLA's stream (what a user's C++ handler does)
* ``nbjit.jax.call``: the same kernel through nbjit's handler (attributes decoded, arguments
  packed and checked by the kernel's signature)

The goal (issue #52): nbjit's handler costs at most the hand-written one + 1 µs. Needs JAX's
CUDA backend and a C compiler.

    python benchmarks/jax_call_overhead.py [--calls 2000] [--repeat 20] [--json out.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import nbjit
from launch_overhead import build_c

SRC = r"""
extern "C" __global__ void axpy(float *y, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
"""
# Two handlers by XLA's FFI C API (the struct layouts nbjit's own handler reads, gpu/_launcher.c)
HANDLERS = r"""
#include <stddef.h>
#include <stdint.h>
typedef struct ext { size_t size; int type; struct ext *next; } ext;
typedef struct { size_t size; ext *e; int major, minor; } version;
typedef struct { size_t size; ext *e; void *ctx; void *stream; } stream_args;
typedef struct { size_t size; ext *e; int dtype; void *data; int64_t rank; int64_t *dims; } buffer;
typedef struct { size_t size; ext *e; int64_t n; int *types; void **items; } list;
typedef struct { const char *ptr; size_t len; } span;
typedef struct { size_t size; ext *e; int64_t n; int *types; span **names; void **attrs; } attrs;
typedef void *(*fn)(void *);
typedef struct { size_t size; ext *e; version v; const void *internal; fn create, get, destroy, reg, stream_get; } api;
typedef struct { size_t size; ext *e; const api *api; void *ctx; int stage; list args, rets; attrs attrs; } frame;
typedef struct { size_t size; version v; uint32_t traits; int64_t state; } metadata;
typedef struct { ext base; metadata *m; } metadata_ext;
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);
static launch_fn cu_launch; static void *function; static float a = 2.0f; static int n;
void set_kernel(void *launch, void *f, int count) { cu_launch = (launch_fn)launch; function = f; n = count; }
static int metadata_call(frame *f) {
    if (f->e == NULL || f->e->type != 1) return 0;
    metadata *m = ((metadata_ext *)f->e)->m;
    m->v.major = 0; m->v.minor = 1; m->traits = 1;
    return 1;
}
void *empty_handler(frame *f) { metadata_call(f); return NULL; }
void *axpy_handler(frame *f) {
    if (metadata_call(f) || f->stage != 3) return NULL;
    stream_args s = {sizeof s, NULL, f->ctx, NULL};
    void *err = f->api->stream_get(&s);
    if (err) return err;
    void *y = ((buffer *)f->rets.items[0])->data, *x = ((buffer *)f->args.items[1])->data;
    void *params[4] = {&y, &x, &a, &n};
    cu_launch(function, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s.stream, params, NULL);
    return NULL;
}
"""
N = 4096


def rows() -> dict:
    """name -> a function making one dispatch."""
    lib = build_c(HANDLERS)
    if lib is None:
        raise SystemExit("jax_call_overhead.py needs a C compiler (cc, gcc or clang)")
    k = nbjit.compile(SRC)["axpy"]
    libcuda = ctypes.CDLL("libcuda.so.1")
    lib.set_kernel(ctypes.cast(libcuda.cuLaunchKernel, ctypes.c_void_p), ctypes.c_void_p(int(k.handle)), N)
    for name in ("empty_handler", "axpy_handler"):
        jax.ffi.register_ffi_target(f"bench_{name}", jax.ffi.pycapsule(getattr(lib, name)), platform="CUDA")
    y, x = jnp.zeros(N, jnp.float32), jnp.ones(N, jnp.float32)
    like = jax.ShapeDtypeStruct(y.shape, y.dtype)
    empty = jax.jit(lambda y, x: jax.ffi.ffi_call("bench_empty_handler", like, input_output_aliases={0: 0})(y, x))
    by_hand = jax.jit(lambda y, x: jax.ffi.ffi_call("bench_axpy_handler", like, input_output_aliases={0: 0})(y, x))
    grid = (N + 255) // 256
    nb = jax.jit(lambda y, x: nbjit.jax.call(k, y, x, 2.0, N, grid=grid, block=256, inplace=("y",)))
    return {"empty FFI handler": lambda: empty(y, x),
            "FFI handler written for this kernel (cuLaunchKernel)": lambda: by_hand(y, x),
            "nbjit.jax.call (nbjit's handler)": lambda: nb(y, x)}, lib


def main() -> None:
    ap = argparse.ArgumentParser(description="host µs per dispatch of a jitted FFI call")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    table, keep = rows()
    for fn in table.values():
        for _ in range(50):
            out = fn()
        out.block_until_ready()
    samples: dict[str, list[float]] = {name: [] for name in table}
    for _ in range(a.repeat):
        for name, fn in table.items():
            t0 = time.perf_counter()
            for _ in range(a.calls):
                out = fn()
            t1 = time.perf_counter()
            out.block_until_ready()
            samples[name].append((t1 - t0) / a.calls * 1e6)
    best = {name: min(v) for name, v in samples.items()}
    width = max(map(len, best)) + 2
    for name, us in best.items():
        print(f"{name:{width}}{us:8.2f} us")
    extra = best["nbjit.jax.call (nbjit's handler)"] - best["FFI handler written for this kernel (cuLaunchKernel)"]
    print(f"nbjit's handler over the one written for the kernel: {extra:+.2f} us (goal: at most +1)")
    if a.json:
        Path(a.json).write_text(json.dumps({"us": best, "over_hand_written_us": extra, "calls": a.calls,
                                            "repeat": a.repeat, "gpu": str(jax.devices()[0].device_kind),
                                            "jax": jax.__version__, "python": platform.python_version(),
                                            "numpy": np.__version__}, indent=2))


if __name__ == "__main__":
    main()
