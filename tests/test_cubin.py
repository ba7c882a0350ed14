"""nbjit.read.cubin on nvcc, NVRTC, Triton and CUDA 12.9 cubins, checked against cuobjdump."""
from __future__ import annotations

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuobjdump_oracle import describe, find_cuobjdump
from nbjit import ImageFormatError, NbjitArgumentError, inspect_ptx
from nbjit.read.cubin import inspect_cubin

from conftest import DATA  # noqa: E402
CUBINS = sorted(p.relative_to(DATA).as_posix() for p in DATA.rglob("*.cubin"))


def cubin(rel: str):
    return inspect_cubin((DATA / rel).read_bytes(), source=rel)


def expected(rel: str) -> dict:
    return json.loads((DATA / "expected" / (rel.replace("/", "__") + ".json")).read_text())


@pytest.mark.parametrize("rel,arch,specific,abi", [
    ("nvcc/kernels_sm_80.cubin", "sm_80", False, 8),
    ("nvcc/kernels_sm_90.cubin", "sm_90", False, 8),
    ("nvcc/kernels_sm_90a.cubin", "sm_90a", True, 8),  # CUDA 13: the "a" is in .nv.compat only
    ("nvcc/kernels_sm_100.cubin", "sm_100", False, 8),
    ("nvcc/kernels129_sm_80.cubin", "sm_80", False, 7),  # CUDA 12.9: SM in the low e_flags byte
    ("nvcc/kernels129_sm_90a.cubin", "sm_90a", True, 7),
    ("nvrtc/tmpl_sm90.cubin", "sm_90", False, 8),
    ("triton/add_kernel/add_kernel.cubin", "sm_90a", True, 8),
])
def test_arch(rel, arch, specific, abi):
    c = cubin(rel)
    assert (c.arch, c.arch_specific, c.abi_version, c.address_size) == (arch, specific, abi, 64)


def test_virtual_arch_and_toolkit():
    assert (cubin("nvcc/kernels_sm_90.cubin").virtual_arch, cubin("nvcc/kernels_sm_90.cubin").toolkit) == (90, 130)
    assert cubin("nvcc/kernels129_sm_90a.cubin").virtual_arch == 80  # assembled from sm_80 PTX
    assert cubin("nvrtc/tmpl_sm90.cubin").toolkit == 135


def test_kernels_not_device_functions():
    c = cubin("nvcc/kernels_sm_90.cubin")
    assert sorted(e.name for e in c.entries) == sorted(e.name for e in inspect_ptx(
        (DATA / "nvcc/kernels_sm90.ptx").read_text()).entries)
    assert "_Z6helperf" not in {e.name for e in c.entries}


@pytest.mark.parametrize("cub,ptx", [
    ("nvcc/kernels_sm_80.cubin", "nvcc/kernels_sm80.ptx"),
    ("nvcc/kernels_sm_90.cubin", "nvcc/kernels_sm90.ptx"),
    ("nvcc/kernels_sm_100.cubin", "nvcc/kernels_sm90.ptx"),
    ("nvcc/kernels129_sm_90a.cubin", "nvcc/kernels_sm80.ptx"),
    ("nvcc/cluster_sm90.cubin", "nvcc/cluster_sm90.ptx"),
    ("nvrtc/tmpl_sm90.cubin", "nvrtc/tmpl_sm90.ptx"),
    ("triton/add_kernel/add_kernel.cubin", "triton/add_kernel/add_kernel.ptx"),
    ("triton/softmax_kernel/softmax_kernel.cubin", "triton/softmax_kernel/softmax_kernel.ptx"),
    ("triton/matmul_kernel/matmul_kernel.cubin", "triton/matmul_kernel/matmul_kernel.ptx"),
])
def test_params_agree_with_ptx(cub, ptx):
    """The PTX inspector's layout and the cubin's KPARAM_INFO must agree byte for byte."""
    c, p = cubin(cub), inspect_ptx((DATA / ptx).read_text())
    for ke in p.entries:
        kc = c.entry(ke.name)
        assert [(q.offset, q.size) for q in kc.params] == [(q.offset, q.size) for q in ke.params], ke.name
        assert kc.param_size == ke.param_size
        assert kc.linkage == ke.linkage
        assert all(q.type == "unknown" for q in kc.params)  # a cubin does not record types
        if "100" not in cub:  # pointer-ness is recorded for .ptr parameters (LLVM/Triton, sm_100)
            assert [q.pointer for q in kc.params] == [q.pointer for q in ke.params]


def test_pointer_spaces():
    t = cubin("triton/add_kernel/add_kernel.cubin").entries[0]
    assert [q.kind for q in t.params] == ["pointer"] * 3 + ["unknown"] * 2 + ["pointer"] * 2
    assert t.params[0].space == "global"
    k = cubin("nvcc/kernels_sm_100.cubin").entry("k_basic")  # nvcc writes .ptr for sm_100
    assert [q.pointer for q in k.params] == [True, True, False, False] and k.params[0].space is None


def test_directives_and_resources():
    c = cubin("nvcc/kernels_sm_90.cubin")
    lb = c.entry("k_lb")
    assert lb.directives.maxntid == (256, 1, 1)
    assert lb.directives.maxnreg == 128  # __launch_bounds__(256, 2) caps registers at 128
    assert lb.shared == 1024 and c.shared_reserved == 1024  # the 1 KiB tile, reserve excluded
    assert c.entry("k_basic").shared == 0
    cl = cubin("nvcc/cluster_sm90.cubin")
    assert cl.entry("k_cluster").directives.reqnctapercluster == (2, 1, 1)
    assert cl.entry("k_cluster").directives.explicitcluster
    assert cl.entry("k_rank").directives.maxclusterrank == 4
    assert cl.entry("k_maxnreg").directives.maxnreg == 32
    assert cubin("triton/matmul_ctas2/matmul_kernel.cubin").entries[0].directives.cluster == (2, 1, 1)
    assert cubin("triton/add_kernel/add_kernel.cubin").entries[0].directives.reqntid == (128, 1, 1)


@pytest.mark.parametrize("rel", ["nvcc/kernels_sm_90.cubin", "nvcc/kernels_rdc_sm_90.cubin"])
def test_globals(rel):
    info = cubin(rel)
    g = {x.name: x for x in info.globals}
    assert (g["g_arr"].space, g["g_arr"].size) == ("global", 64)
    assert (g["g_counter"].space, g["g_counter"].size) == ("global", 4)
    assert (g["c_tab"].space, g["c_tab"].size) == ("const", 32)
    assert not any(n.startswith("$") for n in g)
    assert info.relocatable == ("rdc" in rel)


def test_stack_of_called_functions():
    """-G keeps calls: a kernel's stack includes its callees' frames (cuobjdump's STACK)."""
    c = {e.name: e for e in cubin("nvcc/kernels_G_sm_90.cubin").entries}
    assert (c["k_globals"].local, c["k_globals"].stack) == (0, 24)  # atomicAdd's frame
    assert (c["k_small"].local, c["k_small"].stack) == (0, 56)  # its own frame is 8 bytes of the 56: stack, not local


def test_a_debug_build_reserves_its_shared_memory_as_the_system_does():
    """A -G cubin holds .nv_debug.shared where others hold .nv.shared.reserved: the 1 KiB
    the driver reserves per block (on the H200 its occupancy counted k_dyn with 20000 dynamic
    bytes as 11 blocks per SM, not the 10 that a further 1 KiB of static shared memory gives)."""
    info = cubin("nvcc/kernels_G_sm_90.cubin")
    c = {e.name: e for e in info.entries}
    assert info.shared_reserved == 1024 and (c["k_dyn"].shared, c["k_lb"].shared) == (0, 1024)


def test_alignment_is_not_guessed():
    """A cubin records offsets, not alignments: a {double, int, char} struct would look
    16-aligned at offset 0 (the PTX says 8)."""
    e = cubin("nvcc/kernels_sm_90.cubin").entry("k_struct")
    assert [p.align for p in e.params] == [None, None]
    assert e.to_json()["params"][0]["align"] is None


def compare(info, oracle: dict, rel: str) -> None:
    assert sorted(e.name for e in info.entries) == sorted(oracle), rel
    for e in info.entries:
        o = oracle[e.name]
        assert [[i, q.offset, q.size] for i, q in enumerate(e.params)] == [p[:3] for p in o["params"]], e.name
        assert e.param_size == o["param_size"]
        assert e.registers == o["reg"] and e.const == o["const0"] and (e.local, e.stack) == (o["local"], o["stack"])
        assert e.shared + (info.shared_reserved if o["shared"] else 0) == o["shared"]
        d = e.directives
        assert list(d.maxntid or []) == o.get("maxntid", []) and list(d.reqntid or []) == o.get("reqntid", [])
        assert list(d.reqnctapercluster or []) == o.get("cluster", [])
        assert d.explicitcluster == o.get("explicit_cluster", False)
        assert d.maxclusterrank == o.get("max_cluster_rank")
        assert info.max_registers[e.name] == o["maxreg"]
        assert e.frame == o.get("frame") and e.spills in (o.get("spills", 0), None), e.name
        if e.spills is None:  # unknown only where a stack frame could hold spills nobody annotated
            assert e.frame and info.toolkit is None


@pytest.mark.parametrize("rel", CUBINS)
def test_against_recorded_cuobjdump(rel):
    compare(cubin(rel), expected(rel), rel)


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
@pytest.mark.parametrize("rel", CUBINS)
def test_against_live_cuobjdump(rel):
    compare(cubin(rel), describe(str(DATA / rel)), rel)


# ---------------------------------------------------------------- bad input

GOOD = (DATA / "nvcc/kernels_sm_90.cubin").read_bytes()


def patched(data: bytes, off: int, new: bytes) -> bytes:
    return data[:off] + new + data[off + len(new):]


@pytest.mark.parametrize("data,msg", [
    (b"", "not an ELF"),
    (b"\x7fELF" + b"\0" * 10, "truncated ELF header"),
    (b"GARBAGE" * 20, "not an ELF"),
    (GOOD[:3000], "truncated"),
    (patched(GOOD, 4, b"\x01"), "32-bit"),
    (patched(GOOD, 18, (62).to_bytes(2, "little")), "not CUDA"),
    (patched(GOOD, 0x3C, (0xFFFF).to_bytes(2, "little")), "section header table"),
    (patched(GOOD, 0x28, (len(GOOD) * 4).to_bytes(8, "little")), "section header table"),
    (patched(GOOD, 0x3E, (0xFFF).to_bytes(2, "little")), "section name table index"),
])
def test_bad_cubins(data, msg):
    with pytest.raises(ImageFormatError, match=msg) as e:
        inspect_cubin(data, source="bad.cubin")
    assert "bad.cubin" in str(e.value)


def test_section_offset_beyond_end():
    shoff = int.from_bytes(GOOD[0x28:0x30], "little")
    bad = patched(GOOD, shoff + 64 * 2 + 24, (len(GOOD) + 100).to_bytes(8, "little"))  # section 2's offset
    with pytest.raises(ImageFormatError, match="runs past the end"):
        inspect_cubin(bad)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=st.sampled_from(["nvcc/kernels_sm_90.cubin", "triton/add_kernel/add_kernel.cubin",
                            "nvcc/kernels129_sm_80.cubin"]), data=st.data())
def test_fuzz_mutated_cubins(src, data):
    raw = bytearray((DATA / src).read_bytes())
    shoff = int.from_bytes(raw[0x28:0x30], "little")
    regions = [(0, 64), (shoff, len(raw)), (0, len(raw))]  # ELF header, section headers, anywhere
    for _ in range(data.draw(st.integers(1, 8))):
        op = data.draw(st.sampled_from(["byte", "word", "cut"]))
        a, b = data.draw(st.sampled_from(regions))
        b = min(b, len(raw))
        i = data.draw(st.integers(min(a, b - 1), b - 1))
        if op == "byte":
            raw[i] = data.draw(st.integers(0, 255))
        elif op == "word":
            raw[i: i + 4] = data.draw(st.sampled_from([b"\xff\xff\xff\xff", b"\0\0\0\0", b"\xff\xff\0\0"]))
        else:
            del raw[i:]
            if not raw:
                break
    try:
        inspect_cubin(bytes(raw))
    except ImageFormatError:
        pass


def test_overlapping_parameters_are_a_format_error():
    """Two KPARAM_INFO records that claim the same bytes: an ImageFormatError, not a
    ValueError from the packer later."""
    raw = bytearray((DATA / "nvcc/kernels_sm_90.cubin").read_bytes())
    info = inspect_cubin(bytes(raw))
    k = info.entry("k_basic")
    # find k_basic's KPARAM_INFO record for ordinal 1 (offset 8) and move it to offset 4
    rec = struct.pack("<BBH", 4, 0x17, 12) + struct.pack("<IHH", 0, 1, 8)
    at = raw.find(rec)
    assert at != -1 and k.params[1].offset == 8
    raw[at + 10: at + 12] = struct.pack("<H", 4)
    with pytest.raises(ImageFormatError, match="parameters 0 .* and 1 .* overlap"):
        inspect_cubin(bytes(raw))


def test_a_declared_struct_that_does_not_fit_is_an_argument_error():
    from nbjit.launch.arguments import ArgPacker
    from nbjit.params.signature import KernelSignature, Param
    sig = KernelSignature((Param("a", "b8", 24, 8, 0, 24), Param("b", "u64", 8, 8, 16)), 24)
    with pytest.raises(NbjitArgumentError, match="do not fit one after another"):
        ArgPacker(sig, "k")


def synthetic_cubin(n: int) -> bytes:
    """A CUDA ELF with ``n`` kernels, each with its .text and .nv.info sections and a
    KPARAM_INFO record: the shape that once made inspect_cubin O(kernels x sections)."""
    names = [f"k{i}" for i in range(n)]
    shnames = [b"", b".shstrtab", b".strtab", b".symtab"]
    for k in names:
        shnames += [f".text.{k}".encode(), f".nv.info.{k}".encode()]
    shstr = b"\0".join(shnames) + b"\0"
    sh_off = [0]
    for nm in shnames[1:]:
        sh_off.append(shstr.index(b"\0" + nm + b"\0") + 1)
    strtab = b"\0" + b"\0".join(k.encode() for k in names) + b"\0"
    name_off, pos = [], 1
    for k in names:
        name_off.append(pos)
        pos += len(k) + 1
    syms = bytes(24)
    for i in range(n):  # STT_FUNC, GLOBAL binding, STO_CUDA_ENTRY, in .text.k<i> (section 4 + 2i)
        syms += struct.pack("<IBBHQQ", name_off[i], (1 << 4) | 2, 0x10, 4 + 2 * i, 0, 16)
    info = struct.pack("<BBH", 4, 0x17, 12) + struct.pack("<IHHI", 0, 0, 0, (8 << 18)) + \
        struct.pack("<BBH", 3, 0x19, 8)
    text = b"\0" * 16
    blobs = [shstr, strtab, syms] + [text, info] * n
    data_off = 64
    offsets = []
    for b in blobs:
        offsets.append(data_off)
        data_off += len(b)
    shoff = data_off
    headers = [bytes(64)]
    types = [3, 3, 2] + [1, 0x70000000] * n
    for i, (b, t) in enumerate(zip(blobs, types)):
        link = 2 if t == 2 else 0
        info_field = (4 + 2 * ((i - 4) // 2)) if t == 0x70000000 else (1 if t == 2 else 0)
        headers.append(struct.pack("<IIQQQQIIQQ", sh_off[i + 1], t, 0, 0, offsets[i], len(b), link, info_field, 8,
                                   24 if t == 2 else 0))
    ehdr = b"\x7fELF" + bytes([2, 1, 1, 0x41, 8]) + bytes(7) + struct.pack(
        "<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 90 << 8, 64, 0, 0, 64, len(headers), 1)
    return ehdr + b"".join(blobs) + b"".join(headers)


def test_many_kernels_inspect_in_linear_time():
    from conftest import assert_linear
    info = inspect_cubin(synthetic_cubin(12000))
    assert len(info.entries) == 12000 and info.entries[-1].params[0].size == 8
    assert_linear(inspect_cubin, synthetic_cubin, 1500)


@pytest.mark.parametrize("tag", ["sm90", "sm80"])
def test_spills_and_frames_against_ptxas_report(tag):
    """ptxas -v's report (kept beside the fixture) and the cubin's own records agree: the
    stack frame, the registers, and which kernels spill (the local array has a frame, no spill)."""
    import re
    log = (DATA / f"nvrtc/spill_{tag}.log").read_text()
    report = {m[0]: tuple(map(int, m[1:])) for m in re.findall(
        r"Function properties for (\w+)\n.*?(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
        r"loads\n.*?Used (\d+) registers", log)}
    info = cubin(f"nvrtc/spill_{tag}.cubin")
    assert sorted(report) == sorted(e.name for e in info.entries)
    for e in info.entries:
        frame, stores, loads, regs = report[e.name]
        assert (e.frame, e.registers, e.spills > 0) == (frame, regs, stores + loads > 0), e.name
    assert info.entry("local_array").frame == 128 and info.entry("local_array").spills == 0
    assert info.entry("spills").spills > 100 and info.entry("spills").to_json()["spills"] == info.entry("spills").spills
