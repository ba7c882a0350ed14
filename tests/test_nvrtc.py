"""NVRTC through nbjit.compile_image (nbjit.toolchain.nvrtc; no GPU: the arch is always given)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import nbjit
from nbjit import NbjitCompileError, compile_image, inspect_cubin, inspect_ptx
from nbjit.cache.store import Cache
from nbjit.toolchain.nvrtc import CompileFailure
from nbjit.toolchain.request import normalize_options
from nbjit.toolchain.nvjitlink import assemble_ptx, nvjitlink_version

from conftest import DATA  # noqa: E402
from nbjit.toolchain import identity
SRC = (DATA / "src/nvrtc_tmpl.cu").read_text()
PLAIN = 'extern "C" __global__ void axpy(float* y, const float* x, float a, int n) { y[n] += a * x[n]; }\n'
HDR = {"scale.cuh": (DATA / "src/scale.cuh").read_text()}
EXPRS = ["fill<float>", "fill<int>", "ns::op<float, 4>", "&plain"]


def test_templates_name_expressions_and_headers(tmp_path):
    img = compile_image(SRC, name="nvrtc_tmpl.cu", name_expressions=EXPRS, headers=HDR, arch="sm_90",
                        cache=Cache(tmp_path))
    assert (img.kind, img.arch, img.name) == ("cubin", "sm_90", "nvrtc_tmpl.cu")
    assert img.lowered_names == {"fill<float>": "_Z4fillIfEvPT_S0_i", "fill<int>": "_Z4fillIiEvPT_S0_i",
                                 "ns::op<float, 4>": "_ZN2ns2opIfLi4EEEvPT_PKS1_i", "&plain": "plain"}
    info = inspect_cubin(img.data)
    assert info.arch == "sm_90"
    assert set(img.lowered_names.values()) <= {e.name for e in info.entries}


@pytest.mark.parametrize("arch,output,kind,target", [
    ("compute_90", "auto", "ptx", "sm_90"), ("sm_90", "ptx", "ptx", "sm_90"), ("sm_90a", "auto", "cubin", None),
    ("sm_80", "cubin", "cubin", None)])
def test_arch_and_output(arch, output, kind, target, tmp_path):
    img = compile_image(SRC, name_expressions=["fill<float>"], headers=HDR, arch=arch, output=output,
                        cache=Cache(tmp_path))
    assert img.kind == kind
    if kind == "ptx":
        assert inspect_ptx(img.data).arch == target
    else:
        c = inspect_cubin(img.data)
        assert c.arch == arch


def test_include_paths_and_defines(tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "scale.cuh").write_text(HDR["scale.cuh"])
    src = '#include "scale.cuh"\nextern "C" __global__ void k(float* x) { x[0] = scale<float>(x[0], WIDTH); }\n'
    img = compile_image(src, include_paths=[str(inc)], options=["-DWIDTH=4"], arch="sm_90", cache=Cache(tmp_path))
    assert "k" in {e.name for e in inspect_cubin(img.data).entries}
    with pytest.raises(NbjitCompileError, match="WIDTH"):
        compile_image(src, include_paths=[str(inc)], arch="sm_90", cache=Cache(tmp_path))


def test_compile_error_shows_numbered_lines(tmp_path):
    src = "extern \"C\" __global__ void k(float* x) {\n  int i = threadIdx.x;\n\n  x[i] = undefined_thing;\n}\n"
    with pytest.raises(CompileFailure) as e:
        compile_image(src, name="my_kernel.cu", options=["-std=c++17"], arch="sm_90", cache=Cache(tmp_path))
    err = e.value
    assert isinstance(err, NbjitCompileError)
    assert "my_kernel.cu(4): error" in err.log and "undefined_thing" in err.log
    assert err.options == ["-arch=sm_90", "-std=c++17"] + err.options[2:] and err.name == "my_kernel.cu"
    msg = str(err)
    assert ">    4 |   x[i] = undefined_thing;" in msg and "my_kernel.cu(4): error" in msg
    assert err.source_with_line_numbers().splitlines()[3] == "    4 |   x[i] = undefined_thing;"


def test_warnings_stay_on_the_image(tmp_path):
    src = 'extern "C" __global__ void k(float* x) { int unused = 3; x[0] = 1.0f; }\n'
    img = compile_image(src, name="w.cu", arch="sm_90", cache=Cache(tmp_path))
    assert "unused" in img.log and "warning" in img.log


def test_bad_arguments(tmp_path):
    with pytest.raises(NbjitCompileError, match="not an architecture"):
        compile_image(SRC, arch="volta")
    with pytest.raises(NbjitCompileError, match="needs a real architecture"):
        compile_image(SRC, arch="compute_90", output="cubin")
    with pytest.raises(NbjitCompileError, match="output must be"):
        compile_image(SRC, arch="sm_90", output="fatbin")
    with pytest.raises(NbjitCompileError, match="arch=..."):
        compile_image(SRC, arch="sm_90", options=["-arch=sm_80"])
    with pytest.raises(NbjitCompileError, match="nothere"):
        compile_image(SRC, headers=HDR, name_expressions=["nothere<int>"], arch="sm_90", cache=Cache(tmp_path))


def test_arguments_of_the_wrong_kind_are_named(tmp_path):
    src = 'extern "C" __global__ void k() {}'
    bad = [({"headers": ["a.h"]}, "headers must be a dict {include name: text}, not list"),
           ({"headers": {"a.h": 5}}, "headers: 'a.h' -> int: both the include name and the header's text must be str"),
           ({"include_paths": [123]}, "include_paths: 123 (int) is not a path"),
           ({"options": [None]}, "options: None (NoneType) is not a str"),
           ({"options": 5}, "options must be a list of str, not int"),
           ({"name_expressions": [1]}, "name_expressions: 1 (int) is not a str"),
           ({"name": 5}, "name must be the source's name (str), not int"),
           ({"cache": str(tmp_path)}, "cache must be an nbjit.Cache (or None for the default), not str")]
    for kwargs, msg in bad:
        with pytest.raises(NbjitCompileError) as e:
            compile_image(src, arch="sm_90", **{"cache": Cache(tmp_path), **kwargs})
        assert str(e.value) == msg


def test_one_str_where_a_list_goes_is_one_item(tmp_path):
    """name_expressions="fill<float>", include_paths="dir" (or a Path): one item each;
    options="-DN=4 -std=c++17": split as a shell splits it; the same compile (and cache entry)
    as the lists."""
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "scale.cuh").write_text(HDR["scale.cuh"])
    src = '#include "scale.cuh"\ntemplate <class T> __global__ void fill(T* p) { p[0] = scale<T>(T(1), N); }\n'
    cache = Cache(tmp_path / "cache")
    one = compile_image(src, options="-DN=4 -std=c++17", name_expressions="fill<float>", include_paths=str(inc),
                        arch="sm_90", cache=cache)  # options in one str: split as a shell splits them
    assert one.lowered_names == {"fill<float>": "_Z4fillIfEvPT_"}
    for paths in ([str(inc)], inc, [inc]):
        many = compile_image(src, options=["-DN=4", "-std=c++17"], name_expressions=["fill<float>"],
                             include_paths=paths, arch="sm_90", cache=cache)
        assert many.data == one.data and many.lowered_names == one.lowered_names
    assert len(cache.entries()) == 1
    with pytest.raises(NbjitCompileError, match="options '-DMSG=\"a b': No closing quotation"):
        compile_image(src, options='-DMSG="a b', arch="sm_90", cache=cache)
    mod = nbjit.compile(src, options="-DN=4 -std=c++17", name_expressions="fill<float>", arch="sm_90", lazy=True,
                        include_paths=inc, cache=cache)  # the module route: the same entry
    assert mod.image.data == one.data and mod.image.lowered_names == {"fill<float>": "_Z4fillIfEvPT_"}
    assert len(cache.entries()) == 1


def test_option_normalisation(tmp_path):
    assert normalize_options(["-I", "inc", "-Dx=1", "--define-macro=y", "--std=c++17", "-use_fast_math",
                              "--generate-line-info", "  -G "]) == [
        f"--include-path={(Path.cwd() / 'inc')}", "-Dx=1", "-Dy", "-std=c++17", "--use_fast_math", "-lineinfo", "-G"]
    assert normalize_options(["-Iinc"]) == normalize_options(["--include-path=inc"]) == normalize_options(["-I", "inc"])
    with pytest.raises(NbjitCompileError, match="needs a value"):
        normalize_options(["-I"])


def test_compiling_for_the_current_device_without_one_says_what_to_do():
    from conftest import gpu_available
    if gpu_available()[0]:
        pytest.skip("a GPU is present")
    src = 'extern "C" __global__ void k(float* y) { y[0] = 1.0f; }'
    for call in (lambda: nbjit.compile_image(src), lambda: nbjit.compile(src)):
        with pytest.raises(nbjit.NbjitError, match="arch="):
            call()


def test_toolchain_fingerprint_follows_the_library_that_loads(tmp_path, monkeypatch):
    """A site-packages wheel's NVRTC (what cuda.bindings loads first) identifies the
    toolchain; the system copies count only where no such wheel has one; a changed file
    changes the fingerprint."""
    import os
    import sys


    def fresh(lib="nvrtc"):
        monkeypatch.setattr("nbjit.toolchain.identity._FINGERPRINTS", {})
        identity._nvidia_dirs.cache_clear()
        return {"libs": identity._toolchain_copies(lib), "fp": identity._toolchain_fingerprint(lib)}

    site, home = tmp_path / "lib" / "site-packages", tmp_path / "cuda"
    (home / "lib64").mkdir(parents=True)
    (home / "lib64" / "libnvrtc.so.13").write_bytes(b"system")
    (home / "lib64" / "libnvJitLink.so.13").write_bytes(b"system")
    monkeypatch.setattr(sys, "path", [str(site), str(site)])
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    try:
        assert fresh()["libs"] == [str(home / "lib64" / "libnvrtc.so.13")]
        wheel = site / "nvidia" / "cu13" / "lib"
        wheel.mkdir(parents=True)
        (wheel / "libnvrtc.so.13").write_bytes(b"wheel")
        first = fresh()
        assert first["libs"] == [str(wheel / "libnvrtc.so.13")]  # the system copy no longer counts
        assert fresh("nvJitLink")["libs"] == [str(home / "lib64" / "libnvJitLink.so.13")]
        os.utime(wheel / "libnvrtc.so.13", ns=(1, 1))
        assert fresh()["fp"] == first["fp"]  # a file time is not what the library is
        (wheel / "libnvrtc.so.13").write_bytes(b"wheel, another build")
        assert fresh()["fp"] != first["fp"]
        # a wheel outside site-packages (pip install --target, on PYTHONPATH) is not what
        # cuda.bindings looks for first: the system copies count as well
        target = tmp_path / "target"
        (target / "nvidia" / "cu13" / "lib").mkdir(parents=True)
        (target / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13").write_bytes(b"target")
        monkeypatch.setattr(sys, "path", [str(target), os.path.dirname(os.__file__)])
        assert fresh()["libs"] == [str(target / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13"),
                                   str(home / "lib64" / "libnvrtc.so.13")]
        assert identity._toolchain_fingerprint() is identity._toolchain_fingerprint()  # once per process
    finally:
        identity._nvidia_dirs.cache_clear()


def test_a_library_without_a_build_id_is_digested_once(tmp_path, monkeypatch):
    """A library with no GNU build ID is named by its content: digesting it (NVRTC's is
    ~140 MB) is remembered in the cache directory by its path, inode, size and times, so only
    the first process after an install reads it whole. A rewrite is digested again, even one
    that puts the old modification time back (its change time moved); a copy elsewhere is the
    same library; with the disk cache off nothing is remembered."""
    import json
    import os

    from nbjit.cache import store as cache_mod
    from nbjit.read.image import content_digest

    lib = tmp_path / "venv1" / "libnvrtc.so.13"
    lib.parent.mkdir()
    lib.write_bytes(b"\x7fELF, no build id, one build" * 1000)
    monkeypatch.setenv("NBJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache_mod, "_DEFAULT", [])  # (the default cache made again from the environment)
    first = identity._library_id(str(lib))
    assert first == f"content:{lib.stat().st_size}:{content_digest(lib.read_bytes())}"
    memo = json.loads((tmp_path / "cache" / "toolchain-ids.json").read_text())
    st = lib.stat()
    assert memo == {str(lib): [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, first]}
    monkeypatch.setattr(identity, "_IDS", {})  # a new process: the file is read, the library is not
    monkeypatch.setattr(identity, "_library_ident", lambda path: pytest.fail(f"{path} read again"))
    assert identity._library_id(str(lib)) == first
    monkeypatch.undo()
    monkeypatch.setenv("NBJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache_mod, "_DEFAULT", [])
    lib.write_bytes(b"\x7fELF, no build id, two build" * 1000)  # the same size, its old time put back
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))
    second = identity._library_id(str(lib))
    assert second != first and second == f"content:{st.st_size}:{content_digest(lib.read_bytes())}"
    copy = tmp_path / "venv2" / "libnvrtc.so.13"  # another venv, the same wheel: the same library
    copy.parent.mkdir()
    copy.write_bytes(lib.read_bytes())
    assert identity._library_id(str(copy)) == second
    assert len(json.loads((tmp_path / "cache" / "toolchain-ids.json").read_text())) == 2
    monkeypatch.setenv("NBJIT_CACHE", "0")
    monkeypatch.setattr(cache_mod, "_DEFAULT", [])
    (tmp_path / "cache" / "toolchain-ids.json").unlink()
    assert identity._library_id(str(copy)) == second
    assert not (tmp_path / "cache" / "toolchain-ids.json").exists()


def test_remembered_identities_fit_what_is_read_back(tmp_path):
    """The memo of toolchain identities keeps the newest entries that fit in what a warm
    start reads (a file cut short would be unreadable: every file read again)."""
    import json


    ids = {f"/{'long/' * 120}{i}/libnvrtc.so.13": [i, 1, 2, 3, f"build-id:{i:040x}"] for i in range(identity._IDS_KEPT)}
    identity._write_ids(str(tmp_path), ids)
    text = (tmp_path / "toolchain-ids.json").read_text()
    kept = json.loads(text)
    assert len(text) < identity._IDS_BYTES and 0 < len(kept) < len(ids)
    assert list(kept) == list(ids)[-len(kept):]  # the newest
    assert identity._read_ids(str(tmp_path)) == kept
    (tmp_path / "toolchain-ids.json").write_text("{" * 10)
    assert identity._read_ids(str(tmp_path)) == {}


def test_a_warm_start_opens_no_toolchain_file(monkeypatch):
    """The toolchain's identity (NVRTC's build ID, CUDA's header version, CCCL's version
    digest) is remembered in the cache directory: a later process stats those files and reads
    one small file, and finds the same key. Where one of them is another file now (a
    reinstall), it is read again."""
    import json

    from nbjit.toolchain import nvrtc as C

    if not identity._toolchain_copies():
        pytest.skip("no NVRTC library found")
    real = {name: getattr(identity, name) for name in ("_library_ident", "_runtime_api_id", "_version_digest")}

    def fresh_process(read: bool):
        monkeypatch.setattr("nbjit.toolchain.identity._FINGERPRINTS", {})
        monkeypatch.setattr(identity, "_IDS", {})
        identity._cuda_headers.cache_clear()
        identity._cccl.cache_clear()
        for name, f in real.items():
            monkeypatch.setattr(identity, name,
                                f if read else lambda path, name=name: pytest.fail(f"{name}({path}) read"))

    try:
        fresh_process(read=True)
        key = C.compile_key(PLAIN, arch="sm_90")
        memo = C.default_cache().path / "toolchain-ids.json"
        ids = json.loads(memo.read_text())
        (lib,) = identity._toolchain_copies()[:1]
        assert ids[lib][4] == identity._library_ident(lib)
        if identity.cuda_include_dir():
            assert f"{identity.cuda_include_dir()}/cuda_runtime_api.h" in ids
        if identity.cccl_include_dir():
            assert f"{identity.cccl_include_dir()}/cuda/std/__cccl/version.h" in ids
        fresh_process(read=False)
        assert C.compile_key(PLAIN, arch="sm_90") == key
        # the memo says another file was at NVRTC's path (another inode), of another build
        memo.write_text(json.dumps({**ids, lib: [ids[lib][0] + 1, *ids[lib][1:4], "build-id:00"]}))
        fresh_process(read=True)
        assert C.compile_key(PLAIN, arch="sm_90") == key
        assert json.loads(memo.read_text())[lib] == ids[lib]
    finally:
        identity._cuda_headers.cache_clear()
        identity._cccl.cache_clear()


def test_architectures_nvrtc_does_not_know(tmp_path):
    """A device newer than NVRTC gets PTX for the newest architecture NVRTC knows (output
    "auto"); what cannot be compiled says which architectures can. An architecture no chip
    has (sm_91 once compiled to PTX that the CLI wrote as k.cubin) or a variant CUDA does not
    define (sm_90f, sm_89a) is refused by nbjit before NVRTC sees it."""
    from nbjit.arch import SHIPPED
    from nbjit.toolchain.nvrtc import supported_archs
    known = supported_archs()
    src = 'extern "C" __global__ void k(float* p) { p[0] = 1.0f; }'
    newer = max(max(known), max(SHIPPED)) + 7
    img = compile_image(src, arch=f"sm_{newer}", cache=Cache(tmp_path))
    assert (img.kind, img.arch) == ("ptx", f"compute_{max(known)}")
    assert inspect_ptx(img.data).arch == f"sm_{max(known)}"
    listed = ", ".join(f"sm_{k}" for k in known)
    refused = ((f"sm_{newer}", "cubin", "a cubin for exactly"), (f"sm_{newer}", "ptx", "PTX for exactly"),
               (f"compute_{newer}", "auto", "PTX for exactly"), (f"sm_{newer}a", "auto", "'a' code"),
               ("sm_40", "auto", "no chip has that compute capability (near it: sm_50)"),
               ("sm_91", "auto", "no chip has that compute capability (near it: sm_86, "),
               ("sm_91", "ptx", "no chip has that compute capability"),
               ("sm_90f", "auto", "family ('f') builds exist from sm_100f on"),
               ("sm_89a", "auto", "arch-specific ('a') builds exist from sm_90a on"),
               ("compute_86a", "auto", "arch-specific ('a') builds exist from sm_90a on"))
    if 101 not in known:  # a shipped chip this NVRTC does not list (CUDA 13 renamed it sm_110)
        refused += (("sm_101", "auto", "it is not one this NVRTC knows"),)
    for arch, output, why in refused:
        with pytest.raises(NbjitCompileError) as e:
            compile_image(src, name="k.cu", arch=arch, output=output, cache=Cache(tmp_path))
        assert "k.cu: NVRTC" in str(e.value) and f"cannot compile for {arch}: {why}" in str(e.value)
        assert str(e.value).endswith(f"It compiles for {listed}")
    assert len(list(tmp_path.glob("*/*.nbjit"))) == 1  # the PTX; a refusal stores nothing


def test_compiles_leave_python_bytes_alone(tmp_path):
    """NVRTC and nvJitLink write into mutable buffers only: a compile whose log is empty once
    wrote NUL into CPython's shared one-byte b" ", after which print('a', 'b') wrote 'a\\0b'
    and b"GET / HTTP".split(b" ") no longer split. In a fresh process (the damage is global):
    compiles with an empty and a non-empty log, a PTX output, an nvJitLink assembly."""
    import subprocess
    import sys
    code = '''
import nbjit
from nbjit.cache.store import Cache
from nbjit.toolchain.nvjitlink import assemble_ptx, nvjitlink_version
c = Cache(None)
img = nbjit.compile_image('extern "C" __global__ void k(){}', arch="sm_90", cache=c)
assert img.log == "", img.log
assert nbjit.compile_image('extern "C" __global__ void w(){ int unused; }', arch="sm_90", cache=c).log
ptx = nbjit.compile_image('extern "C" __global__ void p(){}', arch="sm_90", output="ptx", cache=c)
if nvjitlink_version():
    assemble_ptx(ptx.data, "sm_90")
assert bytes([32]) == b"\\x20" and " ".encode() == b"\\x20", bytes([32])
assert b"GET / HTTP".split(b" ") == [b"GET", b"/", b"HTTP"]
assert b" ".join([b"a", b"b"]) == b"a\\x20b"
print("a", "b")
'''
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, cwd=tmp_path,
                         env={**__import__("os").environ, "NBJIT_CACHE": "0",
                              "PYTHONPATH": str(Path(nbjit.__file__).parents[1])})
    assert out.stdout == b"a b\n", out.stdout


def test_source_given_as_a_path(tmp_path):
    """compile_image("/path/k.cu") compiled the path string as CUDA source ("expected a
    declaration"). A Path, or a str naming a .cu/.cuh file, is read; its directory is searched
    for #include "..." as nvcc does, and its name names the image."""
    (tmp_path / "h.cuh").write_text("#define V 3.0f\n")
    cu = tmp_path / "k.cu"
    cu.write_text('#include "h.cuh"\nextern "C" __global__ void k(float* x) { x[0] = V; }\n')
    for src in (cu, str(cu)):
        img = compile_image(src, arch="sm_90", cache=Cache(tmp_path / "c"))
        assert img.name == "k.cu" and [e.name for e in inspect_cubin(img.data).entries] == ["k"]
    (tmp_path / "h.cuh").write_text("#define V 4.0f\n")  # the header is in the key: a new compile
    assert compile_image(cu, arch="sm_90", cache=Cache(tmp_path / "c")).data != img.data
    m = nbjit.compile(cu, arch="sm_90", lazy=True)
    assert m.kernels == ("k",) and m.name == "k.cu"
    for src, msg in ((str(tmp_path / "nope.cu"), "nope.cu: no such file (a str ending in .cu"),
                     (tmp_path / "nope.cu", f"{tmp_path / 'nope.cu'}: no such file"),
                     (tmp_path, "cannot read it as CUDA source: a directory"),
                     (3, "source must be CUDA C++ text (str) or a .cu file's path, not int")):
        with pytest.raises(NbjitCompileError, match=re.escape(msg) + ("$" if src == tmp_path / "nope.cu" else "")):
            compile_image(src, arch="sm_90", cache=Cache(tmp_path / "c"))
    (tmp_path / "bad.cu").write_bytes(b"// caf\xe9\n")
    with pytest.raises(NbjitCompileError, match="bad.cu: not UTF-8 text"):
        compile_image(tmp_path / "bad.cu", arch="sm_90")


def test_generators_are_read_once(tmp_path):
    """Options and name expressions given as generators: the call's look-up key consumed
    them, NVRTC compiled without them, and the result was remembered under the key that had
    them (a later options=["-DN=5"] got the -DN=0 image)."""
    src = '#ifndef N\n#error N undefined\n#endif\ntemplate<int M> __global__ void f(int* p) { p[0] = N + M; }\n'
    c = Cache(tmp_path)
    a = compile_image(src, options=(o for o in ["-DN=5"]), name_expressions=(e for e in ["f<1>"]), arch="sm_90",
                      cache=c)
    b = compile_image(src, options=["-DN=5"], name_expressions=["f<1>"], arch="sm_90", cache=c)
    assert a.data == b.data and set(a.lowered_names) == {"f<1>"}
    other = compile_image(src, options=["-DN=6"], name_expressions=["f<1>"], arch="sm_90", cache=c)
    assert other.data != a.data
    m = nbjit.compile(src, options=(o for o in ["-DN=5"]), name_expressions=iter(["f<1>"]), arch="sm_90", lazy=True,
                      cache=c)
    assert m.image.data == a.data
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "n.h").write_text("#define N 7\n")
    d = compile_image('#include "n.h"\n' + src, name_expressions=["f<1>"], include_paths=(p for p in [inc]),
                      arch="sm_90", cache=c)
    assert d.data != a.data


def test_compile_inputs_that_cannot_reach_nvrtc(tmp_path):
    """Lone surrogates raised UnicodeEncodeError; 4 million options crashed NVRTC; a FIFO
    header hung it; a header including itself under 2,000 spellings took 1.9 GiB."""
    import os
    c = Cache(tmp_path / "c")
    ok = 'extern "C" __global__ void k() {}\n'
    for kw, msg in (({"options": ["-DX=\udcff"]}, "options '-DX=\\udcff' holds '\\udcff'"),
                    ({"source": ok + "// \udc80\n"}, "the source holds '\\udc80' (line 2)"),
                    ({"name": "k\udc80.cu"}, "name 'k\\udc80.cu' holds"),
                    ({"name_expressions": ["f<\udc80>"]}, "name_expressions"),
                    ({"headers": {"h\udc80": "x"}}, "headers"),
                    ({"options": ["-DX"] * 5000}, "5000 options (15000 characters): more than NVRTC is given"),
                    ({"options": ["-D" + "X" * (2 << 20)]}, "1 options")):
        args = {"source": ok, "arch": "sm_90", "cache": c, **kw}
        with pytest.raises(NbjitCompileError, match=re.escape(msg)):
            compile_image(args.pop("source"), **args)
    from nbjit.toolchain import request
    splits, split = [], request.shlex.split
    request.shlex.split = lambda text: splits.append(len(text)) or split(text)
    try:  # options in one str past the cap: refused before the shell-like split reads them
        with pytest.raises(NbjitCompileError, match=r"options: one str of 3145728 characters: more than NVRTC"):
            compile_image(ok, options="-DX " * (3 << 18), arch="sm_90", cache=c)
        assert splits == []
    finally:
        request.shlex.split = split
    inc = tmp_path / "inc"
    inc.mkdir()
    os.mkfifo(inc / "fifo.h")
    with pytest.raises(NbjitCompileError, match=r"#include \"fifo.h\" finds .*fifo.h, which is a FIFO, not a regular"):
        compile_image('#include "fifo.h"\n' + ok, include_paths=[inc], arch="sm_90", cache=c)
    spellings = "".join(f'#include "{"./" * i}self.h"\n' for i in range(1, 400))
    (inc / "self.h").write_text("#pragma once\n" + spellings)
    from nbjit.toolchain import includes as I
    reads, read = [], I.read_regular
    I.read_regular = lambda path, limit: reads.append(path) or read(path, limit)
    try:
        # each path once (399 spellings through inc, one more from inside self.h, whose directory is inc/.)
        assert len(I.walk_includes(spellings, "kernel.cu", {}, [str(inc)]).files) == 400
    finally:
        I.read_regular = read
    assert reads == [str(inc / "self.h")]  # one read of the file (it was read and queued once per spelling)
    img = compile_image('#include "self.h"\n' + ok, include_paths=[inc], arch="sm_90", cache=c)
    assert [e.name for e in inspect_cubin(img.data).entries] == ["k"]


def test_output_without_kernels_is_said(tmp_path):
    """A template-only source without name expressions, or an empty one, compiled to a cubin
    with no kernel and said nothing."""
    c = Cache(tmp_path)
    for src, output in (("template <class T> __global__ void t(T* p) { p[0] = 1; }\n", "auto"), ("", "auto"),
                        ("", "ptx"), ("__device__ float g;\n", "auto")):
        with pytest.warns(nbjit.NbjitWarning, match="NVRTC compiled no kernel .*name_expressions"):
            compile_image(src, name="t.cu", arch="sm_90", output=output, cache=c)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile_image("template <class T> __global__ void t(T* p) { p[0] = 1; }\n", name_expressions=["t<int>"],
                      arch="sm_90", cache=c)


@pytest.mark.parametrize("header,hint", [("cstdint", "include <cuda/std/cstdint>"),
                                         ("stdint.h", "include <cuda/std/cstdint>"),
                                         ("vector", "<vector> is a host C++ standard library header")])
def test_a_standard_header_nvrtc_has_not_got_gets_a_hint(tmp_path, header, hint):
    from nbjit.toolchain.identity import cccl_include_dir
    if "cuda/std" in hint and cccl_include_dir() is None:
        hint = f"<{header}> is a host C++ standard library header"  # (no CCCL to point to: cu12's wheels)
    with pytest.raises(CompileFailure) as e:
        compile_image(f'#include <{header}>\nextern "C" __global__ void k() {{}}\n', arch="sm_90",
                      cache=Cache(tmp_path))
    assert f'cannot open source file "{header}"' in e.value.log and hint in str(e.value).splitlines()[-1]


def _site_with_nvrtc(where: Path, nvrtc: bytes | None) -> tuple[Path, Path]:
    """(A site-packages directory under ``where`` whose nvidia/cu13 wheel holds NVRTC, that
    library): a fresh copy of the one installed (``nvrtc`` None: another path, another file
    time, the same build) or a file of ``nvrtc``'s bytes; CUDA's headers reached by another
    path (a link)."""
    import os
    import shutil
    site = where / "lib" / "site-packages"
    (site / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    os.symlink(identity.cuda_include_dir(), site / "nvidia" / "cu13" / "include")
    copy = site / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13"
    if nvrtc is None:
        shutil.copyfile(next(f for f in identity._toolchain_copies() if "site-packages" in f), copy)
    else:
        copy.write_bytes(nvrtc)
    return site, copy


def test_cache_entries_travel_between_environments(tmp_path):
    """The key named where NVRTC was installed (path, size, file time of the library; CUDA_HOME,
    LD_LIBRARY_PATH): a cache exported from one environment missed in a second one with the
    same wheels at another path. It now names what the toolchain is: a second environment
    (another path, fresh copies of the library, other variables, no site-packages at all)
    hits the imported entry without NVRTC; another NVRTC build misses."""
    import os
    import subprocess
    import sys
    src = 'extern "C" __global__ void travel(float* p) { p[0] = 42.0f; }\n'
    first = compile_image(src, name="t.cu", arch="sm_90", options=["-DX=1"], cache=Cache(tmp_path / "a"))
    Cache(tmp_path / "a").export_archive(tmp_path / "a.tar.gz")
    Cache(tmp_path / "b").import_archive(tmp_path / "a.tar.gz")

    def other_env(name: str, nvrtc: bytes | None) -> subprocess.CompletedProcess:
        site = _site_with_nvrtc(tmp_path / name, nvrtc)[0]
        code = f"""
import sys
sys.path[:0] = [{str(Path(nbjit.__file__).parents[1])!r}, {str(site)!r}]
from nbjit.toolchain import nvrtc as C
from nbjit.cache.store import Cache
def nvrtc(req):
    raise SystemExit("NVRTC called")
C._run_nvrtc = nvrtc
img = C.compile_image({src!r}, name="t.cu", arch="sm_90", options=["-DX=1"], cache=Cache({str(tmp_path / "b")!r}))
sys.stdout.buffer.write(img.data)
"""
        env = {"PATH": os.environ.get("PATH", ""), "LD_LIBRARY_PATH": str(tmp_path / "elsewhere"),
               "CUDA_HOME": str(tmp_path / "cuda-home"), "NBJIT_CACHE_DIR": str(tmp_path / "unused")}
        # -S: no site-packages, so this environment's NVRTC is the only one there is
        return subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, env=env, timeout=120)

    same = other_env("venv2", None)
    assert same.returncode == 0 and same.stdout == first.data, same.stderr[-2000:]
    other = other_env("venv3", b"\x7fELF another NVRTC")
    assert other.returncode == 1 and b"NVRTC called" in other.stderr, other.stderr[-2000:]


def test_the_compiler_is_told_its_target(tmp_path, monkeypatch):
    """Given an architecture, the compiling stage asks no device (a key without one says to
    give one); an Arch and its text are the same compile (one cache entry)."""
    from nbjit.toolchain import nvrtc as compiler
    from nbjit.gpu import driver as _driver
    from nbjit.gpu.host import current_host
    from nbjit.arch import Arch

    def refuse(*a, **k):
        raise AssertionError("the compiler asked the driver")
    monkeypatch.setattr(current_host(), "current_cc", refuse)
    monkeypatch.setattr(current_host(), "current_context", refuse)
    monkeypatch.setattr(_driver, "current_context_key", refuse)
    cache = Cache(tmp_path)
    with pytest.raises(NbjitCompileError, match=r"k\.cu: no architecture to compile for: give arch= \(e\.g\. 'sm_90"):
        compiler.compile_key(SRC, name="k.cu")
    with pytest.raises(NbjitCompileError, match="not an architecture"):
        compiler.compile_image(SRC, arch=90, cache=cache)
    by_text = compiler.compile_image(SRC, arch="sm_90a", headers=HDR, name_expressions=["fill<float>"], cache=cache)
    by_arch = compiler.compile_image(SRC, arch=Arch.parse("sm_90a"), headers=HDR, name_expressions=["fill<float>"],
                                     cache=Cache(tmp_path))
    assert by_arch.data == by_text.data and by_arch.arch == "sm_90a" and len(cache.entries()) == 1
    # the case of the text, as the command line's --arch: the same compile (it was "not an architecture")
    by_upper = compiler.compile_image(SRC, arch=" SM_90A", headers=HDR, name_expressions=["fill<float>"], cache=cache)
    assert by_upper.data == by_text.data and len(cache.entries()) == 1


def test_ptxas_reports_spills_and_stack_frames_kept_with_the_entry(tmp_path, counted):
    """Where the options ask ptxas for its report (-Xptxas=-v), each function's stack frame
    and spill bytes are kept in the cache entry's facts (a hit compiles nothing and has them
    still); the frame ptxas reports is the one the cubin records. nbjit never asks on its own:
    ptxas records its options in the cubin, so the report changes the bytes."""
    src = DATA / "src/spill.cu"
    img = compile_image(src, arch="sm_90", options=["-Xptxas=-v"], cache=Cache(tmp_path))
    r = img.resources
    kernels = {e.name: e for e in img.info.entries}
    assert set(kernels) <= set(r) and "Function properties for spills" in img.log
    assert r["spills"]["spill_stores"] > 0 and r["spills"]["spill_loads"] > 0 and kernels["spills"].spills > 0
    assert r["local_array"]["stack_frame"] > 0 and r["local_array"]["spill_stores"] == 0
    for name, e in kernels.items():
        # (CUDA 12.9's cubins record no spill count where there is none)
        assert r[name]["stack_frame"] == e.frame and (r[name]["spill_stores"] > 0) == ((e.spills or 0) > 0), name
    hit = compile_image(src, arch="sm_90", options="-Xptxas=-v", cache=Cache(tmp_path))
    assert hit.resources == r and len(counted) == 1
    plain = compile_image(src, arch="sm_90", cache=Cache(tmp_path))
    assert plain.resources == {} and len(counted) == 2  # (another key: CUDA 13's ptxas records -v in the cubin)
    assert compile_image(src, arch="compute_90", options=["-Xptxas=-v"], cache=Cache(tmp_path)).resources == {}


def test_ptxas_report_of_nvjitlink(tmp_path):
    """nvJitLink's -verbose log gives the same report, per function (device functions too)."""
    from nbjit.toolchain.nvjitlink import assemble_ptx, nvjitlink_version
    from nbjit.toolchain.nvrtc import ptxas_report
    if nvjitlink_version() is None or nvjitlink_version() < (13, 0):
        pytest.skip("no nvJitLink that assembles the committed PTX 9.0 (CUDA 13's)")
    out = assemble_ptx((DATA / "nvcc/kernels_sm90.ptx").read_text(), "sm_90", options=("-verbose",))
    report = ptxas_report(out.log)
    frames = {e.name: e.frame for e in inspect_cubin(out.data).entries}
    assert frames and set(frames) < set(report)  # and the device functions they call
    assert all(report[k]["stack_frame"] == f for k, f in frames.items())
    assert ptxas_report(assemble_ptx((DATA / "nvcc/kernels_sm90.ptx").read_text(), "sm_90").log) == {}


@pytest.mark.skipif(nvjitlink_version() is None, reason="no nvJitLink")
def test_nvjitlink_names_the_input_it_refuses():
    """One nvJitLink wrapper (assemble_ptx is one use): a refused input is named by its
    label, with nvJitLink's log; refused options are named."""
    from nbjit.toolchain.nvjitlink import nvjitlink_cubin
    from nbjit.errors import LinkFailure
    ptx = nbjit.compile_image('extern "C" __global__ void p(){}', arch="sm_90", output="ptx")
    ok = nvjitlink_cubin([("ptx", ptx.data + b"\0", "p.ptx")], "sm_90")
    assert nbjit.inspect_cubin(ok.data).entries[0].name == "p"
    with pytest.raises(LinkFailure) as e:
        nvjitlink_cubin([("ptx", ptx.data + b"\0", "p.ptx"), ("ltoir", b"\xed\x43\x4e\x7f" + bytes(60), "bad.ltoir")],
                        "sm_90", options=["-lto"])
    assert e.value.input == "bad.ltoir" and e.value.inputs == ("p.ptx", "bad.ltoir") and e.value.error
    assert str(e.value).startswith("nvJitLink refused bad.ltoir for sm_90: ")
    with pytest.raises(LinkFailure, match="nvJitLink refused the options -arch=sm_90 -bogus: "):
        nvjitlink_cubin([("ptx", ptx.data + b"\0", "p.ptx")], "sm_90", options=["-bogus"])
    with pytest.raises(nbjit.NbjitCompileError, match=r"^x.ptx: nvJitLink could not assemble PTX for sm_90: "):
        assemble_ptx(".version 9.0\n.target sm_90\n.address_size 64\nnonsense;\n", "sm_90", name="x.ptx")


@pytest.mark.parametrize("path", ["kernels_sm90.ptx", "k.cubin", "dir/multi.fatbin", "x.nbjit"])
def test_a_path_to_compiled_code_is_not_compiled_as_source(path):
    with pytest.raises(NbjitCompileError, match="names compiled code, not CUDA C\\+\\+: load it with nbjit.load"):
        compile_image(path, arch="sm_90")


@pytest.mark.parametrize("option", [["-D", "=3"], ["-D="], ["--define-macro="], ["-D"]])
def test_a_define_without_a_macro_name_is_refused(option):
    from nbjit.toolchain.request import normalize_options
    with pytest.raises(NbjitCompileError, match="macro name|needs a value"):
        normalize_options(option)
    assert normalize_options(["-DX=1", "-D", "Y", "--define-macro=Z=2"]) == ["-DX=1", "-DY", "-DZ=2"]


def test_a_source_that_sets_a_graph_condition_compiles_as_with_nvcc(tmp_path):
    """NVRTC's runtime headers lack cudaGraphSetConditional (nvcc's declare it): nbjit declares
    it for a source that calls it; the handle parameter is a 64-bit unsigned integer."""
    src = ('extern "C" __global__ void stop(const float* r, cudaGraphConditionalHandle again) {\n'
           '    if (threadIdx.x == 0) cudaGraphSetConditional(again, r[0] > 1.0f);\n}\n')
    img = compile_image(src, name="stop.cu", arch="sm_90", output="ptx", cache=Cache(tmp_path / "c"))
    assert ".extern .func cudaGraphSetConditional" in img.data.decode()
    m = nbjit.compile(src, name="stop.cu", arch="sm_90", lazy=True, cache=Cache(tmp_path / "c"))
    assert [(p.type, p.ctype) for p in m["stop"].params] == [("u64", "const float*"), ("u64", "unsigned long long")]
    declared = 'extern "C" __device__ void cudaGraphSetConditional(cudaGraphConditionalHandle, unsigned int);\n'
    assert compile_image(declared + src, name="stop2.cu", arch="sm_90", cache=Cache(tmp_path / "c")).kind == "cubin"


def test_cccl_installed_to_a_directory_of_its_own_is_found(tmp_path, monkeypatch):
    """``pip install --target`` puts the CCCL wheel's nvidia/cu13/include/cccl in another
    ``nvidia`` directory than CUDA's headers: found there, where none is beside them."""
    import shutil
    import sys
    if not identity.cuda_include_dir() or "/nvidia/" not in identity.cuda_include_dir():
        pytest.skip("CUDA's headers do not come from a pip wheel here")
    cuda = tmp_path / "a" / "nvidia" / "cu13" / "include"
    cuda.mkdir(parents=True)
    shutil.copyfile(f"{identity.cuda_include_dir()}/cuda_runtime_api.h", cuda / "cuda_runtime_api.h")
    version = tmp_path / "b" / "nvidia" / "cu13" / "include" / "cccl" / "cuda" / "std" / "__cccl" / "version.h"
    version.parent.mkdir(parents=True)
    version.write_text("#define CCCL_VERSION 3003005\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "a"), str(tmp_path / "b")])
    caches = (identity._nvidia_dirs, identity._cuda_headers, identity._cccl)
    try:
        for c in caches:
            c.cache_clear()
        assert identity.cuda_include_dir() == str(cuda)
        assert identity.cccl_include_dir() == str(version.parents[3])
        version.unlink()
        identity._cccl.cache_clear()
        assert identity.cccl_include_dir() is None
    finally:
        monkeypatch.undo()
        for c in caches:
            c.cache_clear()
