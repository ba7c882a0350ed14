"""The #include walk (nbjit.toolchain.includes): every file NVRTC reads is in the compile cache's key,
found as NVRTC finds it, with NVRTC itself as the oracle; an edit to any of them is a new
compile, in this process (the call memo) and in another (the call index)."""
from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

import nbjit
from nbjit import Cache, compile_image
from nbjit.toolchain.nvrtc import compile_key
from nbjit.errors import NbjitCompileError, NbjitWarning
from nbjit.toolchain.includes import walk_includes

KERNEL = 'extern "C" __global__ void k(int* x) { x[0] = V; }\n'


def nvrtc_ok() -> bool:
    try:
        from nbjit.toolchain.nvrtc import nvrtc_version
        nvrtc_version()
        return True
    except Exception:
        return False


needs_nvrtc = pytest.mark.skipif(not nvrtc_ok(), reason="NVRTC is not installed")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def digest(img) -> str:
    return hashlib.sha256(img.data if isinstance(img.data, bytes) else img.data.encode()).hexdigest()


# ------------------------------------------------------------------ the walk alone (no NVRTC)


def test_quoted_include_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "h.h", "#define V 1\n")
    w = walk_includes('#include "h.h"\n', "kernel.cu", {}, [])
    assert [p for p, _ in w.files] == ["h.h"] and w.reaches_disk and w.unknown is None


def test_quoted_include_beside_the_header_that_includes_it(tmp_path):
    inc = tmp_path / "inc"
    write(inc / "sub" / "a.h", '#include "b.h"\n')
    write(inc / "sub" / "b.h", "#define V 1\n")
    w = walk_includes('#include "sub/a.h"\n', "kernel.cu", {}, [str(inc)])
    assert [p for p, _ in w.files] == [str(inc / "sub" / "a.h"), str(inc / "sub" / "b.h")]


def test_absolute_include_and_the_sources_own_directory(tmp_path):
    h = write(tmp_path / "abs" / "h.h", "#define V 1\n")
    write(tmp_path / "src" / "g.h", "#define W 1\n")
    w = walk_includes(f'#include "{h}"\n#include "g.h"\n', str(tmp_path / "src" / "k.cu"), {}, [])
    assert [p for p, _ in w.files] == sorted([str(h), str(tmp_path / "src" / "g.h")])


def test_angle_includes_search_only_the_include_directories(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "h.h", "#define V 1\n")  # (not searched for <h.h>)
    assert walk_includes("#include <h.h>\n", "kernel.cu", {}, []).files == ()
    assert not walk_includes("#include <h.h>\n", "kernel.cu", {}, []).reaches_disk
    write(tmp_path / "inc" / "h.h", "#define V 2\n")
    assert [p for p, _ in walk_includes("#include <h.h>\n", "kernel.cu", {}, [str(tmp_path / "inc")]).files] == \
        [str(tmp_path / "inc" / "h.h")]


def test_in_memory_headers_come_first_and_search_from_their_names_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "h.h", "#define V 1\n")
    write(tmp_path / "src" / "w.h", "#define W 1\n")
    w = walk_includes('#include "h.h"\n', "kernel.cu", {"h.h": "#define V 9\n"}, [])
    assert w.files == () and not w.reaches_disk  # the in-memory one, not the file
    w = walk_includes('#include "src/d.h"\n', "kernel.cu", {"src/d.h": '#include "w.h"\n'}, [])
    assert [p for p, _ in w.files] == [os.path.join("src", "w.h")]


def test_pre_include_option_is_followed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "p.h", "#define V 1\n")
    assert [p for p, _ in walk_includes(KERNEL, "kernel.cu", {}, [], options=["--pre-include=p.h"]).files] == ["p.h"]
    assert [p for p, _ in walk_includes(KERNEL, "kernel.cu", {}, [], options=["-include=p.h"]).files] == ["p.h"]


def test_directives_hidden_by_comments_and_splices_are_found(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for n in "abcd":
        write(tmp_path / f"{n}.h", "")
    text = '#/* c */include "a.h"\n# inc\\\nlude "b.h"\n  #  include  "c.h" // trailing\n' \
           '#if __has_include("d.h")\n#endif\n/* #include "missing-but-commented.h" */\n'
    assert [p for p, _ in walk_includes(text, "kernel.cu", {}, []).files] == ["a.h", "b.h", "c.h", "d.h"]


def test_an_include_through_a_macro_is_unknown():
    w = walk_includes("#define H \"h.h\"\n#include H\n", "kernel.cu", {}, [])
    assert w.unknown == "#include H"
    assert walk_includes("#ifdef __has_include\n#endif\n", "kernel.cu", {}, []).unknown is None


def test_toolchain_headers_are_named_by_the_toolchain_not_read(tmp_path):
    tool = tmp_path / "cuda"
    write(tool / "cuda_fp16.h", '#include "other.h"\n')
    w = walk_includes("#include <cuda_fp16.h>\n", "kernel.cu", {}, [], [str(tool)])
    assert w.files == () and not w.reaches_disk


# ------------------------------------------------------------------ the six layouts, compiled


def edit_and_compile(tmp_path, header: Path, compile_once) -> None:
    """``compile_once()`` before and after ``header``'s V changes: another image (from a
    cache that has the first): in this process, and through the disk (a new Cache object)."""
    write(header, "#define V 1\n")
    first = digest(compile_once(Cache(tmp_path / "cache")))
    write(header, "#define V 2\n")
    cache = Cache(tmp_path / "cache")
    second = digest(compile_once(cache))
    assert first != second
    assert digest(compile_once(cache)) == second  # (and the same again from the memo)
    write(header, "#define V 1\n")
    assert digest(compile_once(Cache(tmp_path / "cache"))) == first


@needs_nvrtc
def test_header_in_the_working_directory_is_in_the_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    edit_and_compile(tmp_path, tmp_path / "h.h",
                     lambda c: compile_image('#include "h.h"\n' + KERNEL, arch="sm_90", cache=c))


@needs_nvrtc
def test_header_by_absolute_path_is_in_the_key(tmp_path):
    h = tmp_path / "abs" / "h.h"
    edit_and_compile(tmp_path, h, lambda c: compile_image(f'#include "{h}"\n' + KERNEL, arch="sm_90", cache=c))


@needs_nvrtc
def test_header_beside_an_included_header_is_in_the_key(tmp_path):
    write(tmp_path / "inc" / "sub" / "a.h", '#include "b.h"\n')
    edit_and_compile(tmp_path, tmp_path / "inc" / "sub" / "b.h",
                     lambda c: compile_image('#include "sub/a.h"\n' + KERNEL, include_paths=[tmp_path / "inc"],
                                             arch="sm_90", cache=c))


@needs_nvrtc
def test_source_file_with_a_header_chain_is_in_the_key(tmp_path):
    cu = write(tmp_path / "src" / "k.cu", '#include "lib/a.h"\n' + KERNEL)
    write(tmp_path / "src" / "lib" / "a.h", '#include "b.h"\n')
    edit_and_compile(tmp_path, tmp_path / "src" / "lib" / "b.h", lambda c: compile_image(cu, arch="sm_90", cache=c))


def cli(*args: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NBJIT_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(nbjit.__file__).parents[1]),
                                                       os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "nbjit", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


@needs_nvrtc
@pytest.mark.parametrize("verb", ["compile", "bundle"])
def test_command_line_sees_a_header_in_the_working_directory(tmp_path, verb):
    write(tmp_path / "src" / "k.cu", '#include "config.h"\n' + KERNEL)
    out = tmp_path / ("k.cubin" if verb == "compile" else "k.nbjit")
    made = []
    for v in (1, 2):
        write(tmp_path / "config.h", f"#define V {v}\n")
        r = cli(verb, "src/k.cu", "--arch", "sm_90", "-o", str(out), cwd=tmp_path, cache=tmp_path / "cache")
        assert r.returncode == 0, r.stderr
        made.append(out.read_bytes() if verb == "compile" else _bundle_cubin(out))
    assert made[0] != made[1]


def _bundle_cubin(path: Path) -> bytes:
    import zipfile
    with zipfile.ZipFile(path) as z:
        return b"".join(z.read(n) for n in sorted(z.namelist()) if n.endswith(".cubin"))


# ------------------------------------------------------------------ NVRTC as the oracle


def nvrtc_reads(source: str, name: str, options: list[str], probe: Path) -> bool:
    """Whether NVRTC reads ``probe`` compiling ``source``: an #error put in it fails the compile."""
    from cuda.bindings import nvrtc as N
    text = probe.read_text()
    probe.write_text("#error nbjit-probe\n" + text)
    try:
        err, prog = N.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
        try:
            opts = [b"-arch=compute_90", *(o.encode() for o in options)]
            N.nvrtcCompileProgram(prog, len(opts), opts)
            _, n = N.nvrtcGetProgramLogSize(prog)
            log = bytearray(n)
            N.nvrtcGetProgramLog(prog, log)
            return b"nbjit-probe" in log
        finally:
            N.nvrtcDestroyProgram(prog)
    finally:
        probe.write_text(text)


def random_layout(rng: random.Random, root: Path) -> tuple[str, str, list[str], list[Path]]:
    """A source, its name, include options and the header files of a random layout: headers
    in the working directory, in include directories, in subdirectories, the source's own
    directory; each including others by quoted, angle, relative, absolute and pre-include."""
    dirs = [root, root / "inc1", root / "inc1" / "sub", root / "inc2", root / "src"]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    files = [d / f"h{i}.h" for i, d in enumerate(rng.choice(dirs) for _ in range(rng.randint(2, 7)))]
    include_dirs = rng.sample([dirs[1], dirs[3], dirs[4]], rng.randint(0, 3))

    def spell(target: Path, here: Path) -> str:
        kind = rng.choice(["quoted", "quoted", "angle", "absolute"])
        if kind == "absolute":
            return f'#include "{target}"'
        if kind == "quoted" and target.parent == here:
            return f'#include "{target.name}"'
        for d in include_dirs:
            if d in target.parents or d == target.parent:
                rel = target.relative_to(d)
                return f'#include "{rel}"' if kind == "quoted" else f"#include <{rel}>"
        return f'#include "{os.path.relpath(target, here)}"'

    for f in files:
        others = rng.sample(files, rng.randint(0, 2))
        write(f, "#pragma once\n" + "".join(spell(o, f.parent) + "\n" for o in others if o != f))
    main_dir = rng.choice([root, root / "src"])
    name = "kernel.cu" if main_dir == root else "src/k.cu"
    source = "".join(spell(f, main_dir) + "\n" for f in rng.sample(files, rng.randint(1, len(files)))) \
        + 'extern "C" __global__ void k() {}\n'
    options = [f"--include-path={d}" for d in include_dirs]
    if rng.random() < 0.3:
        options.append(f"--pre-include={files[0]}")
    return source, name, options, files


@needs_nvrtc
@pytest.mark.parametrize("seed", range(12))
def test_every_file_nvrtc_reads_is_in_the_walk(tmp_path, monkeypatch, seed):
    """Property: for random layouts, each file NVRTC reads (an #error in it fails the compile)
    is among the files the walk read, and an edit of it changes the cache key."""
    monkeypatch.chdir(tmp_path)
    rng = random.Random(seed)
    source, name, options, files = random_layout(rng, tmp_path)
    include_dirs = [o.split("=", 1)[1] for o in options if o.startswith("--include-path=")]
    walked = {os.path.realpath(p) for p, _ in walk_includes(source, name, {}, include_dirs, (), options).files}
    key = compile_key(source, name=name, options=options, arch="sm_90")
    read = [f for f in files if nvrtc_reads(source, name, options, f)]
    assert read, "the layout reads no header: the test checks nothing"
    for f in read:
        assert os.path.realpath(f) in walked, f"NVRTC reads {f}, the walk did not"
        text = f.read_text()
        f.write_text(text + "// edited\n")
        try:
            assert compile_key(source, name=name, options=options, arch="sm_90") != key
        finally:
            f.write_text(text)


# ------------------------------------------------------------------ what NVRTC would hang on, what cannot be named


@needs_nvrtc
@pytest.mark.parametrize("where", ["absolute", "working directory", "beside a header"])
def test_a_fifo_nvrtc_would_read_is_refused(tmp_path, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    fifo = tmp_path / ("deep" if where == "beside a header" else ".") / "f.h"
    fifo.parent.mkdir(exist_ok=True)
    os.mkfifo(fifo)
    source = {"absolute": f'#include "{fifo}"\n', "working directory": '#include "f.h"\n',
              "beside a header": '#include "deep/a.h"\n'}[where] + KERNEL
    write(tmp_path / "deep" / "a.h", '#include "f.h"\n')
    got: list = []
    t = threading.Thread(target=lambda: got.append(_try(lambda: compile_image(
        source, arch="sm_90", cache=Cache(tmp_path / "c")))), daemon=True)
    t.start()
    t.join(60)
    if t.is_alive():  # (free the thread: open the FIFO's other end)
        with open(fifo, "w"):
            pass
        pytest.fail("compile_image waited on a FIFO")
    assert isinstance(got[0], NbjitCompileError) and "FIFO" in str(got[0]), got


def _try(f):
    try:
        return f()
    except Exception as e:
        return e


@needs_nvrtc
def test_a_macro_include_compiles_every_time_and_caches_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "h.h", "#define V 1\n")
    source = '#define HEADER "h.h"\n#include HEADER\n' + KERNEL
    cache = Cache(tmp_path / "cache")
    with pytest.warns(NbjitWarning, match="names its file through a macro"):
        first = compile_image(source, arch="sm_90", cache=cache)
    write(tmp_path / "h.h", "#define V 2\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NbjitWarning)
        second = compile_image(source, arch="sm_90", cache=cache)
    assert digest(first) != digest(second)
    assert not list((tmp_path / "cache").rglob("*.entry")) if (tmp_path / "cache").exists() else True
    with pytest.raises(NbjitCompileError, match="never cached"):
        compile_key(source, arch="sm_90")
