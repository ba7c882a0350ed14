"""NVRTC precompiled headers (nbjit/pch.py and its use in compiler.py): which compiles get
one, that a later compile of the same headers uses it, that the output and the cache key do
not depend on it, and that the cache reclaims the PCH files of processes that are gone.
Compiles run the real NVRTC (no GPU needed)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nbjit.toolchain import nvrtc as C
from nbjit.toolchain import pch as P
from nbjit.cache.store import Cache
from nbjit.errors import NbjitCompileError

ROOT = Path(__file__).resolve().parent.parent
SRC = '''#include <cuda/std/cstdint>
// the kernels come after the headers: the headers are what NVRTC precompiles
template <typename T> __global__ void fill(T* x, T v) { x[threadIdx.x] = v + (T)sizeof(cuda::std::int64_t); }
'''


def _nvrtc_has_pch() -> bool:
    try:
        return C._pch_supported(C.nvrtc_version())
    except NbjitCompileError:
        return False


def _cccl() -> bool:
    from nbjit.toolchain.identity import cccl_include_dir
    return cccl_include_dir() is not None


# (the sources here include <cuda/std/...>: CCCL's headers, which the cu13 extra brings and cu12's not)
needs_pch = pytest.mark.skipif(not (_nvrtc_has_pch() and _cccl()),
                               reason="NVRTC 12.8+ (precompiled headers) and CCCL's headers not both installed")


@pytest.fixture
def store():
    """The process's PCH store, emptied before and after (its counters as they were)."""
    P.STORE.forget_all()
    P.STORE.seen.clear()
    before = dict(P.STORE.stats)
    yield P.STORE
    P.STORE.forget_all()
    P.STORE.seen.clear()
    P.STORE.stats.update(before)


def _fill(cache, t, **kw):
    kw.setdefault("pch", True)  # (the tests of "auto" say so)
    return C.compile_image(SRC, name="fill.cu", name_expressions=[f"fill<{t}>"], arch="sm_90", cache=cache, **kw)


def _same_code(a: bytes, b: bytes, name: str = "fill_cu") -> bool:
    """Equal but for the id NVRTC writes into internal-linkage names on every compile
    (``_INTERNAL_00000000_7_fill_cu_<8 hex>_<n>``), which differs between any two compiles."""
    def norm(x):
        return re.sub(rb"(_\d+_" + name.encode() + rb"_)[0-9a-f]{8}(?=_\d)", rb"\g<1>00000000", x)
    return norm(a) == norm(b)


# ------------------------------------------------------------------ pure parts


def test_header_prefix_is_the_leading_directives():
    src = ("// licence\n/* block\n   comment */\n#include <cub/cub.cuh>\n#define W \\\n  4\n\n"
           "#include \"mine.h\"\ntemplate <int N> __global__ void k() {}\n#include <late.h>\n")
    assert P.header_prefix(src) == src[:src.index("template")]
    assert P.includes(P.header_prefix(src)) == ["cub/cub.cuh", "mine.h"]  # not the one after code
    assert P.header_prefix("__global__ void k() {}\n#include <cub/cub.cuh>\n") == ""
    assert P.header_prefix("#include <a.h>\n/* c */ int x;\n") == "#include <a.h>\n"  # code after a comment
    assert P.header_prefix("#include <a.h>\n/* open\n still */ int x;\n") == "#include <a.h>\n"


def test_which_sources_get_a_pch():
    assert P.worth_it("auto", "#include <cub/block/block_reduce.cuh>\n", 0)
    assert P.worth_it("auto", "#include <thrust/sort.h>\n", 0)
    assert P.worth_it("auto", "#include <cuda/std/cstdint>\n", 0)
    assert not P.worth_it("auto", '#include "small.h"\n', 1000)
    assert P.worth_it("auto", '#include "big.h"\n', P.HEAVY_USER_BYTES)  # a large include walk
    assert P.worth_it("on", '#include "small.h"\n', 10)
    assert not P.worth_it("on", "", 0)  # no header: nothing to precompile
    assert not P.worth_it("off", "#include <cub/cub.cuh>\n", 0)
    assert P.user_pch_option(["-std=c++17", "-pch"]) and P.user_pch_option(["--use-pch=x.pch"])
    assert not P.user_pch_option(["-std=c++17", "-DPCH=1"])


def test_back_end_options_are_not_in_the_pch_key():
    opts = ["-DW=4", "-maxrregcount=64", "-Xptxas", "-v", "--ptxas-options=-O2", "--extra-device-vectorization",
            "-split-compile=2", "--time=t.csv", "-lineinfo", "--maxrregcount", "32", "-Xptxas=-O1", "-time-passes"]
    assert P.pch_options(opts) == ["-DW=4", "-lineinfo", "-time-passes"]
    assert P.pch_options(["-std=c++20", "--use_fast_math", "-G"]) == ["-std=c++20", "--use_fast_math", "-G"]


def test_pch_setting(monkeypatch):
    monkeypatch.delenv(P.PCH_ENV, raising=False)
    assert P.pch_mode(None) == "auto" and P.pch_mode(True) == "on" and P.pch_mode(False) == "off"
    for raw, mode in (("0", "off"), ("off", "off"), ("1", "on"), ("auto", "auto"), ("", "auto")):
        monkeypatch.setenv(P.PCH_ENV, raw)
        assert P.pch_mode(None) == mode
    assert P.pch_mode(False) == "off"  # the argument wins over the environment
    monkeypatch.setenv(P.PCH_ENV, "sometimes")
    with pytest.raises(NbjitCompileError, match="NBJIT_PCH='sometimes'.*0 \\(off\\), 1 \\(on\\) or auto"):
        P.pch_mode(None)
    with pytest.raises(NbjitCompileError, match="pch must be True, False, 'auto' or None"):
        P.pch_mode("yes please")


def test_a_bad_pch_is_refused_on_a_repeated_call_too(tmp_path, monkeypatch):
    """pch=3 is refused also where the call's memo already holds what the same call made
    without it (the memo answered first, and pch=3 went through)."""
    import nbjit
    from nbjit.gpu.host import current_host
    monkeypatch.setattr(current_host(), "current_context", lambda: (_ for _ in ()).throw(AssertionError("no GPU")))
    src = 'extern "C" __global__ void k(float* y) { y[threadIdx.x] = 1.0f; }\n'
    cache = Cache(tmp_path)
    C.compile_image(src, arch="sm_90", cache=cache)
    nbjit.compile(src, arch="sm_90", cache=cache, lazy=True)
    for bad in (3, "yes", 0.0):
        with pytest.raises(NbjitCompileError, match=f"pch must be True, False, 'auto' or None .*not {bad!r}"):
            C.compile_image(src, arch="sm_90", cache=cache, pch=bad)
        with pytest.raises(NbjitCompileError, match="pch must be True, False, 'auto' or None"):
            nbjit.compile(src, arch="sm_90", cache=cache, lazy=True, pch=bad)
    assert C.compile_image(src, arch="sm_90", cache=cache, pch="auto").kind == "cubin"


def test_nvrtc_pch_lines_leave_the_log():
    """NVRTC 13.5's own lines (as it writes them) are nbjit's business; the user's warnings stay."""
    made = '"heavy.cu": creating precompiled header file "/c/pch/1-0-ab.pch"\n'
    log, said = P.clean_log(made)
    assert log == "" and said["created"] == "/c/pch/1-0-ab.pch"
    other_heap = ('Warning #20282-D: incompatible precompiled header (PCH) heap allocation address from PCH file '
                  '"/c/x.pch".  This usually occurs if the PCH file was not created by the same dynamic instance '
                  'of the NVRTC library\n\nRemark: The warnings can be suppressed with "-diag-suppress '
                  '<warning-number>"\n\n')
    log, said = P.clean_log(other_heap)
    assert log == "" and said["refused"] == [20282]
    user = ('fill.cu(3): warning #177-D: variable "unused" was declared but never referenced\n    int unused;\n'
            '        ^\n\nRemark: The warnings can be suppressed with "-diag-suppress <warning-number>"\n\n')
    log, said = P.clean_log('"fill.cu": using precompiled header file "/c/p.pch"\n' + user)
    assert log == user.strip() and said["used"] == "/c/p.pch"


# ------------------------------------------------------------------ with NVRTC


@needs_pch
def test_a_later_compile_uses_the_pch_and_gives_the_same_output(tmp_path, store, monkeypatch):
    monkeypatch.delenv(P.PCH_ENV, raising=False)
    cache = Cache(tmp_path / "c")
    first = _fill(cache, "int", pch=None)  # "auto" (cuda/std is a heavy header): once, no PCH yet
    assert store.stats["created"] == 0 and not store.files
    second = _fill(cache, "short", pch=None)  # the same headers again: "auto" makes the PCH now
    assert store.stats["created"] == 1 and len(store.files) == 1 and second.log == ""
    made = next(iter(store.files.values()))
    assert Path(made).parent == tmp_path / "c" / "pch" and Path(made).name.startswith(f"{os.getpid()}-")
    assert cache.info()["pch_files"] == 1 and cache.info()["pch_bytes"] == os.path.getsize(made)
    used = store.stats["used"]
    with_pch = _fill(cache, "float", pch=None)
    assert store.stats["used"] == used + 1
    without = _fill(Cache(None), "float", pch=False)
    assert store.stats["used"] == used + 1  # pch=False: not used
    assert _same_code(with_pch.data, without.data) and with_pch.log == without.log
    assert first.log == "" and "precompiled" not in with_pch.log


@needs_pch
def test_the_cache_key_does_not_depend_on_the_pch(tmp_path, store, monkeypatch):
    cache = Cache(tmp_path / "c")
    calls = []
    real = C._run_nvrtc
    monkeypatch.setattr(C, "_run_nvrtc", lambda req: calls.append(req.pch) or real(req))
    a = _fill(cache, "int", pch=True)
    b = C.compile_image(SRC + " ", name="fill.cu", name_expressions=["fill<int>"], arch="sm_90",
                        cache=Cache(tmp_path / "c"), pch=False)  # another source: compiled
    c = C.compile_image(SRC, name="fill.cu", name_expressions=["fill<int>"], arch="sm_90",
                        cache=Cache(tmp_path / "c"), pch=False)  # the first one's entry
    assert calls == ["on", "off"]  # the third is the first one's entry: the key has no PCH in it
    assert c.data == a.data and b.data


@needs_pch
def test_off_makes_none_and_a_users_own_pch_option_is_left_alone(tmp_path, store):
    cache = Cache(tmp_path / "c")
    _fill(cache, "int", pch=False)
    C.compile_image(SRC, name="fill.cu", name_expressions=["fill<char>"], arch="sm_90", cache=cache,
                    options=[f"--create-pch={tmp_path / 'mine.pch'}"], pch=True)
    assert store.stats["created"] == 0 and not store.files
    assert (tmp_path / "mine.pch").is_file()  # NVRTC did what the user asked
    assert not (tmp_path / "c" / "pch").exists() or not os.listdir(tmp_path / "c" / "pch")


@needs_pch
def test_another_set_of_headers_or_options_gets_its_own_pch(tmp_path, store):
    cache = Cache(tmp_path / "c")
    _fill(cache, "int")
    _fill(cache, "float", options=["-DWIDTH=4"])  # another option: another PCH
    assert store.stats["created"] == 2 and len(store.files) == 2
    _fill(cache, "double", options=["-DWIDTH=4"])
    assert store.stats["created"] == 2


@needs_pch
@pytest.mark.parametrize("first, later", [
    ([], ["-maxrregcount=32"]),
    (["-maxrregcount=32"], []),
    (["-maxrregcount=64"], ["-maxrregcount=32", "-Xptxas", "-O1", "--extra-device-vectorization", "-split-compile=2"]),
    ([], ["--ptxas-options=-O2"]),
])
def test_a_new_back_end_option_uses_the_same_pch(tmp_path, store, first, later):
    """NVRTC takes a PCH made with other back-end options (it does not compare them), and the
    cubin is the one the same options make without a PCH: the key leaves them out, and a new
    register limit is a warm compile (were NVRTC to refuse, "refused" would count it)."""
    cache = Cache(tmp_path / "c")
    _fill(cache, "int", options=first)
    assert store.stats["created"] == 1
    used, refused = store.stats["used"], store.stats["refused"]
    img = _fill(cache, "float", options=later)
    assert store.stats["used"] == used + 1 and store.stats["refused"] == refused and store.stats["created"] == 1
    without = _fill(Cache(None), "float", options=later, pch=False)
    assert _same_code(img.data, without.data) and img.log == without.log


@needs_pch
def test_a_front_end_option_still_gets_its_own_pch(tmp_path, store):
    """-lineinfo, --use_fast_math: NVRTC compares them (warning #629), so they stay in the key."""
    cache = Cache(tmp_path / "c")
    _fill(cache, "int", options=["-maxrregcount=64"])
    _fill(cache, "float", options=["-maxrregcount=64", "-lineinfo"])
    _fill(cache, "short", options=["--use_fast_math"])
    assert store.stats["created"] == 3 and store.stats["refused"] == 0


@needs_pch
def test_a_resized_heap_voids_every_pch_and_the_next_compile_makes_it_again(tmp_path, store):
    cache = Cache(tmp_path / "c")
    _fill(cache, "int")
    old = next(iter(store.files.values()))
    store.resized()  # what nbjit does after NVRTC's heap grows (a PCH is an image of the heap)
    assert not store.files and not os.path.exists(old)
    _fill(cache, "float")
    new = next(iter(store.files.values()))
    assert new != old and store.stats["created"] == 2


@needs_pch
def test_a_pch_removed_under_us_is_made_again(tmp_path, store):
    cache = Cache(tmp_path / "c")
    _fill(cache, "int")
    os.unlink(next(iter(store.files.values())))  # e.g. someone removed the cache directory's files
    img = _fill(cache, "float")
    assert store.stats["created"] == 2 and img.log == ""


@needs_pch
def test_the_pch_goes_when_its_process_exits(tmp_path):
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\nfrom nbjit.toolchain.nvrtc import compile_image\n"
            f"from nbjit.cache.store import Cache\nfrom nbjit.toolchain import pch\n"
            f"compile_image({SRC!r}, name_expressions=['fill<int>'], arch='sm_90', cache=Cache({str(tmp_path)!r}))\n"
            "print(len(pch.STORE.files))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "NBJIT_PCH": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"  # it had one
    assert os.listdir(tmp_path / "pch") == []


def test_prune_and_clear_reclaim_the_pch_of_a_process_that_is_gone(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    d = tmp_path / "pch"
    d.mkdir()
    (d / f"{gone}-0-{'a' * 32}.pch").write_bytes(b"x" * 100)
    mine = d / f"{os.getpid()}-0-{'b' * 32}.pch"
    mine.write_bytes(b"y" * 50)
    cache = Cache(tmp_path)
    assert cache.info()["pch_files"] == 2 and cache.info()["pch_bytes"] == 150
    assert cache.info()["bytes"] == 0  # not entries: the size limit counts entries
    cache.prune()
    assert sorted(p.name for p in d.iterdir()) == [mine.name]  # a live process's stays (it uses it)
    (d / f"{gone}-1-{'c' * 32}.pch").write_bytes(b"z")
    cache.clear()
    assert sorted(p.name for p in d.iterdir()) == [mine.name]
