"""Triton metadata and launch rules (nbjit.loading.triton) on Triton 3.9 artifacts, without a GPU."""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nbjit import NbjitArgumentError, NbjitLaunchError, NbjitLoadError, inspect_ptx
from nbjit.loading.triton import describe, launch_rules, read_triton

from conftest import DATA  # noqa: E402
T = DATA / "triton"


@pytest.mark.parametrize("entry,name,warps,ctas,shared,gscratch", [
    ("add_kernel", "add_kernel", 4, 1, 0, 0), ("softmax_kernel", "softmax_kernel", 8, 1, 32, 0),
    ("matmul_kernel", "matmul_kernel", 8, 1, 65536, 0), ("matmul_ctas2", "matmul_kernel", 4, 2, 24576, 0),
    ("copy_desc_kernel", "copy_desc_kernel", 4, 1, 4104, 256)])
def test_metadata_from_cache_entries(entry, name, warps, ctas, shared, gscratch):
    art = read_triton(T / entry)
    m = art.meta
    assert (m.name, m.num_warps, m.num_ctas, m.shared, m.global_scratch_size) == (name, warps, ctas, shared, gscratch)
    assert m.block == (warps * 32, 1, 1) and m.arch == "sm_90" and m.arch.number == 90 and m.triton_version == "3.9.0"
    assert m.scratch_params == 2  # Triton >= 3.5: global and profile scratch
    assert art.cubin.name == f"{name}.cubin" and art.ptx.name == f"{name}.ptx"
    assert read_triton(T / entry / f"{name}.json").meta == m  # the .json itself works too


def test_a_launch_pdl_kernel_says_so_twice():
    """Triton 3.9 with launch_pdl=True: the metadata asks for programmatic dependent launch,
    and the PTX runs griddepcontrol (tl.extra.cuda.gdc_wait / gdc_launch_dependents)."""
    art = read_triton(T / "pdl_step_kernel")
    assert art.meta.pdl and not read_triton(T / "add_kernel").meta.pdl
    (entry,) = inspect_ptx(art.ptx.read_bytes()).entries
    assert entry.griddepcontrol == ("wait", "launch_dependents") and entry.waits_for_grid


def test_launch_rules_and_scratch_sizes():
    d = describe(T / "copy_desc_kernel")
    r = d["launch"]
    assert r["user_params"] == 4 and r["scratch_params"] == 2 and r["block"] == [128, 1, 1]
    assert r["global_scratch"] == {"bytes_per_program": 256, "align": 128}
    m = read_triton(T / "copy_desc_kernel").meta
    assert m.scratch_bytes((4, 3, 1)) == (256 * 12, 0)
    c2 = read_triton(T / "matmul_ctas2").meta
    assert c2.scratch_bytes((2, 2, 1)) == (0, 0) and c2.num_ctas == 2
    # the PTX confirms Triton's compile-time cluster for num_ctas=2
    ptx = inspect_ptx((T / "matmul_ctas2/matmul_kernel.ptx").read_text())
    assert ptx.entries[0].directives.reqnctapercluster == (2,)


def copy_entry(tmp_path, entry, edit):
    dst = tmp_path / entry
    shutil.copytree(T / entry, dst)
    j = next(dst.glob("*.json"))
    d = json.loads(j.read_text())
    edit(d)
    j.write_text(json.dumps(d))
    return dst


@pytest.mark.parametrize("drop,expect_scratch,expect_user", [
    ((), 2, 5),                                                   # 3.5+: global + profile scratch
    (("profile_scratch_size", "profile_scratch_align"), 1, 6),   # 3.3 / 3.4: global scratch only
    (("profile_scratch_size", "profile_scratch_align", "global_scratch_size", "global_scratch_align"), 0, 7),
])
def test_triton_versions_differ_in_scratch_parameters(tmp_path, drop, expect_scratch, expect_user):
    def edit(d):
        for k in drop:
            d.pop(k, None)
    entry = copy_entry(tmp_path, "add_kernel", edit)
    r = describe(entry)["launch"]
    assert (r["scratch_params"], r["user_params"]) == (expect_scratch, expect_user)


def test_scratch_claim_checked_against_parameters():
    info = inspect_ptx((DATA / "nvcc/kernels_sm90.ptx").read_text())
    meta = read_triton(T / "add_kernel").meta
    with pytest.raises(NbjitLoadError, match="2 trailing scratch pointer"):
        launch_rules(meta, info.entry("k_basic").params)  # ends in f32, u32: not scratch pointers


def test_ptx_with_meta_comments(tmp_path):
    text = "// meta:name=softmax_kernel\n// meta:num_warps=8\n// meta:shared=32\n" + \
           (T / "softmax_kernel/softmax_kernel.ptx").read_text()
    p = tmp_path / "softmax.ptx"
    p.write_text(text)
    art = read_triton(p)
    assert art.meta.source == "ptx comments" and art.cubin is None
    assert (art.meta.name, art.meta.num_warps, art.meta.shared, art.meta.scratch_params) == ("softmax_kernel", 8, 32, 2)
    assert describe(p)["launch"]["user_params"] == 5


def test_bad_inputs(tmp_path):
    with pytest.raises(NbjitLoadError, match="no such file"):
        read_triton(tmp_path / "nope.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NbjitLoadError, match="no Triton metadata"):
        read_triton(tmp_path / "empty")
    with pytest.raises(NbjitLoadError, match="without '// meta:'"):
        read_triton(DATA / "nvcc/kernels_sm90.ptx")
    bad = tmp_path / "k.json"
    bad.write_text("{not json")
    with pytest.raises(NbjitLoadError, match="unreadable"):
        read_triton(bad)
    bad.write_text(json.dumps({"num_warps": 4}))
    with pytest.raises(NbjitLoadError, match="Triton metadata 'name': missing"):
        read_triton(bad)
    bad.write_text(json.dumps({"name": "k", "target": {"backend": "hip", "arch": "gfx942"}}))
    with pytest.raises(NbjitLoadError, match="not CUDA"):
        read_triton(bad)
    bad.write_text(json.dumps({"name": "k"}))
    with pytest.raises(NbjitLoadError, match="neither k.cubin nor k.ptx"):
        read_triton(bad)



# ------------------------------------------------------------------ what lies in a Triton directory

def _finishes(fn, seconds: float = 60.0):
    """``fn()``'s exception (or None), run in a child process of bounded memory: a reader
    that blocks on a FIFO or reads /dev/zero without end fails the test instead of hanging
    it or exhausting the machine's memory."""
    import resource  # POSIX, as the FIFOs these tests make
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child():
        resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))
        try:
            fn()
            send.send(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            send.send(e)
    proc = ctx.Process(target=child)
    proc.start()
    try:
        if not recv.poll(seconds):
            pytest.fail(f"still running after {seconds} s: something opened a FIFO to read it")
        return recv.recv()
    finally:
        proc.kill()
        proc.join()


def _entry(tmp_path, entry="add_kernel"):
    d = tmp_path / entry
    shutil.copytree(T / entry, d)
    return d


def _replace(path, what: str) -> None:
    path.unlink()
    if what == "fifo":
        os.mkfifo(path)
    elif what == "dir":
        path.mkdir()
    else:  # a link to a device that never ends
        path.symlink_to("/dev/zero")


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"), reason="POSIX only")
@pytest.mark.parametrize("suffix", [".ttir", ".ptx", ".cubin"])
@pytest.mark.parametrize("what,kind", [("fifo", "a FIFO"), ("dir", "a directory"),
                                       ("zero", "a device or other special file")])
def test_a_kernel_file_that_is_not_a_file_is_a_load_error(tmp_path, suffix, what, kind):
    d = _entry(tmp_path)
    f = d / f"add_kernel{suffix}"
    _replace(f, what)
    for call in (lambda: describe(d), lambda: read_triton(d / "add_kernel.json")):
        e = _finishes(call)
        assert isinstance(e, NbjitLoadError), repr(e)
        assert str(e).startswith(f"{f}: {kind}, not a regular file"), str(e)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX only")
def test_beside_a_ptx_with_meta_comments_too(tmp_path):
    p = tmp_path / "softmax.ptx"
    p.write_text("// meta:name=softmax_kernel\n" + (T / "softmax_kernel/softmax_kernel.ptx").read_text())
    ttir = tmp_path / "softmax.ttir"
    os.mkfifo(ttir)
    e = _finishes(lambda: describe(p))
    assert isinstance(e, NbjitLoadError) and f"{ttir}: a FIFO, not a regular file" in str(e), repr(e)
    ttir.unlink()
    ttir.mkdir()
    with pytest.raises(NbjitLoadError, match="a directory, not a regular file"):
        describe(p)
    (tmp_path / "alone").mkdir()
    os.mkfifo(tmp_path / "alone/k.ptx")  # a directory whose only .ptx is a FIFO
    e = _finishes(lambda: describe(tmp_path / "alone"))
    assert isinstance(e, NbjitLoadError) and "k.ptx: a FIFO, not a regular file" in str(e), repr(e)


def test_a_directory_named_like_a_ptx(tmp_path):
    (tmp_path / "x.ptx").mkdir()
    with pytest.raises(NbjitLoadError, match=re.escape(f"{tmp_path / 'x.ptx'}: a directory, not a regular file")):
        read_triton(tmp_path)
    r = subprocess.run([sys.executable, "-m", "nbjit", "inspect", str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "a directory, not a regular file" in r.stderr


def test_a_huge_ir_file_is_not_read(tmp_path):
    d = _entry(tmp_path)
    os.truncate(d / "add_kernel.ttir", 300 << 20)  # sparse: no disk used
    with pytest.raises(NbjitLoadError, match=f"add_kernel.ttir: {300 << 20} bytes, more than nbjit reads"):
        describe(d)


@pytest.mark.parametrize("unit", ["tt.func @f(", "tt.func public @f(%a: i32, (", "(tt.func @f("])
def test_ir_with_unclosed_parameter_lists_reads_in_linear_time(unit):
    from conftest import assert_linear
    from nbjit.params.declarations import triton_ir_signatures
    assert triton_ir_signatures(unit * 100) == {}
    assert_linear(triton_ir_signatures, lambda n: unit * n, 6000)


def test_ir_signatures_unchanged_after_an_unclosed_list():
    from nbjit.params.declarations import triton_ir_signatures
    ir = (T / "add_kernel/add_kernel.ttir").read_text()
    want = triton_ir_signatures(ir)
    assert list(want) == ["add_kernel"] and len(want["add_kernel"]) == 5
    assert triton_ir_signatures("tt.func @broken(%x: i32\n" + ir) == want

def test_cli_inspect_triton():
    r = subprocess.run([sys.executable, "-m", "nbjit", "inspect", str(T / "matmul_kernel")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "block (256, 1, 1) = 8 warps, 65536 bytes dynamic shared memory" in r.stdout
    assert "the first 12 parameters" in r.stdout
    j = json.loads(subprocess.run([sys.executable, "-m", "nbjit", "inspect", "--json", str(T / "add_kernel")],
                                  capture_output=True, text=True, timeout=120).stdout)
    assert j["kind"] == "triton" and j["launch"]["user_params"] == 5
    assert j["launch_pdl"] is False and j["griddepcontrol"] == []
    r = subprocess.run([sys.executable, "-m", "nbjit", "inspect", str(T / "pdl_step_kernel")], capture_output=True,
                       text=True, timeout=120)
    assert "programmatic dependent (launch_pdl)" in r.stdout and "griddepcontrol: wait, launch_dependents" in r.stdout


@pytest.mark.parametrize("meta,msg", [
    ([1, 2], "must be a JSON object"),
    ({"name": "k", "target": "cuda"}, "'target': expected an object or a list, got str"),
    ({"name": "k", "target": ["cuda"]}, "neither k.cubin nor k.ptx"),  # old list form, arch unknown
    ({"name": "k", "target": []}, "'target': an empty list"),
    ({"name": "k", "num_warps": 1e308}, "'num_warps'"),
    ({"name": "k", "shared": "9" * 5000}, "'shared'"),
    ({"name": "k", "shared": -1}, "'shared'"),
    ({"name": "k", "num_warps": True}, "'num_warps': expected a whole number, got bool"),
    ({"name": "/"}, "'name': '/' is not a kernel name"),
    ({"name": "k" * 5000}, "is not a kernel name"),
    ({"name": ""}, "is not a kernel name"),
    ({"name": "k", "cluster_dims": [1, 2, 3, 4]}, "'cluster_dims'"),
    ({"name": "k", "cluster_dims": ["x"]}, "'v'"),
])
def test_metadata_of_any_shape_is_an_nbjit_error(tmp_path, meta, msg):
    bad = tmp_path / "k.json"
    bad.write_text(json.dumps(meta))
    with pytest.raises(NbjitLoadError, match=re.escape(msg)):
        read_triton(bad)


@pytest.mark.parametrize("text,msg", [
    ('{"name": "k", "num_warps": Infinity}', "Infinity is not a JSON number"),
    ('{"name": "k", "num_warps": NaN}', "NaN is not a JSON number"),
    ("[" * 100_000 + "]" * 100_000, "unreadable"),
])
def test_unreadable_metadata(tmp_path, text, msg):
    bad = tmp_path / "k.json"
    bad.write_text(text)
    with pytest.raises(NbjitLoadError, match=re.escape(msg)):
        read_triton(bad)


def test_meta_comments_that_name_no_kernel(tmp_path):
    ptx = (T / "softmax_kernel/softmax_kernel.ptx").read_text()
    p = tmp_path / "k.ptx"
    p.write_text("// meta: name=\n" + ptx)
    with pytest.raises(NbjitLoadError, match="names no kernel"):
        read_triton(p)
    p.write_text("// meta: name=nope\n" + ptx)
    with pytest.raises(NbjitLoadError, match="names kernel 'nope'; the image has softmax_kernel"):
        describe(p)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                           | st.text(st.characters(codec="utf-8"), max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=4), max_leaves=20)
REAL = json.loads((T / "add_kernel/add_kernel.json").read_text())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(REAL) + ["extra"]), value=json_values, drop=st.booleans())
def test_fuzz_metadata_any_json_shape(tmp_path, key, value, drop):
    """Triton's real metadata with one key set to any JSON value (or dropped): read, or an
    NbjitLoadError; never another exception."""
    d = dict(REAL)
    if drop:
        d.pop(key, None)
    else:
        d[key] = value
    bad = tmp_path / "add_kernel.json"
    bad.write_text(json.dumps(d))
    for f in ("add_kernel.ptx", "add_kernel.cubin"):
        if not (tmp_path / f).exists():
            (tmp_path / f).write_bytes((T / "add_kernel" / f).read_bytes())
    try:
        art = read_triton(bad)
        describe(bad)
        assert art.meta.num_warps >= 1
    except NbjitLoadError:
        pass


def test_ptx_meta_fallbacks_are_tritons():
    """The reader hands back the comments as written; Triton's defaults live in triton.py."""
    from nbjit.loading.triton import DEFAULTS, ptx_meta
    ptx = (T / "softmax_kernel/softmax_kernel.ptx").read_text()
    i = inspect_ptx("// TRITON_GLOBAL_SCRATCH_BYTES_PER_CTA: 64\n// meta:shared=32\n" + ptx)
    m = ptx_meta(i)
    assert m["shared"] == 32 and m["global_scratch_size"] == 64
    assert m["name"] == "softmax_kernel"  # first visible entry
    assert m["num_warps"] == 8  # .reqntid 256 -> 8 warps
    assert m["num_ctas"] == DEFAULTS["num_ctas"] and m["profile_scratch_size"] == 0
    traps = (DATA / "hand/traps.ptx").read_text().replace("// meta:name=ignored_because_last_wins_no", "")
    m = ptx_meta(inspect_ptx("// meta:shared=0\n" + traps))
    assert m["num_warps"] == 2 and m["name"] == "k_all"  # k_weak .reqntid 8,4,2 = 64 threads, rounded up



@pytest.mark.parametrize("block_comment", [False, True])
def test_meta_comments_count_at_module_scope_whatever_else_the_file_holds(tmp_path, block_comment):
    """A '// meta:' line inside a kernel's body counted only in a file with a /* */ comment
    somewhere, so strip_debug (which removes the debug sections such a comment may sit in)
    changed num_warps. Module scope only, whatever else the file holds."""
    from nbjit import strip_debug
    ptx = (T / "softmax_kernel/softmax_kernel.ptx").read_text()
    body = ptx.index("{", ptx.index(".reqntid")) + 1
    text = ("// meta:name=softmax_kernel\n" + ptx[:body] + "\n\t// meta:num_warps=2\n\t// TRITON_SHARED_MEM_BYTES: 64\n"
            + ptx[body:] + "\n// meta:shared=32\n")
    if block_comment:
        at = text.index("{", text.index(".section\t.debug_str")) + 1
        text = text[:at] + "\n/* the producer's note */" + text[at:]
    stripped = strip_debug(text)
    assert ("/*" in text, "/*" in stripped) == (block_comment, False)
    for t in (text, stripped):
        assert inspect_ptx(t).metadata == {"name": "softmax_kernel", "shared": 32}
        p = tmp_path / "k.ptx"
        p.write_text(t)
        m = read_triton(p).meta
        assert (m.name, m.num_warps, m.shared) == ("softmax_kernel", 8, 32)  # 8: .reqntid 256, not the body's 2

# ------------------------------------------------------------------ host-side tensor descriptors

def test_host_descriptors_found_among_the_parameters():
    meta = read_triton(T / "copy_hostdesc_kernel").meta
    assert [(d.swizzle, d.elem_type, d.block_size) for d in meta.tensordescs] == [(3, 7, (32, 32))] * 2
    r = describe(T / "copy_hostdesc_kernel")["launch"]
    assert (r["user_params"], r["kernel_params"], r["scratch_params"]) == (3, 11, 2)
    assert [(d["param"], d["arg"], d["ndim"], d["block"], d["swizzle"], d["data_type"]) for d in r["descriptors"]] \
        == [(0, 0, 2, [32, 32], "128B", "FLOAT32"), (5, 1, 2, [32, 32], "128B", "FLOAT32")]
    assert describe(T / "add_kernel")["launch"]["descriptors"] == []


@pytest.mark.parametrize("edit, msg", [
    (lambda d: d.update(triton_version="3.8.0"), "nbjit knows how Triton 3.9 passes them, this kernel was compiled by "
                                                 "Triton 3.8.0"),
    (lambda d: d["tensordesc_meta"][0].update(is_im2col=True), "im2col descriptors are not supported"),
    (lambda d: d["tensordesc_meta"][1].update(block_size=[8, 8, 8]), "expected a 128-byte tensor map then 3 4-byte"),
    (lambda d: d["tensordesc_meta"].append(d["tensordesc_meta"][0]), "tensor descriptor 2: expected a 128-byte"),
    (lambda d: d["tensordesc_meta"][0].update(elem_type=13), "element type 13"),
])
def test_host_descriptor_misfits_are_load_errors(tmp_path, edit, msg):
    with pytest.raises(NbjitLoadError, match=re.escape(msg)):
        describe(copy_entry(tmp_path, "copy_hostdesc_kernel", edit))


@pytest.mark.parametrize("meta, msg", [
    ({"name": "k", "tensordesc_meta": {}}, "'tensordesc_meta': expected a list"),
    ({"name": "k", "tensordesc_meta": [1]}, "'tensordesc_meta[0]': expected an object"),
    ({"name": "k", "tensordesc_meta": [{"block_size": []}]}, "'tensordesc_meta[0].block_size'"),
    ({"name": "k", "tensordesc_meta": [{"block_size": [512]}]}, "from 1 to 256"),
    ({"name": "k", "tensordesc_meta": [{"block_size": [8], "swizzle": 9}]}, "'swizzle'"),
])
def test_malformed_descriptor_metadata(tmp_path, meta, msg):
    bad = tmp_path / "k.json"
    bad.write_text(json.dumps(meta))
    with pytest.raises(NbjitLoadError, match=re.escape(msg)):
        read_triton(bad)


class FakeDeviceArray:
    """An object with __cuda_array_interface__ (as CuPy's and torch's), no GPU behind it."""

    def __init__(self, ptr, shape, dtype="<f4"):
        self._cai = {"shape": shape, "typestr": dtype, "data": (ptr, False), "strides": None, "version": 3}

    @property
    def __cuda_array_interface__(self):
        return self._cai


class HostDescriptor:
    """What Triton's TensorDescriptor carries (duck-typed: nbjit does not import Triton)."""

    def __init__(self, base, shape, strides, block_shape, padding="zero"):
        self.base, self.shape, self.strides, self.block_shape, self.padding = base, shape, strides, block_shape, padding


def test_a_descriptor_argument_becomes_tensor_map_shape_and_strides(monkeypatch):
    import nbjit
    from nbjit import NbjitArgumentError
    from nbjit.gpu import driver as _driver
    from nbjit.loading.triton import _descriptor_args
    from nbjit.launch.tma import TensorMap, plan_tiled

    d = describe(T / "copy_hostdesc_kernel")["launch"]["descriptors"][0]
    plans = []
    monkeypatch.setattr(_driver, "encode_tensor_map_tiled", lambda plan: plans.append(plan) or bytes(128))
    base = FakeDeviceArray(0x7F0000000000, (100, 72))
    tm, *rest = _descriptor_args(HostDescriptor(base, (100, 72), (72, 1), (32, 64), padding="nan"), d, "k")
    assert isinstance(tm, TensorMap) and rest == [100, 72, 72, 1] and tm.array is base
    p = plans[0]  # what the driver is asked for: Triton's own choices (box from its metadata, L2 128B)
    assert (p.address, p.dims, p.strides, p.box, p.swizzle, p.l2_promotion, p.oob_fill, p.data_type) == \
        (0x7F0000000000, (72, 100), (288,), (32, 32), "128B", "L2_128B", "NAN_REQUEST_ZERO_FMA", "FLOAT32")
    # an nbjit tensor map made with the kernel's box and swizzle serves as well
    mine = TensorMap(bytes(128), plan_tiled(0x7F0000000000, (100, 72), None, "f4", (32, 32), swizzle="128B"))
    assert _descriptor_args(mine, d, "k")[1:] == (100, 72, 72, 1)
    with pytest.raises(NbjitArgumentError, match=r"compiled for boxes of \[32, 32\] with swizzle '128B'"):
        _descriptor_args(TensorMap(bytes(128), plan_tiled(0x7F0000000000, (100, 72), None, "f4", (32, 32))), d, "k")
    with pytest.raises(NbjitArgumentError, match="argument 0 .*TensorDescriptor .* not FakeDeviceArray"):
        _descriptor_args(base, d, "k")
    with pytest.raises(NbjitArgumentError, match="axis 0 has a stride of 280 bytes"):
        _descriptor_args(HostDescriptor(base, (100, 70), (70, 1), (32, 64)), d, "k")
    for shape, strides, bad in (((100.5, 72), (72, 1), "its shape must be integers"),
                                ((100, 72), (72.0, 1), "its strides must be integers"),
                                ((100, 72), (72, 1, 1), "the kernel takes a 2-D descriptor")):  # never truncated
        with pytest.raises(NbjitArgumentError, match=rf"argument 0 \(a tensor descriptor\): {bad}"):
            _descriptor_args(HostDescriptor(base, shape, strides, (32, 64)), d, "k")
    assert nbjit.TensorMap is TensorMap


def test_the_cubin_route_knows_its_tensor_map_parameters():
    # load_triton types a cubin with the PTX beside it: the cubin places the 64-aligned tensor
    # maps at its own offsets (48, 240), the PTX gives their alignment; the packer must see them
    from nbjit import inspect_cubin
    from nbjit.launch import arguments as args
    from nbjit.params import signature

    d = T / "copy_hostdesc_kernel"
    ce = inspect_cubin((d / "copy_hostdesc_kernel.cubin").read_bytes()).entries[0]
    pe = inspect_ptx((d / "copy_hostdesc_kernel.ptx").read_text()).entries[0]
    info = signature.merge(ce.name, [("cubin", ce), ("triton ptx", pe)])
    assert [p.offset for p in info.params][:6] == [48, 176, 180, 184, 192, 240]
    assert [i for i, r in enumerate(args.ArgPacker(info.signature, ce.name).rules) if r.tensor_map] == [0, 5]
    assert dict(info.params[0].origin)["align"] == "triton ptx"


def test_triton_launchers_follow_a_change_of_pdl(monkeypatch):
    """A Triton grid's per-stream launchers are configured again when kernel.pdl changes
    (without a GPU: the kernel's launcher factory is stood in for)."""
    import types

    from nbjit.gpu import driver as _driver
    from nbjit.launch import kernel as K
    from nbjit.loading.triton import TritonKernel
    monkeypatch.setattr("nbjit.launch.launchers._MULTI", [False])
    monkeypatch.setattr(_driver, "device_info", lambda ordinal: types.SimpleNamespace(cc=(9, 0)))
    art = read_triton(T / "pdl_step_kernel")
    info = inspect_ptx(art.ptx.read_bytes()).entries[0]
    kern = K.Kernel(None, (info.name, None, ()), K._State(info.name, None, info, 0, 0))
    made = []
    monkeypatch.setattr(K.Kernel, "configure", lambda self, cfg, **kw: made.append(self._pdl(cfg.pdl)) or
                        (lambda *args: None))
    tk = TritonKernel(kern, art.meta, "ptx")
    g = tk[4]
    g(0, 0, 4, stream=7)
    g(0, 0, 4, stream=7)
    kern.pdl = False
    g(0, 0, 4, stream=7)
    tk[4](0, 0, 4, stream=7)
    assert made == [True, False]  # configured once with Triton's launch_pdl, once after the change
    assert list(g.by_stream) == [7]
    g(0, 0, 4, stream=[7])  # an unhashable stream: configured each time, kept nowhere
    g(0, 0, 4, stream=[7])
    assert made == [True, False, False, False] and list(g.by_stream) == [7]


@pytest.fixture
def fake_kernel(monkeypatch):
    """A Triton kernel of an entry's PTX over stand-ins for the driver (``calls``: the
    launches cuLaunchKernel would have made)."""
    import types

    from nbjit.gpu import driver as _driver
    from nbjit.launch import kernel as K
    from nbjit.loading.triton import TritonKernel
    calls = []
    monkeypatch.setattr(_driver, "backend", lambda: _driver.Backend("python", lambda *a: calls.append(a) or 0, int))
    monkeypatch.setattr(_driver, "device_info", lambda ordinal: types.SimpleNamespace(
        cc=(9, 0), max_shared_optin=227 << 10, max_shared_default=48 << 10))
    monkeypatch.setattr(_driver, "function_attributes", lambda func: dict(
        registers=16, shared=0, const=0, local=0, max_threads_per_block=1024, ptx_version=90, binary_version=90,
        max_dynamic_shared=0))
    monkeypatch.setattr("nbjit.launch.launchers._MULTI", [False])

    def make(entry):
        art = read_triton(T / entry)
        info = inspect_ptx(art.ptx.read_bytes()).entries[0]
        kern = K.Kernel(None, (info.name, None, ()), K._State(info.name, 0x1234, info, 0, 0))
        return TritonKernel(kern, art.meta, "ptx")
    return types.SimpleNamespace(make=make, calls=calls)


@pytest.mark.parametrize("entry,grid,programs,launched", [
    ("add_kernel", 4, (4, 1, 1), (4, 1, 1)), ("add_kernel", [2, 3], (2, 3, 1), (2, 3, 1)),
    ("matmul_ctas2", (3, 2), (3, 2, 1), (6, 2, 1))])  # num_ctas=2: two blocks per program (its PTX fixes the cluster)
def test_a_triton_grid_is_a_launch_configuration(fake_kernel, entry, grid, programs, launched):
    tk = fake_kernel.make(entry)
    m = tk.meta
    g = tk[grid]
    assert g.grid == programs and g.config.grid == launched and g.config.block == m.block
    assert g.config.shared == m.shared and g.config.cluster is None and not g.config.cooperative
    assert g.config.pdl is None  # the kernel's, decided by Kernel.configure


def test_a_triton_launch_is_the_kernels_launcher_with_a_zero_tail(fake_kernel):
    tk = fake_kernel.make("add_kernel")
    g = tk[4]
    g(0x10, 0x20, 0x30, 1000, 0.5, stream=5)
    g(0x10, 0x20, 0x30, 1000, 0.5, stream=5)
    launcher = g.by_stream[5]
    assert launcher.tail == 2 and launcher.config.stream == 5 and launcher is g.launchers[5]
    assert [c[1:8] for c in fake_kernel.calls] == [(4, 1, 1, 128, 1, 1, 0)] * 2
    with pytest.raises(NbjitArgumentError, match=r"Triton kernel 'add_kernel' takes 5 runtime arguments"):
        g(0x10, 0x20, 0x30, 1000, 0.5, 0, 0, stream=5)


@pytest.mark.parametrize("grid, msg", [
    (0, "grid values must be from 1 to 2\\*\\*32 - 1"), ((1, 2, 3, 4), "grid must be an int or a tuple of 1 to 3"),
    (True, "grid must be an int or a tuple"), (1.5, "grid must be an int or a tuple"),
    ((2, 1.0), "grid must hold ints")])
def test_a_triton_grid_is_checked_as_any_launch(fake_kernel, grid, msg):
    tk = fake_kernel.make("add_kernel")
    with pytest.raises(NbjitLaunchError, match=f"kernel 'add_kernel': {msg}"):
        tk[grid]
