"""An NVRTC kernel and a @cuda.jit kernel (from a bundle) inside jax.jit (needs a GPU and JAX with
its CUDA backend).

``nbjit.jax.call`` launches any nbjit kernel as an XLA FFI call through one handler in nbjit's C
extension: no C++ handler per kernel. The jitted step below runs an NVRTC kernel (an output
made like its input), jax.numpy, and a @cuda.jit kernel from a bundle writing its argument in
place, and is checked against jax.numpy alone.

    python examples/jax_jit_call.py
"""
import importlib.util
from pathlib import Path

from numba import cuda

if not cuda.is_available():
    raise SystemExit("jax_jit_call.py needs a CUDA GPU and driver (examples/inspect_kernels.py runs without one)")
if importlib.util.find_spec("jax") is None:
    raise SystemExit("jax_jit_call.py needs JAX with its CUDA backend (pip install 'jax[cuda13]')")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import nbjit  # noqa: E402

if jax.default_backend() != "gpu":
    raise SystemExit(f"jax_jit_call.py needs JAX's CUDA backend; this JAX runs on {jax.default_backend()} "
                     "(pip install 'jax[cuda13]')")

SOFTPLUS = r"""
extern "C" __global__ void softplus(float *out, const float *x, float beta, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = log1pf(expf(beta * x[i])) / beta;
}
"""
BUNDLE = Path(__file__).parent / "bundle_package" / "src" / "nbjit_demo_kernels" / "kernels.nbjit"


def main() -> None:
    softplus = nbjit.compile(SOFTPLUS)["softplus"]
    scale_rows = nbjit.load_bundle(BUNDLE, name="scale_rows").scale_rows  # m[i, j] *= factors[i] (@cuda.jit)
    rows, cols = 256, 512

    @jax.jit
    def step(m, factors):
        n = m.size
        h = nbjit.jax.call(softplus, m.reshape(-1), 2.0, n, grid=(n + 255) // 256, block=256,
                           outputs={"out": "x"}).reshape(m.shape)
        h = h - h.mean()
        return nbjit.jax.call(scale_rows, h, factors, grid=(rows // 16, cols // 16), block=(16, 16),
                              inplace=("m",), reads=("factors",))

    m = jax.random.normal(jax.random.key(0), (rows, cols), jnp.float32)
    factors = jnp.linspace(0.5, 2.0, rows, dtype=jnp.float32)
    got = step(m, factors)
    h = jax.nn.softplus(2.0 * m) / 2.0
    want = (h - h.mean()) * factors[:, None]
    print(f"nbjit kernels inside jax.jit: max |diff| against jax.numpy {float(jnp.abs(got - want).max()):.2e}")
    assert jnp.allclose(got, want, atol=1e-5)


if __name__ == "__main__":
    main()
