"""nbjit kernels inside jax.jit (nbjit.frameworks.jax), on a CPU: the FFI call JAX lowers,
declarations and arguments refused with nbjit's errors at tracing, and nbjit's XLA FFI handler
run by XLA's own CPU runtime. There, with no GPU, the handler decodes and packs every argument.
Then it stops at the stream, which XLA's CPU runtime does not have. A packing error comes back
through XLA with nbjit's message. Launches on a GPU: test_gpu_jax.py."""
from __future__ import annotations

import pytest

import nbjit
from nbjit import NbjitArgumentError, NbjitOpError

jax = pytest.importorskip("jax", reason="nbjit.jax needs JAX")
jnp = pytest.importorskip("jax.numpy")

SRC = r"""
extern "C" __global__ void axpy(float *y, const float *x, float a, int n) {}
extern "C" __global__ void scale(float *out, const float *x, float a, int n) {}
extern "C" __global__ void writes_x(float *out, float *x, int n) {}
"""
BUNDLE = "examples/bundle_package/src/nbjit_demo_kernels/kernels.nbjit"


@pytest.fixture(scope="module")
def mod():
    return nbjit.compile(SRC, arch="sm_90", lazy=True)


@pytest.fixture
def on_cpu(cpu_entry, monkeypatch):
    """nbjit.jax.call run by XLA's CPU runtime: kernels get C entries made on this CPU, and the
    handler is registered for the CPU platform (which nbjit refuses to users: host memory)."""
    from nbjit.frameworks import jax as bridge
    monkeypatch.setattr(bridge, "_platform", lambda where: "cpu")
    return cpu_entry


def arrays(n=8):
    return jnp.zeros(n, jnp.float32), jnp.ones(n, jnp.float32)


def test_the_call_lowers_to_one_ffi_custom_call(mod, on_cpu):
    k = mod["axpy"]
    text = jax.jit(lambda y, x: nbjit.jax.call(k, y, x, 2.0, 8, grid=(3, 2), block=256, inplace=("y",))) \
        .lower(*arrays()).as_text()
    assert text.count("stablehlo.custom_call @nbjit_launch(") == 1
    assert "dims = dense<[3, 2, 1, 256, 1, 1, 0]>" in text
    assert "plan = dense<[1, 0, 0, 1, 3, 0, 2, 0]>" in text  # y: result 0 (aliased), x: operand 1, a: floats[0], n
    assert "output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [], operand_index = 0" \
        in text
    assert f"kernel = {on_cpu['axpy'].kernel} : ui64" in text


def test_xla_runs_the_handler_which_decodes_and_packs_every_argument(mod, on_cpu):
    k = mod["axpy"]
    y, x = arrays()
    with pytest.raises(Exception, match=r"UNIMPLEMENTED: XLA FFI GPU context is not available"):
        jax.jit(lambda y, x: nbjit.jax.call(k, y, x, 2.0, 8, grid=1, block=256, inplace=("y",)))(y, x)
    # a value the kernel's .s32 cannot take: refused by the C entry's rules, inside XLA's run
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT: kernel 'axpy', parameter 3 \(n, .s32\): 1099511627776 "
                                        r"does not fit in .s32 \(-2147483648 to 2147483647\)"):
        jax.jit(lambda y, x: nbjit.jax.call(k, y, x, 2.0, 2**40, grid=1, block=256, inplace=("y",)))(y, x)
    for n in (2**64 + 8, 2**63, -2**63 - 1):  # (beyond 64 bits, or a .s32's top bit: refused when traced)
        with pytest.raises(NbjitArgumentError, match=rf"parameter 3 \(n, .s32\): {n} does not fit in .s32"):
            nbjit.jax.call(k, y, x, 2.0, n, grid=1, block=256, inplace=("y",))
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT: kernel 'axpy': dynamic shared memory plus|"
                                        r"kernel 'axpy': .* exceed"):
        jax.jit(lambda y, x: nbjit.jax.call(k, y, x, 2.0, 8, grid=1, block=256, shared=1 << 20,
                                            inplace=("y",)))(y, x)


def test_a_plan_that_does_not_fit_the_kernel_is_refused_by_the_handler(mod, on_cpu):
    """A call of nbjit's FFI target written by hand: each plan entry's source is checked
    against its parameter's class before anything is read."""
    import numpy as np

    from nbjit.frameworks import jax as bridge
    k = mod["axpy"]
    jax.jit(lambda y, x: nbjit.jax.call(k, y, x, 2.0, 8, grid=1, block=256, inplace=("y",))).lower(*arrays())
    # (that registered the target and made the kernel's entry)
    y, x = arrays()
    call = jax.ffi.ffi_call(bridge.TARGET, jax.ShapeDtypeStruct(y.shape, y.dtype), input_output_aliases={0: 0})
    for plan in ([0, 0, 0, 1, 0, 0, 2, 0],    # a float parameter from a buffer
                 [0, 0, 0, 1, 3, 0, 3, 0]):   # an integer from the floats
        with pytest.raises(Exception, match=r"INVALID_ARGUMENT: nbjit.jax.call: a plan entry's source does not fit "
                                            r"its parameter"):
            jax.jit(lambda y, x, plan=plan: call(y, x, kernel=np.uint64(on_cpu["axpy"].kernel),
                                                 dims=np.array([1, 1, 1, 256, 1, 1, 0], np.int64),
                                                 plan=np.array(plan, np.int64), ints=np.array([8], np.int64),
                                                 floats=np.array([2.0], np.float64)))(y, x)


def test_a_cuda_jit_kernels_arrays_are_decoded_as_views(on_cpu):
    k = nbjit.load_bundle(BUNDLE, name="scale_rows", lazy=True).scale_rows  # scale_rows(float32[:, :], float32[::1])
    a, s = jnp.ones((4, 3), jnp.float32), jnp.ones(4, jnp.float32)
    with pytest.raises(NbjitArgumentError, match=r"parameter 1 \(factors, .*\): a 2-d array; the parameter is "
                                                 r"array\(float32, 1d, C\)"):
        nbjit.jax.call(k, a, a, grid=1, block=32, inplace=("m",), reads=("factors",))
    with pytest.raises(Exception, match=r"UNIMPLEMENTED: XLA FFI GPU context is not available"):
        jax.jit(lambda a, s: nbjit.jax.call(k, a, s, grid=1, block=32, inplace=("m",), reads=("factors",)))(a, s)


def test_a_triton_kernel_takes_its_own_block(on_cpu, tmp_path):
    import warnings
    bundle = tmp_path / "t.nbjit"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nbjit.NbjitWarning)
        nbjit.build_bundle({"add": "tests/data/triton/add_kernel"}, bundle)
    k = nbjit.load_triton(bundle, name="add", lazy=True)  # add_kernel(x_ptr, y_ptr, out_ptr, n_elements, alpha)
    x = jnp.ones(1000, jnp.float32)
    call = lambda x, y: nbjit.jax.call(k, x, y, 1000, 0.5, grid=8, outputs={"out_ptr": "x_ptr"},  # noqa: E731
                                       reads=("x_ptr", "y_ptr"))
    text = jax.jit(call).lower(x, x).as_text()
    assert "dims = dense<[8, 1, 1, 128, 1, 1, 0]>" in text  # (block: num_warps 4 x 32)
    with pytest.raises(Exception, match=r"UNIMPLEMENTED: XLA FFI GPU context is not available"):
        jax.jit(call)(x, x)
    with pytest.raises(NbjitOpError, match=r"a Triton kernel's block is its num_warps"):
        nbjit.jax.call(k, x, x, 1000, 0.5, grid=8, block=128, outputs={"out_ptr": "x_ptr"}, reads=("x_ptr", "y_ptr"))


@pytest.mark.parametrize("call, error, message", [
    (lambda k, y, x: nbjit.jax.call(k, y, x, 2.0, 8, grid=1, block=1), NbjitOpError,
     r"parameter 0 \(y, pointer\) is float\*, not const, so the kernel may write it: declare it inplace=\('y',\)"),
    (lambda k, y, x: nbjit.jax.call(k, y, x, 2.0, grid=1, block=1, inplace=("y",)), NbjitArgumentError,
     r"3 arguments for its 4 inputs \(y, x, a, n\)"),
    (lambda k, y, x: nbjit.jax.call(k, y.astype(jnp.float16), x, 2.0, 8, grid=1, block=1, inplace=("y",)),
     NbjitArgumentError, r"parameter 0 \(y, pointer\): a float16 array; the parameter is float\* and takes float32"),
    (lambda k, y, x: nbjit.jax.call(k, y, x, 2.0, 8.5, grid=1, block=1, inplace=("y",)), NbjitArgumentError,
     r"parameter 3 \(n, .s32\): a float \(8.5\) was passed; the parameter is an integer"),
    (lambda k, y, x: nbjit.jax.call(k, y, x, 2.0, 8, grid=(1, 2, 3, 4), block=1, inplace=("y",)),
     NbjitArgumentError, r"grid must be an int or a tuple of 1 to 3 ints"),
    (lambda k, y, x: nbjit.jax.call(k, y, x, 2.0, 8, grid=1, block=0, inplace=("y",)), NbjitArgumentError,
     r"block must be an int >= 1, got 0"),
])
def test_mistakes_are_refused_at_tracing(mod, on_cpu, call, error, message):
    y, x = arrays()
    with pytest.raises(error, match=message):
        call(mod["axpy"], y, x)


def test_outputs_by_rule(mod, on_cpu):
    k = mod["scale"]
    x = jnp.ones(8, jnp.float32)
    text = jax.jit(lambda x: nbjit.jax.call(k, x, 3.0, 8, grid=1, block=8, outputs={"out": "x"})).lower(x).as_text()
    assert "-> tensor<8xf32>" in text and "plan = dense<[1, 0, 0, 0, 3, 0, 2, 0]>" in text
    with pytest.raises(NbjitArgumentError, match=r"parameter 0 \(out, pointer\): a float64 array \(the output rule of "
                                                 r"'out'\); the parameter is float\*"):
        nbjit.jax.call(k, x, 3.0, 8, grid=1, block=8, outputs={"out": jax.ShapeDtypeStruct((8,), jnp.float64)})
    with pytest.raises(NbjitOpError, match=r"output rule of 'out': 'n' is not one of its input arrays"):
        nbjit.jax.call(k, x, 3.0, 8, grid=1, block=8, outputs={"out": "n"})


def test_a_traced_scalar_is_refused(mod, on_cpu):
    k = mod["axpy"]
    with pytest.raises(NbjitArgumentError, match=r"parameter 2 \(a, .f32\): .* is not a number fixed at tracing"):
        jax.jit(lambda y, x, a: nbjit.jax.call(k, y, x, a, 8, grid=1, block=1, inplace=("y",)))(*arrays(), 2.0)


def test_vmap_takes_the_declared_rule_or_is_refused(mod, on_cpu):
    k = mod["scale"]
    xs = jnp.ones((4, 8), jnp.float32)
    with pytest.raises(Exception, match="vmap"):
        jax.vmap(lambda x: nbjit.jax.call(k, x, 3.0, 8, grid=1, block=8, outputs={"out": "x"}))(xs)
    text = jax.jit(jax.vmap(lambda x: nbjit.jax.call(k, x, 3.0, 8, grid=1, block=8, outputs={"out": "x"},
                                                     vmap_method="sequential"))).lower(xs).as_text()
    assert "@nbjit_launch" in text
    with pytest.raises(NbjitOpError, match=r"vmap_method='expand_dims': .* its first element only"):
        nbjit.jax.call(k, xs[0], 3.0, 8, grid=1, block=8, outputs={"out": "x"}, vmap_method="expand_dims")


def test_jax_on_the_cpu_is_refused(mod, cpu_entry):
    if jax.default_backend() == "gpu":
        pytest.skip("JAX runs on a GPU here")
    with pytest.raises(NbjitArgumentError, match=r"JAX runs on cpu, and a CUDA kernel needs its arrays on a CUDA "
                                                 r"device"):
        nbjit.jax.call(mod["axpy"], *arrays(), 2.0, 8, grid=1, block=1, inplace=("y",))
