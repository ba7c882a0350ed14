"""The example package's bundle on a GPU (marker `gpu`): loaded eagerly and lazily it picks
this device's SASS (or the PTX), its kernels launch against numpy, refuse a wrong dtype, and
a kernel pickled to a spawned worker loads there from the whole fatbin it carries."""
from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

import nbjit
from nbjit import NbjitArgumentError
from nbjit.arch import Arch
from nbjit.read.fatbin import inspect_fatbin, select_entry

from conftest import DATA  # noqa: E402

pytestmark = pytest.mark.gpu
BUNDLE = DATA.parent.parent / "examples/bundle_package/src/nbjit_demo_kernels/kernels.nbjit"
N = 1000


def _axpy(kernel, cuda) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(N, dtype=np.float32)
    y = np.ones(N, np.float32)
    dy = cuda.to_device(y)
    kernel[(N + 127) // 128, 128](2.5, cuda.to_device(x), dy, N)
    return dy.copy_to_host(), 2.5 * x + y


@pytest.mark.parametrize("lazy", [False, True])
def test_bundle_kernels_launch(cuda, lazy):
    mod = nbjit.load_bundle(BUNDLE, name="axpy", lazy=lazy)
    described = mod.axpy.params  # (lazy: from the manifest, before anything is loaded)
    got, want = _axpy(mod.axpy, cuda)
    np.testing.assert_allclose(got, want)
    # the entry select_entry picks for this device: exact SASS, else SASS that runs here, else PTX
    dev = Arch.parse(cuda.get_current_device().compute_capability)
    chosen = select_entry(inspect_fatbin(mod.image.data).entries, dev)
    if chosen.kind == "cubin":
        assert mod.prepared_kind == "cubin" and mod._live.info.arch == chosen.arch
        # typed from the manifest's facts of that cubin (no ELF read): the signature the module
        # described itself by, the cubin's own resources, which the driver's agree with
        own = nbjit.inspect_cubin(chosen.payload).entry("axpy")
        k = mod.axpy
        assert k.params == described and [(p.offset, p.size) for p in k.params] == [(p.offset, p.size)
                                                                                   for p in own.params]
        assert k.info.registers == own.registers == k.attributes.registers
        assert (k.attributes.frame, k.attributes.spills) == (own.frame, own.spills)
    else:
        assert mod._live.ptx is not None and mod._live.ptx.arch == str(chosen.target.real())
    for t, dtype in (("scale<float>", np.float32), ("scale<double>", np.float64)):
        d = cuda.to_device(np.arange(N, dtype=dtype))
        mod[t][(N + 127) // 128, 128](d, 0.5, N)
        np.testing.assert_allclose(d.copy_to_host(), 0.5 * np.arange(N, dtype=dtype))
    with pytest.raises(NbjitArgumentError, match="float64"):
        mod.axpy[1, 32](1.0, cuda.device_array(N, np.float64), cuda.device_array(N, np.float32), N)


def test_bundle_kernel_launches_as_fast_as_a_compiled_one(cuda):
    """Same launcher, same path: the bundle's kernel takes the C fast path as any other."""
    k = nbjit.load_bundle(BUNDLE, name="axpy").axpy
    cfg = k[(N + 127) // 128, 128]
    x, y = cuda.to_device(np.zeros(N, np.float32)), cuda.to_device(np.zeros(N, np.float32))
    cfg(1.0, x, y, N)
    direct = nbjit.compile(DATA.parent.parent / "examples/bundle_package/kernels/axpy.cu")["axpy"]
    assert cfg.path == direct[(N + 127) // 128, 128].path


def _in_worker(shipped: bytes) -> list[float]:
    from nbjit.gpu.host import current_host
    cuda = current_host().module("cuda")  # (the parent's host: the worker inherits NBJIT_HOST)
    kernel = pickle.loads(shipped)
    x = cuda.to_device(np.arange(100, dtype=np.float32))
    y = cuda.to_device(np.ones(100, np.float32))
    kernel[1, 128](2.0, x, y, 100)
    return y.copy_to_host().tolist()


@pytest.mark.parametrize("lazy", [False, True])
def test_bundle_kernel_pickles_to_a_spawned_worker(cuda, lazy):
    k = nbjit.load_bundle(BUNDLE, name="axpy", lazy=lazy).axpy
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        y = pool.submit(_in_worker, pickle.dumps(k)).result(timeout=300)
    assert y == [1 + 2 * i for i in range(100)]


def test_a_device_without_its_sass_takes_the_ptx(cuda, tmp_path):
    """A bundle whose cubins run on no chip of this device's major version falls back on its
    PTX (the driver compiles it for this device)."""
    dev = Arch.parse(cuda.get_current_device().compute_capability)
    other = "sm_120" if dev.major != 12 else "sm_80"
    nbjit.build_bundle(DATA.parent.parent / "examples/bundle_package/kernels/axpy.cu", tmp_path / "k.nbjit",
                       archs=[other], ptx="compute_80")
    mod = nbjit.load_bundle(tmp_path / "k.nbjit")
    assert mod._live.ptx is not None and mod.route in ("driver", "nvjitlink", "lowered"), mod
    got, want = _axpy(mod.axpy, cuda)
    np.testing.assert_allclose(got, want)
