"""Sources that survive the cache (nbjit.cache.sources), on a CPU: a kernel compiled with
line information keeps its CUDA C++ with its cache entry; in a fresh process, the loader's
rewrite points the line table at this user's copy, and nvdisasm's line information of the
rewritten cubin names files that exist, whose lines are the source's."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings

import pytest

import nbjit
from nbjit.cache.sources import PREFIX_BYTES, program_name, relocated
from nbjit.toolchain.sass import find_nvdisasm

pytest.importorskip("cuda.bindings.nvrtc", reason="compiling needs NVRTC (cuda-bindings)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KERNEL = """#include "twice.h"
extern "C" __global__ void k(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = twice(y[i]);
}
"""
HEADER = """__device__ float twice(float v) {
    return v * 2.0f;
}
"""

FRESH = """
import sys
import nbjit
from nbjit.cache.sources import relocated
from nbjit.toolchain import nvrtc

def no_compile(req):
    raise RuntimeError("this process compiled: the entry was not read from the cache")
nvrtc._nvrtc_entry = no_compile  # (what compiles, where the cache has no entry)
img = nbjit.compile_image(sys.argv[1], arch="sm_90", options=["-lineinfo"])
open(sys.argv[2], "wb").write(relocated(img.data, img.sources))
"""


@pytest.fixture
def project(tmp_path):
    d = tmp_path / "project"
    d.mkdir()
    (d / "k.cu").write_text(KERNEL)
    (d / "twice.h").write_text(HEADER)
    return d


def line_files(cubin: bytes, tmp_path) -> list[tuple[str, int]]:
    """(file, line) of every line record nvdisasm reads from ``cubin``."""
    exe = find_nvdisasm()
    if exe is None:
        pytest.skip("nvdisasm is not installed (the nvidia-cuda-nvdisasm wheel)")
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    out = subprocess.run([exe, "-c", "--print-line-info", str(path)], capture_output=True, text=True, check=True)
    return [(m[1], int(m[2])) for m in re.finditer(r'//## File "([^"]+)", line (\d+)', out.stdout)]


def test_the_line_table_names_a_placeholder_and_the_entry_keeps_the_source(project, tmp_path):
    cache = nbjit.Cache(tmp_path / "cache")
    img = nbjit.compile_image(str(project / "k.cu"), arch="sm_90", options=["-lineinfo"], cache=cache)
    program = program_name(KERNEL, "k.cu")
    header, = set(img.sources) - {program}
    assert img.sources == {program: KERNEL, header: HEADER}
    assert program.startswith("/nbjit-sources/") and program.endswith("/k.cu") and len(program) > PREFIX_BYTES
    assert header[:PREFIX_BYTES] == program[:PREFIX_BYTES] and re.fullmatch(r"/[0-9a-f]{16}/twice\.h",
                                                                             header[PREFIX_BYTES:])
    files = {f for f, _ in line_files(img.data, tmp_path)}
    assert files == {program, header}  # (the header too: nothing of this machine's paths)
    assert str(project).encode() not in img.data
    plain = nbjit.compile_image(str(project / "k.cu"), arch="sm_90", cache=cache)
    assert plain.sources == {} and b"/nbjit-sources" not in plain.data


def test_a_fresh_process_resolves_every_line_from_the_cache(project, tmp_path):
    """The entry made here, read in a fresh process with the same cache: the rewritten cubin's
    line records name this user's copy of the source and the header, line for line."""
    cache_dir = tmp_path / "cache"
    nbjit.compile_image(str(project / "k.cu"), arch="sm_90", options=["-lineinfo"], cache=nbjit.Cache(cache_dir))
    out = tmp_path / "loaded.cubin"
    env = {**os.environ, "NBJIT_CACHE_DIR": str(cache_dir), "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(FRESH), str(project / "k.cu"), str(out)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    records = line_files(out.read_bytes(), tmp_path)
    assert records
    sources = {f for f, _ in records}
    kept = {os.path.basename(f): f for f in sources if f.startswith(str(cache_dir / "sources"))}
    assert sorted(kept) == ["k.cu", "twice.h"] and len(sources) == 2, sources
    for f, line in records:
        assert os.path.isfile(f), f
        assert 1 <= line <= len(open(f).read().splitlines()), (f, line)
    assert open(kept["k.cu"]).read() == KERNEL and open(kept["twice.h"]).read() == HEADER
    assert any(line == 4 for f, line in records if f == kept["k.cu"])  # (y[i] = twice(y[i]);)
    assert any(line == 2 for f, line in records if f == kept["twice.h"])  # (return v * 2.0f;)


def test_diagnostics_name_the_users_file(tmp_path):
    with pytest.raises(nbjit.CompileFailure) as e:
        nbjit.compile_image("extern \"C\" __global__ void k() { undeclared(); }", name="mine.cu", arch="sm_90",
                            options=["-lineinfo"], cache=nbjit.Cache(tmp_path / "cache"))
    assert "mine.cu" in str(e.value) and "nbjit-sources" not in str(e.value)


def test_relocation_leaves_what_it_cannot_point_alone(tmp_path):
    data = b"\x7fELF..." + program_name("x", "x.cu").encode() + b"..."
    assert relocated(b"no placeholder", {}, str(tmp_path)) == b"no placeholder"
    assert relocated(data, {}, "/" + "r" * PREFIX_BYTES) == data  # (a directory longer than the placeholder)
    moved = relocated(data, {program_name("x", "x.cu"): "x"}, str(tmp_path))
    assert len(moved) == len(data) and str(tmp_path).encode() in moved and b"nbjit-sources" not in moved
    digest = program_name("x", "x.cu").split("/")[-2]
    assert (tmp_path / digest / "x.cu").read_text() == "x"


def test_the_command_line_writes_and_shows_the_source_lines(project, tmp_path):
    """nbjit compile --lineinfo -o: the cubin's line table points at this user's copy of the
    source; nbjit inspect --sass --source puts each run of SASS under its source line."""
    if find_nvdisasm() is None:
        pytest.skip("nvdisasm is not installed (the nvidia-cuda-nvdisasm wheel)")
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": ROOT}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "nbjit", *args], env=env, capture_output=True, text=True,
                              timeout=300, cwd=project)
    r = cli("compile", "k.cu", "--arch", "sm_90", "--lineinfo", "-o", "k.cubin")
    assert r.returncode == 0, r.stderr
    files = {f for f, _ in line_files((project / "k.cubin").read_bytes(), tmp_path)}
    assert all(os.path.isfile(f) for f in files) and any(f.startswith(str(tmp_path / "cache")) for f in files)
    r = cli("inspect", "k.cubin", "--sass", "--source")
    assert r.returncode == 0, r.stderr
    shown = re.findall(r"^\s*// (\S+):(\d+)  (.*)$", r.stdout, re.M)
    assert ("if (i < n) y[i] = twice(y[i]);" in [t for _, _, t in shown]
            and "return v * 2.0f;" in [t for _, _, t in shown]), r.stdout[:2000]
    assert all("//" not in f for f, _, _ in shown)  # (the placeholder's run of slashes shown as one)
    r = cli("inspect", "k.cubin", "--source")
    assert r.returncode == 2 and "--source interleaves the SASS with source lines: give it with --sass" in r.stderr


def test_a_bundle_carries_the_source_to_a_process_that_never_had_it(project, tmp_path):
    """A bundle built with -lineinfo keeps the source as a member of its own (listed with its
    SHA-256); a fresh process with an empty cache loads it and resolves every line; a source
    member altered is refused."""
    import zipfile
    bundle = tmp_path / "k.nbjit"
    nbjit.build_bundle({"k": project / "k.cu"}, bundle, archs="sm_90", options=["-lineinfo"],
                       cache=nbjit.Cache(tmp_path / "build-cache"))
    rec, hrec = nbjit.inspect_bundle(bundle).image("k").sources
    assert rec["program"] == program_name(KERNEL, "k.cu")
    assert rec["member"] == f"k/source/{rec['sha256'][:16]}/k.cu"
    assert hrec["kind"] == "header" and hrec["program"].endswith("/twice.h")
    assert hrec["member"] == f"headers/{hrec['sha256'][:16]}/twice.h"
    code = f"""
import sys
import nbjit
from nbjit.cache.sources import relocated
img = nbjit.load_bundle({str(bundle)!r}, lazy=True).image
cubin = img.entries[0]
open(sys.argv[1], "wb").write(relocated(img.data[cubin[2]:cubin[2] + cubin[3]], img.sources))
"""
    out, cache = tmp_path / "loaded.cubin", tmp_path / "user-cache"
    r = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "NBJIT_CACHE_DIR": str(cache), "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr[-3000:]
    records = line_files(out.read_bytes(), tmp_path)
    mine = {os.path.basename(f): open(f).read() for f, _ in records if f.startswith(str(cache))}
    assert mine == {"k.cu": KERNEL, "twice.h": HEADER}
    altered = tmp_path / "altered.nbjit"
    with zipfile.ZipFile(bundle) as src, zipfile.ZipFile(altered, "w") as dst:
        for n in src.namelist():
            dst.writestr(n, src.read(n).replace(b"twice(y[i])", b"twice(y[0])") if n == rec["member"]
                         else src.read(n))
    with pytest.raises(nbjit.BundleError, match=rf"member '{rec['member']}' does not match its SHA-256"):
        nbjit.load_bundle(altered, lazy=True)


def test_nothing_is_written_but_a_placeholder_nbjit_makes_for_that_text(tmp_path):
    """A crafted cache entry or bundle manifest cannot name a file outside the sources
    directory, nor put other text under a digest: such entries are left unwritten."""
    root, outside = tmp_path / "root", tmp_path / "outside.txt"
    outside.write_text("mine")
    good = program_name("text", "x.cu")
    prefix = good[:PREFIX_BYTES]
    data = b"..." + prefix.encode() + b"..."
    crafted = {prefix + "/../outside.txt": "clobbered", prefix + "/" + good.split("/")[-2] + "/../../outside.txt": "x",
               prefix + "/0123456789abcdef/x.cu": "text whose digest is another", good: "text"}
    relocated(data, crafted, str(root))
    assert outside.read_text() == "mine"
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == [good[PREFIX_BYTES:].lstrip("/")]


def test_a_kept_source_takes_the_mode_a_new_file_gets(tmp_path):
    old = os.umask(0o002)
    try:
        relocated(program_name("t", "t.cu").encode(), {program_name("t", "t.cu"): "t"}, str(tmp_path))
    finally:
        os.umask(old)
    f, = [p for p in tmp_path.rglob("t.cu")]
    assert f.stat().st_mode & 0o777 == 0o664


def test_quoted_includes_beside_a_named_text_source_are_found_with_line_information(tmp_path):
    (tmp_path / "twice.h").write_text(HEADER)
    for options in ([], ["-lineinfo"]):
        img = nbjit.compile_image(KERNEL, name=str(tmp_path / "k.cu"), arch="sm_90", options=options,
                                  cache=nbjit.Cache(tmp_path / "cache"))
        assert img.kind == "cubin"


def test_sass_with_source_reads_no_special_file(tmp_path):
    from nbjit.toolchain.sass import with_source
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    text = f'\t//## File "{fifo}", line 1\n\t//## File "/dev/zero", line 1\n'
    assert with_source(text).count("(not found)") == 2


INCLUDING = """#include <ops/scale.h>
extern "C" __global__ void k(float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = scale(y[i]);
}
"""
SCALE = """#pragma once
#include "detail/factor.h"
__device__ float scale(float v) {
    return factor(v) * v;
}
"""
FACTOR = """#pragma once
__device__ float factor(float v) {
    return v > 1.0f ? sqrtf(v) : 3.0f;
}
"""


def test_headers_in_include_directories_resolve_in_a_fresh_process_on_another_tree(tmp_path):
    """Headers found through -I, one including another beside it in a subdirectory: the image
    names none of the compiling machine's paths; a fresh process whose cache is a copy of the
    entry (the project gone) writes each header under its directory's digest, and every line
    record names a file that exists, with the source's and headers' text."""
    import shutil
    inc = tmp_path / "project" / "include"
    (inc / "ops" / "detail").mkdir(parents=True)
    (inc / "ops" / "scale.h").write_text(SCALE)
    (inc / "ops" / "detail" / "factor.h").write_text(FACTOR)
    img = nbjit.compile_image(INCLUDING, name="k.cu", arch="sm_90", options=["-lineinfo"], include_paths=[str(inc)],
                              cache=nbjit.Cache(tmp_path / "made"))
    assert str(tmp_path).encode() not in img.data
    kept = {p[PREFIX_BYTES:].lstrip("/").split("/", 1)[1]: t for p, t in img.sources.items()}
    assert kept == {"k.cu": INCLUDING, "ops/scale.h": SCALE, "ops/detail/factor.h": FACTOR}
    root = tmp_path / "elsewhere" / "sources"
    shutil.rmtree(tmp_path / "project")
    records = line_files(relocated(img.data, img.sources, str(root)), tmp_path)

    def kept(f: str) -> str:  # (a file's name below its digest's directory)
        return os.path.relpath(os.path.normpath(f), root).split("/", 1)[1]
    texts = {kept(f): open(f).read().splitlines() for f, _ in records}
    assert set(texts) == {"k.cu", "ops/scale.h", "ops/detail/factor.h"}, texts
    said = {(kept(f), texts[kept(f)][line - 1].strip()) for f, line in records}
    assert ("ops/detail/factor.h", "return v > 1.0f ? sqrtf(v) : 3.0f;") in said
    assert ("k.cu", "if (i < n) y[i] = scale(y[i]);") in said


def test_a_header_altered_under_its_directory_digest_writes_nothing_of_that_directory(tmp_path):
    """A crafted entry that keeps other text under a header directory's digest: none of that
    directory's headers is written (the digest is of all of them), the source still is."""
    inc = tmp_path / "include"
    (inc / "ops" / "detail").mkdir(parents=True)
    (inc / "ops" / "scale.h").write_text(SCALE)
    (inc / "ops" / "detail" / "factor.h").write_text(FACTOR)
    img = nbjit.compile_image(INCLUDING, name="k.cu", arch="sm_90", options=["-lineinfo"], include_paths=[str(inc)],
                              cache=nbjit.Cache(tmp_path / "made"))
    crafted = {p: (t.replace("3.0f", "4.0f") if p.endswith("factor.h") else t) for p, t in img.sources.items()}
    root = tmp_path / "root"
    relocated(img.data, crafted, str(root))
    assert sorted(p.name for p in root.rglob("*") if p.is_file()) == ["k.cu"]
    relocated(img.data, img.sources, str(root))
    assert sorted(p.name for p in root.rglob("*") if p.is_file()) == ["factor.h", "k.cu", "scale.h"]


def test_diagnostics_in_a_header_name_its_directory_as_given(tmp_path):
    inc = tmp_path / "include"
    (inc / "ops" / "detail").mkdir(parents=True)
    (inc / "ops" / "scale.h").write_text(SCALE.replace("factor(v)", "undeclared(v)"))
    (inc / "ops" / "detail" / "factor.h").write_text(FACTOR)
    with pytest.raises(nbjit.CompileFailure) as e:
        nbjit.compile_image(INCLUDING, name="k.cu", arch="sm_90", options=["-lineinfo"], include_paths=[str(inc)],
                            cache=nbjit.Cache(tmp_path / "cache"))
    assert f"{inc}/ops/scale.h(4)" in e.value.log and "//" not in e.value.log.split("scale.h")[0][-200:]


def test_an_include_directory_too_long_to_pad_keeps_its_path(tmp_path):
    from nbjit.cache.sources import HEADER_DIR_BYTES
    inc = tmp_path / ("d" * max(1, HEADER_DIR_BYTES - len(str(tmp_path)))) / "include"
    (inc / "ops" / "detail").mkdir(parents=True)
    (inc / "ops" / "scale.h").write_text(SCALE)
    (inc / "ops" / "detail" / "factor.h").write_text(FACTOR)
    img = nbjit.compile_image(INCLUDING, name="k.cu", arch="sm_90", options=["-lineinfo"], include_paths=[str(inc)],
                              cache=nbjit.Cache(tmp_path / "cache"))
    assert [p.rsplit("/", 1)[1] for p in img.sources] == ["k.cu"]
    assert str(inc / "ops" / "scale.h") in {os.path.normpath(f) for f, _ in line_files(img.data, tmp_path)}


def linked(tmp_path, inc, include: str, call: str, other_head: str, other_body: str):
    """main.cu (``#include`` ``include``, calling ``call``) linked with -lineinfo to other.cu
    (``other_head``, then ``other(v)`` returning ``other_body``), both reading -I ``inc``."""
    other = tmp_path / "other.cu"
    other.write_text(f'{other_head}extern "C" __device__ float other(float v) {{\n    return {other_body};\n}}\n')
    main = (f'#include {include}\nextern "C" __device__ float other(float);\n'
            f'extern "C" __global__ void k(float *y) {{\n    y[0] = other({call}(y[0]));\n}}\n')
    return nbjit.link_image(main, [str(other)], name="main.cu", options=["-lineinfo"], include_paths=[str(inc)],
                            arch="sm_90", cache=nbjit.Cache(tmp_path / "cache"))


def test_a_kernel_linked_from_lto_ir_keeps_its_sources_and_headers(tmp_path):
    """nbjit.link_image with line information: the linked cubin names the placeholders of the
    main source, of a second source and of the headers (replaced after the link: LTO-IR's
    strings are not plain bytes), and keeps their texts; relocated, every line resolves."""
    inc = tmp_path / "include"
    (inc / "ops" / "detail").mkdir(parents=True)
    (inc / "ops" / "scale.h").write_text(SCALE)
    (inc / "ops" / "detail" / "factor.h").write_text(FACTOR)
    img = linked(tmp_path, inc, "<ops/scale.h>", "scale", "", "v + 1.0f")
    assert str(tmp_path).encode() not in img.data
    assert sorted(p.rsplit("/", 1)[1] for p in img.sources) == ["factor.h", "main.cu", "other.cu", "scale.h"]
    root = tmp_path / "sources"
    records = line_files(relocated(img.data, img.sources, str(root)), tmp_path)
    assert {os.path.basename(f) for f, _ in records} >= {"main.cu", "other.cu", "factor.h"}
    for f, line in records:
        assert os.path.isfile(f) and 1 <= line <= len(open(f).read().splitlines()), (f, line)


def test_headers_past_the_kept_limit_keep_their_paths(tmp_path, monkeypatch):
    """One compile keeps at most MAX_KEPT_BYTES of headers: a directory that would pass it is
    not padded, and its headers are named where NVRTC read them."""
    from nbjit.cache import sources
    small, big = tmp_path / "small", tmp_path / "big"
    (small / "ops" / "detail").mkdir(parents=True)
    (small / "ops" / "scale.h").write_text(SCALE.replace('#include "detail/factor.h"', "#include <big.h>"))
    big.mkdir()
    (big / "big.h").write_text(FACTOR + "// " + "x" * 400 + "\n")
    monkeypatch.setattr(sources, "MAX_KEPT_BYTES", len(SCALE) + 100)
    img = nbjit.compile_image(INCLUDING, name="k.cu", arch="sm_90", options=["-lineinfo"],
                              include_paths=[str(small), str(big)], cache=nbjit.Cache(tmp_path / "cache"))
    assert sorted(p.rsplit("/", 1)[1] for p in img.sources) == ["k.cu", "scale.h"]
    assert str(big / "big.h") in {os.path.normpath(f) for f, _ in line_files(img.data, tmp_path)}


def test_a_header_is_kept_once_under_the_directory_nvrtc_finds_it_through(tmp_path):
    """Include directories inside one another (the project's, then its include/): each header
    is kept under the one it is found through, and the line table names it there."""
    inc = tmp_path / "include"
    (inc / "ops" / "detail").mkdir(parents=True)
    (inc / "ops" / "scale.h").write_text(SCALE)
    (inc / "ops" / "detail" / "factor.h").write_text(FACTOR)
    img = nbjit.compile_image(INCLUDING, name="k.cu", arch="sm_90", options=["-lineinfo"],
                              include_paths=[str(tmp_path), str(inc)], cache=nbjit.Cache(tmp_path / "cache"))
    kept = sorted(p[PREFIX_BYTES:].lstrip("/").split("/", 1)[1] for p in img.sources)
    assert kept == ["k.cu", "ops/detail/factor.h", "ops/scale.h"]
    headers = {p for p in img.sources if p.endswith(".h")}
    assert {f for f, _ in line_files(img.data, tmp_path) if f.endswith(".h")} <= headers


def resolves(img, tmp_path) -> set[str]:
    """The files the image's line records name once relocated to ``tmp_path/sources``, each
    checked to exist and to hold the line."""
    records = line_files(relocated(img.data, img.sources, str(tmp_path / "sources")), tmp_path)
    for f, line in records:
        assert os.path.isfile(f) and 1 <= line <= len(open(f).read().splitlines()), (f, line)
    return {os.path.basename(f) for f, _ in records}


NOINLINE = '#pragma once\n{more}static __noinline__ __device__ float {name}(float v) {{\n    return {body};\n}}\n'


def test_two_linked_sources_that_read_one_include_directory_name_one_placeholder_for_it(tmp_path):
    """main.cu reads a.h and other.cu reads b.h, both through -I inc: the linked cubin names
    that directory once, so its placeholder keeps both headers."""
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "a.h").write_text(NOINLINE.format(more="", name="fa", body="v * 2.0f"))
    (inc / "b.h").write_text(NOINLINE.format(more="", name="fb", body="v * 7.0f"))
    img = linked(tmp_path, inc, "<a.h>", "fa", "#include <b.h>\n", "fb(v) + 1.0f")
    dirs = {p.rsplit("/", 2)[1] for p in img.sources if p.endswith(".h")}
    assert len(dirs) == 1 and str(tmp_path).encode() not in img.data
    assert resolves(img, tmp_path) >= {"a.h", "b.h", "main.cu", "other.cu"}


def test_a_header_reached_through_two_directories_is_kept_under_each(tmp_path):
    """-I p -I p/include; the source reads include/y.h through p, and x.h through p/include;
    y.h reads "x.h" beside it (through p): NVRTC names x.h the first way it meets it."""
    p, inc = tmp_path / "p", tmp_path / "p" / "include"
    inc.mkdir(parents=True)
    (inc / "y.h").write_text(NOINLINE.format(more='#include "x.h"\n', name="fy", body="fx(v) * 2.0f"))
    (inc / "x.h").write_text(NOINLINE.format(more="", name="fx", body="v * 7.0f"))
    src = ('#include <include/y.h>\n#include <x.h>\n'
           'extern "C" __global__ void k(float *y) {\n    y[0] = fy(y[0]) + fx(y[1]);\n}\n')
    img = nbjit.compile_image(src, name="k.cu", arch="sm_90", options=["-lineinfo"], include_paths=[str(p), str(inc)],
                              cache=nbjit.Cache(tmp_path / "cache"))
    assert sorted(q[PREFIX_BYTES:].lstrip("/").split("/", 1)[1] for q in img.sources) == \
        ["include/x.h", "include/y.h", "k.cu", "x.h"]
    assert resolves(img, tmp_path) >= {"x.h", "y.h", "k.cu"}


@pytest.mark.parametrize("source, why", [
    ('#define H <m.h>\n#include H\n', "a header named by a macro"),
    ('#include <sub/../m.h>\n', "a header named with .."),
])
def test_a_directory_nbjit_cannot_follow_keeps_its_paths(tmp_path, source, why):
    inc = tmp_path / "inc"
    (inc / "sub").mkdir(parents=True)
    (inc / "m.h").write_text(NOINLINE.format(more="", name="fm", body="v * 3.0f"))
    src = source + 'extern "C" __global__ void k(float *y) {\n    y[0] = fm(y[0]);\n}\n'
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the macro's: that source is never cached)
        img = nbjit.compile_image(src, name="k.cu", arch="sm_90", options=["-lineinfo"], include_paths=[str(inc)],
                                  cache=nbjit.Cache(tmp_path / "cache"))
    assert [p.rsplit("/", 1)[1] for p in img.sources] == ["k.cu"], why
    names = {os.path.normpath(f) for f, _ in line_files(img.data, tmp_path)}
    assert str(inc / "m.h") in names and resolves(img, tmp_path) >= {"m.h", "k.cu"}, why


def test_a_crafted_name_that_is_no_file_name_writes_nothing(tmp_path):
    good = program_name("text", "x.cu")
    crafted = {good[:PREFIX_BYTES] + "/0123456789abcdef/\ud800.h": "x", good: "text"}
    relocated(good.encode(), crafted, str(tmp_path))
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["x.cu"]


def test_images_that_read_one_header_share_its_member_and_too_many_are_left_out(project, tmp_path, monkeypatch):
    """Two images compiled from sources that read twice.h: one member holds it. Where the
    headers would take the bundle past MAX_MEMBERS, they are left out with a warning, and the
    bundle still loads."""
    import zipfile
    from nbjit.bundles import build
    (project / "k2.cu").write_text(KERNEL.replace("void k(", "void k2("))
    inputs = {"k": project / "k.cu", "k2": project / "k2.cu"}
    how = dict(archs="sm_90", options=["-lineinfo"], cache=nbjit.Cache(tmp_path / "cache"))
    nbjit.build_bundle(inputs, tmp_path / "two.nbjit", **how)
    names = zipfile.ZipFile(tmp_path / "two.nbjit").namelist()
    assert sum(n.startswith("headers/") for n in names) == 1 and sum("/source/" in n for n in names) == 2
    monkeypatch.setattr(build, "MAX_MEMBERS", 5)  # (the manifest, two cubins, two sources)
    with pytest.warns(nbjit.NbjitWarning, match="more than 5 members with the 1 headers"):
        nbjit.build_bundle(inputs, tmp_path / "few.nbjit", **how)
    assert not any(n.startswith("headers/") for n in zipfile.ZipFile(tmp_path / "few.nbjit").namelist())
    assert nbjit.load_bundle(tmp_path / "few.nbjit", name="k2", lazy=True) is not None
