#!/usr/bin/env python3
"""Speed of nbjit.inspect_ptx and strip_debug on ~10 MB of PTX built from each of several
compilers' real output (Triton, nvcc, Numba; with and without debug information), beside a
plain line-by-line scan of the same text (what a straightforward port of a
line-loop PTX parser does: per line, drop the comment, count braces, match the
directives). Prints MB/s and the ratios; writes JSON with --json FILE.

    python benchmarks/bench_ptx.py [--mb 10] [--repeat 5] [--json out.json]
    python benchmarks/bench_ptx.py --hostile     # MB/s on the hostile families of tests/test_ptx.py
"""
from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from nbjit import inspect_ptx, strip_debug

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


# Real compiler output, with and without debug information: (label, file under tests/data)
CORPORA = (
    ("Triton matmul, line info + DWARF", "triton/matmul_kernel/matmul_kernel.ptx"),
    ("Triton softmax, line info + DWARF", "triton/softmax_kernel/softmax_kernel.ptx"),
    ("nvcc -G (DWARF)", "nvcc/kernels_G_sm90.ptx"),
    ("nvcc -lineinfo", "nvcc/kernels_lineinfo_sm90.ptx"),
    ("nvcc, no debug", "nvcc/kernels_sm90.ptx"),
    ("Numba debug=True", "numba/axpy_debug.ptx"),
    ("Numba, no debug", "numba/axpy_plain.ptx"),
)


def build_text(mb: float, path: str = CORPORA[0][1]) -> str:
    """A compiler's PTX file, its kernels and functions repeated under new names until the
    text reaches ``mb`` megabytes (the module's header and debug sections kept once)."""
    src = (DATA / path).read_text()
    info = inspect_ptx(src)
    starts = [m.start() for m in re.finditer(r"^[ \t]*(?:\.(?:visible|weak|extern)\s+)*\.(?:entry|func)\b", src,
                                             re.M)]
    start = starts[0]
    end = min([i for i in (src.find("\t.file", start), src.find(".section", start)) if i != -1] or [len(src)])
    head, body, tail = src[:start], src[start:end].rstrip("\n") + "\n", src[end:]
    names = sorted({e.name for e in info.entries} | {f.name for f in info.functions if f.defined}, key=len,
                   reverse=True)
    rename = re.compile(r"(?<![\w$])(" + "|".join(map(re.escape, names)) + r")(?![\w$])")
    n = max(1, int(mb * 1e6 / len(body)))
    return head + "".join(rename.sub(lambda m, i=i: f"{m.group(1)}_{i}", body) for i in range(n)) + tail


# ----------------------------------------------------------------- the line-scan baseline

_ENTRY = re.compile(r"^\s*(?:\.(visible|weak|extern)\s+)?\.entry\s+([\w$]+)")
_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)(?:\s+\.ptr(?:\s+\.\w+)?(?:\s+\.align\s+\d+)?)?"
                    r"\s+([\w$]+)(?:\[(\d+)\])?")
_DIRECTIVE = re.compile(r"^\s*\.(maxntid|reqntid|minnctapersm|maxnreg|reqnctapercluster|maxclusterrank|"
                        r"explicitcluster)\b\s*([\d,\s]*)")
_GLOBAL = re.compile(r"^\s*(?:\.(?:visible|extern|weak|common)\s+)?\.(global|const|shared)\s")
_SIZES = {"u8": 1, "s8": 1, "b8": 1, "u16": 2, "s16": 2, "b16": 2, "f16": 2, "u32": 4, "s32": 4,
          "b32": 4, "f32": 4, "u64": 8, "s64": 8, "b64": 8, "f64": 8}


def linescan_inspect(text: str) -> dict:
    entries, globals_, files, sections = [], [], [], []
    depth, in_block, cur, in_params, loc = 0, False, None, False, False
    version = target = None
    for line in text.splitlines():
        if in_block:
            if "*/" not in line:
                continue
            line = line.split("*/", 1)[1]
            in_block = False
        if "/*" in line:
            before, after = line.split("/*", 1)
            if "*/" in after:
                line = before + after.split("*/", 1)[1]
            else:
                line, in_block = before, True
        if "//" in line:
            line = line.split("//", 1)[0]
        s = line.strip()
        if not s:
            continue
        if depth == 0:
            if s.startswith(".version"):
                version = s.split()[1]
            elif s.startswith(".target"):
                target = s[7:].strip()
            elif s.startswith(".file"):
                files.append(s)
            elif s.startswith(".section"):
                sections.append(s.split()[1])
            m = _ENTRY.match(s)
            if m:
                cur = {"name": m.group(2), "params": [], "directives": {}}
                entries.append(cur)
                in_params = "(" in s and ")" not in s
            elif in_params:
                for p in _PARAM.finditer(s):
                    cur["params"].append((p.group(2), int(p.group(4) or 1) * _SIZES.get(p.group(2), 0)))
                if ")" in s:
                    in_params = False
            elif cur is not None and _DIRECTIVE.match(s):
                d = _DIRECTIVE.match(s)
                cur["directives"][d.group(1)] = d.group(2).strip()
            elif _GLOBAL.match(s):
                globals_.append(s)
        elif s.startswith(".loc"):
            loc = True
        depth += s.count("{") - s.count("}")
    return {"version": version, "target": target, "entries": entries, "globals": globals_,
            "files": files, "sections": sections, "loc": loc}


def linescan_strip(text: str) -> str:
    out = []
    in_section = False
    for line in text.splitlines(keepends=True):
        s = line.strip()
        if in_section:
            if "}" in s.split("//", 1)[0]:
                in_section = False
            continue
        if s.startswith(".section") and ".debug" in s:
            in_section = "}" not in s
            continue
        if s.startswith((".loc ", ".loc\t", ".file ", ".file\t", "@@DWARF")):  # (not .local)
            continue
        if s.startswith(".target") and "debug" in s:
            line = re.sub(r"\s*,\s*debug\b", "", line)
        out.append(line)
    return "".join(out)


# ----------------------------------------------------------------- timing


def best(fn, arg, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=10.0, help="MB of PTX per corpus")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--hostile", action="store_true", help="MB/s on hostile texts (goal: >= 5 MB/s each)")
    a = ap.parse_args()
    if a.hostile:
        return hostile(a.repeat)
    results = []
    print(f"best of {a.repeat}; MB/s and x the line scan (goals: strip_debug >= 2x, inspect_ptx >= 1.5x)")
    print(f"{'PTX':36}{'MB':>6}{'inspect':>9}{'scan':>7}{'x':>6}{'strip':>9}{'scan':>7}{'x':>6}")
    for label, path in CORPORA:
        text = build_text(a.mb, path)
        mb = len(text.encode()) / 1e6
        # both sides must agree on what they found / produced
        ours, base = inspect_ptx(text), linescan_inspect(text)
        assert [e.name for e in ours.entries] == [e["name"] for e in base["entries"]], label
        assert [len(e.params) for e in ours.entries] == [len(e["params"]) for e in base["entries"]], label
        assert strip_debug(text).rstrip() == linescan_strip(text).rstrip(), label  # (a last newline aside)
        rows = {}
        for key, fn in (("inspect_ptx", inspect_ptx), ("line-scan inspect", linescan_inspect),
                        ("strip_debug", strip_debug), ("line-scan strip", linescan_strip)):
            t = best(fn, text, a.repeat)
            rows[key] = {"seconds": t, "mb_per_s": mb / t}
        r_inspect = rows["line-scan inspect"]["seconds"] / rows["inspect_ptx"]["seconds"]
        r_strip = rows["line-scan strip"]["seconds"] / rows["strip_debug"]["seconds"]
        print(f"{label:36}{mb:6.1f}{rows['inspect_ptx']['mb_per_s']:9.1f}{rows['line-scan inspect']['mb_per_s']:7.1f}"
              f"{r_inspect:6.1f}{rows['strip_debug']['mb_per_s']:9.1f}{rows['line-scan strip']['mb_per_s']:7.1f}"
              f"{r_strip:6.1f}")
        results.append({"corpus": label, "file": path, "mb": mb, "kernels": len(ours.entries), "rows": rows,
                        "inspect_speedup": r_inspect, "strip_speedup": r_strip})
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


def hostile(repeat: int) -> None:
    """Each family of text that once made a reader super-linear, at about 1 MB."""
    import sys
    sys.path.insert(0, str(DATA.parent))
    from test_ptx import FAMILIES, STRIP_FAMILIES

    from nbjit import NbjitError

    def quiet(fn):
        def run(t):
            try:
                fn(t)
            except NbjitError:
                pass
        return run

    print(f"{'family':32}{'MB':>6}{'MB/s':>9}")
    for name, make in [*FAMILIES.items(), *STRIP_FAMILIES.items()]:
        text = make(1_000_000)
        fn = quiet(inspect_ptx if name in FAMILIES else strip_debug)
        t = best(fn, text, repeat)
        print(f"{name:32}{len(text) / 1e6:6.2f}{len(text) / 1e6 / t:9.1f}")


if __name__ == "__main__":
    main()
