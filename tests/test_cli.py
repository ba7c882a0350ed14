"""The nbjit command line, run as a user runs it (the installed console script)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"
EXE = shutil.which("nbjit")


def nbjit(*args: str) -> subprocess.CompletedProcess:
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)


def test_console_script_installed():
    assert EXE, "the 'nbjit' console script is not on PATH: is the package installed?"


def test_inspect_ptx_text():
    r = nbjit("inspect", str(DATA / "nvcc/kernels_sm90.ptx"))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "PTX 9.0, target sm_90" in out
    assert "entry k_basic" in out and "parameter buffer: 24 bytes" in out
    assert "maxntid 256,1,1, minnctapersm 2" in out
    assert "dsm" in out and "dynamic" in out
    assert "debug info: none" in out


def test_inspect_json_keys():
    r = nbjit("inspect", "--json", str(DATA / "triton/add_kernel/add_kernel.ptx"))
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert {"kind", "version", "targets", "address_size", "entries", "globals", "metadata", "debug"} <= set(j)
    assert j["kind"] == "ptx" and j["version"] == [9, 4] and j["targets"] == ["sm_90a"]
    (e,) = j["entries"]
    assert {"name", "params", "param_size", "directives"} <= set(e)
    assert e["directives"] == {"reqntid": [128]}
    assert e["param_size"] == 48
    for p in e["params"]:
        assert {"name", "type", "size", "align", "offset"} <= set(p)
    assert e["params"][3] == {"name": "add_kernel_param_3", "type": "u32", "size": 4, "align": 4, "offset": 24,
                              "origin": {"layout": "ptx", "type": "ptx"}}
    assert j["debug"]["kind"] == "dwarf" and ".debug_info" in j["debug"]["sections"]


def test_strip(tmp_path):
    out = tmp_path / "out.ptx"
    r = nbjit("strip", str(DATA / "nvcc/kernels_G_sm90.ptx"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    j = json.loads(nbjit("inspect", "--json", str(out)).stdout)
    assert j["debug"]["kind"] == "none"
    r = nbjit("strip", str(DATA / "nvcc/kernels_G_sm90.ptx"), "-o", str(out), "--keep-lineinfo")
    assert json.loads(nbjit("inspect", "--json", str(out)).stdout)["debug"]["kind"] == "lineinfo"


@pytest.mark.parametrize("content", [b"hello, world\n", b"\x7fELF\x00\x00garbage", b""])
def test_bad_input_one_line_exit_2(tmp_path, content):
    f = tmp_path / "bad.bin"
    f.write_bytes(content)
    r = nbjit("inspect", str(f))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert "bad.bin" in lines[0]


def test_missing_file_exit_2(tmp_path):
    r = nbjit("inspect", str(tmp_path / "nope.ptx"))
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr


def test_inspect_cubin_json_same_keys_as_ptx():
    r = nbjit("inspect", "--json", str(DATA / "nvcc/kernels_sm_90.cubin"))
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["kind"] == "cubin" and j["arch"] == "sm_90"
    e = {x["name"]: x for x in j["entries"]}["k_basic"]
    assert {"name", "params", "param_size", "directives", "registers", "shared", "const", "local"} <= set(e)
    assert e["params"][2] == {"name": "param_2", "type": "unknown", "size": 4, "align": None, "offset": 16,
                              "origin": {"layout": "cubin"}}
    assert e["param_size"] == 24
    t = {x["name"]: x for x in j["entries"]}["_Z6k_tmplIfEvPT_S0_i"]  # C++: typed by its mangled name
    assert [p.get("ctype") for p in t["params"]] == ["float*", "float", "int"]
    assert t["params"][0]["origin"] == {"layout": "cubin", "pointer": "mangled name", "pointee": "mangled name",
                                        "ctype": "mangled name"}
    lb = {x["name"]: x for x in j["entries"]}["k_lb"]
    assert lb["directives"] == {"maxntid": [256, 1, 1], "maxnreg": 128} and lb["shared"] == 1024


def test_inspect_cubin_text():
    r = nbjit("inspect", str(DATA / "nvcc/cluster_sm90.cubin"))
    assert r.returncode == 0, r.stderr
    assert "cubin for sm_90" in r.stdout and "entry k_cluster" in r.stdout
    assert "explicitcluster, reqnctapercluster 2,1,1" in r.stdout
    assert "type unknown" in r.stdout


def test_inspect_fatbin_with_arch():
    r = nbjit("inspect", str(DATA / "nvcc/kernels_multi_lz4.fatbin"), "--arch", "sm_86")
    assert r.returncode == 0, r.stderr
    assert "fatbin with 3 images" in r.stdout and "lz4" in r.stdout
    assert "sm_86 uses image 0 (cubin sm_80)" in r.stdout and "entry k_basic" in r.stdout
    j = json.loads(nbjit("inspect", "--json", str(DATA / "nvcc/kernels_multi.fatbin"), "--arch", "sm_100").stdout)
    assert j["kind"] == "fatbin"
    assert [(i["kind"], i["arch"], i["compressed"]) for i in j["images"]] == [
        ("cubin", "sm_80", False), ("ptx", "compute_90", True), ("cubin", "sm_90", False)]
    assert j["selected"] == 1 and j["selected_image"]["kind"] == "ptx"


def test_inspect_bad_arch_and_ltoir(tmp_path):
    r = nbjit("inspect", str(DATA / "nvcc/kernels_multi.fatbin"), "--arch", "volta")
    assert r.returncode == 2 and "not an architecture" in r.stderr
    f = tmp_path / "k.bc"
    f.write_bytes(b"BC\xc0\xde" + b"\0" * 64)
    r = nbjit("inspect", str(f))
    assert r.returncode == 2 and "LLVM bitcode" in r.stderr and "Traceback" not in r.stderr
