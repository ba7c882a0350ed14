"""nbjit kernels as PyTorch operators (nbjit.frameworks.torch), on a CPU: the schema read from
the kernel's signature, declarations refused with nbjit's error naming the op and the
parameter, tracing through torch.compile(fullgraph=True) on meta tensors (the fake
implementation), and the checks the CUDA implementation makes before it launches. Launches,
opcheck, Inductor, CUDA graphs and autograd: test_gpu_torch.py."""
from __future__ import annotations

import subprocess
import sys

import pytest

import nbjit
from nbjit import NbjitArgumentError, NbjitOpError

torch = pytest.importorskip("torch", reason="nbjit.torch needs PyTorch")
from conftest import blocks, fresh, numel  # noqa: E402

SRC = r"""
extern "C" __global__ void axpy(float *y, const float *x, float a, int n) {}
extern "C" __global__ void scale(float *out, const float *x, float a, int n) {}
extern "C" __global__ void widen(double *out, const float *x, int n) {}
extern "C" __global__ void writes_x(float *out, float *x, int n) {}
struct triple { int a, b, c; };
extern "C" __global__ void by_value(float *out, triple p) {}
"""


@pytest.fixture(scope="module")
def mod():
    return nbjit.compile(SRC, arch="sm_90", lazy=True)




def test_the_schema_comes_from_the_signature(mod):
    axpy = nbjit.torch.op(mod["axpy"], name=fresh("axpy"), inplace=("y",), fill={"n": numel}, grid=blocks,
                          block=256)
    scale = nbjit.torch.op(mod["scale"], name=fresh("scale"), outputs={"out": "x"}, fill={"n": numel},
                           grid=blocks, block=256)
    widen = nbjit.torch.op(mod["widen"], name=fresh("widen"), outputs={"out": lambda x: x.shape}, fill={"n": numel},
                           grid=blocks, block=256)
    assert str(axpy.default._schema).endswith("(Tensor(a!) y, Tensor x, float a) -> ()")
    assert str(scale.default._schema).endswith("(Tensor x, float a) -> Tensor")
    with torch._subclasses.fake_tensor.FakeTensorMode():  # (what torch.compile traces with)
        x = torch.empty(10, 3, device="cuda")
        out = widen(x)
    assert (out.shape, out.dtype, out.device.type) == ((10, 3), torch.float64, "cuda")  # (float64: double*)


@pytest.mark.parametrize("kwargs, message", [
    (dict(outputs={"out": "x"}, fill={"n": numel}), r"parameter 1 \(x, pointer\) is float\*, not const, so the "
                                                    r"kernel may write it: declare it inplace=\('x',\) if it does, "
                                                    r"reads=\('x',\) if it only reads"),
    (dict(outputs={"result": "x"}, reads=("x",)), r"outputs names 'result', which kernel writes_x does not have "
                                                  r"\(its parameters: out, x, n\)"),
    (dict(outputs={"out": "x"}, inplace=("n",)), r"inplace names parameter 2 \(n, .s32\), which is not a pointer"),
    (dict(outputs={"out": "x"}, reads=("x",), grid=lambda size: size), r"grid takes size, which the op does not "
                                                                       r"have \(it has x, n, out\)"),
    (dict(outputs={"out": "n"}, reads=("x",)), r"output rule of 'out': 'n' is not one of the op's input tensors "
                                               r"\(x\)"),
    (dict(outputs={"out": 3}, reads=("x",)), r"output rule of 'out': give the name of an input tensor"),
    (dict(outputs={"out": "x"}, inplace=("out",), reads=("x",)), r"'out' is declared in both outputs and inplace"),
    (dict(outputs={"out": "x"}, reads=("x",), block=None), r"give block="),
    (dict(outputs={"out": "x"}, inplace=("x",), reads=("x", "out")), r"'x' is declared in both inplace and reads"),
    (dict(inplace=("out", "x"), backward=lambda i, o, g: {}), r"backward= with inplace=\('out', 'x'\): torch's "
                                                              r"autograd takes a formula for functional ops only"),
])
def test_declarations_that_do_not_fit_are_refused(mod, kwargs, message):
    kw = dict(grid=1, block=256) | kwargs
    with pytest.raises(NbjitOpError, match=message) as e:
        nbjit.torch.op(mod["writes_x"], name=fresh("bad"), **kw)
    assert "op 'nbjit_test::bad_" in str(e.value)


def test_a_rule_against_the_element_type_is_refused_at_registration(mod):
    with pytest.raises(NbjitOpError, match=r"output rule of 'out': like 'x' \(const float\*\) gives float32 tensors; "
                                           r"parameter 0 \(out, pointer\) is double\*"):
        nbjit.torch.op(mod["widen"], name=fresh("widen"), outputs={"out": "x"}, fill={"n": numel}, grid=1, block=1)


def test_what_no_op_input_can_be(mod):
    with pytest.raises(NbjitOpError, match=r"parameter 1 \(p, .*\) takes its own bytes \(triple\), which no op input "
                                           r"is: compute it with fill="):
        nbjit.torch.op(mod["by_value"], name=fresh("by_value"), outputs={"out": lambda: (4,)}, grid=1, block=1)
    with pytest.raises(NbjitOpError, match=r"name it 'namespace::op_name'"):
        nbjit.torch.op(mod["axpy"], name="no_namespace", inplace=("y",), grid=1, block=1)
    with pytest.raises(NbjitOpError, match=r"str is not an nbjit kernel"):
        nbjit.torch.op("axpy", name=fresh("axpy"), grid=1, block=1)
    name = fresh("twice")
    nbjit.torch.op(mod["axpy"], name=name, inplace=("y",), grid=1, block=1)
    with pytest.raises(NbjitOpError, match=rf"op '{name}': torch refused its schema"):
        nbjit.torch.op(mod["axpy"], name=name, inplace=("y",), grid=1, block=1)


def test_ptx_parameters_are_named_and_typed_as_the_image_says():
    from pathlib import Path
    ptx = Path(__file__).parent / "data" / "nvcc" / "kernels_sm90.ptx"
    k = nbjit.load(ptx, lazy=True)["k_basic"]  # (PTX: .u64 addresses, no pointer types, <kernel>_param_<i>)
    with pytest.raises(NbjitOpError, match=r"none of its inputs is a tensor, which tells the device"):
        nbjit.torch.op(k, name=fresh("ptx"), grid=1, block=1)  # (its .u64 addresses are ints to an op)
    typed = k.module.get_kernel("k_basic", signature="void(float *out, const float *x, float a, unsigned n)")
    op = nbjit.torch.op(typed, name=fresh("ptx"), inplace=("out",), grid=1, block=1)
    assert str(op.default._schema).endswith("(Tensor(a!) out, Tensor x, float a, int n) -> ()")
    op = nbjit.torch.op(typed, name=fresh("ptx"), names=("y", "x", "alpha", "size"), inplace=("y",), grid=1, block=1)
    assert str(op.default._schema).endswith("(Tensor(a!) y, Tensor x, float alpha, int size) -> ()")
    with pytest.raises(NbjitOpError, match=r"names= gives 1 names; kernel k_basic has 4 parameters"):
        nbjit.torch.op(k, name=fresh("ptx"), names=("a",), grid=1, block=1)
    with pytest.raises(NbjitOpError, match=r"parameter 1 \(a, .*\) has no name an op can use"):
        nbjit.torch.op(k, name=fresh("ptx"), names=("a", "a", "b", "c"), grid=1, block=1)


def two_ops_and_a_torch_op(mod):
    names = fresh("axpy"), fresh("scale")
    axpy = nbjit.torch.op(mod["axpy"], name=names[0], inplace=("y",), fill={"n": numel}, grid=blocks, block=256)
    scale = nbjit.torch.op(mod["scale"], name=names[1], outputs={"out": "x"}, fill={"n": numel}, grid=blocks,
                           block=256)

    def model(y, x):
        z = scale(x, 3.0)
        z = torch.sin(z)
        axpy(y, z, 2.0)
        return y * 2
    return model, names


def test_torch_compile_traces_the_ops_in_one_graph(mod):
    model, names = two_ops_and_a_torch_op(mod)
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    y, x = torch.zeros(1000, device="meta"), torch.ones(1000, device="meta")
    out = torch.compile(model, fullgraph=True, backend=keep)(y, x)  # (fullgraph: a graph break would raise)
    assert (out.shape, out.dtype) == ((1000,), torch.float32)
    assert len(graphs) == 1
    code = graphs[0].code
    assert all(f"torch.ops.{name.replace('::', '.')}" in code for name in names), code
    out = torch.compile(model, fullgraph=True, backend="aot_eager")(y, x)  # (functionalised: y written in place)
    assert out.shape == (1000,)


def test_the_cuda_implementation_checks_before_it_launches(mod):
    from nbjit.frameworks.torch import _OPS
    name = fresh("scale")
    nbjit.torch.op(mod["scale"], name=name, outputs={"out": "x"}, fill={"n": numel}, grid=blocks, block=256)
    spec = _OPS[name]
    with pytest.raises(NbjitArgumentError, match=rf"op '{name}': parameter 1 \(x, pointer\): a float64 tensor; the "
                                                 r"parameter is const float\* and takes float32 arrays"):
        spec._arguments((torch.ones(4, dtype=torch.float64, device="meta"), 2.0), check=True)
    rule = fresh("rule")
    nbjit.torch.op(mod["scale"], name=rule, outputs={"out": lambda x: (x.shape, torch.float16)}, fill={"n": numel},
                   grid=1, block=1)
    with pytest.raises(NbjitArgumentError, match=r"parameter 0 \(out, pointer\): a float16 tensor \(made by the "
                                                 r"output rule of 'out'\); the parameter is float\*"):
        _OPS[rule]._arguments((torch.ones(4, device="meta"), 2.0), check=True)
    inplace = fresh("axpy")
    nbjit.torch.op(mod["axpy"], name=inplace, inplace=("y",), fill={"n": numel}, grid=1, block=1)
    y = torch.zeros(4, 4, device="meta").t()
    with pytest.raises(NbjitArgumentError, match=r"parameter 0 \(y, pointer\): a tensor of strides "
                                                 r"\(1, 4\) cannot be written in place"):
        _OPS[inplace]._arguments((y, torch.ones(4, 4, device="meta"), 1.0), check=True)
    values, _ = _OPS[inplace]._arguments((torch.zeros(16, device="meta"), torch.ones(4, 4, device="meta").t(), 1.0),
                                         check=True)
    assert values["x"].is_contiguous() and values["n"] == 16  # (a read-only input: made contiguous)


def test_cuda_jit_arrays_are_laid_out_as_their_parameters_say():
    """A @cuda.jit kernel's arrays: a C-layout parameter gets a C-contiguous tensor (a copy where
    it is not), an "A" one any strides; named as the Python function names them, in messages too."""
    from pathlib import Path

    from nbjit.frameworks.torch import _OPS
    bundle = Path(__file__).parent.parent / "examples/bundle_package/src/nbjit_demo_kernels/kernels.nbjit"
    k = nbjit.load_bundle(bundle, name="scale_rows", lazy=True).scale_rows  # (m: float32 2-d "A"; factors: 1-d "C")
    name = fresh("rows")
    nbjit.torch.op(k, name=name, inplace=("m",), reads=("factors",), grid=1, block=(4, 3))
    m, f = torch.zeros(8, 6, device="meta")[::2, ::2], torch.ones(8, device="meta")[::2]
    values, _ = _OPS[name]._arguments((m, f), check=True)
    assert values["m"] is m and values["factors"].is_contiguous() and values["factors"].shape == (4,)
    with pytest.raises(NbjitOpError, match=r"outputs names 'out', which kernel numba_kernels.scale_rows does not "
                                           r"have \(its parameters: m, factors\)"):
        nbjit.torch.op(k, name=fresh("rows"), outputs={"out": "m"}, grid=1, block=(4, 3))


BUNDLE_PROCESS = r'''
import sys, torch, nbjit
k = nbjit.load_bundle(sys.argv[1], lazy=True)["scale"]
scale = nbjit.torch.op(k, name="nbjit_bundle::scale", outputs={"out": "x"}, fill={"n": lambda x: x.numel()},
                       grid=lambda n: (n + 255) // 256, block=256)
out = torch.compile(lambda x: scale(x, 2.0) + 1, fullgraph=True, backend="aot_eager")(torch.ones(8, device="meta"))
print(tuple(out.shape), out.dtype)
'''


def test_a_bundles_kernel_is_an_op_in_a_fresh_process(tmp_path):
    bundle = tmp_path / "k.nbjit"
    nbjit.build_bundle({"k": SRC}, bundle, archs="sm_90")
    out = subprocess.run([sys.executable, "-c", BUNDLE_PROCESS, str(bundle)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "(8,) torch.float32"
