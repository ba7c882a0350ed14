#!/usr/bin/env python3
"""A fresh process's compile served by the cache's remote tier, against a local warm hit
and a cold compile (no GPU needed: nbjit.compile_image with an explicit arch).

The remote tier is moto's S3 server on loopback (started here), reached through s3fs, so
the figures are nbjit's and s3fs's own costs plus a loopback round trip; a real object store
adds its latency (a few ms to tens of ms per request: a hit is two requests, a miss two and
a publish two more). Each figure is the median over --runs fresh processes of the
``compile_image`` call alone (``import nbjit`` done before it):

  cold          an empty local cache and no remote: NVRTC compiles;
  cold+publish  the same with the remote tier: NVRTC, then the entry published;
  remote hit    an empty local cache, the entry in the remote tier (s3fs imported by the call);
  remote hit, s3fs imported   the same with fsspec/s3fs imported before the call;
  local warm    the entry in the local cache.

    python benchmarks/remote_cache.py [--runs 5] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = r'''
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''

CHILD = r'''
import json, sys, time
sys.path.insert(0, sys.argv[5])
from nbjit.toolchain.nvrtc import compile_image
from nbjit.cache.store import Cache
if sys.argv[4] == "preimport":
    import s3fs  # noqa: F401
cache = Cache(sys.argv[2], remote=sys.argv[3] or None)
t = time.perf_counter()
img = compile_image(sys.argv[1], name="saxpy.cu", arch="sm_90", cache=cache)
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "bytes": len(img.data)}))
'''


def child(src: str, cache: str, remote: str, env: dict, preimport: bool = False) -> float:
    r = subprocess.run([sys.executable, "-c", CHILD, src, cache, remote, "preimport" if preimport else "", str(ROOT)],
                       capture_output=True, text=True, env=env, timeout=300)
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout)["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="write every run's figures here")
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    import boto3
    boto3.client("s3", endpoint_url=f"http://{host}:{port}", aws_access_key_id="bench",
                 aws_secret_access_key="bench-secret", region_name="us-east-1").create_bucket(Bucket="bench")
    rows: dict[str, list[float]] = {k: [] for k in ("cold", "cold+publish", "remote hit",
                                                    "remote hit, s3fs imported", "local warm")}
    try:
        for i in range(args.runs):
            src = SRC + f"// run {i} {os.getpid()}\n"  # a new key each run: nothing from an earlier run
            remote = f"s3://bench/run{i}"
            with tempfile.TemporaryDirectory() as d:
                rows["cold"].append(child(src, f"{d}/cold", "", env))
                rows["cold+publish"].append(child(src, f"{d}/a", remote, env))
                rows["remote hit"].append(child(src, f"{d}/b", remote, env))
                rows["remote hit, s3fs imported"].append(child(src, f"{d}/c", remote, env, preimport=True))
                rows["local warm"].append(child(src, f"{d}/a", "", env))
    finally:
        server.stop()
    print(f"{'':28} {'median':>10} {'min':>10} {'max':>10}   ({args.runs} fresh processes each)")
    for k, v in rows.items():
        print(f"{k:28} {statistics.median(v) * 1e3:>8.2f}ms {min(v) * 1e3:>8.2f}ms {max(v) * 1e3:>8.2f}ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"seconds": rows, "runs": args.runs}, indent=2))


if __name__ == "__main__":
    main()
