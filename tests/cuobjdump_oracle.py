"""cuobjdump as an independent decoder of cubins: what it says, as plain data.

Used by make_fixtures.py to write tests/data/expected/*.json and by the tests to compare
nbjit's cubin inspector against cuobjdump where it is installed (pip
nvidia-cuda-cuobjdump, which the test extra brings, or Triton's bundled copy).
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sysconfig


def find_cuobjdump() -> str | None:
    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    site = sysconfig.get_paths()["purelib"]
    for pattern in ("nvidia/cu13/bin/cuobjdump", "nvidia/cuda_cuobjdump/bin/cuobjdump",
                    "triton/backends/nvidia/bin/cuobjdump"):
        hits = glob.glob(os.path.join(site, pattern))
        if hits and os.access(hits[0], os.X_OK):
            return hits[0]
    return None


def _ints(s: str) -> list[int]:
    return [int(x, 16) for x in re.findall(r"0x[0-9a-fA-F]+", s)]


def describe(path: str, exe: str | None = None) -> dict:
    """{kernel: {params: [[ordinal, offset, size, space]], param_size, maxntid, reqntid,
    maxreg, cluster, explicit_cluster, max_cluster_rank, spills (SpillRefill annotations),
    frame, reg, shared, local, const0}}"""
    exe = exe or find_cuobjdump()
    elf = subprocess.run([exe, "-elf", path], capture_output=True, text=True, check=True).stdout
    res = subprocess.run([exe, "-res-usage", path], capture_output=True, text=True, check=True).stdout
    out: dict[str, dict] = {}
    # .nv.info.<kernel> sections: blocks of "<0xN> Attribute: ... Format: ... Value: ..."
    for sec in re.split(r"\n(?=\.nv\.info\.)", elf):
        m = re.match(r"\.nv\.info\.(\S+)\n", sec)
        if not m:
            continue
        k = out.setdefault(m.group(1), {"params": []})
        nxt = re.search(r"\n(?=[^\t\n])", sec[m.end():])  # the section ends at an unindented line
        body = sec[: m.end() + nxt.start()] if nxt else sec
        for block in re.split(r"\n\t<0x[0-9a-f]+>", body)[1:]:
            a = re.search(r"Attribute:\s*(EIATTR_\w+)", block)
            if not a:
                continue
            name = a.group(1)
            val = block.split("Value:", 1)[1] if "Value:" in block else ""
            if name == "EIATTR_KPARAM_INFO":
                f = dict(re.findall(r"(Ordinal|Offset|Size|Space)\s*:\s*(0x[0-9a-fA-F]+)", val))
                k["params"].append([int(f["Ordinal"], 16), int(f["Offset"], 16), int(f["Size"], 16),
                                    int(f["Space"], 16)])
            elif name == "EIATTR_CBANK_PARAM_SIZE":
                k["param_size"] = _ints(val)[0]
            elif name == "EIATTR_MAX_THREADS":
                k["maxntid"] = _ints(val)[:3]
            elif name == "EIATTR_REQNTID":
                k["reqntid"] = _ints(val)[:3]
            elif name == "EIATTR_MAXREG_COUNT":
                k["maxreg"] = _ints(val)[0]
            elif name == "EIATTR_CTA_PER_CLUSTER":
                k["cluster"] = _ints(val)[:3]
            elif name == "EIATTR_EXPLICIT_CLUSTER":
                k["explicit_cluster"] = True
            elif name == "EIATTR_MAX_CLUSTER_RANK":
                k["max_cluster_rank"] = _ints(val)[0]
            elif name == "EIATTR_ANNOTATIONS":
                k["spills"] = k.get("spills", 0) + val.count("SpillRefill")
        k["params"].sort()
    # the module-wide .nv.info: "function: K(0x7)\tframe size: 0x1f8"
    for m in re.finditer(r"function: (\S+)\(0x[0-9a-f]+\)\s+frame size:\s*(0x[0-9a-fA-F]+)", elf):
        if m.group(1) in out:
            out[m.group(1)]["frame"] = int(m.group(2), 16)
    usage = r"Function (\S+):\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+) CONSTANT\[0\]:(\d+)"
    for m in re.finditer(usage, res):
        if m.group(1) in out:
            out[m.group(1)].update(reg=int(m.group(2)), stack=int(m.group(3)), shared=int(m.group(4)),
                                   local=int(m.group(5)), const0=int(m.group(6)))
    # device functions of -G / -rdc cubins have .nv.info.<name> sections too: kernels only
    return {k: v for k, v in out.items() if "param_size" in v or "maxreg" in v}
