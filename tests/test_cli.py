"""The nbjit command line, run as a user runs it (the installed console script)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nbjit as nbjit_lib
from conftest import DATA  # noqa: E402
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


def test_inspect_of_cuda_source_says_how_to_compile_it(tmp_path):
    f = tmp_path / "k.cu"
    f.write_text('extern "C" __global__ void k(float* p) { p[0] = 1.0f; }\n')
    r = nbjit("inspect", str(f))
    assert r.returncode == 2 and r.stderr == (f"nbjit inspect: error: {f}: CUDA C++ source, not compiled code: compile "
                                              "it first (nbjit.compile(), or 'nbjit compile FILE --arch sm_XX')\n")


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
    assert "fatbin with 3 entries" in r.stdout and "lz4" in r.stdout
    assert "sm_86 uses entry 0 (cubin sm_80)" in r.stdout and "entry k_basic" in r.stdout
    j = json.loads(nbjit("inspect", "--json", str(DATA / "nvcc/kernels_multi.fatbin"), "--arch", "sm_100").stdout)
    assert j["kind"] == "fatbin"
    assert [(i["kind"], i["arch"], i["compressed"]) for i in j["entries"]] == [
        ("cubin", "sm_80", False), ("ptx", "compute_90", True), ("cubin", "sm_90", False)]
    assert j["selected"] == 1 and j["selected_entry"]["kind"] == "ptx"


def test_inspect_a_bundle_name_that_is_no_bundle(tmp_path):
    f = tmp_path / "kernels.nbjit"
    f.write_text("hello\n")
    r = nbjit("inspect", str(f))
    assert r.returncode == 2 and "not a kernel bundle (a bundle is a ZIP archive" in r.stderr
    f.write_bytes((DATA / "nvcc/kernels_sm90.ptx").read_bytes())  # an image by any name is read as one
    r = nbjit("inspect", str(f))
    assert r.returncode == 0 and "PTX 9.0" in r.stdout, r.stderr


def test_inspect_fatbin_with_a_damaged_cubin(tmp_path):
    """A fatbin whose embedded cubin does not read as one: listed as damaged, with what is
    wrong, and the exit status says so (the fatbin's container itself reads)."""
    data = bytearray((DATA / "nvcc/kernels_multi_none.fatbin").read_bytes())
    entry = {e.index: e for e in nbjit_lib.inspect_fatbin(bytes(data)).entries}[0]
    assert entry.kind == "cubin" and entry.arch_name == "sm_80"
    data[entry.offset + 0x28:entry.offset + 0x30] = b"\xff" * 8  # its ELF section header table's offset
    f = tmp_path / "damaged.fatbin"
    f.write_bytes(data)
    r = nbjit("inspect", str(f), "--arch", "sm_80")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[3:6]]
    assert rows[0][-3:] == ["no", "(damaged:", "below)"] and rows[1][-1] == rows[2][-1] == "yes"
    assert f"damaged: {f}[0]: section header table" in r.stdout and "sm_80 uses entry 0" in r.stdout
    assert "1 entry damaged (#0)" in r.stderr
    r = nbjit("inspect", "--json", str(f), "--arch", "sm_80")
    j = json.loads(r.stdout)
    assert r.returncode == 1 and "section header table" in j["entries"][0]["damaged"]
    assert "damaged" not in j["entries"][2] and j["selected"] == 0 and "selected_entry" not in j
    assert nbjit("inspect", str(DATA / "nvcc/kernels_multi_none.fatbin")).returncode == 0


def test_inspect_fatbin_with_ltoir():
    r = nbjit("inspect", str(DATA / "nvcc/lto_sm90.fatbin"), "--arch", "sm_90")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:5]]
    assert rows[2:] == [["0", "cubin", "sm_90", "-", "3840", "yes"],
                        ["1", "ltoir", "lto_90", "zstd", rows[3][4], "no", "(nvJitLink", "reads", "it)"]]
    assert "sm_90 uses entry 0 (cubin sm_90)" in r.stdout and "entry k_triple" in r.stdout
    j = json.loads(nbjit("inspect", "--json", str(DATA / "nvcc/lto_sm90_none.fatbin")).stdout)
    assert [(i["kind"], i["arch"], i["compression"], i["decompressed"]) for i in j["entries"]] == [
        ("cubin", "sm_90", None, True), ("ltoir", "lto_90", None, True)]


def test_inspect_bad_arch_and_ltoir(tmp_path):
    r = nbjit("inspect", str(DATA / "nvcc/kernels_multi.fatbin"), "--arch", "volta")
    assert r.returncode == 2 and "not an architecture" in r.stderr
    f = tmp_path / "k.bc"
    f.write_bytes(b"BC\xc0\xde" + b"\0" * 64)
    r = nbjit("inspect", str(f))
    assert r.returncode == 2 and "LLVM bitcode" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- hostile and careless use

import os  # noqa: E402
import threading  # noqa: E402


def test_version():
    r = nbjit("--version")
    assert r.returncode == 0 and r.stdout.startswith("nbjit ")


@pytest.mark.parametrize("verb", [["inspect"], ["strip", "-o", "/tmp/nbjit-never.ptx"], ["compile", "--arch", "sm_90"]])
def test_a_fifo_is_refused_not_waited_on(tmp_path, verb):
    fifo = tmp_path / "pipe.ptx"
    os.mkfifo(fifo)
    r = nbjit(verb[0], str(fifo), *verb[1:])  # the 120 s timeout would fire on a hang
    assert r.returncode == 2 and "is a FIFO, not a regular file" in r.stderr


def test_dev_zero_and_links_to_it_are_refused(tmp_path):
    link = tmp_path / "zero.ptx"
    link.symlink_to("/dev/zero")
    for f in ("/dev/zero", str(link)):
        r = nbjit("inspect", f)
        assert r.returncode == 2 and "not a regular file" in r.stderr


def test_output_onto_the_input_is_refused(tmp_path):
    src = tmp_path / "g.ptx"
    src.write_bytes((DATA / "nvcc/kernels_G_sm90.ptx").read_bytes())
    link = tmp_path / "link.ptx"
    link.symlink_to(src)
    for out in (src, link):
        r = nbjit("strip", str(src), "-o", str(out))
        assert r.returncode == 2 and "refusing to overwrite it" in r.stderr
    assert src.read_bytes() == (DATA / "nvcc/kernels_G_sm90.ptx").read_bytes()
    r = nbjit("strip", str(link), "--in-place")
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and ".debug_info" not in src.read_text()  # the link's target, replaced
    cu = tmp_path / "k.cu"
    cu.write_text('extern "C" __global__ void k(int* p) { p[0] = 1; }\n')
    r = nbjit("compile", str(cu), "--arch", "sm_90", "-o", str(cu))
    assert r.returncode == 2 and "refusing to overwrite" in r.stderr and "__global__" in cu.read_text()
    assert "--in-place" not in r.stderr  # compile has no such option to suggest


def test_compile_refuses_output_onto_the_input_before_compiling(tmp_path, monkeypatch, capsys):
    from nbjit.cli import main as cli

    def refuse(*a, **k):
        raise AssertionError("compiled although the output is the input")
    monkeypatch.setattr("nbjit.toolchain.nvrtc.compile_image", refuse)
    cu = tmp_path / "k.cu"
    cu.write_text('extern "C" __global__ void k(int* p) { p[0] = 1; }\n')
    assert cli.main(["compile", str(cu), "--arch", "sm_90", "-o", str(cu)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err and "__global__" in cu.read_text()


@pytest.mark.parametrize("content,msg", [
    (b"\xff\xfe\x00k", "not UTF-8 text"),
    ('extern "C" __global__ void k() {} // caf\xe9\n'.encode("latin-1"), "not UTF-8 text"),
    ((DATA / "nvcc/kernels_sm90.ptx").read_bytes(), "is ptx, already compiled"),
    ((DATA / "nvcc/kernels_sm_90.cubin").read_bytes(), "is cubin, already compiled"),
    ((DATA.parent.parent / "examples/bundle_package/src/nbjit_demo_kernels/kernels.nbjit").read_bytes(),
     "is a ZIP archive (a kernel bundle?), not CUDA source"),
], ids=["utf16", "latin1", "ptx", "cubin", "bundle"])
def test_compile_says_what_a_file_is(tmp_path, content, msg):
    f = tmp_path / "x.cu"
    f.write_bytes(content)
    r = nbjit("compile", str(f), "--arch", "sm_90", "-o", str(tmp_path / "out"))
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["inspect", str(DATA / "nvcc/kernels_G_sm90.ptx")],
                                  ["inspect", "--json", str(DATA / "nvcc/kernels_G_sm90.ptx")],
                                  ["strip", str(DATA / "nvcc/kernels_G_sm90.ptx"), "-o", "-"]])
def test_output_piped_to_head_exits_quietly(args):
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    for _ in range(5):
        p = subprocess.Popen([*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdout.readline()
        p.stdout.close()  # what `| head -1` does
        err = p.stderr.read().decode()
        said = f"{args[1]}: debug info dwarf -> standard output (37499 -> 19593 bytes)\n"  # strip's report (stderr)
        assert p.wait(timeout=60) == 0 and err in ("", said), err


PTX = str(DATA / "nvcc/kernels_sm90.ptx")


@pytest.mark.parametrize("args, closing, said", [
    (["inspect", PTX], ">&-", "nbjit inspect: error: standard output is closed (the command writes there: "),
    (["strip", PTX, "-o", "-"], ">&-", "nbjit strip: error: standard output is closed"),
    (["inspect", "--help"], ">&-", "nbjit: error: standard output is closed"),
    (["inspect", "-"], "<&-", "nbjit inspect: error: standard input is closed ('-' reads it: give a file, or < FILE)"),
    (["cache", "import", "-"], "<&-", "nbjit cache: error: standard input is closed"),
    (["inspect", PTX], ">&- 2>&-", ""),
])
def test_a_closed_standard_stream_is_one_line_and_status_2(tmp_path, args, closing, said):
    """``nbjit inspect x >&-`` printed a traceback ('NoneType' object has no attribute 'flush')."""
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    r = subprocess.run(["sh", "-c", f'exec "$@" {closing}', "sh", *cmd, *args], capture_output=True, text=True,
                       env={**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "c")}, timeout=120)
    assert (r.returncode, r.stdout) == (2, "") and r.stderr.startswith(said) and len(r.stderr.splitlines()) == \
        (1 if said else 0), r.stderr


def test_a_command_that_writes_no_standard_output_runs_with_it_closed(tmp_path):
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    out = tmp_path / "o.ptx"
    r = subprocess.run(["sh", "-c", 'exec "$@" >&- <&-', "sh", *cmd, "strip", PTX, "-o", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and out.read_text() == Path(PTX).read_text() and "-> " + str(out) in r.stderr


@pytest.mark.parametrize("verb", ["compile", "bundle"])
def test_ctrl_c_stops_a_long_compile_at_once(tmp_path, verb):
    """Ctrl-C while NVRTC compiles (it went on: 90 s and counting): status 130 at once, no
    traceback, and nothing left behind (no output, no lock or temporary file in the cache)."""
    import signal
    from conftest import endless_source, wait_compiling
    src = tmp_path / "endless.cu"
    src.write_text(endless_source())
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    p = subprocess.Popen([*cmd, verb, str(src), "--arch", "sm_90", "-o", str(tmp_path / "out")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "cache")})
    try:
        wait_compiling(tmp_path / "cache", 1, lambda: [p.pid])
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert (p.returncode, out, err) == (130, "", "\n")
        assert not (tmp_path / "out").exists()
        assert not [f for f in (tmp_path / "cache").rglob("*") if f.name.endswith(".lock") or
                    f.name.startswith(".tmp-")]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_options_that_make_no_sense(tmp_path):
    r = nbjit("inspect", "--arch", "sm_90", str(DATA / "nvcc/kernels_sm90.ptx"))
    assert r.returncode == 2 and "--arch chooses a fatbin's entry; " in r.stderr
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path)}
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    run = lambda *a, **kw: subprocess.run([*cmd, *a], capture_output=True, text=True, env={**env, **kw}, timeout=60)
    r = run("cache", "list", "--max-bytes", "5")
    assert r.returncode == 2 and "--max-bytes applies to 'cache prune'" in r.stderr
    r = run("cache", "prune", "--max-bytes", "-5")
    assert r.returncode == 2 and "byte count >= 0" in r.stderr
    r = run("cache", "info", NBJIT_CACHE_MAX_BYTES="abc")
    assert r.returncode == 2 and "NBJIT_CACHE_MAX_BYTES='abc'" in r.stderr
    r = run("cache", "prune")
    assert r.returncode == 0 and "(limit 1 GiB)" in r.stdout


def test_cache_on_a_read_only_directory(tmp_path):
    c = tmp_path / "ro"
    (c / "ab").mkdir(parents=True)
    (c / "ab" / ("ab" + "0" * 62 + ".nbjit")).write_bytes(b"x" * 100)
    os.chmod(c / "ab", 0o555)
    try:
        env = {**os.environ, "NBJIT_CACHE_DIR": str(c)}
        cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
        r = subprocess.run([*cmd, "cache", "prune", "--max-bytes", "0"], capture_output=True, text=True, env=env,
                           timeout=60)
        if os.geteuid() == 0:  # root writes anyway: nothing to refuse
            assert r.returncode == 0
        else:
            assert r.returncode == 2 and "cannot remove" in r.stderr and "Traceback" not in r.stderr
    finally:
        os.chmod(c / "ab", 0o755)


def test_cache_verbs_with_the_disk_cache_off():
    """NBJIT_CACHE=0: clear and prune say there is nothing to do (clear printed "from None");
    export and import refuse, as nothing is there to read or write."""
    env = {**os.environ, "NBJIT_CACHE": "0"}
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    said = {}
    for verb in ("clear", "prune", "export"):
        r = subprocess.run([*cmd, "cache", verb, *(["x.tgz"] if verb == "export" else [])], capture_output=True,
                           text=True, env=env, timeout=60)
        said[verb] = (r.returncode, r.stdout + r.stderr)
    assert said == {"clear": (0, "nothing to clear: the disk cache is off (NBJIT_CACHE=0)\n"),
                    "prune": (0, "nothing to prune: the disk cache is off (NBJIT_CACHE=0)\n"),
                    "export": (2, "nbjit cache: error: cannot export: the disk cache is off (NBJIT_CACHE=0)\n")}


def test_cache_list_tells_entries_of_another_format_from_corrupt_ones(tmp_path, monkeypatch):
    import nbjit.cache.store as C
    from nbjit.cache import entries
    entry = entries.CacheEntry("cubin", "sm_90", b"x" * 100)
    C.Cache(tmp_path).write(entries.cache_key({"i": 1}), entry)
    monkeypatch.setattr(entries, "FORMAT_VERSION", entries.FORMAT_VERSION - 1)  # as an older nbjit writes
    C.Cache(tmp_path).write(entries.cache_key({"i": 2}), entry)
    monkeypatch.undo()
    (f,) = [f for f in tmp_path.glob("??/*.nbjit") if f.read_bytes()[8] == entries.FORMAT_VERSION]  # (this one's)
    f.write_bytes(f.read_bytes()[:-1] + b"y")  # a flipped byte
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path)}
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    r = subprocess.run([*cmd, "cache", "list"], capture_output=True, text=True, env=env, timeout=60)
    lines = sorted(line.split(":", 1)[1].split("  ", 1)[1].strip() for line in r.stdout.splitlines())
    assert lines == ["corrupt: checksum mismatch",
                     f"unused: cache format {entries.FORMAT_VERSION - 1} (this nbjit's is {entries.FORMAT_VERSION}): "
                     "never read, it ages out"], r.stdout


def test_cache_list_while_entries_come_and_go(tmp_path):
    from nbjit.cache.store import Cache
    from nbjit.cache.entries import cache_key
    from nbjit.cache.entries import CacheEntry
    cache = Cache(tmp_path, max_bytes=None)
    stop = threading.Event()

    def churn():
        i = 0
        while not stop.is_set():
            k = cache_key({"i": i % 20})
            cache.write(k, CacheEntry("cubin", "sm_90", b"x" * 1000))
            if i % 3 == 0:
                cache.clear()
            i += 1

    t = threading.Thread(target=churn)
    t.start()
    try:
        env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path)}
        cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
        for _ in range(4):
            r = subprocess.run([*cmd, "cache", "list"], capture_output=True, text=True, env=env, timeout=60)
            assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    finally:
        stop.set()
        t.join()


def test_strip_under_an_ascii_locale(tmp_path):
    src = tmp_path / "u.ptx"
    src.write_text((DATA / "nvcc/kernels_G_sm90.ptx").read_text() + "// r\u00e9sum\u00e9 \u2603\n", encoding="utf-8")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": "ascii"}
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    r = subprocess.run([*cmd, "strip", str(src), "-o", str(tmp_path / "o.ptx")], capture_output=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "\u2603" in (tmp_path / "o.ptx").read_text(encoding="utf-8")
    r = subprocess.run([*cmd, "inspect", str(src)], capture_output=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr


def test_compile_without_nvrtc_says_what_to_install(tmp_path):
    code = ("import sys, cuda.bindings.nvrtc as N\n"
            "def gone(*a): raise RuntimeError('Failure finding libnvrtc.so')\n"
            "N.nvrtcVersion = gone\n"
            "from nbjit.cli.main import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    cu = tmp_path / "k.cu"
    cu.write_text('extern "C" __global__ void k(int* p) { p[0] = 1; }\n')
    r = subprocess.run([sys.executable, "-c", code, "compile", str(cu), "--arch", "sm_90", "-o",
                        str(tmp_path / "k.cubin")], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "NBJIT_CACHE": "0"})
    assert r.returncode == 2 and "pip install -e '.[cu13]' in a checkout of nbjit" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "nbjit-core[" not in r.stderr  # (not on PyPI)


def test_compile_several_architectures_prewarms_the_cache(tmp_path, monkeypatch):
    import os

    import nbjit.toolchain.nvrtc as C
    from nbjit import compile_image
    from nbjit.cache.store import Cache
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* x, float a) { x[threadIdx.x] *= a; }\n')
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "cache")}
    run = lambda *a: subprocess.run([*cmd, *a], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    r = run("compile", str(src), "--arch", "sm_80,sm_90", "--cache-only", "-DUNUSED=1")
    assert r.returncode == 0 and "cubin for sm_80 in the cache" in r.stderr and "sm_90" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "k.cu"]  # no file written
    r = run("compile", str(src), "--arch", "80,sm_90")  # (each compile is told an Arch: 80 is sm_80)
    assert r.returncode == 0 and {"k.sm_80.cubin", "k.sm_90.cubin"} <= {p.name for p in tmp_path.iterdir()}
    assert nbjit("inspect", str(tmp_path / "k.sm_80.cubin")).stdout.count("sm_80") >= 1

    def no_compiler(*a, **k):
        raise AssertionError("NVRTC ran: the prewarmed entry was not found")
    monkeypatch.setattr(C, "_run_nvrtc", no_compiler)
    for arch in ("sm_80", "sm_90"):  # what a process on that GPU asks for
        img = compile_image(src.read_text(), name="k.cu", options=["-DUNUSED=1"], arch=arch,
                            cache=Cache(tmp_path / "cache"))
        assert img.arch == arch and img.data == (tmp_path / f"k.{arch}.cubin").read_bytes()


@pytest.mark.parametrize("args, msg", [
    (["--arch", "sm_80,,sm_90"], "once each"),
    (["--arch", "sm_80,sm_80"], "once each"),
    (["--arch", "sm_90,90"], "once each"),
    (["--arch", "sm_80,bogus"], "not an architecture"),
    (["--arch", "sm_80,sm_90", "-o", "x.cubin"], "an existing directory (one file each), and there is nothing at"),
    (["--arch", "sm_80,sm_90", "-o", "k.cu"], "and there is a file at that path"),
    (["--arch", "sm_90", "--cache-only", "-o", "x.cubin"], "drop -o"),
])
def test_compile_arch_lists_that_make_no_sense(tmp_path, args, msg):
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k() {}\n')
    r = nbjit("compile", str(src), *[str(tmp_path / a) if a.endswith((".cubin", ".cu")) else a for a in args])
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_inspect_shows_griddepcontrol():
    r = nbjit("inspect", str(DATA / "nvcc/pdl_sm90.ptx"))
    assert r.returncode == 0, r.stderr
    assert "griddepcontrol: wait, launch_dependents (programmatic dependent launch by default)" in r.stdout
    assert "griddepcontrol: wait (programmatic dependent launch by default)" in r.stdout
    j = json.loads(nbjit("inspect", "--json", str(DATA / "nvcc/pdl_sm90.ptx")).stdout)
    assert [e.get("griddepcontrol") for e in j["entries"]] == [["wait", "launch_dependents"], ["wait"], None]


def test_output_to_standard_output(tmp_path):
    """-o - writes to standard output (the messages stay on standard error), never a file named '-'."""
    import os
    from nbjit import strip_debug
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "cache")}
    run = lambda *a, **kw: subprocess.run([*cmd, *a], capture_output=True, env=env, cwd=tmp_path, timeout=120, **kw)
    ptx = DATA / "nvcc/kernels_G_sm90.ptx"
    r = run("strip", str(ptx), "-o", "-")
    assert r.returncode == 0 and r.stdout == strip_debug(ptx.read_bytes()).encode()
    assert b"-> standard output" in r.stderr
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* p) { p[0] = 1.0f; }\n')
    r = run("compile", str(src), "--arch", "sm_90", "--ptx", "-o", "-")
    assert r.returncode == 0 and r.stdout.startswith(b"//") and b".target sm_90" in r.stdout
    r = run("compile", str(src), "--arch", "sm_90", "-o", "-")  # a pipe, not a terminal: the cubin
    assert r.returncode == 0 and r.stdout.startswith(b"\x7fELF") and b"cubin for sm_90" in r.stderr
    r = run("compile", str(src), "--arch", "sm_80,sm_90", "-o", "-")
    assert r.returncode == 2 and b"one architecture's output" in r.stderr and not r.stdout
    leader, follower = os.openpty()  # a terminal: no binary there
    try:
        r = subprocess.run([*cmd, "compile", str(src), "--arch", "sm_90", "-o", "-"], stdout=follower,
                           stderr=subprocess.PIPE, env=env, cwd=tmp_path, timeout=120)
    finally:
        os.close(follower)
        os.close(leader)
    assert r.returncode == 2 and b"a cubin is binary, not for a terminal" in r.stderr
    assert not (tmp_path / "-").exists()


def test_compile_never_writes_ptx_as_a_cubin(tmp_path, capsys):
    """--arch sm_91 -o k.cubin once exited 0 and wrote PTX text into k.cubin. An output
    named .cubin asks for a cubin; .ptx for PTX; an architecture no chip has, or one newer
    than NVRTC knows (which once gave PTX for the newest it knows, whatever -o said), is
    refused, in one line naming what NVRTC compiles for."""
    from nbjit.cli import main as cli
    from nbjit.arch import SHIPPED
    from nbjit.toolchain.nvrtc import supported_archs
    cu = tmp_path / "k.cu"
    cu.write_text('extern "C" __global__ void k(int* p) { p[0] = 1; }\n')
    newer = f"sm_{max(SHIPPED) + 9}"
    newest = f"compute_{max(supported_archs())}"
    for arch, out, said in (("sm_91", "k.cubin", "no chip has that compute capability"),
                            (newer, "k.cubin", f"runs there: --arch {newest})"), ("sm_91", "k.ptx", "no chip"),
                            (newer, "dir", f"cannot compile for it; it compiles for sm_{min(supported_archs())}, ")):
        assert cli.main(["compile", str(cu), "--arch", arch, "-o", str(tmp_path / out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"nbjit compile: error: --arch {arch}: ") and said in err, err
        assert len(err.splitlines()) == 1 and not (tmp_path / out).exists()
    assert cli.main(["compile", str(cu), "--arch", "sm_90", "-o", str(tmp_path / "k.ptx")]) == 0
    assert (tmp_path / "k.ptx").read_bytes().lstrip().startswith(b"//")
    assert cli.main(["compile", str(cu), "--arch", "sm_90", "-o", str(tmp_path / "k.cubin")]) == 0
    assert (tmp_path / "k.cubin").read_bytes()[:4] == b"\x7fELF"
    assert cli.main(["compile", str(cu), "--arch", newest, "-o", str(tmp_path / "dir")]) == 0  # no suffix: PTX
    assert (tmp_path / "dir").read_bytes().lstrip().startswith(b"//") and "ptx for compute_" in capsys.readouterr().err


def test_a_compile_error_names_the_toolchains_include_directories_by_what_they_are(tmp_path, monkeypatch, capsys):
    """The header of an NVRTC error once listed --include-path=<the venv>/site-packages/nvidia/...:
    nbjit's own include directories are shown as <cuda> and <cccl>; the user's as given; the
    exception keeps the real options."""
    from nbjit.cli import main as cli
    from nbjit.toolchain.identity import cccl_include_dir, cuda_include_dir
    from nbjit.toolchain.nvrtc import compile_image, nvrtc_version
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inc").mkdir()
    (tmp_path / "bad.cu").write_text('extern "C" __global__ void k(float* p) { p[0] = undefined_thing; }\n')
    assert cli.main(["compile", "bad.cu", "--arch", "sm_90", "-I", "inc"]) == 2
    head = capsys.readouterr().err.splitlines()[0]
    assert head == (f"nbjit compile: error: bad.cu: NVRTC {'.'.join(map(str, nvrtc_version()))} could not "
                    f"compile it (options: -arch=sm_90 --include-path={tmp_path / 'inc'} --include-path=<cuda>"
                    + (" --include-path=<cccl>)" if cccl_include_dir() else ")")), head  # (CUDA 12's wheels: no CCCL)
    with pytest.raises(nbjit_lib.CompileFailure) as e:
        compile_image((tmp_path / "bad.cu").read_text(), arch="sm_90")
    assert f"--include-path={cuda_include_dir()}" in e.value.options and cuda_include_dir() not in str(e.value)


@pytest.mark.parametrize("args, said", [
    (["compile", "k.cu", "--arch", "sm_90", "--ptx", "-o", "k.cubin"],
     "-o k.cubin names a cubin, and --ptx writes PTX: name it k.ptx, or drop --ptx for a cubin"),
    (["compile", "k.cu", "--arch", "compute_90", "-o", "k.CUBIN"],
     "-o k.CUBIN names a cubin, and --arch compute_90 gives PTX: name it k.ptx, or give --arch sm_90 for a cubin"),
    (["compile", "k.cu", "--arch", "sm_90", "-o", "k.fatbin"],
     "-o k.fatbin names a fatbin, and nbjit compile writes a cubin (or PTX): name it k.cubin"),
    (["compile", "k.cu", "--arch", "sm_90", "-o", "k.nbjit"], "-o k.nbjit names a kernel bundle, and nbjit compile "
     "writes a cubin (or PTX): name it k.cubin (nbjit bundle makes a bundle)"),
    (["bundle", "k.ptx", "-o", "b.cubin"],
     "-o b.cubin names a cubin, and nbjit bundle writes a kernel bundle (a ZIP archive): name it b.nbjit"),
    (["bundle", "k.ptx", "-o", "b.fatbin"], "-o b.fatbin names a fatbin, and nbjit bundle writes a kernel bundle"),
    (["strip", "k.ptx", "-o", "s.cubin"], "-o s.cubin names a cubin, and nbjit strip writes PTX: name it s.ptx"),
    (["strip", "k.ptx", "-o", "s.nbjit"], "-o s.nbjit names a kernel bundle, and nbjit strip writes PTX"),
])
def test_an_output_named_for_another_kind_is_refused(tmp_path, monkeypatch, capsys, args, said):
    """PTX is never written under a cubin's name (--ptx -o k.cubin once wrote PTX text there and
    exited 0), nor anything under the name of a kind it is not (.ptx, .cubin, .fatbin, .nbjit):
    one line, exit 2, nothing written."""
    from nbjit.cli import main as cli
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(int* p) { p[0] = 1; }\n')
    shutil.copy(DATA / "nvcc/kernels_G_sm90.ptx", tmp_path / "k.ptx")
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"nbjit {args[0]}: error: {said}") and err.endswith("; nothing written\n"), err
    assert len(err.splitlines()) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["k.cu", "k.ptx"]


def test_an_output_of_another_or_no_suffix_is_written(tmp_path, monkeypatch, capsys):
    """Suffixes that name no kind (.o, .txt, none) and .ptx (which asks compile for PTX) are written."""
    from nbjit.cli import main as cli
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(int* p) { p[0] = 1; }\n')
    assert cli.main(["compile", "k.cu", "--arch", "sm_90", "--ptx", "-o", "k.txt"]) == 0
    assert cli.main(["compile", "k.cu", "--arch", "sm_90", "-o", "k.PTX"]) == 0
    assert cli.main(["compile", "k.cu", "--arch", "sm_90", "-o", "k.o"]) == 0
    assert cli.main(["strip", "k.txt", "-o", "s"]) == 0
    assert cli.main(["bundle", "k.o", "-o", "b.zip"]) == 0
    assert (tmp_path / "k.txt").read_bytes().startswith(b"//") and (tmp_path / "k.PTX").read_bytes().startswith(b"//")
    assert (tmp_path / "k.o").read_bytes()[:4] == b"\x7fELF" and (tmp_path / "b.zip").read_bytes()[:2] == b"PK"


def test_an_output_that_is_a_device_is_written_through_never_replaced(tmp_path):
    """-o onto a character device (here links to /dev/null and /dev/full, and where root may
    make one a device node in tmp_path) writes into it; the node stays a device. A FIFO is
    written through to its reader; one nobody reads, a directory, are refused."""
    import stat
    ptx = str(DATA / "nvcc/kernels_G_sm90.ptx")
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    run = lambda *a: subprocess.run([*cmd, *a], capture_output=True, text=True, env=env, timeout=120)
    null, full = tmp_path / "null", tmp_path / "full"
    null.symlink_to("/dev/null")
    full.symlink_to("/dev/full")
    outs = [null]
    if os.geteuid() == 0:
        node = tmp_path / "node"
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
        outs.append(node)
    for out in outs:
        r = run("strip", ptx, "-o", str(out))
        assert r.returncode == 0, r.stderr
        r = run("cache", "export", str(out))
        assert r.returncode == 0 and "exported 0 entries" in r.stdout, r.stderr
    for args in (["strip", ptx, "-o", str(full)], ["cache", "export", str(full)]):
        r = run(*args)
        assert r.returncode == 2 and "No space left on device" in r.stderr and len(r.stderr.splitlines()) == 1, \
            r.stderr
    assert null.is_symlink() and full.is_symlink()
    for dev in ("/dev/null", "/dev/full", *map(str, outs[1:])):
        assert stat.S_ISCHR(os.stat(dev).st_mode), f"{dev} is no longer a character device"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = run("strip", ptx, "-o", str(fifo))  # nobody reads it: refused, not waited on
    assert r.returncode == 2 and "a FIFO that no process is reading" in r.stderr, r.stderr
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    try:
        for _ in range(100):  # until the reader has it open
            r = run("strip", ptx, "-o", str(fifo))
            if "no process is reading" not in r.stderr:
                break
    finally:
        if r.returncode != 0:
            os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # let the reader go
        reader.join(timeout=60)
    from nbjit import strip_debug
    assert r.returncode == 0 and got == [strip_debug(Path(ptx).read_bytes()).encode()], r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    r = run("cache", "export", str(tmp_path))
    assert r.returncode == 2 and f"cannot write the cache archive {tmp_path}: it is a directory" in r.stderr


def test_an_output_through_a_link_replaces_the_file_it_names(tmp_path):
    """-o a link to a regular file: the file is replaced (its permissions kept), the link stays."""
    real = tmp_path / "real.ptx"
    real.write_text("old")
    os.chmod(real, 0o640)
    link = tmp_path / "link.ptx"
    link.symlink_to(real)
    r = nbjit("strip", str(DATA / "nvcc/kernels_G_sm90.ptx"), "-o", str(link))
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and ".entry" in real.read_text() and (real.stat().st_mode & 0o777) == 0o640


def test_compile_options_that_start_with_a_dash(tmp_path, monkeypatch, capsys):
    """--option -lineinfo (the documented form) reaches NVRTC as -lineinfo, as --option=-X does;
    -G, --lineinfo, --std, -D, -I are shortcuts."""
    from nbjit.cli import main as cli
    from nbjit.read.image import Image
    seen = []

    def fake(source, *, name, options, arch, output, name_expressions, include_paths=()):
        seen.append(list(options))
        return Image(b"//\n.version 8.0\n.target sm_90\n.address_size 64\n", "ptx", name, arch=arch)
    monkeypatch.setattr("nbjit.toolchain.nvrtc.compile_image", fake)
    cu = tmp_path / "k.cu"
    cu.write_text('extern "C" __global__ void k() {}\n')
    out = str(tmp_path / "k.ptx")
    assert cli.main(["compile", str(cu), "--arch", "sm_90", "--option", "-lineinfo", "--option=-use_fast_math",
                     "--opt", "--extra-device-vectorization", "-o", out]) == 0, capsys.readouterr().err
    assert seen[-1] == ["-lineinfo", "-use_fast_math", "--extra-device-vectorization"]
    assert cli.main(["compile", str(cu), "--arch", "sm_90", "-G", "--lineinfo", "--std", "c++17", "-D", "N=4",
                     "-DM", "-I", "inc", "-o", out]) == 0
    assert seen[-1] == ["-I", "inc", "-DN=4", "-DM", "-std=c++17", "-G", "-lineinfo"]
    assert "--option -use_fast_math" in nbjit("compile", "--help").stdout
    r = nbjit("compile", str(cu), "--arch", "sm_90", "--ptx", "--option", "-lineinfo", "-o", "-")
    assert r.returncode == 0 and ".loc" in r.stdout, r.stderr  # and NVRTC took it


@pytest.mark.parametrize("args, line", [
    (["inspect", "--jsn", "k.ptx"], "nbjit inspect: error: unrecognized arguments: --jsn (did you mean --json?)"),
    (["compile", "k.cu", "--arch", "sm_90", "-lineinfo"],
     "nbjit compile: error: unrecognized arguments: -lineinfo (did you mean --lineinfo?)"),
    (["compile", "k.cu", "--arch", "sm_90", "-use_fast_math"],
     "nbjit compile: error: unrecognized arguments: -use_fast_math (an NVRTC option goes as --option -use_fast_math)"),
    (["compile", "k.cu"], "nbjit compile: error: the following arguments are required: --arch"),
    (["cache", "lst"], "nbjit cache: error: argument ACTION: invalid choice: 'lst' (choose from 'info', 'list', "
                       "'clear', 'prune', 'export', 'import', 'push', 'pull'); did you mean 'list'?"),
    (["inspct", "k.ptx"], "nbjit: error: argument COMMAND: invalid choice: 'inspct' (choose from 'inspect', "
                          "'strip', 'cache', 'compile', 'bundle', 'tune'); did you mean 'inspect'?"),
    ([], "nbjit: error: give a command: inspect, strip, compile, bundle or cache (nbjit --help, nbjit COMMAND "
         "--help)"),
    (["--versoin"], "nbjit: error: unrecognized arguments: --versoin (did you mean --version?)"),
    (["cache", "push"], "nbjit cache: error: 'cache push' needs a remote cache: give --remote URL "
                        "(s3://bucket/prefix, gs://..., file:///dir) or set NBJIT_CACHE_REMOTE"),
    (["inspect", "k.ptx", "-o", "k.txt"], "nbjit inspect: error: unrecognized arguments: -o k.txt (inspect prints "
                                          "to standard output: redirect it, > FILE)"),
])
def test_usage_errors_are_one_line_naming_the_command(args, line, monkeypatch):
    monkeypatch.delenv("NBJIT_CACHE_REMOTE", raising=False)
    r = nbjit(*args)
    assert r.returncode == 2 and r.stderr == line + "\n" and not r.stdout


def test_warnings_are_one_line_naming_the_command(tmp_path):
    (tmp_path / "file").write_text("")
    cu = tmp_path / "k.cu"
    cu.write_text('extern "C" __global__ void k() {}\n')
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    r = subprocess.run([*cmd, "compile", str(cu), "--arch", "sm_90", "-o", str(tmp_path / "k.cubin")],
                       env={**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "file" / "cache")}, capture_output=True,
                       text=True, timeout=120)
    lines = r.stderr.splitlines()
    assert r.returncode == 0 and len(lines) == 2 and lines[0] == (
        f"nbjit compile: warning: nbjit cache: cannot write to {tmp_path}/file/cache (Not a directory); going on "
        "without the disk cache") and lines[1].startswith(f"{cu}: cubin for sm_90 -> "), r.stderr


def test_inspect_says_no_kernels(tmp_path):
    """A cubin of an empty source, a template never instantiated, a PTX of device functions only."""
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    run = lambda *a: subprocess.run([*cmd, *a], capture_output=True, text=True, env=env, timeout=120)
    (tmp_path / "t.cu").write_text("template <class T> __global__ void fill(T* p) { p[0] = T(1); }\n")
    (tmp_path / "f.ptx").write_text(".version 8.0\n.target sm_90\n.address_size 64\n\n"
                                    ".visible .func f()\n{\n\tret;\n}\n")
    r = run("compile", str(tmp_path / "t.cu"), "--arch", "sm_90", "-o", str(tmp_path / "t.cubin"))
    assert r.returncode == 0, r.stderr
    for f in ("t.cubin", "f.ptx"):
        r = run("inspect", str(tmp_path / f))
        assert r.returncode == 0 and "\nno kernels\n" in r.stdout, r.stdout
    r = run("inspect", str(DATA / "nvcc/kernels_sm90.ptx"))
    assert r.returncode == 0 and "no kernels" not in r.stdout


def test_ptx_type_column_is_what_the_ptx_declares():
    """fill<int>(int*, int, int) is declared .u64, .u32, .u32: the C type (from the mangled name)
    goes in its own column, never into the PTX type (it showed s32, and .ptr nowhere in the PTX)."""
    r = nbjit("inspect", str(DATA / "nvrtc/tmpl_sm90.ptx"))
    assert r.returncode == 0, r.stderr
    block = r.stdout.split("entry _Z4fillIiEvPT_S0_i")[1].split("parameter buffer")[0]
    rows = [line.split()[2:4] for line in block.splitlines() if line.strip()[:1].isdigit()]
    assert rows == [["int*", ".u64"], ["int", ".u32"], ["int", ".u32"]], block
    r = nbjit("inspect", str(DATA / "nvcc/kernels_sm_90.cubin"))  # a cubin declares no types: no such column
    assert r.returncode == 0 and "PTX type" not in r.stdout and "  0  param_0  int*    8" in r.stdout, r.stdout


@pytest.mark.parametrize("rel, said", [("nvcc/kernels_lineinfo_sm90.ptx", "line info"),
                                       ("nvrtc/tmpl_lineinfo_sm90.ptx", "line info"),
                                       ("nvcc/kernels_G_sm90.ptx", "DWARF"), ("nvrtc/tmpl_G_sm90.ptx", "DWARF")])
def test_lineinfo_builds_are_not_called_dwarf(rel, said):
    """-lineinfo emits .loc/.file and a .debug_str (names of inlined code): line info, not -G's DWARF."""
    r = nbjit("inspect", str(DATA / rel))
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith(f"debug info: {said} "), r.stdout
    r = nbjit("strip", str(DATA / rel), "-o", "-")
    assert r.returncode == 0 and f"debug info {said.replace(' ', '').lower()} -> standard output" in r.stderr, r.stderr


@pytest.mark.parametrize("rel, kind", [("nvcc/kernels_G_sm_90.cubin", "cubin"),
                                       ("nvcc/kernels_multi.fatbin", "fatbin")])
def test_strip_says_what_a_compiled_file_is(tmp_path, rel, kind):
    r = nbjit("strip", str(DATA / rel), "-o", str(tmp_path / "out"))
    assert r.returncode == 2 and f"{DATA / rel} is a {kind}, not PTX" in r.stderr and "UTF-8" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_strip_refuses_in_place_with_an_output(tmp_path):
    src = tmp_path / "g.ptx"
    src.write_bytes((DATA / "nvcc/kernels_G_sm90.ptx").read_bytes())
    r = nbjit("strip", str(src), "--in-place", "-o", str(tmp_path / "x.ptx"))
    assert r.returncode == 2 and "give one of them" in r.stderr, r.stderr
    assert src.read_bytes() == (DATA / "nvcc/kernels_G_sm90.ptx").read_bytes() and not (tmp_path / "x.ptx").exists()


def test_sizes_with_units(tmp_path):
    """Sizes are taken with units (100k, 1G) and shown with them (366.7 KiB); JSON keeps bytes."""
    from nbjit.cache.store import parse_size
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path)}
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    run = lambda *a, **kw: subprocess.run([*cmd, *a], capture_output=True, text=True, env={**env, **kw}, timeout=60)
    r = run("cache", "prune", "--max-bytes", "100k")
    assert r.returncode == 0 and r.stdout == "removed 0 entries; 0 bytes left (limit 100 KiB)\n", r.stderr
    for raw, shown in (("1G", "1 GiB"), ("512M", "512 MiB"), ("1.5GiB", "1.5 GiB"), ("4096", "4 KiB"),
                       ("375550", "366.7 KiB"), ("1000", "1000 bytes")):
        r = run("cache", "info", NBJIT_CACHE_MAX_BYTES=raw)
        assert r.returncode == 0 and f"size:     0 bytes (limit {shown})\n" in r.stdout, (raw, r.stdout, r.stderr)
        j = json.loads(run("cache", "info", "--json", NBJIT_CACHE_MAX_BYTES=raw).stdout)
        assert j["max_bytes"] == parse_size(raw) and j["bytes"] == 0  # (numbers in JSON)
    r = run("cache", "prune", "--max-bytes", "1x")
    assert r.returncode == 2 and "'1x' is not a byte count" in r.stderr and len(r.stderr.splitlines()) == 1


def test_json_of_compile_and_cache(tmp_path):
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    run = lambda *a: subprocess.run([*cmd, *a], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    src = tmp_path / "t.cu"
    src.write_text("template <class T> __global__ void fill(T* p, T v) { p[threadIdx.x] = v; }\n")
    r = run("compile", str(src), "--arch", "sm_90", "--expr", "fill<float>", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["lowered_names"] == {"fill<float>": "_Z4fillIfEvPT_S0_"}
    assert [(o["arch"], o["kind"], o["file"]) for o in j["outputs"]] == [("sm_90", "cubin", "t.cubin")]
    r = run("compile", str(src), "--arch", "sm_90", "--json", "-o", "-")
    assert r.returncode == 2 and "choose one" in r.stderr
    info = json.loads(run("cache", "info", "--json").stdout)
    assert info["entries"] == 1 and info["location"] == str(tmp_path / "cache")
    (e,) = json.loads(run("cache", "list", "--json").stdout)
    assert (e["status"], e["kind"], e["arch"], len(e["key"])) == ("ok", "cubin", "sm_90", 64)
    r = run("cache", "clear", "--json")
    assert r.returncode == 2 and "--json applies to 'cache info' and 'cache list'" in r.stderr


def test_compile_shows_what_ptxas_reported(tmp_path):
    """With ptxas's report asked for, nbjit compile names the kernels that use local memory
    (stack frame, spill bytes) and gives every kernel's report in --json; again from the cache."""
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    run = lambda *a: subprocess.run([*cmd, *a], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    for _ in range(2):  # compiled, then a cache hit
        r = run("compile", str(DATA / "src/spill.cu"), "--arch", "sm_90", "--option=-Xptxas=-v", "--json", "-o",
                str(tmp_path / "s.cubin"))
        assert r.returncode == 0, r.stderr
        (out,) = json.loads(r.stdout)["outputs"]
        spills = out["resources"]["spills"]
        assert spills["spill_stores"] > 0 and out["resources"]["plain"] == dict.fromkeys(spills, 0)
        assert (f"spills: {spills['stack_frame']} bytes stack frame, {spills['spill_stores']} bytes spill stores, "
                f"{spills['spill_loads']} bytes spill loads") in r.stderr and "\nplain:" not in r.stderr
    r = run("compile", str(DATA / "src/spill.cu"), "--arch", "sm_90", "--json", "-o", str(tmp_path / "s.cubin"))
    assert r.returncode == 0 and json.loads(r.stdout)["outputs"][0]["resources"] == {}  # not asked for


def test_standard_input(tmp_path):
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    run = lambda data, *a: subprocess.run([*cmd, *a], input=data, capture_output=True, timeout=60)
    r = run((DATA / "nvcc/kernels_sm_90.cubin").read_bytes(), "inspect", "-")
    assert r.returncode == 0 and r.stdout.startswith(b"<stdin>: cubin for sm_90"), r.stderr
    ptx = (DATA / "nvcc/kernels_G_sm90.ptx").read_bytes()
    r = run(ptx, "strip", "-", "-o", str(tmp_path / "s.ptx"))
    assert r.returncode == 0 and r.stderr.startswith(b"<stdin>: debug info dwarf -> "), r.stderr
    from nbjit import strip_debug
    assert (tmp_path / "s.ptx").read_text() == strip_debug(ptx)
    r = run(ptx, "strip", "-", "--in-place")
    assert r.returncode == 2 and b"give -o OUT" in r.stderr
    r = run(b"", "inspect", "-")
    assert r.returncode == 2 and b"<stdin>: empty image" in r.stderr


def test_inspect_a_bundle_from_standard_input():
    bundle = (DATA.parent.parent / "examples/bundle_package/src/nbjit_demo_kernels/kernels.nbjit").read_bytes()
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    r = subprocess.run([*cmd, "inspect", "-"], input=bundle, capture_output=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(b"<stdin>: nbjit bundle (format 1"), r.stderr


def test_cache_only_says_when_nothing_was_stored(tmp_path):
    """--cache-only said "in the cache" with NBJIT_CACHE=0, an unwritable cache directory or a
    size limit that prunes the entry as it is written: a container's prewarm step passed and
    stored nothing. Now it exits 2 saying why."""
    import os
    cu = tmp_path / "k.cu"
    cu.write_text('extern "C" __global__ void k(int* p) { p[0] = 1; }\n')
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    run = lambda **env: subprocess.run([*cmd, "compile", str(cu), "--arch", "sm_90", "--cache-only"],
                                       capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
    r = run(NBJIT_CACHE="0")
    assert r.returncode == 2 and r.stderr == ("nbjit compile: error: --cache-only would store nothing: the disk cache "
                                              "is off (NBJIT_CACHE=0); unset NBJIT_CACHE (or set it to 1)\n")
    r = run(NBJIT_CACHE_DIR=str(cu / "cache"))  # under a file: cannot be made (said in one line, before NVRTC)
    assert r.returncode == 2 and r.stderr == (f"nbjit compile: error: --cache-only would store nothing: the cache "
                                              f"directory {cu / 'cache'} cannot be written (Not a directory); set "
                                              "NBJIT_CACHE_DIR to a writable directory\n")
    r = run(NBJIT_CACHE_DIR=str(tmp_path / "small"), NBJIT_CACHE_MAX_BYTES="0")  # written, then pruned at once
    assert r.returncode == 2 and r.stderr == ("nbjit compile: error: --cache-only: cubin for sm_90 written to the "
                                              "cache and pruned at once: its size limit (0 bytes, "
                                              "NBJIT_CACHE_MAX_BYTES) cannot hold it; raise the limit\n")
    assert not list((tmp_path / "small").glob("*/*.nbjit"))
    # several architectures: a later write can prune an earlier entry; each is looked for at the end
    # (a limit that holds either entry, not both: writing sm_90's prunes sm_80's, the older)
    several = [*cmd, "compile", str(cu), "--arch", "sm_80,sm_90", "--cache-only"]
    subprocess.run(several, env={**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "sizes")}, check=True, timeout=120)
    s80, s90 = (f.stat().st_size for f in sorted((tmp_path / "sizes").glob("*/*.nbjit"), key=os.path.getmtime))
    limit = int(max(s80, s90 / 0.9)) + 16
    assert limit < s80 + s90
    r = subprocess.run(several, capture_output=True, text=True, env={
        **os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "one"), "NBJIT_CACHE_MAX_BYTES": str(limit)}, timeout=120)
    assert len(list((tmp_path / "one").glob("*/*.nbjit"))) == 1
    assert r.returncode == 2 and r.stderr.startswith("nbjit compile: error: --cache-only: cubin for sm_80 written to "
                                                     "the cache and pruned at once"), r.stderr
    r = run(NBJIT_CACHE_DIR=str(tmp_path / "cache"))
    assert r.returncode == 0 and f"in the cache {tmp_path / 'cache'}" in r.stderr
    assert len(list((tmp_path / "cache").glob("*/*.nbjit"))) == 1


def test_cache_only_over_a_read_only_cache(tmp_path, monkeypatch, capsys):
    """--cache-only over a cache that cannot be written: fine where it holds every entry asked
    for already (a prewarmed, read-only image layer), refused before NVRTC where one is missing."""
    from nbjit.cache import store as cache_mod
    from nbjit.cli import main as cli
    cu = tmp_path / "k.cu"
    cu.write_text('extern "C" __global__ void k(int* p) { p[0] = 2; }\n')
    monkeypatch.setenv("NBJIT_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setattr(cache_mod, "_DEFAULT", [])
    assert cli.main(["compile", str(cu), "--arch", "sm_90", "--cache-only"]) == 0
    capsys.readouterr()
    monkeypatch.setattr("nbjit.cli.compile.cannot_write", lambda d: "Read-only file system")
    monkeypatch.setattr(cache_mod, "_DEFAULT", [])
    assert cli.main(["compile", str(cu), "--arch", "sm_90", "--cache-only"]) == 0
    assert "cubin for sm_90 in the cache" in capsys.readouterr().err
    assert cli.main(["compile", str(cu), "--arch", "sm_80,sm_90", "--cache-only"]) == 2
    assert capsys.readouterr().err == (f"nbjit compile: error: --cache-only would store nothing: the cache directory "
                                       f"{tmp_path / 'c'} cannot be written (Read-only file system); set "
                                       "NBJIT_CACHE_DIR to a writable directory\n")


# ------------------------------------------------ what the compiler made: spills, occupancy, SASS

SPILL = str(DATA / "nvrtc/spill_sm90.cubin")


def test_fail_on_spills_names_the_kernels():
    r = nbjit("inspect", "--fail-on-spills", SPILL)
    assert r.returncode == 1, r.stderr
    assert "1 kernel(s) spill registers to local memory: spills (" in r.stderr and "240 byte stack frame" in r.stderr
    assert "local_array" not in r.stderr  # a stack frame, but no spill
    ok = nbjit("inspect", "--fail-on-spills", str(DATA / "nvcc/kernels_sm_90.cubin"))
    assert ok.returncode == 0 and "no kernel spills registers (11 kernels, sm_90)" in ok.stdout
    j = nbjit("inspect", "--fail-on-spills", "--json", SPILL)
    assert j.returncode == 1 and json.loads(j.stdout)["spills"][0]["kernel"] == "spills"


def test_spills_and_frames_in_the_description():
    r = nbjit("inspect", SPILL)
    assert r.returncode == 0
    block = r.stdout.split("entry spills")[1]
    assert "frame 240" in block and "spills " in block
    e = {k["name"]: k for k in json.loads(nbjit("inspect", "--json", SPILL).stdout)["entries"]}
    assert e["local_array"]["frame"] == 128 and e["local_array"]["spills"] == 0 and e["spills"]["spills"] > 100
    assert e["tiled"]["barriers"] == 1


def test_occupancy_table_and_json():
    r = nbjit("inspect", "--occupancy", "32,1000", SPILL)
    assert r.returncode == 0, r.stderr
    assert "occupancy on sm_90, block 32, dynamic shared 1000 bytes" in r.stdout
    row = next(line.split() for line in r.stdout.splitlines() if line.startswith("tiled"))
    assert row[:4] == ["tiled", "14", "8192", "22"] and row[-1] == "shared"
    j = json.loads(nbjit("inspect", "--occupancy", "1024", "--json", SPILL).stdout)
    assert {o["kernel"]: o["blocks_per_sm"] for o in j["occupancy"]} == dict.fromkeys(
        ["plain", "tiled", "local_array", "spills"], 2)


@pytest.mark.parametrize("args,err", [
    (["--occupancy", "12x"], "is not BLOCK[,SMEM]"), (["--occupancy", "0"], "1 to 1024 threads"),
    (["--occupancy", "1,2,3"], "is not BLOCK[,SMEM]"),
])
def test_occupancy_bad_arguments(args, err):
    r = nbjit("inspect", *args, SPILL)
    assert r.returncode == 2 and err in r.stderr


def test_ptx_needs_an_arch_for_compiled_facts():
    ptx = str(DATA / "nvcc/kernels_sm90.ptx")
    r = nbjit("inspect", "--fail-on-spills", ptx)
    assert r.returncode == 2 and "is ptx: give --arch (e.g. sm_90)" in r.stderr


def test_sass():
    from nbjit.toolchain.sass import find_nvdisasm
    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    r = nbjit("inspect", "--sass", SPILL)
    assert r.returncode == 0 and ".text.spills" in r.stdout and "STL" in r.stdout


# ------------------------------------------------------------------ a newcomer's findings (session 35)


def test_bundle_writes_through_a_link_and_into_a_fifo(tmp_path):
    """nbjit bundle -o writes where a link points (the link stays) and into a FIFO being read,
    as every other output does (it once replaced both with a file)."""
    import os
    import threading
    real, link = tmp_path / "real.nbjit", tmp_path / "link.nbjit"
    link.symlink_to(real)
    r = nbjit("bundle", str(DATA / "nvcc/kernels_sm90.ptx"), "-o", str(link))
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and real.read_bytes()[:4] == b"PK\x03\x04"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    r = nbjit("bundle", str(DATA / "nvcc/kernels_sm90.ptx"), "-o", str(fifo))
    reader.join(30)
    assert r.returncode == 0, r.stderr
    assert fifo.is_fifo() and got and got[0] == real.read_bytes()


def test_compile_to_dev_stdout_writes_into_the_pipe():
    r = subprocess.run([EXE or sys.executable, *([] if EXE else ["-m", "nbjit"]), "compile",
                        str(DATA / "src/spill.cu"), "--arch", "sm_90", "-o", "/dev/stdout"],
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout[:4] == b"\x7fELF"


def test_bundle_of_lto_ir_alone_says_so_in_one_line(tmp_path):
    r = nbjit("bundle", str(DATA / "nvcc/lto_rdc.fatbin"), "-o", str(tmp_path / "x.nbjit"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "holds no cubin and no PTX" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cache_import_of_a_directory_says_so_in_one_line(tmp_path):
    r = nbjit("cache", "import", str(DATA))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "is a directory, so not a cache archive" in r.stderr


@pytest.mark.parametrize("target", ["triton/add_kernel", "bundle"])
@pytest.mark.parametrize("option", [["--fail-on-spills"], ["--occupancy", "256"], ["--sass"]])
def test_compiled_code_options_refuse_what_they_cannot_read(target, option):
    """--fail-on-spills, --occupancy and --sass on a Triton kernel's directory or a bundle
    are refused (a CI spill check must not pass having checked nothing)."""
    path = PKG_BUNDLE if target == "bundle" else DATA / target
    r = nbjit("inspect", *option, str(path))
    assert r.returncode == 2 and "read one cubin" in r.stderr, (r.returncode, r.stdout[:200], r.stderr)


def test_compiled_code_options_on_a_bundle_say_how_to_take_a_cubin_out(tmp_path):
    """inspect bundle.nbjit --sass said only that a bundle holds several: it says how to take
    one out (unzip, as bundles.md does), naming a member that is there (the one --arch uses)."""
    import zipfile
    for arch, member in (([], "axpy/sm_80.cubin"), (["--arch", "sm_90"], "axpy/sm_90.cubin")):
        r = nbjit("inspect", "--occupancy", "128", *arch, str(PKG_BUNDLE))
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.endswith(f"a kernel bundle holds several: take one out with unzip and inspect that (unzip -p "
                                 f"{PKG_BUNDLE} {member} > {member.split('/')[1]}; 'nbjit inspect {PKG_BUNDLE}' lists "
                                 "the members)\n"), r.stderr
        with zipfile.ZipFile(PKG_BUNDLE) as z:  # the member named is there, and inspects
            (tmp_path / "k.cubin").write_bytes(z.read(member))
        assert nbjit("inspect", "--occupancy", "128", str(tmp_path / "k.cubin")).returncode == 0


def test_cache_help_says_what_each_action_does():
    """nbjit cache --help listed its eight actions without a word on each."""
    r = nbjit("cache", "--help")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    for action in ("info", "list", "clear", "prune", "export", "import", "push", "pull"):
        said = [line for line in lines if re.match(rf"  {action}\s{{2,}}\w", line)]
        assert len(said) == 1 and len(said[0]) <= 80, (action, said)


def test_occupancy_refuses_a_block_no_gpu_has():
    r = nbjit("inspect", "--occupancy", "2048", str(DATA / "nvcc/kernels_sm_90.cubin"))
    assert r.returncode == 2 and "1 to 1024 threads" in r.stderr


def test_compile_finds_includes_beside_the_source_from_anywhere(tmp_path):
    """#include "scale.cuh" is found in the source's own directory, whatever the working
    directory (as nvcc and nbjit.compile(path) do)."""
    out = tmp_path / "t.cubin"
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    r = subprocess.run([*cmd, "compile", str(DATA / "src/nvrtc_tmpl.cu"), "--arch", "sm_90", "-o", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:4] == b"\x7fELF"


PKG_BUNDLE = DATA.parent.parent / "examples/bundle_package/src/nbjit_demo_kernels/kernels.nbjit"
AXPY = DATA.parent.parent / "examples/bundle_package/kernels/axpy.cu"


@pytest.mark.parametrize("path, said", [
    (DATA / "nvcc/kernels_multi.fatbin", "no entry runs on sm_75"),
    (PKG_BUNDLE, "no entry of images axpy, scale_rows runs on sm_75"),
])
@pytest.mark.parametrize("json_", [False, True])
def test_inspect_that_finds_nothing_to_run_on_arch_fails(path, said, json_):
    """inspect multi.fatbin --arch sm_75 printed "no image runs on sm_75" and exited 0: a check
    that found nothing to run is a failure for scripts (exit 1, said on standard error)."""
    r = nbjit("inspect", *(["--json"] if json_ else []), "--arch", "sm_75", str(path))
    assert r.returncode == 1 and r.stderr == f"nbjit inspect: {path}: {said}\n", (r.returncode, r.stderr)
    if json_:
        assert json.loads(r.stdout)["selected"] in (None, {"axpy": None, "scale_rows": None})
    else:
        assert "no entry runs on sm_75" in r.stdout
    r = nbjit("inspect", *(["--json"] if json_ else []), "--arch", "sm_90", str(path))
    assert r.returncode == 0 and r.stderr == ""


def test_a_bundles_template_kernels_read_as_a_cubins():
    """A bundle's template kernels once showed _Z5scaleIfEvPT_S0_i_param_0 for each parameter
    (the PTX's placeholder): param_0, as a cubin names it, under the demangled name; an
    extern "C" kernel's parameters keep the source's names."""
    r = nbjit("inspect", str(PKG_BUNDLE))
    assert r.returncode == 0, r.stderr
    assert "_param_" not in r.stdout.replace(" param_", " ")  # (no <mangled>_param_N left)
    head = r.stdout.index("entry _Z5scaleIfEvPT_S0_i  (weak)\n  = void scale<float>(float*, float, int)\n")
    assert re.match(r"(?s).*?\n  0\s+param_0\s+float\*\s+8 .*?\n  2\s+param_2\s+int\s+4 ", r.stdout[head:])
    assert re.search(r"\n  0\s+a\s+float\s+4 .*\n  1\s+x\s+const float\*", r.stdout)  # axpy, from its source
    j = json.loads(nbjit("inspect", "--json", str(PKG_BUNDLE)).stdout)  # (JSON: the names as declared)
    assert j["images"][0]["kernels"]["_Z5scaleIfEvPT_S0_i"]["params"][0]["name"] == "_Z5scaleIfEvPT_S0_i_param_0"


def _run(*args: str, stdin: bytes | None = None, **kw) -> subprocess.CompletedProcess:
    """nbjit as a user runs it, with bytes in and out."""
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    return subprocess.run([*cmd, *args], input=stdin, capture_output=True, timeout=120, **kw)


def _on_a_terminal(*args: str, **kw) -> subprocess.CompletedProcess:
    """nbjit with its standard output a terminal."""
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    leader, follower = os.openpty()
    try:
        return subprocess.run([*cmd, *args], stdout=follower, stderr=subprocess.PIPE, timeout=120, **kw)
    finally:
        os.close(follower)
        os.close(leader)


def test_bundle_to_standard_output(tmp_path):
    """bundle -o - once wrote a file named '-'. It writes the bundle to standard output, which
    'nbjit inspect -' reads back; the report goes to standard error; a terminal is refused."""
    r = _run("bundle", str(DATA / "nvcc/kernels_sm90.ptx"), "-o", "-", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout[:4] == b"PK\x03\x04" and r.stderr == b"standard output: kernels_sm90: compute_90 (11 kernels)\n"
    back = _run("inspect", "--json", "-", stdin=r.stdout)
    assert back.returncode == 0 and json.loads(back.stdout)["images"][0]["name"] == "kernels_sm90"
    t = _on_a_terminal("bundle", str(DATA / "nvcc/kernels_sm90.ptx"), "-o", "-", cwd=tmp_path)
    assert t.returncode == 2 and t.stderr == (b"nbjit bundle: error: -o -: a bundle is binary, not for a terminal: "
                                              b"redirect standard output (> FILE) or pipe it\n")
    assert list(tmp_path.iterdir()) == []


def test_bundle_reads_standard_input(tmp_path):
    """bundle - was refused (no file named '-') where other verbs read standard input: its image
    (PTX, cubin, fatbin) or CUDA source becomes image "stdin", or goes into --name's image."""
    nv = DATA / "nvcc"
    r = _run("bundle", "-", "-o", "-", stdin=(nv / "kernels_sm90.ptx").read_bytes(), cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == b"standard output: stdin: compute_90 (11 kernels)\n", r.stderr
    entry = nbjit_lib.inspect_bundle(r.stdout).image("stdin").entries[0]
    assert entry.payload == (nv / "kernels_sm90.ptx").read_bytes()
    r = _run("bundle", "-", str(nv / "kernels_sm_90.cubin"), "--name", "k", "-o", "k.nbjit",
             stdin=(nv / "kernels_sm_80.cubin").read_bytes(), cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == b"k.nbjit: k: sm_80, sm_90 (11 kernels)\n", r.stderr
    r = _run("bundle", "-", "--arch", "sm_90", "-o", "a.nbjit", stdin=AXPY.read_bytes(), cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == b"a.nbjit: stdin: sm_90 (1 kernel)\n", r.stderr
    for args, stdin, line in (
            (["-"], AXPY.read_bytes(), "standard input is CUDA source: say what to compile it for with --arch"),
            (["-", "-"], b"", "- is given twice: standard input is read once"),
            (["-", str(nv / "kernels_sm_90.cubin")], b"", "- among other FILEs needs --name NAME"),
            (["-", "--expr", "f<int>"], (nv / "kernels_sm90.ptx").read_bytes(), "--expr f<int>: name expressions "
             "instantiate templates of CUDA C++ sources"),
            (["-"], (tmp_path / "a.nbjit").read_bytes(), "<stdin> is a ZIP archive (a kernel bundle?)")):
        r = _run("bundle", *args, "-o", "x.nbjit", stdin=stdin, cwd=tmp_path)
        err = r.stderr.decode()
        assert r.returncode == 2 and err.startswith(f"nbjit bundle: error: {line}") and len(err.splitlines()) == 1, \
            (args, err)
    assert not (tmp_path / "x.nbjit").exists()


def test_reports_name_standard_output_as_such(tmp_path):
    """strip -o - once reported '-> -'."""
    ptx = DATA / "nvcc/kernels_G_sm90.ptx"
    r = _run("strip", str(ptx), "-o", "-")
    assert r.returncode == 0 and r.stdout.startswith(b"//")
    assert r.stderr.decode() == f"{ptx}: debug info dwarf -> standard output (37499 -> 19593 bytes)\n"
    r = _run("compile", str(AXPY), "--arch", "sm_90", "--ptx", "-o", "-", env={**os.environ,
                                                                               "NBJIT_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.startswith(b"//")
    assert re.fullmatch(rf"{re.escape(str(AXPY))}: ptx for sm_90 -> standard output \(\d+ bytes\)\n", r.stderr.decode())


def test_cache_export_and_import_through_a_pipe(tmp_path):
    """cache export - once wrote a file named '-' (and its report into the archive's stream).
    As tar: export - streams the archive to standard output, import - reads standard input."""
    one, two = tmp_path / "one", tmp_path / "two"
    env1 = {**os.environ, "NBJIT_CACHE_DIR": str(one)}
    env2 = {**os.environ, "NBJIT_CACHE_DIR": str(two)}
    assert _run("compile", str(AXPY), "--arch", "sm_90", "--cache-only", env=env1).returncode == 0
    out = _run("cache", "export", "-", env=env1, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout[:2] == b"\x1f\x8b", out.stderr  # gzip
    assert out.stderr == b"exported 1 entry to standard output\n" and not (tmp_path / "-").exists()
    r = _run("cache", "import", "-", stdin=out.stdout, env=env2)
    assert r.returncode == 0 and r.stdout.decode() == f"imported 1 new entry into {two}\n", r.stderr
    r = _run("cache", "import", "-", stdin=out.stdout, env=env2)  # (once: "imported 0 new entries", no more)
    assert r.returncode == 0 and r.stdout.decode() == f"imported 0 new entries into {two}; 1 was there already\n"
    r = _run("cache", "import", "-", stdin=b"hello\n", env=env2)
    assert r.returncode == 2 and r.stderr.startswith(b"nbjit cache: error: <stdin>: not a tar archive")
    t = _on_a_terminal("cache", "export", "-", env=env1)
    assert t.returncode == 2 and b"cache export -: a cache archive is binary, not for a terminal" in t.stderr
    r = _run("cache", "export", "-o", "-", env=env1)
    assert r.returncode == 2 and b"(the archive is FILE: nbjit cache export FILE, - for standard output)" in r.stderr


@pytest.mark.parametrize("args, line", [
    (["compile", str(AXPY), "--arch", "sm_999"], "--arch sm_999: NVRTC {v} cannot compile for it; it compiles for "
     "{sm} (for a newer GPU, PTX for {newest} runs there: --arch {newest})"),
    (["compile", str(AXPY), "--arch", "sm_90,sm_50"], "--arch sm_50: NVRTC {v} cannot compile for it; it compiles "
     "for {sm} (an older CUDA's may)"),
    (["compile", str(AXPY), "--arch", "compute_999"], "--arch compute_999: NVRTC {v} cannot compile for it; it "
     "compiles for compute_"),
    (["bundle", str(AXPY), "--arch", "sm_999", "-o", "x.nbjit"], "--arch sm_999: NVRTC {v} cannot compile for it; "
     "it compiles for {sm} (for a newer GPU, PTX for {newest} runs there: --ptx {newest})"),
    (["bundle", str(AXPY), "--ptx", "compute_999", "-o", "x.nbjit"], "--ptx compute_999: NVRTC {v} cannot compile"),
    (["bundle", str(AXPY), "--arch", "sm_91", "-o", "x.nbjit"], "--arch sm_91: no chip has that compute capability"),
    (["compile", str(AXPY), "--arch", "sm_89a"], "--arch sm_89a: arch-specific ('a') builds exist from sm_90a on"),
    (["inspect", str(DATA / "nvcc/kernels_multi.fatbin"), "--arch", "sm_91"], "--arch sm_91: no chip has"),
    (["inspect", str(DATA / "nvcc/kernels_multi.fatbin"), "--arch", "sm_9x"], "--arch 'sm_9x': not an architecture "
     "(e.g. sm_90, sm_90a, sm_100f, compute_90)"),
    (["inspect", str(DATA / "nvcc/kernels_sm90.ptx"), "--occupancy", "128", "--arch", "sm_999"],
     "--arch sm_999: nvJitLink {v} cannot assemble PTX for it; it assembles PTX for {sm}"),
    (["inspect", str(DATA / "nvcc/kernels_multi.fatbin"), "--sass", "--arch", "sm_999"],
     "--arch sm_999: nvJitLink {v} cannot assemble PTX for it"),
    (["inspect", str(DATA / "nvcc/kernels_sm90.ptx"), "--occupancy", "128", "--arch", "sm_80"],
     "--arch sm_80: {ptx90} holds PTX for sm_90, which assembles for sm_90 and newer"),
    (["inspect", str(DATA / "triton/add_kernel/add_kernel.ptx"), "--fail-on-spills", "--arch", "sm_100"],
     "--arch sm_100: {tri} holds PTX for sm_90a, which assembles for sm_90a only"),
    (["inspect", str(DATA / "nvcc/kernels_multi.fatbin"), "--occupancy", "128", "--arch", "sm_75"],
     "--arch sm_75: no entry of {multi} runs on it (it holds sm_80, compute_90, sm_90)"),
])
def test_architectures_are_checked_in_one_line(tmp_path, args, line):
    """--arch sm_999 once compiled PTX for the newest architecture NVRTC knows and wrote k.ptx;
    inspect passed what nvJitLink refuses on to it (a multi-line log, or its error code)."""
    from nbjit.toolchain.nvjitlink import nvjitlink_version
    from nbjit.toolchain.nvrtc import nvrtc_version, supported_archs
    known = supported_archs()
    if "nvJitLink" in line and nvjitlink_version() != nvrtc_version():
        pytest.skip("nvJitLink of another CUDA than NVRTC's: it says itself what it refuses")
    if "sm_90,sm_50" in args and 50 in known:
        pytest.skip("this NVRTC (CUDA 12) still compiles for sm_50")
    v = ".".join(map(str, nvrtc_version()))
    want = line.format(v=v, sm=", ".join(f"sm_{k}" for k in known), newest=f"compute_{known[-1]}",
                       ptx90=DATA / "nvcc/kernels_sm90.ptx", tri=DATA / "triton/add_kernel/add_kernel.ptx",
                       multi=DATA / "nvcc/kernels_multi.fatbin")
    r = _run(*args, cwd=tmp_path)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.startswith(f"nbjit {args[0]}: error: ") and len(err.splitlines()) == 1, err
    assert err.startswith(f"nbjit {args[0]}: error: {want}"), err
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("args", [["compile", str(AXPY), "--arch", "sm_91"],
                                  ["bundle", str(AXPY), "--arch", "sm_102", "-o", "x.nbjit"],
                                  ["bundle", str(AXPY), "--ptx", "compute_91", "-o", "x.nbjit"]])
def test_an_architecture_no_chip_has_is_told_what_nvrtc_compiles_near_it(tmp_path, args):
    """--arch sm_91 once suggested sm_101, which this NVRTC then refused: compile and bundle
    suggest only architectures it compiles for."""
    from nbjit.toolchain.nvrtc import supported_archs
    r = _run(*args, cwd=tmp_path)
    err = r.stderr.decode()
    option = "--ptx" if "--ptx" in args else "--arch"
    m = re.fullmatch(rf"nbjit {args[0]}: error: {option} (\w+): no chip has "
                     r"that compute capability \(near it: ([\w, ]+)\)\n", err)
    assert r.returncode == 2 and m, err
    prefix = m[1].split("_")[0]
    near = m[2].split(", ")
    assert near and all(n.startswith(prefix + "_") and int(n.split("_")[1]) in supported_archs() for n in near), err
    assert list(tmp_path.iterdir()) == []


def test_occupancy_counts_by_the_device_arch_not_the_cubin():
    """A fatbin's sm_80 cubin on an sm_86 GPU: sm_86's limits (48 warps per SM), not sm_80's (64)."""
    r = nbjit("inspect", "--json", "--occupancy", "128", "--arch", "sm_86", str(DATA / "nvcc/kernels_multi.fatbin"))
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["arch"] == "sm_80" and {o["arch"] for o in j["occupancy"]} == {"sm_86"}
    assert {o["max_warps_per_sm"] for o in j["occupancy"]} == {48}
    r = nbjit("inspect", "--occupancy", "128", "--arch", "sm_86", str(DATA / "nvcc/kernels_multi.fatbin"))
    assert f"{DATA / 'nvcc/kernels_multi.fatbin'}: occupancy on sm_86 (its sm_80 cubin), block 128" in r.stdout


def test_occupancy_of_a_cubin_counts_by_the_gpu_arch_names():
    """inspect k.cubin --arch sm_86 --occupancy was refused by a message saying --arch applies
    with --occupancy: a cubin's --arch is the GPU whose limits count, one the cubin runs on."""
    cubin = DATA / "nvcc/kernels_sm_80.cubin"
    r = nbjit("inspect", "--json", "--occupancy", "128", "--arch", "sm_86", str(cubin))
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["arch"] == "sm_80" and {(o["arch"], o["max_warps_per_sm"]) for o in j["occupancy"]} == {("sm_86", 48)}
    r = nbjit("inspect", "--occupancy", "128", "--arch", "sm_90", str(cubin))
    assert r.returncode == 2 and r.stderr == (f"nbjit inspect: error: --arch sm_90: {cubin} is a cubin for sm_80, "
                                              "which does not run on it\n")
    for other in (["--sass"], ["--fail-on-spills"], []):
        r = nbjit("inspect", *other, "--arch", "sm_86", str(cubin))
        assert r.returncode == 2 and r.stderr == ("nbjit inspect: error: --arch chooses a fatbin's entry, or with "
                                                  f"--occupancy the GPU whose limits count; {cubin} is a cubin, "
                                                  "whose SASS is its own\n"), r.stderr


def _bundle_cases(tmp: Path) -> list:
    """(FILE... and options, the error line) of bundles that cannot be built."""
    nv = DATA / "nvcc"
    (tmp / "notes.txt").write_text("hello, world\n")
    (tmp / "k.cpp").write_text(AXPY.read_text())
    (tmp / "t.cu").write_text("template <class T> __global__ void fill(T* p, T v) { *p = v; }\n")
    (tmp / "none.ptx").write_text(".version 8.0\n.target sm_80\n.address_size 64\n.visible .func f() { ret; }\n")
    (tmp / "odd.ptx").write_text(".version 8.0\n.target bogus\n.address_size 64\n.visible .entry k() { ret; }\n")
    (tmp / "cut.cubin").write_bytes((nv / "kernels_sm_90.cubin").read_bytes()[:3000])
    (tmp / "a").mkdir()
    (tmp / "b").mkdir()
    (tmp / "a/k.ptx").write_bytes((nv / "kernels_sm90.ptx").read_bytes())
    (tmp / "b/k.ptx").write_bytes((nv / "pdl_sm90.ptx").read_bytes())
    (tmp / "made.nbjit").write_bytes(b"")
    return [
        (["missing.cu", "--arch", "sm_90"], "cannot read missing.cu: No such file or directory"),
        (["missing.cu", "--arch", "sm_90", "-o", "made.nbjit"], "cannot read missing.cu: No such file or directory"),
        (["notes.txt"], "notes.txt: not PTX (no '.version' directive), a cubin or a fatbin (a bundle takes these, "
         "CUDA sources named .cu and Triton cache entries)"),
        (["k.cpp"], "k.cpp: CUDA C++ source, which a bundle compiles from a file named .cu, .cuh or .cuda: rename it"),
        ([str(AXPY)], f"{AXPY} is CUDA source: say what to compile it for with --arch (SASS: sm_80,sm_90) and/or "
         "--ptx (PTX: compute_80)"),
        ([str(AXPY), "--arch", ""], "--arch '': give one or more architectures, separated by commas"),
        ([str(AXPY), "--arch", ","], "--arch ',': give one or more architectures, separated by commas"),
        ([str(AXPY), "--arch", "compute_90"], "--arch compute_90 is a virtual architecture (PTX): give --ptx "
         "compute_90 for PTX, or --arch sm_90 for a cubin"),
        ([str(AXPY), "--ptx", "bogus"], "--ptx 'bogus': not an architecture"),
        ([str(AXPY), "--arch", "sm_90", "-o", "no/dir/k.nbjit"], "cannot write no/dir/k.nbjit: no directory no/dir"),
        ([str(nv / "kernels_sm90.ptx"), "-o", "."], "-o . is a directory: give the bundle's file name "
         "(./kernels.nbjit)"),
        ([str(nv / "kernels_sm90.ptx"), "-o", str(nv / "kernels_sm90.ptx")], f"-o {nv / 'kernels_sm90.ptx'} is the "
         "input file: refusing to overwrite it (choose another -o)"),
        ([str(DATA)], f"{DATA}: no Triton metadata (<name>.json) in this directory"),
        ([str(nv / "lto_rdc.fatbin")], f"{nv / 'lto_rdc.fatbin'}: holds no cubin and no PTX, only LTO-IR"),
        (["none.ptx"], "none.ptx: no kernel to launch in image 'none': it declares no .entry; nothing written"),
        (["t.cu", "--arch", "sm_90"], "t.cu: no kernel to launch in image 't': a template kernel is compiled only "
         "where it is instantiated (--expr 'name<float>')"),
        (["odd.ptx"], "odd.ptx: its .target 'bogus' names no architecture (as sm_90 does)"),
        (["cut.cubin"], "cut.cubin: section header table"),
        (["a/k.ptx", "b/k.ptx"], "a/k.ptx and b/k.ptx would both be image 'k' (each FILE is one image, named after "
         "the file): rename one, or give --name NAME to put them in one image"),
        (["a/k.ptx", "./a/k.ptx"], "./a/k.ptx is given twice"),
        (["a/k.ptx", "a/k.ptx", "--name", "k"], "a/k.ptx: given twice for image 'k'"),
        (["a/k.ptx", "b/k.ptx", "--name", "k"], "b/k.ptx: image 'k' has a ptx for compute_90 already, from a/k.ptx: "
         "one ptx per architecture in an image"),
        ([str(nv / "kernels_sm_80.cubin"), str(nv / "pdl_sm_90.cubin"), "--name", "k"],
         f"image 'k': {nv / 'kernels_sm_80.cubin'} and {nv / 'pdl_sm_90.cubin'} hold different kernels ("),
        (["a/k.ptx", "--name", "a/b"], "--name 'a/b': an image name is 1 to 128 letters"),
        (["a/k.ptx", "--name", ""], "--name '': an image name is 1 to 128 letters"),
        (["a/k.ptx", "--expr", "f<int>"], "--expr f<int>: name expressions instantiate templates of CUDA C++ sources "
         "(FILEs named .cu, .cuh or .cuda), and no FILE is one: drop --expr"),
        (["a/k.ptx", "--expr", "k=f<int>", "--name", "k"], "--expr k=f<int>: name expressions instantiate templates"),
        (["a/k.ptx", "--arch", "sm_90"], "--arch says what to compile CUDA sources for, and no FILE is one (named "
         ".cu, .cuh or .cuda; PTX, cubins, fatbins and Triton kernels go in as they were built): drop --arch"),
        # what is wrong with a FILE comes before what is wrong with an option
        ([str(DATA), "--arch", "sm_90"], f"{DATA}: no Triton metadata (<name>.json) in this directory"),
    ]


def test_bundle_errors_say_what_where_and_what_would_do_in_cli_terms(tmp_path):
    """nbjit bundle with bad inputs once answered in the Python API's terms (archs=[...],
    ptx='compute_80', name them ({'a': ..., 'b': ...})), named a path twice, or wrote a bundle
    of nothing to launch. Each is one line, exit 2, nothing written, the path once."""
    for args, line in _bundle_cases(tmp_path):
        out = [] if "-o" in args else ["-o", "out.nbjit"]
        r = _run("bundle", *args, *out, cwd=tmp_path)
        err = r.stderr.decode()
        assert r.returncode == 2 and err.startswith(f"nbjit bundle: error: {line}"), (args, err)
        assert len(err.splitlines()) == 1 and "Traceback" not in err, (args, err)
        for api in ("archs=", "ptx=", "name=", "({'", "keyword"):
            assert api not in err, (args, err)
        for p in {a for a in args if "/" in a or a.endswith((".ptx", ".cu", ".cubin", ".txt", ".cpp"))}:
            assert err.count(p) <= 1, (args, err)
        assert not (tmp_path / "out.nbjit").exists() and not (tmp_path / "-").exists()
    assert (tmp_path / "made.nbjit").read_bytes() == b""


def test_compile_of_a_missing_file_over_an_existing_output(tmp_path):
    """compile missing.cu -o existing.cubin once ended in a FileNotFoundError traceback."""
    (tmp_path / "old.cubin").write_bytes(b"old")
    r = _run("compile", "missing.cu", "--arch", "sm_90", "-o", "old.cubin", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == b"nbjit compile: error: cannot read missing.cu: No such file or directory\n"
    assert (tmp_path / "old.cubin").read_bytes() == b"old"


@pytest.mark.parametrize("args", [["inspect", "missing.ptx"], ["compile", str(AXPY), "--arch", "sm_999"],
                                  ["inspct"], ["--help"], ["inspect", str(DATA / "nvcc/kernels_sm90.ptx")],
                                  ["bundle", "--help"]])
def test_a_closed_standard_error_is_no_traceback(args, tmp_path):
    """With standard output and error a pipe nobody reads (2>&1 | true) an error once ended
    in a BrokenPipeError traceback and status 1: the status says what went wrong, silently."""
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([*cmd, *args], stdout=write, stderr=write, timeout=120, cwd=tmp_path)
    finally:
        os.close(write)
    assert r.returncode == (0 if "--help" in args or args[0] == "inspect" and "missing" not in args[1] else 2)


def test_inspect_a_fatbin_whose_entry_cannot_be_decompressed(no_lz4):
    """(In-process: a package can only be hidden here.) The table and the chosen entry say
    what is missing."""
    from nbjit.cli.inspect import format_fatbin
    from nbjit.read.fatbin import inspect_fatbin
    path = DATA / "nvcc/kernels_multi_lz4.fatbin"
    text = format_fatbin(inspect_fatbin(path.read_bytes()), str(path), "sm_100")
    assert "1  ptx    compute_90  lz4         9285   no (needs lz4)" in text
    assert text.endswith("sm_100 uses entry 1 (ptx compute_90):\n  lz4-compressed and 'lz4' is not installed "
                         "(pip install lz4): the driver will read the whole fatbin")


# ------------------------------------------------------------------ a newcomer's trial (round 4)


@pytest.mark.parametrize("args", [["inspect", str(DATA / "nvcc/kernels_sm90.ptx")],
                                  ["strip", str(DATA / "nvcc/kernels_G_sm90.ptx"), "-o", "-"],
                                  ["cache", "info"]])
def test_standard_output_that_cannot_be_written_is_one_line(args, tmp_path):
    """/dev/full (a full disk, an I/O error) as standard output: one line and status 2, as
    -o /dev/full gives, not a traceback."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    with open("/dev/full", "w") as full:
        r = subprocess.run([*cmd, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
                           env={**__import__("os").environ, "NBJIT_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "cannot write standard output" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("action", ["clear", "prune"])
def test_remote_on_an_action_of_the_local_cache_is_refused(action, tmp_path):
    (tmp_path / "store").mkdir()
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    r = subprocess.run([*cmd, "cache", action, "--remote", str(tmp_path / "store")], capture_output=True, text=True,
                       timeout=60, env={**__import__("os").environ, "NBJIT_CACHE_DIR": str(tmp_path / "c")})
    assert r.returncode == 2 and "--remote applies to" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_compile_from_standard_input_needs_an_output_name(tmp_path):
    cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
    r = subprocess.run([*cmd, "compile", "--arch", "sm_90", "-"], input='extern "C" __global__ void k() {}\n',
                       capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={**__import__("os").environ, "NBJIT_CACHE_DIR": str(tmp_path / "c")})
    assert r.returncode == 2 and "standard input has no name" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", [b"", b"\x00\x01random bytes", b"// not ptx\n"])
def test_bundle_says_what_a_file_is_before_the_arch_rule(content, tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(content)
    r = nbjit("bundle", "--arch", "sm_90", str(f), "-o", str(tmp_path / "x.nbjit"))
    assert r.returncode == 2 and "drop --arch" not in r.stderr and str(f) in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, stdin, line", [
    (["compile", "EMPTY", "--arch", "sm_90"], None, "{empty} is empty: no CUDA source to compile"),
    (["compile", "-", "--arch", "sm_90", "-o", "x.cubin"], b"", "standard input is empty: no CUDA source to compile"),
    (["bundle", "-", "-o", "x.nbjit"], b"  \n", "standard input is empty: no CUDA source to compile"),
    (["compile", str(AXPY), "--arch", "sm_90", "--expr", ""], None, "--expr '': give the name expression"),
    (["bundle", str(AXPY), "--arch", "sm_90", "--expr", " ", "-o", "x.nbjit"], None,
     "--expr ' ': give the name expression"),
    (["inspect", str(DATA / "nvcc/kernels_multi.fatbin"), "--arch", ""], None, "--arch '': give an architecture"),
    (["compile", str(AXPY), "--arch", "sm_35"], None, "--arch sm_35: NVRTC {v} cannot compile for it"),
])
def test_empty_inputs_and_retired_chips_are_said_as_they_are(tmp_path, args, stdin, line):
    """A newcomer's trial: an empty file compiled to a cubin without a kernel (a warning about
    templates); an empty --expr or --arch was taken as none; sm_35 was 'no chip' (Kepler is
    retired, not unknown: the compiler says it cannot build for it)."""
    from nbjit.toolchain.nvrtc import nvrtc_version, supported_archs
    if "sm_35" in args and 35 in supported_archs():
        pytest.skip("this NVRTC still compiles for sm_35")
    empty = tmp_path / "empty.cu"
    empty.write_bytes(b"")
    args = [str(empty) if a == "EMPTY" else a for a in args]
    r = _run(*args, stdin=stdin, cwd=tmp_path)
    err = r.stderr.decode()
    want = line.format(empty=empty, v=".".join(map(str, nvrtc_version())))
    assert r.returncode == 2 and err.startswith(f"nbjit {args[0]}: error: {want}") and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.cu"]  # nothing written


def test_a_retired_chip_is_a_chip_to_inspect():
    """A fatbin may hold code for sm_35: asking which entry an sm_35 GPU runs is a question."""
    r = nbjit("inspect", str(DATA / "nvcc/kernels_multi.fatbin"), "--arch", "sm_35")
    assert r.returncode == 1 and r.stderr.strip().endswith("no entry runs on sm_35"), r.stderr


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["inspect", "--help"], ["cache", "--help"]])
def test_help_to_a_full_disk_is_an_error(args):
    """argparse swallowed the write error: `nbjit --help > /dev/full` said nothing and exited 0."""
    with open("/dev/full", "wb") as full:
        cmd = [EXE] if EXE else [sys.executable, "-m", "nbjit"]
        r = subprocess.run([*cmd, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr == "nbjit: error: cannot write standard output: No space left on device\n"

