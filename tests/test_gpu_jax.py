"""nbjit kernels inside jax.jit on a real GPU (marker `gpu`; JAX with its CUDA backend): results
against jax.numpy, arrays written in place, a @cuda.jit kernel's arrays, and a kernel in a loop
of XLA's that its command buffers (CUDA graphs) may capture."""
from __future__ import annotations

import pytest

import nbjit

pytestmark = pytest.mark.gpu
jax = pytest.importorskip("jax", reason="nbjit.jax needs JAX")
jnp = pytest.importorskip("jax.numpy")
from conftest import AXPY_SCALE  # noqa: E402



@pytest.fixture(scope="module")
def mod():
    if jax.default_backend() != "gpu":
        pytest.skip(f"JAX runs on {jax.default_backend()} here (its CUDA backend is not installed)")
    return nbjit.compile(AXPY_SCALE)


def test_results_inside_jit(mod):
    n = 10_000
    x = jnp.arange(n, dtype=jnp.float32)
    y = jnp.ones(n, jnp.float32)

    @jax.jit
    def f(y, x):
        z = nbjit.jax.call(mod["scale"], x, 3.0, n, grid=(n + 255) // 256, block=256, outputs={"out": "x"})
        z = jnp.sin(z)
        return nbjit.jax.call(mod["axpy"], y, z, 2.0, n, grid=(n + 255) // 256, block=256, inplace=("y",))
    got = f(y, x)
    assert jnp.allclose(got, y + 2.0 * jnp.sin(3.0 * x))
    assert jnp.array_equal(y, jnp.ones(n, jnp.float32))  # (the caller's array is JAX's: not written)


def test_in_a_loop_xla_may_capture(mod):
    n = 4096

    @jax.jit
    def steps(y, x):
        def body(i, y):
            return nbjit.jax.call(mod["axpy"], y, x, 0.5, n, grid=n // 256, block=256, inplace=("y",))
        return jax.lax.fori_loop(0, 10, body, y)
    x = jnp.ones(n, jnp.float32)
    assert jnp.allclose(steps(jnp.zeros(n, jnp.float32), x), 5.0)


def test_a_cuda_jit_kernels_arrays(mod):
    k = nbjit.load_bundle("examples/bundle_package/src/nbjit_demo_kernels/kernels.nbjit", name="scale_rows").scale_rows
    a = jnp.arange(12, dtype=jnp.float32).reshape(4, 3)
    s = jnp.array([1, 2, 3, 4], jnp.float32)
    got = jax.jit(lambda a, s: nbjit.jax.call(k, a, s, grid=1, block=(4, 3), inplace=("m",), reads=("factors",)))(a, s)
    assert jnp.allclose(got, a * s[:, None])
