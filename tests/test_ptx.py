"""nbjit.read.ptx on real compiler output (nvcc, NVRTC, Numba, Triton) and hand-written edge cases."""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assembler import assemble
from nbjit import PtxParseError, inspect_ptx, strip_debug
from nbjit.read.ptx import set_version

from conftest import DATA  # noqa: E402
ALL_PTX = sorted(p.relative_to(DATA).as_posix() for p in DATA.rglob("*.ptx"))
DEBUG_PTX = [
    "nvcc/kernels_G_sm90.ptx", "nvcc/kernels_lineinfo_sm90.ptx", "nvrtc/tmpl_G_sm90.ptx",
    "nvrtc/tmpl_lineinfo_sm90.ptx", "numba/axpy_debug.ptx", "numba/axpy_lineinfo.ptx",
    "triton/add_kernel/add_kernel.ptx", "triton/softmax_kernel/softmax_kernel.ptx",
    "triton/matmul_kernel/matmul_kernel.ptx",
]


def read(rel: str) -> str:
    return (DATA / rel).read_text()


def info(rel: str):
    return inspect_ptx(read(rel), source=rel)


# ---------------------------------------------------------------- header


@pytest.mark.parametrize("rel,version,targets", [
    ("nvcc/kernels_sm90.ptx", (9, 0), ("sm_90",)),
    ("nvcc/kernels_sm80.ptx", (9, 0), ("sm_80",)),
    ("nvrtc/tmpl_sm90.ptx", (9, 5), ("sm_90",)),
    ("numba/axpy_plain.ptx", (9, 5), ("sm_90",)),
    ("triton/add_kernel/add_kernel.ptx", (9, 4), ("sm_90a",)),
    ("hand/traps.ptx", (8, 3), ("sm_90", "texmode_independent")),
])
def test_header(rel, version, targets):
    i = info(rel)
    assert i.version == version
    assert i.targets == targets
    assert i.arch == targets[0]
    assert i.address_size == 64


def test_target_debug_flag():
    assert info("nvcc/kernels_G_sm90.ptx").debug.target_debug
    assert not info("nvcc/kernels_lineinfo_sm90.ptx").debug.target_debug
    assert info("nvcc/kernels_G_sm90.ptx").targets == ("sm_90",)


# ---------------------------------------------------------------- nvcc entries and params


def test_nvcc_entries_in_file_order():
    names = [e.name for e in info("nvcc/kernels_sm90.ptx").entries]
    assert names == ["k_basic", "k_struct", "k_arr", "k_lb", "k_dyn", "k_small", "k_widths", "k_globals",
                     "_Z6k_tmplIfEvPT_S0_i", "_Z6k_tmplIiEvPT_S0_i", "_Z9k_mangledPi"]


def layout_of(entry):
    return [(p.type, p.count, p.size, p.align, p.offset) for p in entry.params]


def test_nvcc_param_layouts():
    i = info("nvcc/kernels_sm90.ptx")
    basic = i.entry("k_basic")
    assert layout_of(basic) == [("u64", None, 8, 8, 0), ("u64", None, 8, 8, 8),
                                ("f32", None, 4, 4, 16), ("u32", None, 4, 4, 20)]
    assert basic.param_size == 24
    assert [p.name for p in basic.params] == [f"k_basic_param_{n}" for n in range(4)]
    struct = i.entry("k_struct")  # 24-byte struct by value
    assert layout_of(struct) == [("b8", 24, 24, 8, 0), ("u64", None, 8, 8, 24)]
    assert struct.params[0].kind == "struct" and struct.params[1].kind == "scalar"
    assert struct.param_size == 32
    small = i.entry("k_small")  # __half, bf16, bool, char, short, float*
    assert [(p.type, p.count, p.offset) for p in small.params] == [
        ("b8", 2, 0), ("b8", 2, 2), ("u8", None, 4), ("u8", None, 5), ("u16", None, 6), ("u64", None, 8)]
    assert small.param_size == 16
    widths = i.entry("k_widths")
    assert [p.type for p in widths.params] == ["u8", "u8", "u16", "u16", "u32", "u32", "u64", "u64",
                                               "f32", "f64", "u64"]
    assert [p.offset for p in widths.params] == [0, 1, 2, 4, 8, 12, 16, 24, 32, 40, 48]
    assert widths.param_size == 56


def test_nvcc_directives():
    i = info("nvcc/kernels_sm90.ptx")
    lb = i.entry("k_lb").directives
    assert lb.maxntid == (256, 1, 1) and lb.minnctapersm == 2 and lb.reqntid is None
    assert i.entry("k_basic").directives.to_json() == {}
    c = info("nvcc/cluster_sm90.ptx")
    k = c.entry("k_cluster").directives
    assert k.explicitcluster and k.reqnctapercluster == (2, 1, 1) and k.cluster == (2, 1, 1)
    assert c.entry("k_rank").directives.maxclusterrank == 4
    assert c.entry("k_maxnreg").directives.maxnreg == 32


def test_nvcc_globals_functions_dynamic_shared():
    i = info("nvcc/kernels_sm90.ptx")
    g = {v.name: v for v in i.globals}
    assert (g["g_arr"].space, g["g_arr"].size, g["g_arr"].align, g["g_arr"].initialized) == ("global", 64, 4, True)
    assert (g["g_counter"].type, g["g_counter"].size, g["g_counter"].initialized) == ("u32", 4, False)
    assert (g["c_tab"].space, g["c_tab"].size) == ("const", 32)
    assert [d.name for d in i.dynamic_shared] == ["dsm"] and g["dsm"].align == 16
    # the demoted __shared__ tile lives in k_lb's body, not at module scope
    assert "_ZZ4k_lbE4tile" not in g
    assert [(f.name, f.defined) for f in i.functions] == [("_Z6helperf", True)]


def test_nvcc_sm80_same_entries_as_sm90():
    a, b = info("nvcc/kernels_sm80.ptx"), info("nvcc/kernels_sm90.ptx")
    assert [e.to_json() for e in a.entries] == [e.to_json() for e in b.entries]


# ---------------------------------------------------------------- other producers


def test_nvrtc_weak_template_entries():
    i = info("nvrtc/tmpl_sm90.ptx")
    names = json.loads(read("nvrtc/tmpl_sm90.names.json"))
    linkage = {e.name: e.linkage for e in i.entries}
    for expr, mangled in names.items():
        assert mangled in linkage, expr
    assert linkage["plain"] == "visible"
    assert linkage[names["fill<float>"]] == "weak"
    op = i.entry(names["ns::op<float, 4>"])
    assert [(p.type, p.offset) for p in op.params] == [("u64", 0), ("u64", 8), ("u32", 16)]


def test_numba_kernel_params():
    i = info("numba/axpy_plain.ptx")
    (k,) = i.entries
    # two 1-D arrays (7 words each), a float32 and an int32
    assert len(k.params) == 16
    assert [p.type for p in k.params[-2:]] == ["f32", "u32"]
    assert k.param_size == 14 * 8 + 4 + 4
    assert any(g.linkage == "common" for g in i.globals)


def test_triton_kernel():
    i = info("triton/add_kernel/add_kernel.ptx")
    (k,) = i.entries
    assert k.name == "add_kernel" and k.linkage == "visible"
    assert [p.kind for p in k.params] == ["pointer"] * 3 + ["scalar"] * 2 + ["pointer"] * 2
    assert all(p.space == "global" and p.pointee_align == 1 for p in k.params if p.pointer)
    assert k.directives.reqntid == (128,)
    assert i.metadata == {}  # Triton keeps its metadata in the JSON beside the PTX
    mm = info("triton/matmul_kernel/matmul_kernel.ptx")
    assert [g.name for g in mm.dynamic_shared] == ["global_smem"]
    assert mm.entries[0].directives.reqntid == (256,)
    c2 = info("triton/matmul_ctas2/matmul_kernel.ptx")
    assert c2.entries[0].directives.reqnctapercluster == (2,)


# ---------------------------------------------------------------- metadata comments


def with_comments(rel: str, *lines: str) -> str:
    return "\n".join(lines) + "\n" + read(rel)


def test_meta_comments_parsed():
    text = with_comments("triton/matmul_kernel/matmul_kernel.ptx",
                         "// meta:name=matmul_kernel", "// meta:num_warps=8", "// meta:num_ctas=1",
                         "// meta:shared=65536", "// meta:tmem_size=0", "// meta:global_scratch_size=128",
                         "// meta:global_scratch_align=16", "// meta:profile_scratch_size=0",
                         "// meta:profile_scratch_align=1")
    i = inspect_ptx(text)
    assert i.metadata == {"name": "matmul_kernel", "num_warps": 8, "num_ctas": 1, "shared": 65536,
                          "tmem_size": 0, "global_scratch_size": 128, "global_scratch_align": 16,
                          "profile_scratch_size": 0, "profile_scratch_align": 1}


def test_meta_wins_over_legacy():
    text = with_comments("triton/softmax_kernel/softmax_kernel.ptx",
                         "// TRITON_SHARED_MEM_BYTES: 1024", "// TRITON_GLOBAL_SCRATCH_BYTES_PER_CTA: 64",
                         "// TRITON_GLOBAL_SCRATCH_ALIGN: 8", "// meta:shared=32")
    i = inspect_ptx(text)
    assert i.metadata == {"shared": 32, "global_scratch_size": 64, "global_scratch_align": 8}  # as written


def test_meta_inside_string_or_block_comment_is_not_metadata():
    text = read("nvcc/kernels_sm90.ptx") + '\n/*\n// meta:shared=99\n*/\n'
    assert inspect_ptx(text).metadata == {}


# ---------------------------------------------------------------- comments and strings


def test_traps_comments_and_strings_do_not_confuse():
    i = info("hand/traps.ptx")
    assert [(e.name, e.linkage) for e in i.entries] == [
        ("k_all", "visible"), ("k_weak", "weak"), ("k_nolink", None), ("k_rank", "visible")]
    assert "fake_var" not in {g.name for g in i.globals}
    assert i.debug.files == ((1, "we{ir}d (x);dir/k;{(.cu"),)
    assert [(f.name, f.noreturn) for f in i.functions] == [("helper_ret", False), ("helper_void", True)]
    k = i.entry("k_all")
    assert len(k.params) == 22 and k.param_size == 192
    p = {q.name: q for q in k.params}
    assert (p["p_gptr"].pointer, p["p_gptr"].space, p["p_gptr"].pointee_align) == (True, "global", 16)
    assert (p["p_sptr"].space, p["p_generic"].space, p["p_generic"].pointee_align) == ("shared", None, 8)
    assert (p["p_arr"].count, p["p_arr"].size, p["p_arr"].offset) == (3, 12, 96)
    assert (p["p_big"].align, p["p_big"].offset, p["p_struct"].offset, p["p_b128"].offset) == (16, 112, 152, 176)
    assert p["p_f16"].type == "f16" and p["p_ptr"].kind == "scalar"
    assert i.entry("k_weak").directives.reqntid == (8, 4, 2)
    assert i.entry("k_nolink").params == ()


def test_legacy_directives():
    d = info("hand/legacy_directives.ptx").entries[0].directives
    assert d.maxnctapersm == 2 and d.noreturn and d.maxntid == (64,)


def test_bytes_input_and_trailing_nul():
    raw = (DATA / "nvrtc/tmpl_sm90.ptx").read_bytes() + b"\0"
    assert [e.name for e in inspect_ptx(raw).entries] == [e.name for e in info("nvrtc/tmpl_sm90.ptx").entries]


# ---------------------------------------------------------------- debug info


@pytest.mark.parametrize("rel,kind", [
    ("nvcc/kernels_sm90.ptx", "none"), ("nvcc/kernels_G_sm90.ptx", "dwarf"),
    ("nvrtc/tmpl_lineinfo_sm90.ptx", "lineinfo"),  # line info plus a .debug_str for inlined code
    ("numba/axpy_lineinfo.ptx", "lineinfo"), ("numba/axpy_debug.ptx", "dwarf"),
    ("triton/add_kernel/add_kernel.ptx", "dwarf"), ("hand/traps.ptx", "lineinfo"),
])
def test_debug_kind(rel, kind):
    assert info(rel).debug.kind == kind


def test_debug_details():
    d = info("nvcc/kernels_G_sm90.ptx").debug
    assert d.sections == (".debug_abbrev", ".debug_info", ".debug_macinfo")
    assert d.lineinfo and d.files and d.target_debug
    assert info("numba/axpy_debug.ptx").debug.sections == (".debug_loc", ".debug_abbrev", ".debug_info")


# ---------------------------------------------------------------- strip_debug


def is_subsequence(small: list[str], big: list[str]) -> bool:
    it = iter(big)
    return all(any(line == b for b in it) for line in small)


@pytest.mark.parametrize("rel", DEBUG_PTX)
@pytest.mark.parametrize("keep_lineinfo", [False, True])
def test_strip_debug_assembles(rel, keep_lineinfo):
    text = read(rel)
    before = inspect_ptx(text)
    out = strip_debug(text, keep_lineinfo=keep_lineinfo)
    after = inspect_ptx(out)
    assert after.debug.sections == () and not after.debug.target_debug
    assert after.debug.kind == ("lineinfo" if keep_lineinfo else "none")
    assert [e.to_json() for e in after.entries] == [e.to_json() for e in before.entries]
    # every other byte is left alone: what remains are the original lines, in order,
    # apart from the edited .target and .loc lines
    changed = re.compile(r"^\s*\.(target|loc)\b")
    kept = [ln for ln in out.splitlines() if not changed.match(ln)]
    assert is_subsequence(kept, text.splitlines())
    assert strip_debug(out, keep_lineinfo=keep_lineinfo) == out  # idempotent
    assemble(out, before.targets[0], before.version)


@pytest.mark.parametrize("rel, kind", [("nvcc/kernels_G_sm_90.cubin", "cubin"),
                                       ("nvcc/kernels_multi.fatbin", "fatbin")])
def test_compiled_code_given_as_ptx_is_named_as_what_it_is(rel, kind):
    """strip_debug(cubin bytes) once said "<ptx>: not UTF-8 text (byte 18)" where the command says
    "is a cubin, not PTX": the API says what the bytes are, and what to do."""
    data = (DATA / rel).read_bytes()
    with pytest.raises(PtxParseError, match=rf"^<ptx>: a {kind}, not PTX: strip_debug removes debug information "
                                            r"from PTX text \(for a cubin or fatbin without it, build without -G"):
        strip_debug(data)
    with pytest.raises(PtxParseError, match=rf"^k\.bin: a {kind}, not PTX: read it with nbjit\.inspect_image$"):
        inspect_ptx(data, source="k.bin")
    with pytest.raises(PtxParseError, match=r"^<ptx>: not UTF-8 text \(byte 0\)$"):
        strip_debug(b"\xff" + data[1:])  # (binary that is neither)


@pytest.mark.parametrize("rel", ["nvcc/kernels_sm90.ptx", "nvrtc/tmpl_sm90.ptx", "numba/axpy_plain.ptx"])
def test_strip_debug_leaves_plain_ptx_alone(rel):
    assert strip_debug(read(rel)) == read(rel)


def test_strip_keeps_loc_without_inlined_tails():
    out = strip_debug(read("nvcc/kernels_lineinfo_sm90.ptx"), keep_lineinfo=True)
    assert "function_name" not in out and "inlined_at" not in out
    assert re.search(r"^\s*\.loc\s+\d+\s+\d+\s+\d+\s*$", out, re.M)


def test_strip_block_comments_are_respected():
    text = read("nvcc/kernels_G_sm90.ptx") + "\n/* .section .debug_fake { .b8 1 }\n.loc 1 2 3 */\n"
    out = strip_debug(text)
    assert out.endswith("/* .section .debug_fake { .b8 1 }\n.loc 1 2 3 */\n")
    assert inspect_ptx(out).debug.kind == "none"
    assemble(out, "sm_90", (9, 0))


def test_strip_legacy_dwarf_lines():
    text = read("nvcc/kernels_sm90.ptx") + '@@DWARF .section .debug_info, "",@progbits\n@@DWARF .byte 0x95, 0x02\n'
    assert inspect_ptx(text).debug.dwarf_legacy
    out = strip_debug(text)
    assert out == read("nvcc/kernels_sm90.ptx")


def test_set_version():
    out = set_version(read("numba/axpy_plain.ptx"), (9, 0))
    assert inspect_ptx(out).version == (9, 0)
    assemble(out, "sm_90", (9, 0))


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("text,msg,line", [
    ("", "no '.version", None),
    (".version 9.0\n.address_size 64\n", "no '.target'", 1),
    (".version 9.0\n.target sm_90\n.visible .entry k(\n.param .u64 a\n{\nret;\n", "unclosed '('", 3),
    (".version 9.0\n.target sm_90\n.visible .entry k(.param .u64 a)\n{\nret;\n", "unterminated body", 4),
    (".version 9.0\n.target sm_90\n.visible .entry k(.param .q32 a)\n{\nret;\n}\n", "unknown type", 3),
    (".version 9.0\n.target sm_90\n.visible .entry k(.param .u32 (a))\n{\nret;\n}\n", "unbalanced", 3),
    (".version 9.0\n.target sm_90\n.visible .entry k(.param .u32)\n{\nret;\n}\n", "no name", 3),
    (".version 9.0\n.target sm_90\n.visible .entry k()\n.maxntid 1,2,3,4\n{\nret;\n}\n", "1 to 3", 3),
    (".version 9.0\n.target sm_90\n.visible .entry k()\n.frobnicate 3\n{\nret;\n}\n", "unknown directive", 3),
    (".version 9.0\n.target sm_90\n\x00\x01\x02junk", "binary", 3),
    (".version 9.0\n.target sm_90\n/* never closed\n", "unterminated /*", 3),
    (".version 9.0\n.target sm_90\n.file 1 \"open\n", "unterminated string", 3),
])
def test_malformed_ptx(text, msg, line):
    with pytest.raises(PtxParseError, match=re.escape(msg)) as e:
        inspect_ptx(text, source="bad.ptx")
    assert e.value.line == line
    assert str(e.value).startswith("bad.ptx")


def test_not_utf8():
    with pytest.raises(PtxParseError, match="UTF-8"):
        inspect_ptx(b".version 9.0\n\xff\xfe")


def test_truncated_real_file_names_line():
    text = read("nvcc/kernels_sm90.ptx")
    cut = text[: text.index("k_lb(") + 400]
    with pytest.raises(PtxParseError, match="k_lb") as e:
        inspect_ptx(cut)
    brace = cut.index("{", cut.index("k_lb("))
    assert e.value.line == cut[:brace].count("\n") + 1


FUZZ_SOURCES = ["nvcc/kernels_sm90.ptx", "hand/traps.ptx", "triton/add_kernel/add_kernel.ptx",
                "nvcc/kernels_G_sm90.ptx"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=st.sampled_from(FUZZ_SOURCES), data=st.data())
def test_fuzz_mutated_fixtures(src, data):
    text = read(src)
    n = len(text)
    op = data.draw(st.sampled_from(["cut", "delete", "insert", "replace"]))
    a = data.draw(st.integers(0, n))
    if op == "cut":
        text = text[:a]
    elif op == "delete":
        b = data.draw(st.integers(a, min(n, a + 200)))
        text = text[:a] + text[b:]
    elif op == "insert":
        junk = data.draw(st.text(alphabet=st.sampled_from(list("{}();,.[]\"/*\n \x00abc0123") + ["\u00e9"]),
                                 min_size=1, max_size=8))
        text = text[:a] + junk + text[a:]
    else:
        ch = data.draw(st.sampled_from(list("{}();,.[]\"/*\n x9")))
        text = text[:a] + ch + text[a + 1:]
    for fn in (inspect_ptx, strip_debug):
        try:
            fn(text)
        except PtxParseError:
            pass


def test_strip_truncated_section_with_comments_is_linear():
    # a debug section cut before its '}' with long '//' comments in the body: once made the
    # section pattern backtrack exponentially (found by the fuzz test above)
    text = read("nvcc/kernels_G_sm90.ptx")
    cut = text[: text.index(".section\t.debug_info") + 200] + "\n// " + "x y " * 40 + "\n.b8 1 // z z z z z z z\n"
    with pytest.raises(PtxParseError, match=r"cannot strip debug section \.debug_info: its '\{ \.\.\. \}' body is "
                                            "missing"):
        strip_debug(cut)  # a section stripping cannot close is an error, not output that keeps it


# ---------------------------------------------------------------- hostile input: linear time

import time  # noqa: E402

H = ".version 8.0\n.target sm_90\n.address_size 64\n"
FAMILIES = {
    "one-line kernels": lambda n: H + "".join(f".visible .entry k{i}(){{ret;}}\n" for i in range(n // 30)),
    "indented closing braces": lambda n: H + "".join(f".visible .entry k{i}()\n{{\nret;\n  }}\n"
                                                     for i in range(n // 34)),
    ".entry in a comment": lambda n: H + "// " + ".entry " * (n // 7) + "\n",
    ".loc in a comment": lambda n: H + "// " + ".loc " * (n // 5) + "\n",
    "';' run in a comment": lambda n: H + ".visible .entry k()//" + ";" * n + "\n{\nret;\n}\n",
    ".entry in a .pragma string": lambda n: H + '.pragma "' + ".entry " * (n // 7) + '";\n',
    ".global without ';'": lambda n: H + ".global .u32 x\n" * (n // 15),
    ".visible chain": lambda n: H + ".visible " * (n // 9) + ".entry k(){ret;}\n",
    "many kernels on one line": lambda n: H + "".join(f".entry k{i}(){{ret;}} " for i in range(n // 20)),
    "a long parameter list, bad at its end": lambda n: H + ".visible .entry k(" + ".param .u32 p, " * (n // 15)
    + ".param .u32 )\n{\nret;\n}\n",
    "stars and quotes in a comment": lambda n: H + "// " + '*"' * (n // 2) + "\n.visible .entry k()\n{\nret;\n}\n",
}
STRIP_FAMILIES = {
    "unterminated debug sections": lambda n: H + ".section .debug_x {\n" * (n // 20),
    "a line of .target": lambda n: ".version 8.0\nx" + " .target" * (n // 8) + "\n",
}


def _elapsed(fn, text) -> float:
    t0 = time.perf_counter()
    try:
        fn(text)
    except PtxParseError:
        pass
    return time.perf_counter() - t0


@pytest.mark.parametrize("family", list(FAMILIES) + list(STRIP_FAMILIES))
def test_linear_time_on_hostile_text(family):
    """8x the input takes about 8x the time, never the 64x of a quadratic reader (each
    family here took minutes at a few hundred KB before)."""
    make = FAMILIES.get(family) or STRIP_FAMILIES[family]
    fn = inspect_ptx if family in FAMILIES else strip_debug
    from conftest import assert_linear
    assert_linear(lambda t: _elapsed(fn, t), make, 60_000)  # MB/s: benchmarks/bench_ptx.py --hostile


@pytest.mark.parametrize("text,msg", [
    (H + ".visible .entry k()\n{\nret;\n}\n}\nld.global.f32 %r1, [x];\n", "unbalanced '}'"),
    (H + ".visible .entry k()\n{\nret;\n}\n  ld.global.f32 %r1, [%rd1];\n", "instruction 'ld.global.f32' outside"),
    (H + ".visible .entyr k()\n{\nret;\n}\n", "unknown directive .entyr at module scope (did you mean .entry?)"),
    (H + ".global .u32 x\n.global .u32 y;\n", "malformed .global declaration (no ';' ends it)"),
    (H + "{\n", "unbalanced '{'"),
    (".version 9" + "9" * 5000 + ".0\n.target sm_90\n", ".version 99999"),
    (H + ".visible .entry k(.param .align 1" + "6" * 5000 + " .b8 p[8])\n{\nret;\n}\n", ".align"),
    (H + ".visible .entry k(.param .b8 p[" + "8" * 5000 + "])\n{\nret;\n}\n", "array size"),
    (H + ".visible .entry k() .reqntid 1" + "2" * 5000 + "\n{\nret;\n}\n", ".reqntid"),
    (H + ".global .align 4 .b8 g[" + "1" * 5000 + "];\n", "array size"),
    ("// meta: num_warps=" + "4" * 5000 + "\n" + H, "metadata num_warps"),
    ("// TRITON_GLOBAL_SCRATCH_BYTES_PER_CTA: " + "1" * 5000 + "\n" + H, "metadata global_scratch_size"),
])
def test_hostile_text_is_a_parse_error(text, msg):
    with pytest.raises(PtxParseError, match=re.escape(msg)) as e:
        inspect_ptx(text, source="bad.ptx")
    assert e.value.line is not None


def test_declared_then_defined_function_is_listed_once():
    text = H + (".extern .func (.param .b32 r) f(.param .b32 a);\n"
                ".visible .func (.param .b32 r) f(.param .b32 a)\n{\nret;\n}\n"
                ".visible .entry k()\n{\nret;\n}\n")
    fs = inspect_ptx(text).functions
    assert [(f.name, f.defined, f.linkage) for f in fs] == [("f", True, "visible")]


def test_strip_crlf_leaves_no_stray_cr():
    text = read("nvcc/kernels_G_sm90.ptx").replace("\n", "\r\n")
    for keep in (False, True):
        out = strip_debug(text, keep_lineinfo=keep)
        assert "\r\r" not in out and re.search(r"\r(?!\n)", out) is None
        assert ".debug_info" not in out and inspect_ptx(out).debug.dwarf is False


# ---------------------------------------------------------------- structure-aware fuzzing

_DEBUG_LINE = re.compile(r"^\s*(?:\.loc|\.file|@@DWARF)\b")


def _line_edit(lines: list[str], data) -> list[str]:
    """Delete, move or duplicate whole lines, or cut one inside a section or comment."""
    n = len(lines)
    op = data.draw(st.sampled_from(["delete", "move", "duplicate", "cut inside"]))
    i = data.draw(st.integers(0, n - 1))
    j = data.draw(st.integers(i, min(n, i + 30)))
    out = list(lines)
    if op == "delete":
        del out[i:j]
    elif op == "move":
        chunk = out[i:j]
        del out[i:j]
        k = data.draw(st.integers(0, len(out)))
        out[k:k] = chunk
    elif op == "duplicate":
        out[j:j] = out[i:j]
    else:  # cut a line that starts a section, holds a comment, or a .loc, at a random point
        cands = [k for k, ln in enumerate(out) if ".section" in ln or "//" in ln or ".loc" in ln] or [i]
        k = data.draw(st.sampled_from(cands))
        out[k] = out[k][: data.draw(st.integers(0, len(out[k])))]
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=st.sampled_from(FUZZ_SOURCES + ["nvrtc/tmpl_G_sm90.ptx", "numba/axpy_debug.ptx"]), data=st.data())
def test_fuzz_line_edits(src, data):
    """Edited real PTX: the reader succeeds or raises PtxParseError; strip_debug's output
    holds no debug section and keeps every line that is not debug information."""
    lines = read(src).splitlines(keepends=True)
    for _ in range(data.draw(st.integers(1, 3))):
        lines = _line_edit(lines, data)
    text = "".join(lines)
    try:
        inspect_ptx(text)
    except PtxParseError:
        pass
    try:
        out = strip_debug(text)
    except PtxParseError:
        return
    try:
        info = inspect_ptx(out)
    except PtxParseError:
        return  # the edit broke the text itself; stripping must not have hidden that
    assert not any(s.startswith(".debug") for s in info.debug.sections)
    kept = out.splitlines()
    in_section = False
    for ln in text.splitlines():
        if re.match(r"\s*\.section\s+\.debug", ln):
            in_section = "}" not in ln
            continue
        if in_section:
            in_section = "}" not in ln.split("//", 1)[0]
            continue
        if _DEBUG_LINE.match(ln) or ".target" in ln:
            continue
        assert ln in kept, ln


# ------------------------------------------------------------------ programmatic dependent launch

def test_griddepcontrol_found_in_kernels_and_the_functions_they_call():
    info = inspect_ptx((DATA / "nvcc/pdl_sm90.ptx").read_text())
    got = {e.name: e.griddepcontrol for e in info.entries}
    assert got == {"pdl_producer": ("wait", "launch_dependents"),  # CUDA's device runtime calls, inlined
                   "pdl_consumer": ("wait",),  # through a call to a .func
                   "pdl_none": ()}
    assert [e.waits_for_grid for e in info.entries] == [True, True, False]
    assert [f.griddepcontrol for f in info.functions] == [("wait",)]
    j = info.to_json()
    assert j["entries"][0]["griddepcontrol"] == ["wait", "launch_dependents"]
    assert "griddepcontrol" not in j["entries"][2]


def test_griddepcontrol_in_a_comment_or_another_kernel_is_not_counted():
    text = (DATA / "nvcc/pdl_sm90.ptx").read_text()
    body = text.index("pdl_none(")
    brace = text.index("{", body)
    edited = text[:brace + 1] + "\n\t// griddepcontrol.wait;\n\t/* griddepcontrol.launch_dependents; */" + \
        text[brace + 1:]
    e = inspect_ptx(edited).entry("pdl_none")
    assert e.griddepcontrol == () and not e.waits_for_grid


def test_strip_keeps_the_line_break_after_a_section_that_ends_mid_line():
    # found by test_fuzz_line_edits: a debug section moved into code ends at the first '}',
    # which is inside an instruction; the text after it must stay on a line of its own
    text = (DATA / "triton/add_kernel/add_kernel.ptx").read_text()
    lines = text.splitlines(keepends=True)
    lines[21:21] = lines[0:21]
    chunk = lines[68:98]
    del lines[68:98]
    lines[230:230] = chunk
    out = strip_debug("".join(lines)).splitlines()
    assert "}" in out and ", [ %rd1 + 0 ];" in out


def test_strip_debug_at_the_very_start_of_the_text():
    """A debug section or line that opens the text (no newline before it) goes too (the
    line-edit fuzzer moved `.section .debug_macinfo { }` to the top of Triton's PTX)."""
    body = read("triton/add_kernel/add_kernel.ptx")
    for first in ("\t.section\t.debug_macinfo\t{\t}\n", ".loc 1 2 3\n", "@@DWARF .byte 1\n"):
        out = strip_debug(first + body)
        assert not out.lstrip().startswith((".section", ".loc", "@@DWARF")), first
        assert not any(s.startswith(".debug") for s in inspect_ptx(out).debug.sections)
    kept = strip_debug(".loc 1 2 3\n" + body, keep_lineinfo=True)
    assert kept.startswith(".loc 1 2 3\n")


def test_a_section_inside_another_is_an_error():
    """The line-edit fuzzer moved `.section .debug_macinfo { }` into `.debug_abbrev`'s body:
    the reader took both as sections (strip_debug, rightly, could not strip the outer one)."""
    body = read("triton/add_kernel/add_kernel.ptx")
    i = body.index(".b8 1", body.index(".section\t.debug_abbrev"))
    bad = body[:i] + "\t.section\t.debug_macinfo\t{\t}\n" + body[i:]
    with pytest.raises(PtxParseError, match=r"section \.debug_macinfo starts inside section \.debug_abbrev"):
        inspect_ptx(bad)


def test_a_path_given_for_ptx_text_is_named_as_one():
    import nbjit
    path = str(DATA / "nvcc/kernels_sm90.ptx")
    for f in (nbjit.inspect_ptx, nbjit.strip_debug):
        with pytest.raises(PtxParseError, match="is a file's path, not PTX text \\(read the file first: "
                                                "open\\(path\\).read\\(\\)\\)"):
            f(path)
    assert nbjit.strip_debug(open(path).read())  # what the message says to do


# ------------------------------------------------------------------ the usual shapes, read fast
# The reader takes declaration heads, parameter lists and variables of the shapes compilers
# write through a few compiled patterns, everything else token by token: both ways must agree.

def _commented(text: str) -> str:
    """``text`` with a comment after every parameter line: a head holding one is not of the
    usual shape, and is read the general way (comments blanked, then the same parts)."""
    return re.sub(r"(?m)^([ \t]*\.param\b[^\n]*)$", r"\1 // p", text)


def _reordered(text: str) -> str:
    """``text`` with every parameter line's alignment written after its type (``.param .u64
    .align 8 p``; the natural one where it had none): the same parameters, in an order only
    the token reader takes."""
    from nbjit.params.signature import SCALAR_TYPES

    def move(m):
        return f"{m.group(1)}.{m.group(3)} .align {m.group(2) or SCALAR_TYPES[m.group(3)]}"
    return re.sub(r"(?m)^([ \t]*\.param\s+)(?:\.align\s+(\d+)\s+)?\.([a-z0-9]+)\b", move, text)


@pytest.fixture
def spy(monkeypatch):
    """Calls of the reader's general ways: ``spy["param"]`` (the token reader, one call a
    parameter), ``spy["declaration"]`` (a head read with its comments blanked) and
    ``spy["check_scope"]`` (a gap between bodies read with its comments blanked)."""
    import nbjit.read.ptx
    calls: dict[str, list] = {"param": [], "declaration": [], "check_scope": []}
    for name, got in calls.items():
        real = getattr(nbjit.read.ptx._Parser, name)
        monkeypatch.setattr(nbjit.read.ptx._Parser, name,
                            lambda self, *a, _r=real, _g=got: _g.append(a) or _r(self, *a))
    return calls


def _same(fast, slow):
    assert fast.entries == slow.entries and fast.functions == slow.functions and fast.globals == slow.globals
    assert json.dumps(fast.to_json()) == json.dumps(slow.to_json())


@pytest.mark.parametrize("rel", ALL_PTX)
def test_usual_heads_and_heads_read_the_general_way_agree(rel, spy):
    text = read(rel)
    fast = inspect_ptx(text)
    if not rel.startswith("hand/"):
        assert not spy["declaration"] and not spy["param"]  # compilers' output is all of the usual shapes
    other = _commented(text)
    if other == text or "/*" in text:  # (with block comments, every head is read on a view with comments blanked)
        pytest.skip("no parameter on a line of its own, or block comments")
    spy["declaration"].clear()
    _same(fast, inspect_ptx(other))
    assert spy["declaration"]


@pytest.mark.parametrize("rel", ALL_PTX)
def test_usual_gaps_and_gaps_read_the_general_way_agree(rel, spy):
    text = read(rel)
    # a module-scope .pragma before each declaration: its string keeps the gap from the usual shape
    other = re.sub(r"(?m)^(?=[ \t]*(?:\.(?:visible|weak|extern)\s+)*\.(?:entry|func)\b)", '.pragma "x";\n', text)
    fast = inspect_ptx(text)
    spy["check_scope"].clear()
    _same(fast, inspect_ptx(other))
    assert len(spy["check_scope"]) >= len(fast.entries)  # each read the general way


@pytest.mark.parametrize("rel", ALL_PTX)
def test_usual_parameters_and_the_token_reader_agree(rel, spy):
    text = read(rel)
    other = _reordered(text)
    if other == text:
        pytest.skip("no parameter on a line of its own")
    fast = inspect_ptx(text)
    spy["param"].clear()
    _same(fast, inspect_ptx(other))
    assert spy["param"]


PARAM_FORMS = [
    ".param .u64 p", ".param .align 8 .b8 s[24]", ".param .align 64 .b8 tmap[128]", ".param .u64 .ptr p",
    ".param .u64 .ptr .global p", ".param .u64 .ptr .global .align 16 p", ".param .u64 .ptr .shared .align 1 p",
    ".param .u64 .ptr .align 8 p", ".param .b8 z[]", ".param .u32 x [ 4 ]", ".param .b128 v", ".param .f16x2 h",
    ".param .bf16 $b", ".param .u32 %r1", ".param   .align\t16\n .b8\ts[32]",
]


@pytest.mark.parametrize("form", PARAM_FORMS)
def test_each_parameter_form_reads_as_the_token_reader_reads_it(form, spy):
    from nbjit.read.ptx import _Parser
    from nbjit.params.signature import layout
    chunks = [".param .u8 first", form]
    fast = inspect_ptx(H + ".visible .entry k(\n\t" + ",\n\t".join(chunks) + "\n)\n{\nret;\n}\n").entries[0]
    assert not spy["param"]  # read by the pattern
    slow = layout([_Parser(H, None).param(c, i, 0, "kernel 'k'") for i, c in enumerate(chunks)])
    assert fast.signature == slow and slow.params[1].offset > 0


@pytest.mark.parametrize("usual,other", [
    (".global .align 4 .u32 x;", ".global .u32 .align 4 x;"),
    (".visible .global .align 8 .b8 t[16] = {1, 2};", ".visible .global .b8 .align 8 t[16] = {1, 2};"),
    (".extern .shared .align 16 .b8 dsm[];", ".extern .shared .b8 .align 16 dsm[];"),
    (".const .f64 c[0];", ".const .f64 .align 8 c[0];"),
    (".common .global .align 8 .u64 env;", ".common .global .u64 .align 8 env;"),
])
def test_variables_of_the_usual_shape_read_as_the_token_reader_reads_them(usual, other):
    assert inspect_ptx(H + usual + "\n").globals == inspect_ptx(H + other + "\n").globals


@pytest.mark.parametrize("text,msg", [
    (H + ".visible .entry k(.param .align 3 .b8 s[8])\n{\nret;\n}\n", "alignment 3 is not a power of two"),
    (H + ".visible .entry k(.param .u64 .ptr .align 0 p)\n{\nret;\n}\n", "alignment 0 is not a power of two"),
    (H + ".visible .entry k(.param .u65 p)\n{\nret;\n}\n", "unknown type or qualifier '.u65'"),
    (H + ".visible .entry k(.param .u32 a,)\n{\nret;\n}\n", "parameter 1 of kernel 'k': expected '.param'"),
    (H + ".visible .entry k(.param .u32 a, ( .param .u32 b)\n{\nret;\n}\n", "unbalanced parentheses"),
    (H + ".visible .entry k(.param .u32 a b)\n{\nret;\n}\n", "unexpected 'b'"),
])
def test_shapes_the_patterns_leave_are_reported_by_the_token_reader(text, msg):
    with pytest.raises(PtxParseError, match=re.escape(msg)):
        inspect_ptx(text)


def test_strip_finds_sections_through_their_word_and_dwarf_lines_in_and_out_of_them():
    # sections are found by the literal '.section' at a line's start (after blanks); @@DWARF
    # lines inside a section go with it, the others on their own; one after code on its
    # line is left, and refused
    text = (H + "@@DWARF .b8 1\n\t .section .debug_info {\n@@DWARF .b8 2\n.b8 3 // }\n}\n@@DWARF x\n"
            ".visible .entry k()\n{\nret;\n}\n  .section\t.debug_str\n{\n.b8 0\n} // end\n")
    assert strip_debug(text) == H + ".visible .entry k()\n{\nret;\n}\n"
    assert strip_debug("/* c */\n" + text) == "/* c */\n" + H + ".visible .entry k()\n{\nret;\n}\n"
    with pytest.raises(PtxParseError, match=r"cannot strip debug section \.debug_y") as e:
        strip_debug(H + ".visible .entry k()\n{\nret;\n} .section .debug_y { .b8 1 }\n")
    assert e.value.line == 7


def test_many_stars_and_quotes_before_a_block_comment_or_a_brace_in_a_string():
    # '/*' and strings holding braces are found through '*' and '"' (rare in PTX), the
    # regex engine taking over after many: either way a comment hides what is in it
    stars = "// " + "*" * 200 + "\n"
    text = H + stars * 3 + "/* .visible .entry fake(){ret;} */\n.visible .entry k()\n{\nret;\n}\n"
    assert [e.name for e in inspect_ptx(text).entries] == ["k"]
    quotes = '.pragma "x";\n' * 100 + '.pragma "{";\n'
    text = H + quotes + ".visible .entry k()\n{\nret;\n}\n"
    assert [e.name for e in inspect_ptx(text).entries] == ["k"]


# ------------------------------------------------------------------ the collector's pause


def test_the_garbage_collector_is_as_it_was_after_reading():
    import gc
    text = read("nvcc/kernels_sm90.ptx")
    assert gc.isenabled()
    inspect_ptx(text)
    assert gc.isenabled()
    with pytest.raises(PtxParseError):
        inspect_ptx(text[: len(text) // 2])
    assert gc.isenabled()
    gc.disable()
    try:
        inspect_ptx(text)
        assert not gc.isenabled()  # a collector the caller turned off stays off
    finally:
        gc.enable()


def test_the_collector_is_paused_while_reading_and_back_when_every_thread_is_done():
    import gc
    import threading
    seen, go = [], threading.Barrier(4)
    real = __import__("nbjit.read.ptx", fromlist=["_Parser"])._Parser.parse

    def parse(self):
        seen.append(gc.isenabled())
        go.wait(timeout=30)  # every thread is inside the reader at once
        return real(self)

    import nbjit.read.ptx
    text = read("nvcc/kernels_sm90.ptx")
    nbjit.read.ptx._Parser.parse = parse
    try:
        threads = [threading.Thread(target=inspect_ptx, args=(text,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        nbjit.read.ptx._Parser.parse = real
    assert seen == [False] * 4 and gc.isenabled()
