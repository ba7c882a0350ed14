"""nbjit kernels on CuPy arrays and PyTorch tensors, with their streams (marker `gpu`)."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

# Import PyTorch before Numba creates its context: importing it afterwards in the same
# process has been seen to fail inside torch (schema parsing) on the GPU machine.
torch = pytest.importorskip("torch") if importlib.util.find_spec("torch") else None

from nbjit import NbjitArgumentError  # noqa: E402

pytestmark = pytest.mark.gpu


def test_cupy_arrays(cuda, kernels):
    cp = pytest.importorskip("cupy")
    n = 4096
    x = cp.arange(n, dtype=cp.float32)
    y = cp.ones(n, dtype=cp.float32)
    s = cp.cuda.Stream()
    kernels["k_basic"][(n + 255) // 256, 256, s.ptr](y, x, 2.0, n)
    s.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(y), 2 * np.arange(n, dtype=np.float32) + 1)


def test_torch_tensors(cuda, kernels):
    if torch is None:
        pytest.skip("PyTorch is not installed")
    n = 4096
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    y = torch.ones(n, dtype=torch.float32, device="cuda")
    stream = torch.cuda.current_stream()
    kernels["k_basic"][(n + 255) // 256, 256, stream.cuda_stream](y, x, 2.0, n)
    kernels["k_basic"][(n + 255) // 256, 256, stream](y, x, 1.0, n)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(y.cpu().numpy(), 3 * np.arange(n, dtype=np.float32) + 1)
    with pytest.raises(NbjitArgumentError, match="CPU"):
        kernels["k_basic"][1, 32](torch.zeros(4), x, 1.0, 4)


class DLPackOnly:
    """A tensor seen through DLPack alone (as a JAX array is): no __cuda_array_interface__."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, **kw):
        return self._t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def test_arrays_offering_only_dlpack(cuda, kernels):
    """Objects with __dlpack__ and no __cuda_array_interface__ pass for pointer parameters (a
    view at an offset is the DLTensor's data plus byte_offset); a typed pointer checks the
    element type at every launch (such an object has no dtype to remember); a CPU tensor is
    refused naming where its memory is."""
    if torch is None:
        pytest.skip("PyTorch is not installed")
    n = 4096
    x = torch.arange(n + 8, dtype=torch.float32, device="cuda")[8:]
    y = torch.ones(n, dtype=torch.float32, device="cuda")
    kernels["k_basic"][(n + 255) // 256, 256](DLPackOnly(y), DLPackOnly(x), 2.0, n)  # extern "C" PTX: untyped
    torch.cuda.synchronize()
    np.testing.assert_array_equal(y.cpu().numpy(), 2 * (np.arange(n, dtype=np.float32) + 8) + 1)
    tmpl = kernels["_Z6k_tmplIfEvPT_S0_i"]  # k_tmpl<float>(float* out, float v, int n): out[i] = v * i
    assert tmpl.params[0].ctype == "float*"
    out = torch.zeros(n + 8, dtype=torch.float32, device="cuda")
    for _ in range(2):  # the second launch takes the launcher the first made
        tmpl[(n + 255) // 256, 256](DLPackOnly(out[8:]), 3.0, n)
        with pytest.raises(NbjitArgumentError, match="int32"):
            tmpl[1, 32](DLPackOnly(torch.zeros(4, dtype=torch.int32, device="cuda")), 1.0, 4)
    torch.cuda.synchronize()
    got = out.cpu().numpy()
    assert not got[:8].any()
    np.testing.assert_array_equal(got[8:], 3 * np.arange(n, dtype=np.float32))
    with pytest.raises(NbjitArgumentError, match="the CPU"):
        kernels["k_basic"][1, 32](DLPackOnly(torch.zeros(4)), x, 1.0, 4)
    with pytest.raises(NbjitArgumentError, match="the CPU"):
        tmpl[1, 32](DLPackOnly(torch.zeros(4)), 1.0, 4)


JAX_SCRIPT = r"""
import os
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # JAX takes 75% of the GPU otherwise
import numpy as np
import jax, jax.numpy as jnp
import nbjit
from nbjit import NbjitArgumentError
{host}
if jax.default_backend() != "gpu":
    print("skip: JAX has no GPU backend here:", jax.devices())
    raise SystemExit(0)
k = nbjit.load({ptx!r})
n = 4096
x = jnp.arange(n, dtype=jnp.float32) * 0.5  # a JAX array: __cuda_array_interface__ (jax >= 0.4), __dlpack__, a dtype
y = cuda.to_device(np.ones(n, np.float32))
k["k_basic"][(n + 255) // 256, 256](y, x, 2.0, n)  # y = 2 x + y, x read through DLPack
cuda.synchronize()
np.testing.assert_array_equal(y.copy_to_host(), np.arange(n, dtype=np.float32) + 1)
tmpl = k["_Z6k_tmplIfEvPT_S0_i"]  # k_tmpl<float>(float* out, float v, int n)
try:
    tmpl[1, 32](jnp.zeros(4, dtype=jnp.int32), 1.0, 4)
except NbjitArgumentError as e:
    assert "int32" in str(e), e
else:
    raise AssertionError("an int32 JAX array passed for float*")
cpu = jax.device_put(jnp.zeros(4, jnp.float32), jax.devices("cpu")[0])
try:
    k["k_basic"][1, 32](y, cpu, 1.0, 4)
except NbjitArgumentError as e:
    assert "CPU" in str(e), e
else:
    raise AssertionError("a JAX array on the CPU passed")
print("ok", jax.__version__)
"""


def test_jax_arrays(cuda, tmp_path):
    """JAX arrays pass for pointer parameters, their dtype checked, in a process of their own
    (JAX's runtime beside the host's context). JAX's GPU arrays offer __cuda_array_interface__
    as well as DLPack; DLPack alone is test_arrays_offering_only_dlpack's."""
    import importlib.util
    import os
    import subprocess
    import sys

    from conftest import DATA, HOST_CUDA
    if importlib.util.find_spec("jax") is None:
        pytest.skip("JAX is not installed")
    script = JAX_SCRIPT.format(host=HOST_CUDA, ptx=str(DATA / "nvcc/kernels_sm90.ptx"))
    root = str(DATA.parent.parent)
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    if r.stdout.startswith("skip: "):
        pytest.skip(r.stdout.strip()[6:])
    assert r.stdout.startswith("ok"), r.stdout
