"""Assemble PTX on the host for tests: ptxas where its version takes the PTX, else nvJitLink."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest


def ptxas_version() -> tuple[int, int] | None:
    exe = shutil.which("ptxas")
    if not exe:
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


# PTX ISA version a CUDA release accepts at most (FORMATS.md §5.4): 12.x -> 8.x, 13.x -> 9.x.
def _max_isa(cuda: tuple[int, int]) -> tuple[int, int]:
    major, minor = cuda
    if major >= 13:
        return (9, minor)
    return (8, {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 5, 8: 7, 9: 8}.get(minor, 0))


def assemble(ptx: str, arch: str, version: tuple[int, int]) -> str:
    """Assemble; return the tool used. Fails the test with the assembler's log on error;
    skips when no assembler can take this PTX."""
    pv = ptxas_version()
    if pv is not None and version <= _max_isa(pv):
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "in.ptx"
            src.write_text(ptx)
            r = subprocess.run(["ptxas", f"-arch={arch}", str(src), "-o", str(Path(d) / "out.cubin")],
                               capture_output=True, text=True)
            if r.returncode != 0:
                pytest.fail(f"ptxas rejected the PTX:\n{r.stderr}")
            return "ptxas"
    from nbjit.toolchain.nvjitlink import assemble_ptx, nvjitlink_version

    nv = nvjitlink_version()
    if nv is None or version > _max_isa(nv):
        pytest.skip(f"no assembler for PTX {version[0]}.{version[1]} (ptxas {pv}, nvJitLink {nv})")
    assemble_ptx(ptx, arch)
    return "nvJitLink"
