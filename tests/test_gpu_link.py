"""Python operators inside C++ kernels on a real GPU (marker `gpu`): nbjit.compile(...,
link=[(function, signature)]) of a block-level reduction template (no CUB) and an element-wise
template, checked against numpy; fatbins with LTO-IR entries loaded and linked."""
from __future__ import annotations

import math

import numpy as np
import pytest

import nbjit

from conftest import DATA  # noqa: E402

pytestmark = pytest.mark.gpu
TEMPLATES = (DATA / "src/block_reduce_op.cu").read_text()
BLOCK = 256


def _functor(c: str, name: str) -> str:
    """The extern "C" declaration of the linked operator and a functor that calls it."""
    return (f'extern "C" __device__ {c} {name}({c} a, {c} b);\n'
            f"struct Op_{name} {{ __device__ {c} operator()({c} a, {c} b) const {{ return {name}(a, b); }} }};\n")


def add_f32(a, b):
    return a + b


def max_f64(a, b):
    return max(a, b)


def xor_i32(a, b):
    return a ^ b


def add_i32(a, b):
    return a + b


CASES = [  # (operator, signature, C type, dtype, identity, numpy's reduction of the same operator)
    (add_f32, "float32(float32, float32)", "float", np.float32, 0, np.sum),
    (max_f64, "float64(float64, float64)", "double", np.float64, -np.inf, np.max),
    (xor_i32, "int32(int32, int32)", "int", np.int32, 0, np.bitwise_xor.reduce),
    (add_i32, "int32(int32, int32)", "int", np.int32, 0, np.sum),
]


def _data(dtype, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(n).astype(dtype)
    return rng.integers(-1000, 1000, n).astype(dtype)


@pytest.mark.parametrize("op,sig,c,dtype,init,reduce", CASES, ids=[c[0].__name__ for c in CASES])
def test_block_reduce_with_a_python_operator(cuda, op, sig, c, dtype, init, reduce):
    name = op.__name__
    expr = f"block_reduce<{c}, Op_{name}, {BLOCK}>"
    m = nbjit.compile(_functor(c, name) + TEMPLATES, name=f"reduce_{name}.cu", name_expressions=[expr],
                      link=[(op, sig)])
    n, blocks = 1_000_003, 120
    x = _data(dtype, n)
    partial = cuda.device_array(blocks, dtype)
    m[expr][blocks, BLOCK](cuda.to_device(x), partial, n, dtype(init))
    got = reduce(partial.copy_to_host())
    if np.dtype(dtype).kind == "f" and reduce is np.sum:
        np.testing.assert_allclose(got, x.sum(dtype=np.float64), rtol=1e-4, atol=1e-2)
    else:
        assert got == reduce(x)


def scale_shift(x, k):
    return x * k + 1.0


def test_two_argument_operator_of_two_types(cuda):
    """transform2<double, int, F>: out[i] = f(x[i], k[i]) with f a Python function of a double
    and an int, no struct in between."""
    src = ('extern "C" __device__ double scale_shift(double x, int k);\n'
           "struct F { __device__ double operator()(double x, int k) const { return scale_shift(x, k); } };\n"
           + TEMPLATES)
    expr = "transform2<double, int, F>"
    m = nbjit.compile(src, name_expressions=[expr], link=[(scale_shift, "float64(float64, int32)")])
    n = 100_000
    x, k = _data(np.float64, n), _data(np.int32, n, seed=1)
    out = cuda.device_array(n, np.float64)
    m[expr][(n + 255) // 256, 256](out, cuda.to_device(x), cuda.to_device(k), n)
    np.testing.assert_allclose(out.copy_to_host(), x * k + 1.0, rtol=1e-15, atol=1e-12)  # (an FMA may round once)


def test_python_and_cpp_operators_agree(cuda):
    """The same operator written in Python (linked) and in C++ (compiled with the template);
    its device function a @cuda.jit of the serving host's."""
    @cuda.jit(device=True)
    def softplus(v):
        return math.log1p(math.exp(v))

    def op(a, b):
        return a + softplus(b)

    src = _functor("float", "op") + TEMPLATES
    cpp = ("struct CppOp { __device__ float operator()(float a, float b) const { return a + log1pf(expf(b)); } };\n"
           + TEMPLATES)
    ex_py, ex_cpp = f"block_reduce<float, Op_op, {BLOCK}>", f"block_reduce<float, CppOp, {BLOCK}>"
    m_py = nbjit.compile(src, name_expressions=[ex_py], link=[(op, "float32(float32, float32)")])
    m_cpp = nbjit.compile(cpp, name_expressions=[ex_cpp])
    n, blocks = 200_000, 64
    x = cuda.to_device(_data(np.float32, n))
    a, b = cuda.device_array(blocks, np.float32), cuda.device_array(blocks, np.float32)
    m_py[ex_py][blocks, BLOCK](x, a, n, np.float32(0))
    m_cpp[ex_cpp][blocks, BLOCK](x, b, n, np.float32(0))
    np.testing.assert_allclose(a.copy_to_host(), b.copy_to_host(), rtol=1e-5)


def test_fatbin_with_ltoir_entry_loads_and_links(cuda):
    """nvcc code=[sm_90,lto_90]: the cubin loads; relocatable LTO-IR (a fatbin) links."""
    if cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("the fixture is built for sm_90")
    n = 1000
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    out = cuda.device_array(n, np.float32)
    nbjit.load(DATA / "nvcc/lto_sm90.fatbin")["k_triple"][(n + 127) // 128, 128](out, x, n)
    np.testing.assert_array_equal(out.copy_to_host(), 3 * np.arange(n, dtype=np.float32))
    user = ('extern "C" __device__ float triple(float);\n'
            'extern "C" __global__ void twice_triple(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; '
            "if (i < n) x[i] = 2.0f * triple(x[i]); }\n")
    m = nbjit.compile(user, link=[DATA / "nvcc/lto_rdc.fatbin"])
    m["twice_triple"][(n + 127) // 128, 128](x, n)
    np.testing.assert_array_equal(x.copy_to_host(), 6 * np.arange(n, dtype=np.float32))
