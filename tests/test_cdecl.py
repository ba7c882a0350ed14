"""C parameter types (nbjit.params.cdecl, nbjit.params.declarations): demangled names, CUDA
source declarations, Triton IR."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from nbjit.params.declarations import device_declarations, parse_ctype, source_declarations, triton_ir_signatures
from nbjit.params.cdecl import MAX_DEMANGLED, CParam, demangle, demangled_text, element_of, mangled_tree
from nbjit.read.ptx import inspect_ptx

from conftest import DATA  # noqa: E402


def texts(params):
    return [p.text for p in params]


@pytest.mark.parametrize("name,want", [
    ("_Z4fillIdEvPT_S0_m", ["double*", "double", "unsigned long"]),  # the example
    ("_ZN2ns2opIfLi4EEEvPT_PKS1_i", ["float*", "const float*", "int"]),  # namespace, template, const
    ("_Z1fPyxPKy", ["unsigned long long*", "long long", "const unsigned long long*"]),
    ("_Z1fP6__halfPK13__nv_bfloat16S_", ["__half*", "const __nv_bfloat16*", "__half"]),
    ("_Z1fPK4PairS_", ["const Pair*", "Pair"]),  # struct types by pointer and by value
    ("_Z1fPK7double2P6float4Pb", ["const double2*", "float4*", "bool*"]),
    ("_Z1fPN6thrust7complexIfEEj", ["thrust::complex<float>*", "unsigned int"]),
    ("_Z1fPaPhsth", ["signed char*", "unsigned char*", "short", "unsigned short", "unsigned char"]),
    ("_Z1fPPf", ["void**"]),  # pointers to pointers: 8-byte elements of no fixed type
    ("_Z1fv", []),
])
def test_demangled_parameter_types(name, want):
    assert texts(demangle(name)) == want


def test_plain_and_unreadable_names_say_nothing():
    assert demangle("k_basic") is None  # extern "C"
    assert demangle("_Znot_a_name") is None
    assert demangled_text("_Z4fillIdEvPT_S0_m") == "void fill<double>(double*, double, unsigned long)"


def test_every_mangled_kernel_in_the_fixtures():
    info = inspect_ptx((DATA / "nvrtc/tmpl_sm90.ptx").read_text())
    got = {e.name: texts(demangle(e.name)) for e in info.entries if e.name.startswith("_Z")}
    assert got == {"_Z4fillIfEvPT_S0_i": ["float*", "float", "int"], "_Z4fillIiEvPT_S0_i": ["int*", "int", "int"],
                   "_ZN2ns2opIfLi4EEEvPT_PKS1_i": ["float*", "const float*", "int"]}


def _without_demangler(code: str, *args: str, env: dict, stub: bool = False) -> str:
    """``code`` run in a fresh interpreter where ``itanium_demangler`` cannot be imported (or,
    ``stub``, is an empty module of that name); its standard output."""
    import subprocess
    import sys
    hide = "" if stub else "import sys; sys.modules['itanium_demangler'] = None\n"
    r = subprocess.run([sys.executable, "-c", hide + code, *args], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_missing_demangler_is_an_error_not_unknown_types(tmp_path):
    """Without itanium-demangler (a dependency) a C++ kernel's types cannot be read: using it
    says what to install, where it once left the kernel untyped (its launches unchecked, and
    those unknown types kept in the facts cache after the package came back). Look-ups by name
    still work, and say why C++ names are not shown demangled."""
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(DATA.parent.parent), os.environ.get("PYTHONPATH")]))}
    ptx = str(DATA / "nvcc/kernels_sm90.ptx")
    out = _without_demangler(
        "import sys, nbjit\n"
        "m = nbjit.load(sys.argv[1], lazy=True)\n"
        "try:\n"
        "    m['_Z9k_mangledPi'].params\n"
        "except nbjit.NbjitError as e:\n"
        "    print(type(e).__name__, e)\n"
        "print('nope' in m, '_Z9k_mangledPi' in m, len(m['k_basic'].params))\n"
        "try:\n"
        "    m['nope']\n"
        "except nbjit.KernelNotFoundError as e:\n"
        "    print(e)\n", ptx, env=env)
    lines = out.splitlines()
    assert lines[0].startswith("NbjitError the parameter types of the C++ kernel '_Z9k_mangledPi' are read with the "
                               "itanium-demangler package"), out
    assert lines[0].endswith("pip install 'itanium-demangler>=1.1,<1.2'")
    assert lines[1] == "False True 4", out  # (an extern "C" kernel needs no demangler)
    assert "(C++ names are not demangled: the itanium-demangler package" in out
    # a compile: its entry keeps no facts with unknown types, and is typed once the package is back
    src = "__global__ void scale(float* x, int n) { x[threadIdx.x] *= n; }"
    code = ("import sys, nbjit\n"
            "m = nbjit.compile(sys.argv[1], arch='sm_90')\n"
            "try:\n"
            "    print([p.ctype for p in m['_Z5scalePfi'].params])\n"
            "except nbjit.NbjitError as e:\n"
            "    print(type(e).__name__)\n")
    assert _without_demangler(code, src, env=env).split() == ["NbjitError"]
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", code, src], env=env, capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["['float*',", "'int']"], r.stderr


def test_a_demangler_without_the_readers_nbjit_uses_is_an_error(tmp_path):
    """An ``itanium_demangler`` that imports but lacks the private readers nbjit calls (another
    version) is refused by name, not read as "no types"."""
    (tmp_path / "itanium_demangler.py").write_text("")
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), str(DATA.parent.parent),
                                                       os.environ.get("PYTHONPATH")]))}
    out = _without_demangler("import sys, nbjit\n"
                             "from nbjit.params.cdecl import demangle\n"
                             "try:\n"
                             "    demangle('_Z4fillIdEvPT_S0_m')\n"
                             "except nbjit.NbjitError as e:\n"
                             "    print(e)\n", env=env, stub=True)
    assert "lacks FuncNode, Node, _Cursor, _SPECIAL_RE, _parse_name, _parse_type, which nbjit reads names with" in out
    assert out.rstrip().endswith("pip install 'itanium-demangler>=1.1,<1.2'"), out


def test_numba_mangled_names_are_not_c_signatures():
    """Numba encodes arrays as Array<...> structs; its ABI expands them into 7 parameters, so
    the demangled list never fits that layout (signature.merge leaves it out)."""
    name = next(e.name for e in inspect_ptx((DATA / "numba/axpy_plain.ptx").read_text()).entries)
    d = demangle(name)
    assert d is None or len(d) == 4


def nested_args(levels: int, first: int = 0) -> str:
    """Mangled parameter types ``A<B, B>, A<A<B, B>, A<B, B>>, ...``: each level names the
    one before twice by substitution, so the demangled text doubles per level. ``first``:
    the substitutions the name makes before ``A``."""
    def s(n):
        return "S_" if n == 0 else f"S{np.base_repr(n - 1, 36)}_"
    out = f"1AI1B{s(first + 1)}E"
    for i in range(1, levels):
        out += f"{s(first)}I{s(first + i + 1)}{s(first + i + 1)}E"
    return out


def nested_template(levels: int) -> str:
    """The same types as a function template's arguments, the parameters naming them (T_)."""
    return "_Z1fI" + nested_args(levels, 1) + "Ev" + "".join(f"T{np.base_repr(i - 1, 36) if i else ''}_"
                                                              for i in range(levels))


def test_fixture_names_read_as_the_demangler_reads_them():
    """nbjit's linear walk over the demangler's tree gives the library's own tree."""
    from itanium_demangler import parse
    names = {m.decode() for f in DATA.rglob("*") if f.is_file() for m in re.findall(rb"_Z[\w$]+", f.read_bytes())}
    names |= {"_Z4fillIdEvPT_S0_m", "_Z1fv", "_Z1f" + nested_args(6), nested_template(6),
              "_Z3sumIJifdEEvDpT_", "_ZN2ns2opIfLi4EEEvPT_PKS1_i", "_Z1kIL_Z1xEEvv", "_Z9VAL_Zerosv"}
    assert len(names) > 100
    for n in names:
        try:
            tree = parse(n)
        except NotImplementedError:  # local names
            tree = None
        assert mangled_tree(n) == tree and demangled_text(n) == (None if tree is None else str(tree)), n
    assert sum(mangled_tree(n) is not None for n in names) >= 30
    # a name nested in a name is read by the library's own (quadratic) top level: short ones only
    assert demangled_text("_Z1kIL_Z1xEEvv") == "void k<x>()"
    assert mangled_tree("_Z1kIL_Z1g" + "P" * 300 + "iEEvv") is None


def nested_function(levels: int) -> str:
    return "_Z1f" + nested_args(levels)


@pytest.mark.parametrize("make,levels", [(nested_function, 16), (nested_template, 16), (nested_function, 400)])
def test_names_standing_for_megabytes_give_no_types(make, levels):
    """The issue's 173-byte name (16 levels: 786 KB demangled, 41 s in nbjit inspect) and a
    4 KB one: no C types and no demangled text, the sizes counted without writing it out;
    5 levels read as before."""
    assert demangle(make(levels)) is None and demangled_text(make(levels)) is None
    assert len(demangled_text(make(5))) < MAX_DEMANGLED and len(demangle(make(5))) == 5


def nvrtc_name(levels: int) -> str:
    """NVRTC's name for ``k<T>`` of ``template <class T> __global__ void k(T*)`` where
    ``typedef A<B, B> T0; typedef A<T0, T0> T1; ...``, T the last of ``levels`` + 1."""
    return ("_Z1kI1AI" + "S0_I" * (levels - 1) + "1BS1_E" +
            "".join(f"S{np.base_repr(i, 36)}_E" for i in range(2, levels + 1)) + "EvPT_")


def test_nvrtc_name_of_a_template_over_16_typedef_levels_gives_no_types():
    """The name NVRTC gives k<T15> (11.4 s in compile_image before, for 1.5 MB of text)."""
    assert nvrtc_name(16) == ("_Z1kI1AIS0_IS0_IS0_IS0_IS0_IS0_IS0_IS0_IS0_IS0_IS0_IS0_IS0_IS0_IS0_I1BS1_ES2_ES3_ES4_E"
                              "S5_ES6_ES7_ES8_ES9_ESA_ESB_ESC_ESD_ESE_ESF_ESG_EEvPT_")
    assert demangle(nvrtc_name(16)) is None and demangled_text(nvrtc_name(16)) is None
    assert demangled_text(nvrtc_name(2)) == "void k<A<A<B, B>, A<B, B>>>(A<A<B, B>, A<B, B>>*)"
    assert texts(demangle(nvrtc_name(2))) == ["A<A<B, B>, A<B, B>>*"]


@pytest.mark.parametrize("make", [nested_function, nested_template])
def test_demangling_is_linear(make):
    from conftest import assert_linear
    assert_linear(mangled_tree.__wrapped__, make, 150)


# A real long name: a CUB kernel nvcc 13.0 names for thrust::reduce over a transform_iterator
# of a zip_iterator (1.0 part of the demangler's lists per character; the work allowed is 8)
CUB_NAME = ("_ZN3cub17CUB_300001_SM_9006detail6reduce18DeviceReduceKernelINS2_10policy_hubIN4cuda3std3__45tupleIJfdiE"
            "EEjN2my6deeply6nested2ns2OpEE10Policy1000EN6thrust23THRUST_300001_SM_900_NS18transform_iteratorINSD_2TrENS"
            "I_12zip_iteratorINS8_IJNSI_6detail15normal_iteratorINSI_10device_ptrIfEEEENSN_INSO_IdEEEENSN_INSO_IiEEEENSN"
            "_INSO_IlEEEENSN_INSO_IsEEEEEEEEENSI_11use_defaultES11_EEjSE_S9_NS7_10__identityEEEvT0_PT3_T1_NS0_13GridEvenS"
            "hareIS17_EET2_T4_")


def substitutions_doubling(refs: int) -> str:
    """``N1a1b`` then ``refs`` substitutions, each naming the prefix made last (skipping the
    numbers that hold an E, which would end a name nested in a name): the list doubles."""
    out, latest = [], 1
    for _ in range(refs):
        i = latest
        while "E" in np.base_repr(max(i - 1, 0), 36):
            i -= 1
        out.append(f"S{np.base_repr(i - 1, 36) if i else ''}_")
        latest += 1
    return "N1a1b" + "".join(out)


# Names whose reading took quadratic or exponential time and memory (nested namespaces: 22 KB
# took 11 s and 128 MiB; a doubling list: 71 bytes 12 s and 98 MiB, 101 bytes in a name in a
# name 5.4 s; a pack named by each parameter: 18 KB 21 s and 150 MiB), sized so that the code
# of before took a few seconds.
HOSTILE_NAMES = {
    "nested_namespaces": "_ZN" + "".join(f"{len(str(i)) + 1}n{i}" for i in range(2000)) + "1fEv",
    "doubling_substitutions": "_Z" + substitutions_doubling(17) + "1fEv",
    "doubling_in_a_name_in_a_name": "_Z1fIL_Z" + substitutions_doubling(24) + "EEvv",
    "pack_named_by_each_parameter": "_Z1fIJ" + "i" * 1000 + "EEv" + "DpOT_" * 1000,
}


@pytest.mark.parametrize("family", HOSTILE_NAMES)
def test_reading_a_name_takes_memory_linear_in_its_length(family):
    """What reading a name builds is bounded by its length (``_demangle.WORK_PER_CHAR`` parts
    of lists per character): memory measured, which the time follows (each part is made once)."""
    import tracemalloc
    name = HOSTILE_NAMES[family]
    mangled_tree.__wrapped__("_Z1fv")  # (the demangler imported before measuring)
    tracemalloc.start()
    try:
        tree = mangled_tree.__wrapped__(name)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 1024 * len(name) + (4 << 20), (len(name), peak)
    assert tree is None  # (more than a name may take, or no name at all)


def test_real_long_names_are_read_within_their_work():
    from itanium_demangler import parse
    assert mangled_tree(CUB_NAME) == parse(CUB_NAME) and demangled_text(CUB_NAME).startswith(
        "void cub::CUB_300001_SM_900::detail::reduce::DeviceReduceKernel<")
    assert texts(demangle(CUB_NAME))[1:3] == ["cuda::std::__4::tuple<float, double, int>*", "unsigned int"]
    for n in (10, 100):  # nested names of many parts, packs named many times: read as the library reads them
        for name in ("_ZN" + "".join(f"{len(str(i)) + 1}n{i}" for i in range(n)) + "1fEv",
                     "_Z1fIJ" + "i" * n + "EEv" + "DpOT_" * n, "_Z" + substitutions_doubling(n // 10) + "1fEv"):
            assert mangled_tree(name) == parse(name) is not None, name


def test_source_declarations():
    src = r'''
#include <cuda_fp16.h>
// extern "C" __global__ void in_a_comment(int x);
/* extern "C" __global__ void in_a_block(int x); */
const char* s = "extern \"C\" __global__ void in_a_string(int x)";
extern "C" __global__ void axpy(float* __restrict__ y, const float * __restrict__ x,
                                float a, /* the length */ int n) {}
extern "C" {
__global__ void __launch_bounds__(128, 2) both(unsigned n, size_t m, const int* const q, float2* v, Pair p) {}
__global__ void nothing(void) {}
}
template <typename T> __global__ void tmpl(T* out) {}
__global__ void cxx(int* p) {}
extern "C" __global__ void fnptr(int (*f)(int)) {}
#define K(name) extern "C" __global__ void name(int x) {}
'''
    got = source_declarations(src)
    assert set(got) == {"axpy", "both", "nothing"}
    assert texts(got["axpy"]) == ["float*", "const float*", "float", "int"]
    assert [p.name for p in got["axpy"]] == ["y", "x", "a", "n"]
    assert texts(got["both"]) == ["unsigned int", "unsigned long", "const int*", "float2*", "Pair"]
    assert got["nothing"] == ()


def test_source_declarations_of_the_fixture_source():
    got = source_declarations((DATA / "src/kernels.cu").read_text())
    assert texts(got["k_small"]) == ["__half", "__nv_bfloat16", "bool", "char", "short", "float*"]
    assert texts(got["k_widths"])[:8] == ["signed char", "unsigned char", "short", "unsigned short", "int",
                                          "unsigned int", "long long", "unsigned long long"]
    assert "k_tmpl" not in got and "k_mangled" not in got  # C++ kernels: typed by their mangled names


def test_character_literals_open_no_comment():
    """'/*' is a character literal (valid CUDA): the kernels after it are read (before: a
    comment to the end of the source, read again from each '/*': quadratic)."""
    src = ('extern "C" __global__ void a(int* x) { x[0] = \'/*\'; x[1] = \'"\'; }\n'
           'extern "C" __global__ void b(const char* s, int n) { }  // a \'*/\' here\n'
           'extern "C" __global__ void c(float v) { } /* unterminated: the rest is a comment\n'
           'extern "C" __global__ void d(float v) { }\n')
    assert {k: texts(v) for k, v in source_declarations(src).items()} == {
        "a": ["int*"], "b": ["const char*", "int"], "c": ["float"]}


# Sources each of which took quadratic time (13.5 s for 48 KB of '/* ', 61.6 s for 176 KB of
# '__global__', 9.3 s for a valid 115 KB source with '/*' character literals): n picked for
# about 10 ms.
SOURCE_FAMILIES = {
    "unterminated_comment": (lambda n: "/* " * n, 12000),
    "extern_c_blocks": (lambda n: 'extern "C" {' * n, 2000),
    "global_words": (lambda n: "__global__ " * n, 4000),
    "char_literals": (lambda n: "".join(f"extern \"C\" __global__ void k{i}(int* x) {{ x[0] = '/*'; }}\n"
                                        for i in range(n)), 300),
    "escaped_quotes": (lambda n: '"' + '\\"' * n, 20000),
    "unclosed_parameter_lists": (lambda n: "__global__ void f(" * n, 2000),
    "nested_parameter_lists": (lambda n: 'extern "C" __global__ void f(' * n + ")" * n, 600),
    "long_word_before_the_name": (lambda n: 'extern "C" __global__ void ' + "a" * n + " b(int x) {}", 40000),
}


@pytest.mark.parametrize("family", SOURCE_FAMILIES)
def test_source_declarations_linear_time_on_hostile_text(family):
    from conftest import assert_linear
    make, n = SOURCE_FAMILIES[family]
    assert_linear(source_declarations, make, n)


def test_device_declarations():
    """The extern "C" __device__ functions a link resolves: declared or defined, one by one
    or in an extern "C" block; not C++ functions, variables, kernels, templates or calls."""
    src = """#include <cuda_fp16.h>
extern "C" __device__ float op(float a, float b);   // the operator (a comment: op(int) is no declaration)
extern "C" {
__device__ double op2(double, const double* p);
__device__ void none(void);
}
extern "C" __device__ __forceinline__ unsigned defined(int x) { return x; }
extern "C" __device__ int counter;
__device__ float plain(float);
extern "C" __global__ void k(float* o) { o[0] = op(o[1], o[2]); }
template <typename T> __device__ T t(T);
extern "C" __device__ float through(float (*f)(float));
"""
    got = {k: (d.returns.text if d.returns else None, None if d.params is None else texts(d.params), d.line, d.defines)
           for k, d in device_declarations(src).items()}
    assert got == {"op": ("float", ["float", "float"], 2, False),
                   "op2": ("double", ["double", "const double*"], 4, False),
                   "none": ("void", [], 5, False), "defined": ("unsigned int", ["int"], 7, True),
                   "through": ("float", None, 12, False)}
    assert device_declarations(src)["op"].text == 'extern "C" __device__ float op(float a, float b)'
    # a definition after a declaration is what a link's "defined twice" names
    both = 'extern "C" __device__ float f(float);\nextern "C" __device__ float f(float x) { return x; }\n'
    assert (device_declarations(both)["f"].line, device_declarations(both)["f"].defines) == (2, True)


@pytest.mark.parametrize("family", [*SOURCE_FAMILIES, "many_declarations"])
def test_device_declarations_linear_time_on_hostile_text(family):
    from conftest import assert_linear
    if family == "many_declarations":  # (each found its extern "C" by a scan of all before it: quadratic)
        make, n = (lambda n: "".join(f'extern "C" __device__ float f{i}(float x);\n' for i in range(n))), 500
    else:
        make, n = SOURCE_FAMILIES[family]
    device = {"long_word_before_the_name": lambda n: 'extern "C" __device__ float ' + "a" * n + " b(int x);"}
    assert_linear(device_declarations, device.get(family, lambda n: make(n).replace("__global__", "__device__")), n)


def test_device_declarations_read_a_heads_words_once(monkeypatch):
    """``extern "C" __device__ __device__ ... int f(int a);``: each ``__device__`` read the
    text up to the '(' again (22 KB took 2.3 s, 88 KB 45 s): a declaration is read from its
    last ``__device__`` alone, so what its readers see adds up to the source once."""
    from nbjit.params import declarations as declarations_mod
    seen = []

    class Counted:  # a pattern that counts the characters it is given
        def __init__(self, pattern):
            self.pattern = pattern

        def search(self, text, *a):
            seen.append(len(text))
            return self.pattern.search(text, *a)

        def sub(self, repl, text, *a):
            seen.append(len(text))
            return self.pattern.sub(repl, text, *a)
    for name in ("_TRAILING_NAME", "_FUNC_WORDS", "_STRING_C"):
        monkeypatch.setattr(declarations_mod, name, Counted(getattr(declarations_mod, name)))
    for n in (1, 2000):
        src = 'extern "C" ' + "__device__ " * n + "int f(int a);"
        seen.clear()
        d = device_declarations(src)["f"]
        assert (d.returns.text, texts(d.params), d.line, d.text) == ("int", ["int"], 1, " ".join(src[:-1].split()))
        assert sum(seen) <= 3 * len(src), (n, sum(seen), len(src))


@pytest.mark.parametrize("text,want", [
    ("const float* __restrict__ x", CParam("float", True, True, "x")),
    ("unsigned long long n", CParam("unsigned long long", False, False, "n")),
    ("unsigned n", CParam("unsigned int", False, False, "n")),
    ("int64_t k", CParam("long", False, False, "k")),
    ("float**", CParam("void*", True, False)),
    ("int& r", None),
])
def test_parse_ctype(text, want):
    assert parse_ctype(text, named=True) == want


def test_elements():
    assert element_of("float") == ("f", 4) and element_of("unsigned int") == ("i", 4)
    assert element_of("__nv_bfloat16") == ("bf", 2) and element_of("bool") == ("b", 1)
    assert element_of("float2") == ("any", 8) and element_of("cuDoubleComplex") == ("any", 16)
    assert element_of("thrust::complex<float>") == ("c", 8)
    assert element_of("void") == ("void", None) and element_of("Pair") == ("void", None)


def test_triton_ir_signatures():
    ttir = (DATA / "triton/matmul_kernel/matmul_kernel.ttir").read_text()
    sig = triton_ir_signatures(ttir)["matmul_kernel"]
    assert texts(sig)[:4] == ["__half*", "__half*", "__half*", "int"] and len(sig) == 12
    assert [p.name for p in sig][:3] == ["a_ptr", "b_ptr", "c_ptr"]
    assert triton_ir_signatures('tt.func public @k(%arg0: !tt.ptr<f8E4M3FN> {tt.divisibility = 16 : i32}, '
                                '%arg1: i64) {') == {"k": (CParam("f8E4M3FN", True), CParam("long"))}
