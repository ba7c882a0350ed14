"""nbjit.toolchain.link: a CUDA C++ source linked with Python device functions (Numba, LTO-IR), LTO-IR,
C++ and relocatable device code by nvJitLink -lto, on a CPU (no GPU: arch given). Numba's
LTO-IR needs no GPU: numba.cuda.compile(..., output="ltoir", cc=(9, 0)) runs without one."""
from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest

import nbjit
from nbjit.toolchain import link as L
from nbjit.cache.store import Cache
from nbjit.read.fatbin import inspect_fatbin

from conftest import DATA  # noqa: E402

numba_cuda = pytest.importorskip("numba.cuda")
if L.nvjitlink.nvjitlink_version() is None:
    pytest.skip("no nvJitLink", allow_module_level=True)

REDUCE = (DATA / "src/block_reduce_op.cu").read_text()
DECL_F32 = '''extern "C" __device__ float op_f32(float a, float b);
struct OpF32 { __device__ float operator()(float a, float b) const { return op_f32(a, b); } };
'''
SRC = DECL_F32 + REDUCE
EXPR = "block_reduce<float, OpF32, 256>"


def op_f32(a, b):
    return a + math.sin(b) * 2


def other_op(a, b):
    return max(a, b)


@pytest.fixture
def spies(monkeypatch):
    """Counts Numba compiles and nvJitLink links (NVRTC compiles: the ``counted`` fixture)."""
    calls = {"numba": 0, "nvjitlink": 0}
    numba_compile, nvjitlink = L._numba_compile, L.nvjitlink.nvjitlink_cubin

    def count_numba(*a, **k):
        calls["numba"] += 1
        return numba_compile(*a, **k)

    def count_link(*a, **k):
        calls["nvjitlink"] += 1
        return nvjitlink(*a, **k)

    monkeypatch.setattr(L, "_numba_compile", count_numba)
    monkeypatch.setattr(L.nvjitlink, "nvjitlink_cubin", count_link)
    return calls


def test_a_python_operator_in_a_template_links_to_a_cubin_nbjit_reads():
    img = nbjit.link_image(SRC, [(op_f32, "float32(float32, float32)")], name="reduce.cu", name_expressions=[EXPR],
                           arch="sm_90")
    assert (img.kind, img.arch, img.name) == ("cubin", "sm_90", "reduce.cu")
    mangled = img.lowered_names[EXPR]
    assert mangled == "_Z12block_reduceIf5OpF32Li256EEvPKT_PS1_iS1_"
    info = nbjit.inspect_cubin(img.data)
    assert info.arch == "sm_90" and [e.name for e in info.entries] == [mangled]
    kernel = img.typed[mangled]
    assert [(p.ctype, p.size, p.offset) for p in kernel.params] == [
        ("const float*", 8, 0), ("float*", 8, 8), ("int", 4, 16), ("float", 4, 20)]
    assert kernel.shared == 256 * 4 and kernel.barriers == 1  # part[256], __syncthreads()
    # LTO inlined the operator: no call to op_f32 is left (the cubin names no such function)
    assert "op_f32" not in info.functions and b"op_f32" not in img.data


def test_lto_inlines_the_python_operator_as_cpp_would():
    """The kernel with a Python a + b linked in has the SASS of the same kernel with a + b
    written in C++ (the same instructions; no call left)."""
    import re

    from nbjit.toolchain.sass import find_nvdisasm
    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")

    def add(a, b):
        return a + b

    cpp = "struct OpF32 { __device__ float operator()(float a, float b) const { return a + b; } };\n" + REDUCE
    linked = nbjit.link_image(SRC, [(add, "float32(float32, float32)", "op_f32")], name_expressions=[EXPR],
                              arch="sm_90")
    plain = nbjit.compile_image(cpp, name_expressions=[EXPR], arch="sm_90")

    def opcodes(img):
        text = nbjit.disassemble(img.data, kernel=img.lowered_names[EXPR])
        return re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text)

    got, want = opcodes(linked), opcodes(plain)
    assert "FADD" in got and not any(o.startswith("CALL") for o in got)
    assert got == want


def test_a_bad_pch_is_refused_on_a_repeated_link_too(tmp_path):
    """pch=3 is refused where the link's memo already holds the same link (the memo answered
    before pch was read, and pch=3 went through)."""
    cache = Cache(tmp_path)
    args = dict(name_expressions=[EXPR], arch="sm_90", cache=cache)
    nbjit.link_image(SRC, [(op_f32, "float32(float32, float32)")], **args)
    with pytest.raises(nbjit.NbjitCompileError, match="pch must be True, False, 'auto' or None .*not 3"):
        nbjit.link_image(SRC, [(op_f32, "float32(float32, float32)")], pch=3, **args)


def test_same_operator_hits_and_a_new_operator_is_a_new_entry(counted, spies, tmp_path):
    cache = Cache(tmp_path)
    first = nbjit.link_image(SRC, [(op_f32, "float32(float32, float32)")], name_expressions=[EXPR], arch="sm_90",
                             cache=cache)
    assert (len(counted), spies) == (1, {"numba": 1, "nvjitlink": 1})
    # a new in-process cache over the same directory: the disk entries answer, nothing runs
    again = nbjit.link_image(SRC, [(op_f32, "float32(float32, float32)")], name_expressions=[EXPR], arch="sm_90",
                             cache=Cache(tmp_path))
    assert again.data == first.data and (len(counted), spies) == (1, {"numba": 1, "nvjitlink": 1})
    # another Python operator under the declared name: Numba and nvJitLink run, NVRTC does not
    other = nbjit.link_image(SRC, [(other_op, "float32(float32, float32)", "op_f32")], name_expressions=[EXPR],
                             arch="sm_90", cache=cache)
    assert other.data != first.data
    assert (len(counted), spies) == (1, {"numba": 2, "nvjitlink": 2})
    entries = {f.stem for f, _, _ in cache.entries()}
    assert len(entries) == 5  # the C++ LTO-IR, two Python LTO-IRs, two cubins


def test_repeated_call_is_remembered_in_process():
    args = dict(name_expressions=[EXPR], arch="sm_90")
    a = nbjit.link_image(SRC, [(op_f32, "float32(float32, float32)")], **args)
    assert nbjit.link_image(SRC, [(op_f32, "float32(float32, float32)")], **args) is a


def test_a_fresh_process_over_the_cache_runs_no_numba(tmp_path):
    """The Python function's LTO-IR is kept under its code's fingerprint: a later process
    neither compiles it nor imports numba."""
    script = tmp_path / "op.py"
    script.write_text(f'''import math, sys
import nbjit
from nbjit.toolchain import link
calls = []
real = link._numba_compile
link._numba_compile = lambda *a: calls.append(1) or real(*a)

def op_f32(a, b):
    return a + math.sin(b) * 2

img = nbjit.link_image({SRC!r}, [(op_f32, "float32(float32, float32)")], name_expressions=[{EXPR!r}], arch="sm_90")
print(len(calls), "numba" in sys.modules, img.digest)
''')
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(DATA.parent.parent), os.environ.get("PYTHONPATH")]))}
    out = [subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, check=True,
                          timeout=300).stdout.split() for _ in range(2)]
    assert out[0][:2] == ["1", "True"] and out[1][:2] == ["0", "False"] and out[0][2] == out[1][2]


def _op(src: str, **globals_):
    ns = dict(globals_)
    exec(compile(src, "<operator>", "exec"), ns)
    return ns["op"]


def test_fingerprint_follows_what_numba_reads():
    body = "def op(a, b):\n    return a * K + helper(b)\n"
    helper = numba_cuda.jit(device=True)(lambda x: x + 1)
    base = L.fingerprint(_op(body, K=2.0, helper=helper))
    assert base is not None
    assert L.fingerprint(_op(body, K=2.0, helper=helper)) == base  # the same code and values
    assert L.fingerprint(_op(body, K=3.0, helper=helper)) != base  # a global constant
    helper2 = numba_cuda.jit(device=True)(lambda x: x + 2)
    assert L.fingerprint(_op(body, K=2.0, helper=helper2)) != base  # a device function it calls
    fast = numba_cuda.jit(device=True, fastmath=True)(lambda x: x + 1)
    assert L.fingerprint(_op(body, K=2.0, helper=fast)) != base  # its options
    assert L.fingerprint(_op(body.replace("a * K", "a * K + 1"), K=2.0, helper=helper)) != base
    table = np.arange(4.0)
    arr = L.fingerprint(_op("def op(a, b):\n    return T[0] + a\n", T=table))
    assert arr is not None and arr != L.fingerprint(_op("def op(a, b):\n    return T[0] + a\n", T=table + 1))
    assert L.fingerprint(_op("def op(a, b):\n    return math.exp(a) + np.float32(b)\n", math=math, np=np))
    # what nbjit cannot see into: a plain function (an overload may stand behind it), an
    # object of a class of the user's, a module of the user's
    assert L.fingerprint(_op(body, K=2.0, helper=lambda x: x)) is None
    assert L.fingerprint(_op(body, K=object(), helper=helper)) is None
    assert L.fingerprint(_op("def op(a, b):\n    return mod.f(a)\n", mod=pickle)) is None


def test_a_dispatcher_is_linked_with_its_options(spies):
    add = numba_cuda.jit(device=True, fastmath=True)(lambda a, b: a + b)
    img = nbjit.link_image(SRC, [(add, "float32(float32, float32)", "op_f32")], name_expressions=[EXPR],
                           arch="sm_90")
    assert img.kind == "cubin" and spies["numba"] == 1


def test_calling_device_functions_needs_a_gpu_to_compile():
    """numba-cuda compiles a called @cuda.jit device function for the current device: without
    a GPU that fails, and the message says so (functions that call none compile anywhere)."""
    from conftest import gpu_available
    if gpu_available()[0]:
        pytest.skip("this machine has a GPU (test_gpu_link.py links such a function)")
    twice = numba_cuda.jit(device=True)(lambda v: 2 * v)

    def op(a, b):
        return a + twice(b)

    with pytest.raises(nbjit.NbjitCompileError, match=r"(?s)op \(Python, as op_f32\): Numba could not compile it .*"
                                                     r"CudaSupportError.*which needs a GPU and driver"):
        nbjit.link_image(SRC, [(op, "float32(float32, float32)", "op_f32")], arch="sm_90")


def test_declaration_with_other_types_is_refused_before_linking(spies):
    with pytest.raises(nbjit.NbjitCompileError) as e:
        nbjit.link_image(SRC, [(op_f32, "float64(float64, float64)")], name_expressions=[EXPR], arch="sm_90")
    msg = str(e.value)
    assert "kernel.cu:1 declares extern \"C\" __device__ float op_f32(float a, float b)" in msg
    assert "it returns float, the Python function double" in msg
    assert 'Declare it so: extern "C" __device__ double op_f32(double, double);' in msg
    assert spies["nvjitlink"] == 0
    with pytest.raises(nbjit.NbjitCompileError, match="its parameter 2 is float, the Python function's int"):
        nbjit.link_image(SRC, [(lambda a, k: a * k, "float32(float32, int32)", "op_f32")], name_expressions=[EXPR],
                         arch="sm_90")


def test_a_name_no_input_defines_is_named_with_its_declaration():
    src = 'extern "C" __device__ float my_op(float a, float b);\n' \
          'extern "C" __global__ void k(float* x) { x[0] = my_op(x[1], x[2]); }\n'
    with pytest.raises(nbjit.LinkFailure) as e:
        nbjit.link_image(src, [(op_f32, "float32(float32, float32)")], name="k.cu", arch="sm_90")
    err = e.value
    assert err.undefined == ("my_op",) and "my_op" in err.log
    assert 'k.cu:1 declares extern "C" __device__ float my_op(float a, float b)' in str(err)
    assert "the Python functions are linked as: op_f32 as 'op_f32'" in str(err)
    assert "(op_f32, 'float32(float32, float32)', 'my_op')" in str(err)
    assert err.inputs == ("k.cu", "op_f32 (Python, as op_f32)")
    assert pickle.loads(pickle.dumps(err)).undefined == ("my_op",)
    # the fix the message gives links
    assert nbjit.link_image(src, [(op_f32, "float32(float32, float32)", "my_op")], arch="sm_90").kind == "cubin"


def test_a_name_two_inputs_define_is_named_with_both():
    with pytest.raises(nbjit.LinkFailure, match=r"more than one input defines 'op_f32': op_f32 \(Python, as op_f32\), "
                                                r"link1.cu:1"):
        nbjit.link_image(SRC, [(op_f32, "float32(float32, float32)"),
                               'extern "C" __device__ float op_f32(float a, float b) { return a; }'], arch="sm_90")


def test_a_declaration_without_extern_c_is_named():
    src = '__device__ float op_f32(float a, float b);\n' \
          'extern "C" __global__ void k(float* x) { x[0] = op_f32(x[1], x[2]); }\n'
    with pytest.raises(nbjit.LinkFailure, match=r"op_f32\(float, float\)\): a C\+\+ \(mangled\) name, so its "
                                                r"declaration lacks extern \"C\""):
        nbjit.link_image(src, [(op_f32, "float32(float32, float32)")], arch="sm_90")


TRIPLE_USER = '''extern "C" __device__ float triple(float);
extern "C" __global__ void use_triple(float* x) { x[threadIdx.x] = triple(x[threadIdx.x]); }
'''
TRIPLE_CPP = 'extern "C" __device__ float triple(float x) { return 3.0f * x; }\n'


def _kernels(img) -> list[str]:
    return sorted(e.name for e in nbjit.inspect_cubin(img.data).entries)


def test_every_kind_of_input_links(tmp_path):
    """LTO-IR (bytes, an .ltoir file), CUDA C++ (text, a .cu file), a fatbin with LTO-IR, a
    host object (nvcc -dc), a relocatable cubin and PTX (NVRTC -rdc), each defining triple()."""
    rdc = inspect_fatbin((DATA / "nvcc/lto_rdc.fatbin").read_bytes()).entries[0]
    assert rdc.kind == "ltoir" and rdc.payload[:4] == b"\xed\x43\x4e\x7f"
    (tmp_path / "triple.ltoir").write_bytes(rdc.payload)
    (tmp_path / "triple.cu").write_text(TRIPLE_CPP)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nbjit.NbjitWarning)  # (no kernel in them)
        ptx = nbjit.compile_image(TRIPLE_CPP, arch="sm_90", output="ptx", options=["-rdc=true"])
        cubin = nbjit.compile_image(TRIPLE_CPP, arch="sm_90", options=["-rdc=true"])
    inputs = {"ltoir bytes": rdc.payload, "ltoir file": tmp_path / "triple.ltoir", "source": TRIPLE_CPP,
              "source file": str(tmp_path / "triple.cu"), "fatbin": DATA / "nvcc/lto_rdc.fatbin",
              "host object": DATA / "nvcc/lto_host.o", "cubin": cubin.data, "ptx": ptx.data.decode()}
    # the committed LTO-IR was made by nvcc 13.0: an older nvJitLink (CUDA 12's) refuses it, saying why
    from nbjit.toolchain.nvjitlink import nvjitlink_version
    older = nvjitlink_version() < (13, 0)
    for what, item in inputs.items():
        try:
            img = nbjit.link_image(TRIPLE_USER, [item], arch="sm_90")
        except nbjit.LinkFailure as e:
            assert older and what in ("ltoir bytes", "ltoir file", "fatbin", "host object"), (what, e)
            assert "links LTO-IR of its own CUDA version or older" in str(e), (what, e)
            continue
        assert "use_triple" in _kernels(img), what
    if not older:
        assert _kernels(nbjit.link_image(TRIPLE_USER, DATA / "nvcc/lto_host.o", arch="sm_90")) == ["k_triple",
                                                                                                    "use_triple"]


def test_inputs_nvjitlink_cannot_take_are_refused_by_name(tmp_path):
    def refused(item, match):
        with pytest.raises(nbjit.NbjitCompileError, match=match):
            nbjit.link_image(TRIPLE_USER, [item], arch="sm_90")

    refused(DATA / "nvcc/kernels_sm_90.cubin", r"kernels_sm_90.cubin: a linked \(executable\) cubin: .*-rdc=true")
    refused(b"BC\xc0\xde" + bytes(60), r"link\[0\] \(64 bytes\): LLVM bitcode")
    refused(b"\x01\x02\x03\x00" * 8, r"link\[0\] \(32 bytes\): not a link input nbjit knows \(starts with 01 02")
    refused(op_f32, r"link\[0\]: a Python function is linked with its signature: \(op_f32, 'float32")
    refused((op_f32, "float32(float32, float32)", "not a name"), r"'not a name' is not a C name")
    refused(str(tmp_path / "missing.ltoir"), r"missing.ltoir: no such file")
    refused(3.5, r"link\[0\]: float is not a link input")
    refused((op_f32, "float32(float32[:], float32)"), r"array\(float32, 1d, A\) has no C ABI")
    refused((lambda a, b: undefined_name(a), "float32(float32, float32)", "op"),  # noqa: F821
            r"<lambda> \(Python, as op\): Numba could not compile it for float32\(float32, float32\) \(compute "
            r"capability 9.0\): TypingError")
    with pytest.raises(nbjit.NbjitCompileError, match="a link makes a cubin, for a real architecture"):
        nbjit.link_image(TRIPLE_USER, [TRIPLE_CPP], arch="compute_90")
    with pytest.raises(nbjit.NbjitCompileError, match="link_options: give the architecture as arch="):
        nbjit.link_image(TRIPLE_USER, [TRIPLE_CPP], arch="sm_90", link_options=["-arch=sm_80"])
    with pytest.raises(nbjit.NbjitCompileError, match="link must be a list of inputs, not int"):
        nbjit.link_image(TRIPLE_USER, 3, arch="sm_90")


def test_a_source_nvrtc_rejects_is_a_compile_failure():
    with pytest.raises(nbjit.CompileFailure, match=r"link0.cu"):
        nbjit.link_image(TRIPLE_USER, ['extern "C" __device__ float triple(float x) { return nope; }'], arch="sm_90")


def test_link_options_reach_nvjitlink_and_the_key(tmp_path):
    cache = Cache(tmp_path)
    a = nbjit.link_image(SRC, [(op_f32, "float32(float32, float32)")], name_expressions=[EXPR], arch="sm_90",
                         cache=cache)
    b = nbjit.link_image(SRC, [(op_f32, "float32(float32, float32)")], name_expressions=[EXPR], arch="sm_90",
                         cache=cache, link_options="-maxrregcount=24")  # (sm_90's least)
    assert len({f.stem for f, _, _ in cache.entries()}) == 4  # one more cubin
    assert nbjit.inspect_cubin(b.data).entries[0].registers <= 24 and a.data != b.data
    with pytest.raises(nbjit.LinkFailure, match=r"nvJitLink refused the options -arch=sm_90 -lto -nonsense: "
                                                r"ERROR_UNRECOGNIZED_OPTION"):
        nbjit.link_image(SRC, [(op_f32, "float32(float32, float32)")], arch="sm_90", link_options=["-nonsense"])


def test_compile_with_link_makes_a_module_lazily_without_a_gpu():
    m = nbjit.compile(SRC, link=[(op_f32, "float32(float32, float32)")], name_expressions=[EXPR], arch="sm_90",
                      lazy=True)
    assert m.image.kind == "cubin" and EXPR in m.image.lowered_names
    m2 = pickle.loads(pickle.dumps(m))
    assert m2.image.data == m.image.data
    with pytest.raises(nbjit.NbjitCompileError, match="output='ptx': a link makes a cubin"):
        nbjit.compile(SRC, link=[(op_f32, "float32(float32, float32)")], arch="sm_90", output="ptx", lazy=True)


def test_a_header_in_the_working_directory_is_read_again_on_a_repeated_link(tmp_path, monkeypatch):
    """A source that includes a header from the working directory is not remembered by its
    call: the header's edit is a new link (the memo of calls holds only sources that read no
    file outside the toolchain's directories)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scale.h").write_text("#define SCALE 2.0f\n")
    src = '#include "scale.h"\n' + DECL_F32 + \
        'extern "C" __global__ void k(float* x) { x[0] = op_f32(x[0], SCALE); }\n'
    args = {"arch": "sm_90", "cache": Cache(tmp_path / "c")}
    first = nbjit.link_image(src, [(op_f32, "float32(float32, float32)")], **args)
    (tmp_path / "scale.h").write_text("#define SCALE 3.0f\n")
    again = nbjit.link_image(src, [(op_f32, "float32(float32, float32)")], **args)
    assert again is not first and again.data != first.data
