"""Two nbjit kernels as PyTorch operators inside a torch.compile'd model (needs a GPU, PyTorch
and Numba).

* ``gelu_bias``: CUDA C++ compiled by NVRTC (nbjit.compile), an output made by its rule
  (like the input) and returned;
* ``clip_``: a @cuda.jit kernel (nbjit.from_numba) writing its argument in place.

``nbjit.torch.op`` registers each as a ``torch.library`` custom op read from the kernel's
signature, so ``torch.compile(fullgraph=True)`` traces the model in one graph with torch's own
ops between them; the compiled model (and its CUDA-graph mode) gives eager's results.

    python examples/torch_compile_op.py
"""
import importlib.util

from numba import cuda, types

if not cuda.is_available():
    raise SystemExit("torch_compile_op.py needs a CUDA GPU and driver (examples/inspect_kernels.py runs without one)")
if importlib.util.find_spec("torch") is None:
    raise SystemExit("torch_compile_op.py needs PyTorch (pip install torch)")

import torch  # noqa: E402 (before Numba makes its context: a GPU and PyTorch are there)

import nbjit  # noqa: E402

GELU_BIAS = r"""
extern "C" __global__ void gelu_bias(float *out, const float *x, const float *bias, int n, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i] + bias[i % cols];
        out[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
    }
}
"""


@cuda.jit
def clip(x, lo, hi):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = min(max(x[i], lo), hi)


def blocks(n):
    return (n + 255) // 256


gelu_bias = nbjit.torch.op(
    nbjit.compile(GELU_BIAS)["gelu_bias"], name="nbjit_example::gelu_bias",
    outputs={"out": "x"}, fill={"n": lambda x: x.numel(), "cols": lambda bias: bias.numel()},
    grid=blocks, block=256)
clip_ = nbjit.torch.op(
    nbjit.from_numba(clip, (types.float32[::1], types.float32, types.float32)), name="nbjit_example::clip_",
    inplace=("x",), grid=lambda x: blocks(x.numel()), block=256)


class Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = torch.nn.Linear(width, width, device="cuda")
        self.bias = torch.nn.Parameter(torch.randn(width, device="cuda"))

    def forward(self, x):
        h = gelu_bias(self.linear(x), self.bias)  # nbjit (NVRTC)
        h = h * torch.sigmoid(h)  # torch
        flat = h.reshape(-1)
        clip_(flat, -1.0, 1.0)  # nbjit (@cuda.jit), in place
        return flat.reshape(h.shape)


def main() -> None:
    torch.manual_seed(0)
    model = Block(512).eval()
    x = torch.randn(64, 512, device="cuda")
    with torch.no_grad():
        eager = model(x)
        for mode in (None, "reduce-overhead"):
            compiled = torch.compile(model, fullgraph=True, mode=mode)
            for _ in range(3):  # (CUDA-graph mode records, then replays)
                got = compiled(x)
            torch.testing.assert_close(got, eager)
            print(f"torch.compile(fullgraph=True, mode={mode!r}): the same as eager "
                  f"(max |diff| {float((got - eager).abs().max()):.2e})")


if __name__ == "__main__":
    main()
