"""Triton metadata and launch rules (nbjit.triton) on Triton 3.9 artifacts, without a GPU."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nbjit import NbjitLoadError, inspect_ptx
from nbjit.triton import describe, launch_rules, read_triton

DATA = Path(__file__).resolve().parent / "data"
T = DATA / "triton"


@pytest.mark.parametrize("entry,name,warps,ctas,shared,gscratch", [
    ("add_kernel", "add_kernel", 4, 1, 0, 0), ("softmax_kernel", "softmax_kernel", 8, 1, 32, 0),
    ("matmul_kernel", "matmul_kernel", 8, 1, 65536, 0), ("matmul_ctas2", "matmul_kernel", 4, 2, 24576, 0),
    ("copy_desc_kernel", "copy_desc_kernel", 4, 1, 4104, 256)])
def test_metadata_from_cache_entries(entry, name, warps, ctas, shared, gscratch):
    art = read_triton(T / entry)
    m = art.meta
    assert (m.name, m.num_warps, m.num_ctas, m.shared, m.global_scratch_size) == (name, warps, ctas, shared, gscratch)
    assert m.block == (warps * 32, 1, 1) and m.arch == 90 and m.triton_version == "3.9.0"
    assert m.scratch_params == 2  # Triton >= 3.5: global and profile scratch
    assert art.cubin.name == f"{name}.cubin" and art.ptx.name == f"{name}.ptx"
    assert read_triton(T / entry / f"{name}.json").meta == m  # the .json itself works too


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
    assert inspect_ptx((T / "matmul_ctas2/matmul_kernel.ptx").read_text()).entries[0].directives.reqnctapercluster == (2,)


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
    with pytest.raises(NbjitLoadError, match="without 'name'"):
        read_triton(bad)
    bad.write_text(json.dumps({"name": "k", "target": {"backend": "hip", "arch": "gfx942"}}))
    with pytest.raises(NbjitLoadError, match="not CUDA"):
        read_triton(bad)
    bad.write_text(json.dumps({"name": "k"}))
    with pytest.raises(NbjitLoadError, match="neither k.cubin nor k.ptx"):
        read_triton(bad)


def test_cli_inspect_triton():
    r = subprocess.run([sys.executable, "-m", "nbjit", "inspect", str(T / "matmul_kernel")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "block (256, 1, 1) = 8 warps, 65536 bytes dynamic shared memory" in r.stdout
    assert "the first 12 parameters" in r.stdout
    j = json.loads(subprocess.run([sys.executable, "-m", "nbjit", "inspect", "--json", str(T / "add_kernel")],
                                  capture_output=True, text=True, timeout=120).stdout)
    assert j["kind"] == "triton" and j["launch"]["user_params"] == 5
