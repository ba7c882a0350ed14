#!/usr/bin/env python3
"""nbjit's own host cost per launch from compiled code, in nanoseconds, with no GPU: the
driver's ``cuLaunchKernel`` is replaced by a C function that returns at once, so what is left is
what nbjit adds on top of the driver (checking the configuration, packing the arguments by the
kernel's signature, the call itself). Rows, each in a compiled loop of ``--launches``:

* a C loop calling the stub with the parameters packed once (the floor: the loop and the call)
* a Numba ``cfunc`` calling ``kernel.c_entry``'s ``nbjit_launch`` (4 arguments)
* an ``@njit`` loop launching ``k[grid, block, stream](...)`` with 4 and with 16 arguments

Kernels are compiled by NVRTC for sm_90 (no GPU); the C pieces are built with the system
compiler. Compare with ``launch_overhead.py``'s rows on a GPU, where the driver's own launch
takes about 3 µs.

    python benchmarks/entry_overhead.py [--launches 1000000] [--rounds 5] [--json out.json]
"""
from __future__ import annotations

import argparse
import ctypes as C
import json
import platform
import time
from pathlib import Path

import numba
import numpy as np

import nbjit
from nbjit.gpu import extension
from nbjit.launch.arguments import ArgPacker
from nbjit.launch import entry as entry_module
from nbjit.launch.entry import CEntry, arguments_digest, entry_args, entry_facts, entry_launcher

from launch_overhead import C_LOOP, build_c  # (the same C loop, built the same way)

STUB = r"""
int stub_launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh,
                void *stream, void **params, void **extra) { return 0; }
"""
SRC = r"""
extern "C" __global__ void four(float* y, const float* x, float a, int n) {}
extern "C" __global__ void sixteen(float* y, int a1, int a2, int a3, int a4, int a5, int a6, int a7, int a8, int a9,
                                   int a10, int a11, int a12, int a13, int a14, int a15) {}
"""


def stub_library():
    """The stub launch and launch_overhead.py's C loop, built with the system compiler."""
    lib = build_c(STUB + C_LOOP)
    if lib is None:
        raise SystemExit("entry_overhead.py needs a C compiler (cc, gcc or clang)")
    lib.launch_loop.argtypes = [C.c_void_p, C.c_void_p, C.c_uint, C.c_uint, C.c_void_p, C.c_void_p, C.c_long,
                                C.c_void_p]
    return lib


def cpu_entry(kernel) -> CEntry:
    """A kernel's C entry made from its image alone (its function handle 0: the stub ignores it)."""
    info = kernel.info
    packer = ArgPacker(info.signature, kernel.name)
    launcher = entry_launcher(info, packer, packer.c_layout, 0, entry_facts(info, kernel.name, (0, 0, 232448, 1024)))
    args = entry_args(info, kernel.name)
    p = extension.extension().entry_points()
    return CEntry(p["launch"], p["pack"], p["synchronize"], id(launcher), info.param_size, args, kernel.name,
                  launcher, arguments_digest(args))


@numba.njit(nogil=True)
def four(k, y, s, m):
    for _ in range(m):
        k[4, 256, s](y, y, 2.0, 1024)


@numba.njit(nogil=True)
def sixteen(k, y, s, m):
    for i in range(m):
        k[4, 256, s](y, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, i)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    lib = stub_library()
    stub = C.cast(lib.stub_launch, C.c_void_p).value
    extension.extension().set_entry_point("cuLaunchKernel", stub)  # (what the driver would be)
    mod = nbjit.compile(SRC, arch="sm_90", lazy=True)
    entries = {name: cpu_entry(mod[name]) for name in ("four", "sixteen")}
    entry_module.kernel_entry = lambda k, tail=0: entries[k.name]  # (kernels handed to njit code get these)
    y = nbjit.DeviceView(0x7F0000000000, (1024,), (4,), np.float32)
    s = nbjit.StreamHandle(0)

    u64, i64 = C.c_uint64, C.c_int64
    e = entries["four"]
    launch = C.CFUNCTYPE(C.c_int, u64, u64, C.c_int, u64, u64, i64, u64, i64)(e.launch)
    values = [u64(y.data), u64(y.data), C.c_double(2.0), i64(1024)]
    args = (C.c_void_p * 4)(*[C.addressof(v) for v in values])
    dims, msg = (i64 * 7)(4, 1, 1, 256, 1, 1, 0), C.create_string_buffer(1024)
    kernel, at_dims, at_args, at_msg = e.kernel, C.addressof(dims), C.addressof(args), C.addressof(msg)

    @numba.cfunc("int32(int64)")
    def entry_loop(m):
        for _ in range(m):
            r = launch(kernel, at_dims, 0, 0, at_args, 4, at_msg, 1024)
            if r != 0:
                return r
        return 0
    run_entry = C.CFUNCTYPE(C.c_int32, C.c_int64)(entry_loop.address)
    packed = [u64(y.data), u64(y.data), C.c_float(2.0), C.c_int32(1024)]
    params = (C.c_void_p * 4)(*[C.addressof(v) for v in packed])
    rows = {
        "C loop: the stub launch, parameters packed once":
            lambda n: lib.launch_loop(stub, 0, 4, 256, 0, params, n, None),
        "Numba cfunc: kernel.c_entry's nbjit_launch, 4 arguments": run_entry,
        "@njit: k[g, b, s](...), 4 arguments": lambda n: four(mod["four"], y, s, n),
        "@njit: k[g, b, s](...), 16 arguments": lambda n: sixteen(mod["sixteen"], y, s, n),
    }
    best = {}
    for fn in rows.values():
        fn(1000)  # (compiled, warm)
    for _ in range(a.rounds):
        for name, fn in rows.items():
            t0 = time.perf_counter()
            if fn(a.launches):
                raise SystemExit(f"{name}: a launch failed: {msg.value.decode()}")
            best[name] = min(best.get(name, float("inf")), (time.perf_counter() - t0) / a.launches * 1e9)
    width = max(map(len, best)) + 2
    for name, ns in best.items():
        print(f"{name:{width}}{ns:8.1f} ns per launch")
    if a.json:
        Path(a.json).write_text(json.dumps({"ns": best, "launches": a.launches, "rounds": a.rounds,
                                            "python": platform.python_version(), "machine": platform.processor()
                                            or platform.machine()}, indent=2))


if __name__ == "__main__":
    main()
