"""nbjit.toolchain.sass: SASS through nvdisasm, checked against cuobjdump -sass (both from the test extra)."""
from __future__ import annotations

import re
import subprocess

import pytest

import nbjit
from cuobjdump_oracle import find_cuobjdump
from nbjit import NbjitError
from nbjit.toolchain import sass as S
from nbjit.read.cubin import inspect_cubin

from conftest import DATA  # noqa: E402

needs_nvdisasm = pytest.mark.skipif(S.find_nvdisasm() is None, reason="nvdisasm not installed (pip install "
                                    "nvidia-cuda-nvdisasm, in the test extra)")
CUBINS = ["nvrtc/spill_sm90.cubin", "nvrtc/spill_sm80.cubin", "nvcc/kernels_sm_100.cubin",
          "nvcc/kernels129_sm_80.cubin", "triton/matmul_kernel/matmul_kernel.cubin"]
_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def instructions(text: str) -> list[tuple[int, str]]:
    """(address, opcode) of each instruction in nvdisasm's or cuobjdump's listing."""
    return [(int(m[1], 16), m[3]) for m in _INSTR.finditer(text)]


def cuobjdump_sass(path) -> dict[str, list]:
    out = subprocess.run([find_cuobjdump(), "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    parts = re.split(r"\n\s*Function : (\S+)\n", out)
    return {parts[i]: instructions(parts[i + 1]) for i in range(1, len(parts), 2)}


@needs_nvdisasm
@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
@pytest.mark.parametrize("rel", CUBINS)
def test_same_instructions_as_cuobjdump(rel):
    data = (DATA / rel).read_bytes()
    oracle = cuobjdump_sass(DATA / rel)
    kernels = [e.name for e in inspect_cubin(data).entries]
    assert set(kernels) <= set(oracle)
    for k in kernels:
        ours = instructions(S.disassemble(data, kernel=k, name=rel))
        assert ours and ours == oracle[k], k
    whole = S.disassemble(data, name=rel)
    assert all(f".text.{k}" in whole for k in kernels)


@needs_nvdisasm
def test_spills_are_local_stores_and_loads():
    data = (DATA / "nvrtc/spill_sm90.cubin").read_bytes()
    ops = [op for _, op in instructions(S.disassemble(data, kernel="spills"))]
    assert any(op.startswith("STL") for op in ops) and any(op.startswith("LDL") for op in ops)
    assert not any(op.startswith(("STL", "LDL")) for _, op in instructions(S.disassemble(data, kernel="plain")))


@needs_nvdisasm
def test_kernel_sass_without_a_gpu():
    m = nbjit.load(DATA / "nvrtc/spill_sm90.cubin", lazy=True)
    text = m["tiled"].sass()
    assert ".text.tiled" in text and "BAR.SYNC" in text and ".text.plain" not in text


@needs_nvdisasm
def test_ptx_and_fatbin_give_the_cubin_for_an_arch():
    from nbjit.toolchain.nvjitlink import nvjitlink_version
    fat = S.cubin_for(DATA / "nvcc/kernels_multi.fatbin", "sm_86")  # its sm_80 SASS runs there
    assert inspect_cubin(fat).arch == "sm_80"
    from nbjit.read.ptx import cuda_for_ptx
    have = nvjitlink_version()
    if have is not None and tuple(have) >= cuda_for_ptx((9, 0)):  # (the PTX is 9.0: nvJitLink 12.x cannot)
        cub = S.cubin_for(DATA / "nvcc/kernels_sm90.ptx", "sm_90")
        assert inspect_cubin(cub).arch == "sm_90" and "k_basic" in S.disassemble(cub)
    with pytest.raises(NbjitError, match="give the architecture"):
        S.cubin_for(DATA / "nvcc/kernels_sm90.ptx")
    with pytest.raises(NbjitError, match="no readable entry of the fatbin runs on sm_70"):
        S.cubin_for(DATA / "nvcc/kernels_multi.fatbin", "sm_70")


@needs_nvdisasm
def test_bad_input_is_named():
    with pytest.raises(NbjitError, match="x.cubin: no function 'nope' in the cubin \\(it has plain, tiled"):
        S.disassemble((DATA / "nvrtc/spill_sm90.cubin").read_bytes(), kernel="nope", name="x.cubin")
    with pytest.raises(NbjitError, match="junk.cubin: nvdisasm could not disassemble it"):
        S.disassemble(b"\x7fELF" + b"\0" * 60, name="junk.cubin")


def test_missing_nvdisasm_says_what_to_install(monkeypatch):
    monkeypatch.setattr(S, "find_nvdisasm", lambda: None)
    with pytest.raises(NbjitError, match=r"k.cubin: SASS needs NVIDIA's nvdisasm.*"
                                         r"pip install -e '\.\[sass\]' in a checkout"):
        S.disassemble(b"", name="k.cubin")


def test_cubin_for_names_the_package_an_entry_needs(no_lz4):
    with pytest.raises(NbjitError, match=r"kernels_multi_lz4.fatbin: no readable entry of the fatbin runs on sm_100: "
                                         r"the one for it, compute_90, is lz4-compressed and 'lz4' is not installed "
                                         r"\(pip install lz4\)"):
        S.cubin_for(DATA / "nvcc/kernels_multi_lz4.fatbin", "sm_100")
