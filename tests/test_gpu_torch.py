"""nbjit kernels as PyTorch operators on a real GPU (marker `gpu`): opcheck, torch.compile
(Inductor, fullgraph, CUDA-graph mode) against eager, autograd by a backward kernel, a
@cuda.jit kernel and a bundle's kernel as ops, nbjit's errors from inside a compiled graph."""
from __future__ import annotations

import subprocess
import sys

import pytest

import nbjit
from nbjit import NbjitArgumentError

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch", reason="nbjit.torch needs PyTorch")
from conftest import AXPY_SCALE, blocks, fresh, numel  # noqa: E402



@pytest.fixture(scope="module")
def ops():
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    m = nbjit.compile(AXPY_SCALE)
    axpy = nbjit.torch.op(m["axpy"], name=fresh("axpy"), inplace=("y",), fill={"n": numel}, grid=blocks, block=256)

    def scale_backward(inputs, outputs, grads):
        return {"x": scale(grads[0].contiguous(), inputs["a"])}  # d(a x)/dx = a: the same kernel
    scale = nbjit.torch.op(m["scale"], name=fresh("scale"), outputs={"out": "x"}, fill={"n": numel}, grid=blocks,
                           block=256, backward=scale_backward)
    return axpy, scale


def model(ops, y, x):
    axpy, scale = ops
    z = torch.sin(scale(x, 3.0))
    axpy(y, z, 2.0)
    return y * 2


def inputs(n=5000):
    g = torch.Generator(device="cuda").manual_seed(0)
    return torch.rand(n, device="cuda", generator=g), torch.rand(n, device="cuda", generator=g)


def test_opcheck(ops):
    axpy, scale = ops
    y, x = inputs()
    torch.library.opcheck(scale, (x, 1.5))
    torch.library.opcheck(axpy, (y, x, 0.5))


def test_eager_results(ops):
    axpy, scale = ops
    y, x = inputs()
    want = y + 2.0 * x
    axpy(y, x, 2.0)
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(scale(x, 3.0), 3.0 * x)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compiled_fullgraph_equals_eager(ops, mode):
    torch._dynamo.reset()
    y0, x = inputs()
    want = model(ops, y0.clone(), x)
    compiled = torch.compile(lambda y, x: model(ops, y, x), fullgraph=True, mode=mode)
    for _ in range(3):  # (CUDA-graph mode records on a later call, then replays)
        y = y0.clone()
        got = compiled(y, x)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(y, want / 2)  # (the in-place write reached the caller's tensor)


def test_autograd_by_a_backward_kernel(ops):
    _, scale = ops
    x = torch.rand(1000, device="cuda", requires_grad=True)
    scale(x, 3.0).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))
    x.grad = None
    torch.compile(lambda x: scale(x, 3.0).sum(), fullgraph=True)(x).backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))


def test_a_wrong_dtype_in_a_compiled_graph_is_nbjits_error(ops):
    axpy, scale = ops
    torch._dynamo.reset()
    f = torch.compile(lambda x: scale(x, 2.0) + 1, fullgraph=True)
    with pytest.raises(NbjitArgumentError, match=r"parameter 1 \(x, pointer\): a float64 tensor; the parameter is "
                                                 r"const float\* and takes float32 arrays"):
        f(torch.ones(16, device="cuda", dtype=torch.float64))
    torch.testing.assert_close(f(torch.ones(16, device="cuda")), torch.full((16,), 3.0, device="cuda"))


def test_a_cuda_jit_kernel_as_an_op(ops):
    from conftest import HOST_CUDA
    ns: dict = {}
    exec(HOST_CUDA, ns)
    cuda = ns["cuda"]

    @cuda.jit
    def square(out, x):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = x[i] * x[i]
    from numba import types
    k = nbjit.from_numba(square, (types.float32[::1], types.float32[::1]))
    op = nbjit.torch.op(k, name=fresh("square"), outputs={"out": "x"}, reads=("x",), grid=lambda x: blocks(x.numel()),
                        block=256)
    _, x = inputs()
    torch.testing.assert_close(op(x), x * x)
    torch.testing.assert_close(torch.compile(lambda x: op(x) + 1, fullgraph=True)(x), x * x + 1)
    torch.library.opcheck(op, (x,))


BUNDLE_PROCESS = r'''
import sys, torch, nbjit
k = nbjit.load_bundle(sys.argv[1])["scale"]
scale = nbjit.torch.op(k, name="nbjit_bundle::scale", outputs={"out": "x"}, fill={"n": lambda x: x.numel()},
                       grid=lambda n: (n + 255) // 256, block=256)
x = torch.arange(1000, device="cuda", dtype=torch.float32)
out = torch.compile(lambda x: scale(x, 2.0) + 1, fullgraph=True)(x)
assert torch.equal(out, 2 * x + 1)
print("ok")
'''


def test_a_bundles_kernel_is_an_op_in_a_fresh_process(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    cc = torch.cuda.get_device_capability()
    bundle = tmp_path / "k.nbjit"
    nbjit.build_bundle({"k": AXPY_SCALE}, bundle, archs=f"sm_{cc[0]}{cc[1]}")
    out = subprocess.run([sys.executable, "-c", BUNDLE_PROCESS, str(bundle)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_the_op_launches_on_torchs_current_stream(ops):
    """torch.cuda.graph records on a stream of its own: a launch elsewhere would break the capture."""
    axpy, scale = ops
    y, x = inputs()
    y0 = y.clone()
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        axpy(y, scale(x, 3.0), 2.0)
    torch.testing.assert_close(y, y0)  # (recorded, not run)
    for k in range(1, 3):
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, y0 + k * 6.0 * x)


def test_a_triton_kernel_as_an_op(ops):
    import warnings
    from conftest import DATA
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nbjit.NbjitWarning)
        k = nbjit.load_triton(DATA / "triton" / "add_kernel")  # out = x * alpha + y, BLOCK 1024
    add = nbjit.torch.op(k, name=fresh("tadd"), outputs={"out_ptr": "x_ptr"}, reads=("x_ptr", "y_ptr"),
                         fill={"n_elements": lambda x_ptr: x_ptr.numel()}, grid=lambda n_elements: (n_elements + 1023)
                         // 1024)
    y, x = inputs()
    torch.testing.assert_close(add(x, y, 0.5), x * 0.5 + y)
    torch.testing.assert_close(torch.compile(lambda x, y: add(x, y, 0.5) * 2, fullgraph=True)(x, y), (x * 0.5 + y) * 2)
