"""Triton kernels (compiled ahead of time by Triton 3.9) launched through nbjit on Numba
arrays, checked against numpy and, where this machine has Triton and PyTorch, against Triton
itself on the same inputs (marker `gpu`)."""
from __future__ import annotations

import importlib.util
import shutil
import sys
import warnings

import numpy as np
import pytest

# PyTorch first (see test_gpu_interop.py)
torch = pytest.importorskip("torch") if importlib.util.find_spec("torch") else None

import nbjit  # noqa: E402
from nbjit import NbjitArgumentError, NbjitWarning  # noqa: E402

pytestmark = pytest.mark.gpu
from conftest import DATA  # noqa: E402
T = DATA / "triton"


def triton_jit():
    """The fixture kernels under this machine's own Triton (if any), for a second opinion."""
    if torch is None or importlib.util.find_spec("triton") is None or not torch.cuda.is_available():
        return None
    sys.path.insert(0, str(DATA / "src"))
    try:
        import triton_kernels
        return triton_kernels
    except Exception:  # an older Triton without an API the fixtures use
        return None
    finally:
        sys.path.pop(0)


def test_vector_add(cuda):
    k = nbjit.load_triton(T / "add_kernel")
    assert k.route == "cubin" and k.kernel[1, k.meta.block].block == (128, 1, 1)
    n = 100_003
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    y = np.random.default_rng(1).random(n, dtype=np.float32)
    out = cuda.device_array(n, np.float32)
    k[(n + 1023) // 1024](cuda.to_device(x), cuda.to_device(y), out, n, np.float32(0.5))
    np.testing.assert_allclose(out.copy_to_host(), 0.5 * x + y, rtol=1e-6)
    with pytest.raises(NbjitArgumentError, match="takes 5 runtime arguments"):
        k[1](out, out, out, n)
    tk = triton_jit()
    if tk is not None:
        tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
        tout = torch.empty_like(tx)
        tk.add_kernel[((n + 1023) // 1024,)](tx, ty, tout, n, 0.5, BLOCK=1024)
        np.testing.assert_allclose(out.copy_to_host(), tout.cpu().numpy(), rtol=1e-6)


def test_softmax_rows(cuda):
    k = nbjit.load_triton(T / "softmax_kernel")
    rows, cols = 300, 781
    x = np.random.default_rng(2).standard_normal((rows, cols)).astype(np.float32)
    dx = cuda.to_device(x)
    out = cuda.device_array((rows, cols), np.float32)
    s = cuda.stream()
    k[rows](out, dx, cols, cols, cols, stream=s)
    s.synchronize()
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out.copy_to_host(), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    tk = triton_jit()
    if tk is not None:
        tx = torch.from_numpy(x).cuda()
        tout = torch.empty_like(tx)
        tk.softmax_kernel[(rows,)](tout, tx, cols, cols, cols, BLOCK=1024, num_warps=8)
        np.testing.assert_allclose(out.copy_to_host(), tout.cpu().numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("entry,bm,bn", [("matmul_kernel", 128, 128), ("matmul_ctas2", 128, 128)])
def test_matmul(cuda, entry, bm, bn):
    k = nbjit.load_triton(T / entry)
    M, N, K = 512, 384, 320
    a = np.random.default_rng(3).standard_normal((M, K)).astype(np.float16)
    b = np.random.default_rng(4).standard_normal((K, N)).astype(np.float16)
    c = cuda.device_array((M, N), np.float16)
    grid = ((M + bm - 1) // bm, (N + bn - 1) // bn)
    k[grid](cuda.to_device(a), cuda.to_device(b), c, M, N, K, K, 1, N, 1, N, 1)
    ref = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(c.copy_to_host().astype(np.float32), ref, rtol=2e-2, atol=2e-1)
    if entry == "matmul_kernel":
        assert k.meta.shared > 48 * 1024 and k.kernel.shared_optin >= k.meta.shared  # opted in above 48 KiB


def test_global_scratch(cuda):
    k = nbjit.load_triton(T / "copy_desc_kernel")
    assert k.meta.global_scratch_size == 256
    M, N = 96, 64
    x = np.arange(M * N, dtype=np.float32).reshape(M, N)
    out = cuda.device_array((M, N), np.float32)
    k[(M // 32, N // 32)](cuda.to_device(x), out, M, N)
    np.testing.assert_array_equal(out.copy_to_host(), 2 * x)
    from nbjit.gpu.host import current_host
    arrays = current_host().module("devicearray").DeviceNDArray
    assert k._scratch and all(type(a) is arrays for a, *_ in k._scratch.values())  # the host's arrays


def test_ptx_fallback_route(cuda, tmp_path):
    """Without a usable cubin, the PTX (ISA 9.4, newer than the 13.0 driver) still loads."""
    d = tmp_path / "add_kernel"
    shutil.copytree(T / "add_kernel", d)
    (d / "add_kernel.cubin").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NbjitWarning)
        k = nbjit.load_triton(d)
    assert k.route in ("nvjitlink", "lowered", "driver")
    n = 4096
    x = np.arange(n, dtype=np.float32)
    out = cuda.device_array(n, np.float32)
    k[n // 1024](cuda.to_device(x), cuda.to_device(x), out, n, np.float32(2.0))
    np.testing.assert_array_equal(out.copy_to_host(), 3 * x)


def test_ptx_with_meta_comments(cuda, tmp_path):
    p = tmp_path / "softmax.ptx"
    p.write_text("// meta:name=softmax_kernel\n// meta:num_warps=8\n// meta:shared=32\n"
                 + (T / "softmax_kernel/softmax_kernel.ptx").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NbjitWarning)
        k = nbjit.load_triton(p)
    x = np.random.default_rng(5).standard_normal((4, 100)).astype(np.float32)
    out = cuda.device_array((4, 100), np.float32)
    k[4](out, cuda.to_device(x), 100, 100, 100)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out.copy_to_host(), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


class _Descriptor:
    """What Triton's TensorDescriptor carries (nbjit reads these attributes, imports no Triton)."""

    def __init__(self, base, shape, strides, block_shape, padding="zero"):
        self.base, self.shape, self.strides, self.block_shape, self.padding = base, shape, strides, block_shape, padding


def test_host_tensor_descriptors(cuda):
    k = nbjit.load_triton(T / "copy_hostdesc_kernel")
    assert k._n == 3 and [d["param"] for d in k.rules["descriptors"]] == [0, 5]
    m, n = 100, 72  # not multiples of the 32 x 64 block
    a = (np.arange(m * n) % 1000).astype(np.float32).reshape(m, n)
    src, dst = cuda.to_device(a), cuda.to_device(np.zeros((m, n), np.float32))
    grid = (-(-m // 32), -(-n // 64))
    k[grid](_Descriptor(src, (m, n), (n, 1), (32, 64)), _Descriptor(dst, (m, n), (n, 1), (32, 64)), np.float32(2.0))
    np.testing.assert_array_equal(dst.copy_to_host(), 2 * a)
    # nbjit's own tensor maps, made with the kernel's box and swizzle
    k[grid](nbjit.tensor_map(src, (32, 32), swizzle="128B"), nbjit.tensor_map(dst, (32, 32), swizzle="128B"),
            np.float32(3.0))
    np.testing.assert_array_equal(dst.copy_to_host(), 3 * a)
    with pytest.raises(NbjitArgumentError, match=r"takes 3 runtime arguments \(.*tensor descriptor"):
        k[grid](src, dst)
    if importlib.util.find_spec("triton") is not None and torch is not None:
        from triton.tools.tensor_descriptor import TensorDescriptor
        ta = torch.from_numpy(a).cuda()
        tout = torch.zeros_like(ta)
        k[grid](TensorDescriptor.from_tensor(ta, [32, 64]), TensorDescriptor.from_tensor(tout, [32, 64]),
                np.float32(0.5))
        torch.cuda.synchronize()
        np.testing.assert_array_equal(tout.cpu().numpy(), 0.5 * a)


def test_launch_pdl_kernels_launch_as_programmatic_dependents(cuda):
    """Triton 3.9 with launch_pdl=True and gdc_wait/gdc_launch_dependents: a chain of 60
    dependent steps gives the right sum launched with PDL (Triton's default) and plainly (the
    user's choice, which the default does not override)."""
    if cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90")
    from conftest import expected_path
    k = nbjit.load_triton(T / "pdl_step_kernel")
    n = 300_001
    bufs = [cuda.to_device(np.zeros(n, np.float32)), cuda.device_array(n, np.float32)]
    s = cuda.stream()
    grid = k[(n + 1023) // 1024]
    for pdl in (True, False):
        if not pdl:
            k.kernel.pdl = False  # the launchers configured for this grid follow
        bufs[0].copy_to_device(np.zeros(n, np.float32), stream=s)
        for i in range(60):
            grid(bufs[i % 2], bufs[(i + 1) % 2], n, stream=s)
        s.synchronize()
        np.testing.assert_array_equal(bufs[0].copy_to_host(), np.full(n, 60, np.float32), err_msg=f"pdl={pdl}")
        launcher = grid.by_stream[s]
        assert launcher.config.pdl is pdl
        assert launcher.path == ("c" if expected_path() == "c" else
                                 "python (cuLaunchKernelEx)" if pdl else "python")
        assert k.kernel.pdl is pdl
    k[(n + 1023) // 1024]  # a new grid does not bring the default back
    assert k.kernel.pdl is False


def test_kernels_from_a_bundle_launch_as_from_the_cache_entry(cuda, tmp_path):
    """load_triton(bundle): the fatbin picks the sm_90a cubin on Hopper, and the kernel
    launches by Triton's rules exactly as the cache entry's does (scratch, tensor maps too)."""
    for e in ("add_kernel", "copy_desc_kernel", "copy_hostdesc_kernel"):
        nbjit.build_bundle(T / e, tmp_path / f"{e}.nbjit")
    direct = nbjit.load_triton(T / "add_kernel")
    lazy = nbjit.load_triton(tmp_path / "add_kernel.nbjit", lazy=True)
    assert lazy.route is None
    for k in (nbjit.load_triton(tmp_path / "add_kernel.nbjit"), lazy):
        assert k.meta == direct.meta and k.rules == direct.rules
        facts = lambda ps: [{f: v for f, v in p.to_json().items() if f != "origin"} for p in ps]  # noqa: E731
        # the same parameters (a bundle's come from its fatbin's PTX before loading: another origin)
        assert facts(k.kernel.params) == facts(direct.kernel.params)
        n = 100_003
        x = np.random.default_rng(0).random(n, dtype=np.float32)
        y = np.random.default_rng(1).random(n, dtype=np.float32)
        dx, dy = cuda.to_device(x), cuda.to_device(y)
        want, got = cuda.device_array(n, np.float32), cuda.device_array(n, np.float32)
        direct[(n + 1023) // 1024](dx, dy, want, n, np.float32(0.5))
        k[(n + 1023) // 1024](dx, dy, got, n, np.float32(0.5))
        np.testing.assert_array_equal(got.copy_to_host(), want.copy_to_host())
        assert k.route == direct.route == "cubin"  # the lazy one: known once loaded
        with pytest.raises(NbjitArgumentError, match="takes 5 runtime arguments"):
            k[1](got, got, got, n)
    k = nbjit.load_triton(tmp_path / "copy_desc_kernel.nbjit")  # global scratch
    M, N = 96, 64
    x = np.arange(M * N, dtype=np.float32).reshape(M, N)
    out = cuda.device_array((M, N), np.float32)
    k[(M // 32, N // 32)](cuda.to_device(x), out, M, N)
    np.testing.assert_array_equal(out.copy_to_host(), 2 * x)
    k = nbjit.load_triton((tmp_path / "copy_hostdesc_kernel.nbjit").read_bytes())  # tensor maps on the cubin route
    m, n = 100, 72
    a = (np.arange(m * n) % 1000).astype(np.float32).reshape(m, n)
    src, dst = cuda.to_device(a), cuda.to_device(np.zeros((m, n), np.float32))
    desc = [_Descriptor(d, (m, n), (n, 1), (32, 64)) for d in (src, dst)]
    k[(-(-m // 32), -(-n // 64))](*desc, np.float32(2.0))
    np.testing.assert_array_equal(dst.copy_to_host(), 2 * a)
