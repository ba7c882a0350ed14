#!/usr/bin/env python3
"""How far nbjit's fresh-process warm start (``compile_cache.py`` (b)) is from the least any
implementation of the same work could take on this machine.

The "floor" is that work written flat in one function, in a fresh process over the same
cache directory: stat the toolchain files nbjit identified and read their remembered
identities (``toolchain-ids.json``), hash a key over the same fields, read the entry file,
check its checksum, parse its description, make a few objects of the typed parameters, and
(with a GPU) the driver's calls, timed apart as well: the current context, loading the cubin,
getting the function and its parameters' layout. It leaves out what nbjit adds beyond that
(checking the arguments, the module and kernel objects, argument packers, the in-process
memos), so it is a lower bound, not a target.

Each fresh process times two calls: the first (what ``compile_cache.py`` measures) and a
second of a different source, whose entry is in the cache too (Python's code then runs for
the second time: what is left is the work itself). nbjit and the floor take turns.

    python benchmarks/warm_floor.py [--runs 9] [--stand-in] [--json out.json]

``--stand-in``: no GPU; the driver's calls answer at once (nbjit's) or are left out (the
floor's).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_cache import NBJIT, ROOT, SRC  # noqa: E402  (the same source and the same stand-ins)

SECOND = SRC.replace("+ y[i]", "- y[i]")  # another kernel (another cubin: nothing shared in the process)

# nbjit: compile_cache.py's child, then a second source in the same process
_PRINT = 'print(json.dumps({"first": t1 - t0,'
assert NBJIT.count(_PRINT) == 1, "compile_cache.py's child changed: this script's copy of it needs changing too"
NBJIT_TWO = NBJIT.replace(
    _PRINT,
    'src2 = __import__("os").environ["NBJIT_BENCH_SECOND"]\n'
    't2 = time.perf_counter(); nbjit.compile(src2)["saxpy"]; t3 = time.perf_counter()\n'
    'print(json.dumps({"second": t3 - t2, "first": t1 - t0,')

FLOOR = r'''
import hashlib, json, os, struct, sys, time
cache_dir, gpu, sources = sys.argv[1], sys.argv[2] == "gpu", sys.argv[3:5]
if gpu:
    from numba import cuda
    cuda.current_context()
    from cuda.bindings import driver as cu
entries = sorted(os.path.join(r, f) for r, _, fs in os.walk(cache_dir) for f in fs if f.endswith(".nbjit"))
_SCAN = json.JSONDecoder().scan_once
_ENC = json.encoder.c_make_encoder(None, None, json.encoder.encode_basestring_ascii, None, ":", ",", True, False,
                                   True)


class Param:
    __slots__ = ("name", "ptx_type", "size", "offset", "pointer", "ctype")

    def __init__(self, name, ptx_type, size, offset, pointer, ctype):
        self.name, self.ptx_type, self.size, self.offset, self.pointer, self.ctype = \
            name, ptx_type, size, offset, pointer, ctype


DRIVER = []  # per call: the driver's calls' time


def warm(src, entry_file):
    d = 0
    if gpu:
        t = time.perf_counter(); ctx = cu.cuCtxGetCurrent(); dev = cu.cuCtxGetDevice(); d += time.perf_counter() - t
        if ctx[0] != 0 or dev[0] != 0 or not int(ctx[1]):
            raise SystemExit("no current context")
    [p for p in sys.path if p and os.path.isdir(p + "/nvidia")]  # (where the toolchain is looked for)
    with open(cache_dir + "/toolchain-ids.json", "rb") as f:
        ids = _SCAN(f.read().decode(), 0)[0]
    idents = []
    for path, got in ids.items():
        st = os.stat(path)
        if got[:4] == [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]:
            idents.append(got[4])
    fields = {"format": 3, "producer": "nvrtc", "toolchain": idents, "source": src, "name": "kernel.cu",
              "headers": [], "options": ["--include-path=<cuda>", "--include-path=<cccl>"], "arch": "sm_90",
              "output": "auto", "expressions": [], "includes": None}
    hashlib.blake2b("".join(_ENC(fields, 0)).encode(), digest_size=32).hexdigest()
    with open(entry_file, "rb") as f:
        raw = f.read()
    _, _, dlen, check = struct.unpack_from("<8sII32s", raw)
    desc_bytes, payload = raw[48:48 + dlen], raw[48 + dlen:]
    digest = hashlib.blake2b(payload, digest_size=32).digest()
    if hashlib.blake2b(desc_bytes + digest, digest_size=32).digest() != check:
        raise SystemExit("checksum mismatch")
    desc = _SCAN(desc_bytes.decode(), 0)[0]
    params = [Param(*p[2:4], p[4], p[6], p[8], p[11]) for k in desc["facts"]["typed"].values()
              for p in k[3][2][1:]]
    if gpu:
        t = time.perf_counter()
        err, mod = cu.cuModuleLoadData(payload)
        ok = err == 0
        err, func = cu.cuModuleGetFunction(mod, b"saxpy")
        ok &= err == 0
        for i in range(len(params)):
            ok &= cu.cuFuncGetParamInfo(func, i)[0] == 0
        d += time.perf_counter() - t
        if not ok:  # (a failed call is no floor)
            raise SystemExit("a driver call failed")
    DRIVER.append(d)
    return params


t0 = time.perf_counter(); warm(sources[0], entries[0]); t1 = time.perf_counter()
warm(sources[1], entries[1]); t2 = time.perf_counter()
print(json.dumps({"first": t1 - t0, "second": t2 - t1, "driver first": DRIVER[0], "driver second": DRIVER[1]}))
'''

FILL = r'''
import sys, nbjit
if sys.argv[1] == "gpu":
    for src in sys.argv[2:]:
        nbjit.compile(src)["saxpy"]
else:
    for src in sys.argv[2:]:
        nbjit.compile_image(src, arch="sm_90")
'''


def child(code: str, args: list[str], env: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}


def main() -> None:
    ap = argparse.ArgumentParser(description="nbjit's warm start against the floor of the same work")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--stand-in", action="store_true", help="no GPU (the driver's calls answer at once or are "
                    "left out)")
    ap.add_argument("--json")
    a = ap.parse_args()
    import compileall
    compileall.compile_dir(str(ROOT / "nbjit"), quiet=1)
    mode = "stand-in" if a.stand_in else "gpu"
    rows: dict[str, dict[str, list[float]]] = {"nbjit": {"first": [], "second": []},
                                                "floor": {"first": [], "second": [], "driver first": [],
                                                          "driver second": []}}
    with tempfile.TemporaryDirectory() as d:
        path = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        env = {**os.environ, "NBJIT_CACHE_DIR": d, "PYTHONPATH": path}
        child(FILL, [mode, SRC, SECOND], env)
        # (the floor reads the two entries in the order their keys sort: which source each is does not matter)
        for _ in range(a.runs):
            got = child(NBJIT_TWO, [SRC, *(("stand-in",) if a.stand_in else ())], {**env, "NBJIT_BENCH_SECOND": SECOND})
            for k in ("first", "second"):
                rows["nbjit"][k].append(got[k])
            got = child(FLOOR, [d, mode, SRC, SECOND], env)
            for k in rows["floor"]:
                rows["floor"][k].append(got[k])
    print(f"{mode}: medians of {a.runs} fresh processes each [range], us")
    for name, r in rows.items():
        print(f"{name:6} first {statistics.median(r['first']) * 1e6:8.1f} [{min(r['first']) * 1e6:.0f}-"
              f"{max(r['first']) * 1e6:.0f}]   second {statistics.median(r['second']) * 1e6:8.1f} "
              f"[{min(r['second']) * 1e6:.0f}-{max(r['second']) * 1e6:.0f}]")
    if not a.stand_in:
        dr = rows["floor"]
        print(f"of the floor, the driver's calls: first {statistics.median(dr['driver first']) * 1e6:.1f}, second "
              f"{statistics.median(dr['driver second']) * 1e6:.1f}")
    for k in ("first", "second"):
        ratio = statistics.median(rows["nbjit"][k]) / statistics.median(rows["floor"][k])
        print(f"nbjit / floor, {k} call: {ratio:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
