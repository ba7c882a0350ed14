"""One signature per kernel (nbjit.params.signature.merge): every source's facts, where each came
from, and contradictions."""
from __future__ import annotations

from dataclasses import replace

import pytest

from nbjit import inspect_cubin, inspect_ptx
from nbjit.params.declarations import source_declarations, triton_ir_signatures
from nbjit.params.cdecl import CParam, demangle
from nbjit.params.signature import typed_entries
from nbjit.params.signature import KernelInfo, KernelSignature, SignatureConflict, merge

from conftest import DATA  # noqa: E402
PTX = inspect_ptx((DATA / "nvcc/kernels_sm90.ptx").read_text())
CUBIN = inspect_cubin((DATA / "nvcc/kernels_sm_90.cubin").read_bytes())
SOURCE = source_declarations((DATA / "src/kernels.cu").read_text())


def test_cubin_alone_is_untyped_and_says_so():
    k = merge("k_basic", [("cubin", CUBIN.entry("k_basic"))])
    assert [p.type for p in k.params] == ["unknown"] * 4
    assert all(p.ctype is None for p in k.params)
    assert str(k.signature) == "(<8 bytes> param_0, <8 bytes> param_1, <4 bytes> param_2, <4 bytes> param_3)"


def test_cubin_and_source():
    k = merge("k_basic", [("cubin", CUBIN.entry("k_basic"))], [("source", SOURCE["k_basic"])])
    assert str(k.signature) == "(float* y, const float* x, float a, int n)"
    assert [p.type for p in k.params] == ["u64", "u64", "f32", "s32"]
    assert [(p.pointer, p.pointee, p.const) for p in k.params] == [
        (True, "float", False), (True, "float", True), (False, None, False), (False, None, False)]
    assert dict(k.params[0].origin) == {"layout": "cubin", "pointer": "source", "pointee": "source",
                                        "ctype": "source"}
    assert k.registers is not None  # the cubin's resources stay


def test_ptx_types_refined_by_c_types():
    """nvcc writes int as .u32 and __half as .b8[2]: the C type says what they are."""
    k = merge("k_small", [("ptx", PTX.entry("k_small"))], [("source", SOURCE["k_small"])])
    assert [p.type for p in k.params] == ["f16", "bf16", "u8", "s8", "s16", "u64"]
    assert [p.count for p in k.params] == [None] * 6
    assert dict(k.params[0].origin) == {"layout": "ptx", "type": "source", "ctype": "source"}
    n = merge("k_basic", [("ptx", PTX.entry("k_basic"))], [("source", SOURCE["k_basic"])]).params[3]
    assert (n.type, dict(n.origin)["type"]) == ("s32", "source")


def test_structs_by_value_keep_their_bytes():
    k = merge("k_struct", [("ptx", PTX.entry("k_struct"))], [("source", SOURCE["k_struct"])])
    s = k.params[0]
    assert (s.ctype, s.type, s.count, s.size) == ("S24", "b8", 24, 24)


def test_ptx_and_cubin_together():
    """The nvJitLink route: PTX names and types, the cubin's resources."""
    k = merge("_Z6k_tmplIfEvPT_S0_i", [("ptx", PTX.entry("_Z6k_tmplIfEvPT_S0_i")),
                                       ("cubin", CUBIN.entry("_Z6k_tmplIfEvPT_S0_i"))],
              [("mangled name", demangle("_Z6k_tmplIfEvPT_S0_i"))])
    assert str(k.signature).startswith("(float* param_0, float ")  # (PTX's placeholder names shown as a cubin's)
    assert k.registers == CUBIN.entry("_Z6k_tmplIfEvPT_S0_i").registers


def test_layouts_that_disagree():
    e = PTX.entry("k_basic")
    shifted = replace(e, signature=KernelSignature(tuple(replace(p, offset=p.offset + 4 * (i == 3))
                                                         for i, p in enumerate(e.params)), 28))
    with pytest.raises(SignatureConflict, match=r"k_basic.*ptx lays out.*\(20, 4\)\].*cubin as.*\(24, 4\)\]"):
        merge("k_basic", [("ptx", e), ("cubin", shifted)])


@pytest.mark.parametrize("ctype,msg", [
    (CParam("double"), r"parameter 2 \(k_basic_param_2\): the source type is double, 8 bytes, but the parameter "
                       r"takes 4"),
    (CParam("int"), r"the source type is int, but the ptx type is .f32"),
    (CParam("float", True), r"a pointer \(8 bytes\), but the parameter takes 4 bytes"),
])
def test_c_type_that_contradicts_the_image(ctype, msg):
    cps = list(SOURCE["k_basic"])
    cps[2] = ctype
    with pytest.raises(SignatureConflict, match=msg):
        merge("k_basic", [("ptx", PTX.entry("k_basic"))], [("source", cps)])


def test_two_c_sources_that_disagree():
    cps = list(SOURCE["k_basic"])
    cps[0] = CParam("double", True)
    with pytest.raises(SignatureConflict, match=r"the mangled name type is double\*, but the source type is float\*"):
        merge("k_basic", [("ptx", PTX.entry("k_basic"))], [("source", SOURCE["k_basic"]), ("mangled name", cps)])


def test_a_list_of_another_length_says_nothing_but_a_declaration_must_fit():
    e = PTX.entry("k_basic")
    assert merge("k_basic", [("ptx", e)], [("mangled name", SOURCE["k_basic"][:2])]).params[0].ctype is None
    with pytest.raises(SignatureConflict, match="declaration has 2 parameters, the kernel 4"):
        merge("k_basic", [("ptx", e)], [("declared", SOURCE["k_basic"][:2])])


def test_triton_ir_types_a_triton_cubin():
    d = DATA / "triton/add_kernel"
    cub = inspect_cubin((d / "add_kernel.cubin").read_bytes()).entry("add_kernel")
    ir = triton_ir_signatures((d / "add_kernel.ttir").read_text())["add_kernel"]
    scratch = (CParam("void", True, name="global_scratch"), CParam("void", True, name="profile_scratch"))
    k = merge("add_kernel", [("cubin", cub)], [("triton ir", ir + scratch)])
    assert str(k.signature) == ("(float* x_ptr, float* y_ptr, float* out_ptr, int n_elements, float alpha, "
                                "void* global_scratch, void* profile_scratch)")


def test_no_layout_at_all():
    with pytest.raises(SignatureConflict, match="no source gives its parameter layout"):
        merge("k", [])


def test_typed_entries_for_inspection():
    entries = {e.name: e for e in typed_entries(CUBIN.entries, "cubin")}
    assert str(entries["_Z6k_tmplIiEvPT_S0_i"].signature) == "(int* param_0, int param_1, int param_2)"
    assert entries["k_basic"].params[0].ctype is None  # extern "C" in a cubin: nothing to say
    j = entries["_Z6k_tmplIiEvPT_S0_i"].to_json()["params"][0]
    assert j["ctype"] == "int*" and j["pointee"] == "int" and j["origin"]["pointee"] == "mangled name"


def test_a_kernel_without_parameters():
    k = merge("k", [("ptx", KernelInfo("k", KernelSignature((), 0)))], [("mangled name", ())])
    assert k.params == ()


# ------------------------------------------------------------------ the fast constructors


def _same_object(made, built):
    """Equal, same hash and repr, fields in the dataclass's order (what to_json and pickle see)."""
    from dataclasses import fields
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    assert list(made.__dict__) == [f.name for f in fields(built)]


def test_layout_places_as_the_dataclass_would():
    from nbjit.params.signature import layout
    from nbjit.params.signature import Param
    specs = [("a", "u8", 1, None, False, None, None, None), ("s", "b8", 1, 24, False, None, 8, None),
             ("p", "u64", 8, None, True, "global", None, 16), ("v", "b128", 16, None, False, None, None, None),
             ("e", "b8", 1, 0, False, None, None, None)]
    sig = layout(specs)
    expected = [Param("a", "u8", 1, 1, 0), Param("s", "b8", 24, 8, 8, 24), Param("p", "u64", 8, 8, 32, None, True,
                "global", 16), Param("v", "b128", 16, 16, 48), Param("e", "b8", 0, 1, 64, 0)]
    assert sig.size == 64
    for made, built in zip(sig.params, expected, strict=True):
        _same_object(made, built)
    again = layout(specs)  # shapes are shared between calls; the parameters are not
    assert again == sig and all(x is not y for x, y in zip(again.params, sig.params))


def test_maker_builds_what_the_constructor_builds():
    from nbjit.read.ptx import PtxInfo
    from nbjit.params.signature import maker
    from nbjit.params.signature import Directives
    sig = KernelSignature((), 0)
    _same_object(maker(KernelInfo)(name="k", signature=sig, linkage="visible", griddepcontrol=("wait",)),
                 KernelInfo("k", sig, linkage="visible", griddepcontrol=("wait",)))
    _same_object(maker(Directives)(maxntid=(256, 1, 1), minnctapersm=2), Directives(maxntid=(256, 1, 1),
                                                                                  minnctapersm=2))
    assert maker(Directives)(maxnreg=32).to_json() == {"maxnreg": 32}
    with pytest.raises(TypeError, match="default factory"):
        maker(PtxInfo)  # its metadata dict would be shared


def _every_kernel():
    for path in sorted(DATA.glob("**/*.ptx")) + sorted(DATA.glob("**/*.cubin")):
        try:
            info = (inspect_ptx if path.suffix == ".ptx" else inspect_cubin)(path.read_bytes())
        except Exception:  # a fixture that is meant not to read (hand-made damage)
            continue
        for k in info.entries:
            yield path.name, typed_entries([k], path.suffix[1:])[0]


def test_kernel_json_reads_back_as_written():
    """KernelInfo.from_json is to_json's inverse (a kernel bundle's manifest lists kernels so):
    every field to_json writes, for every kernel of the fixtures (typed by their mangled names)."""
    seen = 0
    for where, k in _every_kernel():
        back = KernelInfo.from_json(k.to_json())
        assert back.to_json() == k.to_json(), where
        # to_json leaves out a pointer's pointee alignment (a cubin's, shown nowhere) and foreign ABIs
        assert back == replace(k, signature=KernelSignature(tuple(replace(p, pointee_align=None, abi=None)
                                                                  for p in k.params), k.param_size)), where
        seen += 1
    assert seen > 100


@pytest.mark.parametrize("change,msg", [
    (lambda d: d.pop("name"), "no name"),
    (lambda d: d.update(param_size="16"), r"kernel 'k': param_size is str, not int"),
    (lambda d: d["params"][0].update(offset=-8), r"kernel 'k': parameter 'a': size 8 at offset -8"),
    (lambda d: d["params"][1].update(size=32), r"kernel 'k': parameters overrun the 16-byte parameter buffer"),
    (lambda d: d["params"][0].update(origin=[["layout", "ptx"]]), r"parameter 'a': origin is not"),
    (lambda d: d.update(directives={"maxntid": "256"}), r"directive maxntid: '256' is not a list of integers"),
    (lambda d: d.update(directives={"warp_size": 32}), r"'warp_size' is not a directive"),
    (lambda d: d.update(registers=1.5), r"registers is float, not int"),
    (lambda d: d.update(params={}), r"params is not a list"),
])
def test_kernel_json_that_to_json_does_not_write_is_refused(change, msg):
    d = {"name": "k", "linkage": None, "param_size": 16, "directives": {"maxntid": [256, 1, 1]},
         "params": [{"name": "a", "type": "u64", "size": 8, "align": 8, "offset": 0, "pointer": True, "space": None,
                     "ctype": "float*", "pointee": "float", "const": False, "origin": {"layout": "ptx"}},
                    {"name": "n", "type": "s32", "size": 4, "align": 4, "offset": 8}]}
    assert KernelInfo.from_json(d).to_json() == {**d, "params": [dict(d["params"][0]), dict(d["params"][1])]}
    change(d)
    with pytest.raises(ValueError, match=msg):
        KernelInfo.from_json(d)


def test_every_directive_reads_back():
    from dataclasses import fields

    from nbjit.params.signature import _DIRECTIVE_KINDS, Directives
    assert list(_DIRECTIVE_KINDS) == [f.name for f in fields(Directives)]
    d = Directives(maxntid=(128, 1, 1), reqntid=(64,), minnctapersm=2, maxnctapersm=4, maxnreg=64, noreturn=True,
                   explicitcluster=True, reqnctapercluster=(2, 1, 1), maxclusterrank=8, blocksareclusters=True)
    assert Directives.from_json(d.to_json()) == d


def test_a_merged_layout_keeps_where_its_facts_came_from():
    """A kernel merged before (a bundle's manifest's) merged again, with the same declaration
    and a layout that adds nothing, is the same kernel: its origins are not relabelled."""
    ptx = inspect_ptx((DATA / "nvrtc/tmpl_sm90.ptx").read_bytes())
    k = ptx.entries[0]
    once = merge(k.name, [("ptx", k)], [("mangled name", demangle(k.name))])
    again = merge(k.name, [("fatbin", once), ("triton ptx", k)], [("mangled name", demangle(k.name))])
    assert again == once and dict(again.params[0].origin)["layout"] == "ptx"


def test_a_compilers_placeholder_parameter_name_is_shown_as_param_n():
    from nbjit.params.signature import shown_param_name
    assert shown_param_name("_Z5scaleIfEvPT_S0_i_param_0", 0) == "param_0"
    assert shown_param_name("k_basic_param_3", 3) == "param_3"
    assert shown_param_name("x", 0) == "x" and shown_param_name("k_param_1", 0) == "k_param_1"
    info = inspect_ptx((DATA / "nvcc/kernels_sm90.ptx").read_text())
    assert "_param_" not in str(info.entries[0].signature)
