"""Telling images apart by content: nbjit.read.image.sniff / as_image / inspect_image."""
from __future__ import annotations

from pathlib import Path

import pytest

from nbjit import ImageFormatError
from nbjit.read.cubin import CubinInfo
from nbjit.read.fatbin import FatbinInfo
from nbjit.read.image import Image, as_image, inspect_image, sniff
from nbjit.read.ptx import PtxInfo

from conftest import DATA  # noqa: E402


@pytest.mark.parametrize("rel,kind", [
    ("nvcc/kernels_sm90.ptx", "ptx"), ("numba/axpy_debug.ptx", "ptx"), ("triton/add_kernel/add_kernel.ptx", "ptx"),
    ("nvcc/kernels_sm_90.cubin", "cubin"), ("nvcc/kernels129_sm_80.cubin", "cubin"),
    ("nvcc/kernels_multi.fatbin", "fatbin"), ("hand/traps.ptx", "ptx")])
def test_sniff_real_files(rel, kind, tmp_path):
    raw = (DATA / rel).read_bytes()
    assert sniff(raw) == kind
    # by content, never by name
    p = tmp_path / "misnamed.bin"
    p.write_bytes(raw)
    assert Image.from_path(p).kind == kind
    info = inspect_image(p)
    assert isinstance(info, {"ptx": PtxInfo, "cubin": CubinInfo, "fatbin": FatbinInfo}[kind])


def test_nvrtc_ptx_with_trailing_nul():
    assert sniff((DATA / "nvrtc/tmpl_sm90.ptx").read_bytes() + b"\0") == "ptx"


def lto_ir() -> bytes:
    from cuda.bindings import nvrtc as N
    err, prog = N.nvrtcCreateProgram(b'extern "C" __global__ void k(float* x) { x[0] = 1; }', b"k.cu", 0, [], [])
    N.nvrtcCompileProgram(prog, 2, [b"-arch=sm_90", b"-dlto"])
    err, n = N.nvrtcGetLTOIRSize(prog)
    buf = bytearray(n)  # NVRTC writes here: never a bytes object (CPython shares small ones)
    N.nvrtcGetLTOIR(prog, buf)
    N.nvrtcDestroyProgram(prog)
    return buf


@pytest.mark.parametrize("make,msg", [
    (lto_ir, "LTO-IR"),
    (lambda: b"BC\xc0\xde" + b"\0" * 60, "LLVM bitcode"),
    (lambda: (DATA / "src/kernels.cu").read_bytes(), "CUDA C\\+\\+ source"),
    (lambda: b"; ModuleID = 'k'\ntarget triple = \"nvptx64-nvidia-cuda\"\n", "LLVM IR text"),
    (lambda: Path("/bin/sh").resolve().read_bytes()[:4096], "host"),
    # a cubin cut before its header says what machine it is for (it was called a host file)
    (lambda: (DATA / "nvcc/kernels_sm_90.cubin").read_bytes()[:10], r"^thing: a truncated ELF file \(shorter than "),
    (lambda: b"", "empty"),
    (lambda: b"\x01\x02\x03\x00\x00\x05garbage", "neither PTX"),
    (lambda: (DATA.parent.parent / "examples/bundle_package/src/nbjit_demo_kernels/kernels.nbjit").read_bytes(),
     r"^thing: a ZIP archive \(a kernel bundle\?\), not a kernel image: load a bundle with nbjit.load_bundle"),
    (lambda: b"just some words\n", "not PTX"),
])
def test_sniff_rejects_with_advice(make, msg):
    with pytest.raises(ImageFormatError, match=msg):
        sniff(make(), "thing")


def test_as_image_forms(tmp_path):
    text = (DATA / "nvcc/kernels_sm90.ptx").read_text()
    assert as_image(text).kind == "ptx"
    assert as_image(str(DATA / "nvcc/kernels_sm_90.cubin")).kind == "cubin"
    assert as_image(DATA / "nvcc/kernels_multi.fatbin").kind == "fatbin"
    img = as_image(text.encode(), name="k.ptx")
    assert img.name == "k.ptx" and as_image(img) is img
    assert len(img.sha256) == 64 and len(img.digest) == 64 and img.digest != img.sha256
    assert as_image(text.encode(), name="other.ptx").digest == img.digest  # the bytes name it, not the name
    with pytest.raises(ImageFormatError, match="no such file"):
        as_image(str(tmp_path / "missing.ptx"))
    with pytest.raises(TypeError):
        as_image(42)
    with pytest.raises(ImageFormatError, match="an image is a path, bytes, PTX text or nbjit.Image, not list"):
        as_image([1, 2])


def test_a_str_is_text_when_it_spans_lines_else_a_path(tmp_path, monkeypatch):
    """A path whose name holds '.version' is still a path; text with line breaks is PTX."""
    text = (DATA / "nvcc/kernels_sm90.ptx").read_text()
    f = tmp_path / "k.version.ptx"
    f.write_text(text)
    assert as_image(str(f)).name == str(f)
    monkeypatch.chdir(tmp_path)
    assert as_image("k.version.ptx").kind == "ptx"
    assert as_image(text).name == "<ptx>"
    with pytest.raises(ImageFormatError, match="no such file, and not PTX text either"):
        as_image("missing.ptx")


@pytest.mark.parametrize("reader", ["inspect_cubin", "inspect_fatbin", "inspect_ptx"])
def test_readers_check_their_input_type(reader):
    import nbjit
    with pytest.raises(nbjit.NbjitError, match="not int"):
        getattr(nbjit, reader)(2 ** 40)  # never bytes(2**40)
