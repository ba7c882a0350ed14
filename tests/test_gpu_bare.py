"""The bare host on a GPU (marker `gpu`): a process where no Numba can be imported loads a bundle
of @cuda.jit kernels (built here by numba-cuda) and launches them on PyTorch tensors (C-, F-ordered
and strided) and CuPy arrays, on their streams, in a captured graph, pickled, with results equal to
the same kernels launched by Numba here; nbjit's own arrays (a device variable, an allocation)
read back through PyTorch. The CPU side of the host: test_host_bare.py."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import nbjit

from conftest import DATA  # noqa: E402
from test_host_bare import NO_NUMBA  # noqa: E402

pytestmark = pytest.mark.gpu

CHILD = r"""
import json, pickle, sys
import numpy as np
import nbjit
from nbjit.gpu.host import current_host
from nbjit import NbjitArgumentError

d = np.load(sys.argv[2])
out = {"host": current_host().name}
torch = cupy = None
try:
    import torch
except ImportError:
    pass
try:
    import cupy
except ImportError:
    pass
load = lambda name: nbjit.load_bundle(sys.argv[1], name=name)
axpy, rowsum, ints, weigh, shout = (load(n)[n] for n in ("axpy", "rowsum", "scale_int", "weigh", "shout"))
res = {}
if torch is not None:
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()
    o = torch.empty(d["x"].size, dtype=torch.float32, device="cuda")
    s = torch.cuda.Stream()
    axpy[8, 128, s](o, np.float32(1.5), t(d["x"]), t(d["y"]))  # (on PyTorch's stream)
    s.synchronize()
    res["axpy"] = o.cpu().numpy()
    m = t(d["m"])
    for name, view in (("rowsum_C", m), ("rowsum_F", m.t().contiguous().t()), ("rowsum_strided", m[:, ::3])):
        r = torch.zeros(m.shape[0], dtype=torch.float64, device="cuda")
        rowsum[m.shape[0], 128](view, r)
        res[name] = r.cpu().numpy()
    i = t(d["i"])
    ints[4, 256](i, 3)
    res["scale_int"] = i.cpu().numpy()
    try:
        axpy[1, 32](o, 1.0, t(d["x"]).double(), t(d["y"]))
    except NbjitArgumentError as e:
        out["refused"] = str(e)
    # a captured graph on PyTorch's stream, replayed twice
    g_out, gx = torch.zeros_like(o), t(d["x"])
    with nbjit.capture(s) as g:  # (no tensor made inside: PyTorch's copies may not run while s is captured)
        axpy[8, 128, s](g_out, np.float32(1.0), gx, g_out)
    g.launch(s); g.launch(s); s.synchronize()
    res["graph"] = g_out.cpu().numpy()
    again = pickle.loads(pickle.dumps(axpy))
    o2 = torch.empty_like(o)
    again[8, 128](o2, np.float32(1.5), t(d["x"]), t(d["y"]))
    res["pickled"] = o2.cpu().numpy()
    # nbjit's own arrays: a device variable and an allocation, read through PyTorch
    mod = nbjit.compile('__device__ int table[4] = {1, 2, 3, 4};\n'
                        'extern "C" __global__ void bump() { table[threadIdx.x] += 10; }')
    mod.bump[1, 4]()
    table = mod.get_global("table").as_array(np.int32)
    out["table"] = [type(table).__name__, torch.as_tensor(table, device="cuda").cpu().tolist(),
                    table.copy_to_host().tolist()]
    buf = current_host().allocate(64)
    buf.copy_from_host(np.arange(64, dtype=np.uint8))
    out["allocated"] = torch.as_tensor(buf, device="cuda").sum().item()
if cupy is not None:
    p = cupy.asarray(d["points"])
    w = cupy.zeros(p.size, dtype=cupy.float32)
    weigh[1, 64](p, w)
    res["weigh"] = cupy.asnumpy(w)
shout[1, 1](np.ones(1, np.float32) if False else (cupy.ones(1, cupy.float32) if cupy is not None else
                                                   torch.ones(1, device="cuda")))
nbjit_sync = (torch.cuda.synchronize() if torch is not None else cupy.cuda.Device().synchronize())
np.savez(sys.argv[3], **res)
out["numba"] = sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "numba_cuda", "numba_cuda_mlir",
                                                                   "llvmlite"))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def kernels():
    sys.path.insert(0, str(DATA / "numba_src"))
    try:
        return importlib.import_module("bundle_kernels")
    finally:
        sys.path.remove(str(DATA / "numba_src"))


def test_a_process_without_numba_launches_bundled_cuda_jit_kernels_as_numba_does(cuda, kernels, tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs PyTorch (the arrays of the bare process)")
    from numba.np.numpy_support import from_dtype
    from numba import types
    cc = cuda.get_current_device().compute_capability
    arch = f"sm_{cc[0]}{cc[1]}"
    inputs = {k: (getattr(kernels, k), sig) for k, sig in kernels.SIGNATURES.items()}
    inputs["weigh"] = (kernels.weigh, (from_dtype(kernels.POINT)[::1], types.float32[::1]))
    bundle = tmp_path / "k.nbjit"
    nbjit.build_bundle(inputs, bundle, archs=arch, ptx="compute_80")

    rng = np.random.default_rng(3)
    n = 1000
    d = {"x": rng.standard_normal(n, dtype=np.float32), "y": rng.standard_normal(n, dtype=np.float32),
         "m": rng.standard_normal((37, 300)), "i": rng.integers(-1000, 1000, 1000, dtype=np.int64),
         "points": np.zeros(50, kernels.POINT)}
    d["points"]["x"], d["points"]["w"] = rng.standard_normal(50), np.arange(50)
    np.savez(tmp_path / "in.npz", **d)

    # the same kernels launched by Numba, here
    want = {}
    o = cuda.device_array(n, np.float32)
    kernels.axpy[8, 128](o, np.float32(1.5), cuda.to_device(d["x"]), cuda.to_device(d["y"]))
    want["axpy"] = want["pickled"] = o.copy_to_host()
    m = cuda.to_device(d["m"])
    for name, view in (("rowsum_C", d["m"]), ("rowsum_F", np.asfortranarray(d["m"])), ("rowsum_strided",
                                                                                       d["m"][:, ::3])):
        r = cuda.device_array(37, np.float64)
        kernels.rowsum[37, 128](cuda.to_device(view) if name != "rowsum_strided" else m[:, ::3], r)
        want[name] = r.copy_to_host()
    i = cuda.to_device(d["i"])
    kernels.scale_int[4, 256](i, 3)
    want["scale_int"] = i.copy_to_host()
    w = cuda.device_array(50, np.float32)
    kernels.weigh[1, 64](cuda.to_device(d["points"]), w)
    want["weigh"] = w.copy_to_host()
    g = np.zeros(n, np.float32)
    for _ in range(2):
        g = d["x"] + g  # (what the graph's two replays make: 1.0 * twice(x) * 0.5 + out, twice)
    want["graph"] = g

    env = {**os.environ, "NBJIT_HOST": "bare"}
    r = subprocess.run([sys.executable, "-c", NO_NUMBA + CHILD, str(bundle), str(tmp_path / "in.npz"),
                        str(tmp_path / "out.npz")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["host"] == "bare" and out["numba"] == []
    assert "first item 1.0" in r.stdout  # (print: the driver's vprintf)
    assert "a float64 array was passed; the parameter is array(float32, 1d, C)" in out["refused"]
    assert out["table"] == ["DeviceArray", [11, 12, 13, 14], [11, 12, 13, 14]]
    assert out["allocated"] == sum(range(64))
    got = dict(np.load(tmp_path / "out.npz"))
    for k, v in got.items():
        if k == "graph":
            np.testing.assert_allclose(v, want[k], rtol=1e-6)
        else:
            np.testing.assert_array_equal(v, want[k], err_msg=k)
    expected = {"axpy", "rowsum_C", "rowsum_F", "rowsum_strided", "scale_int", "graph", "pickled"}
    assert expected <= set(got), set(got)
    if importlib.util.find_spec("cupy") is not None:
        assert "weigh" in got


MLIR_CHILD = r"""
import json, sys
import numpy as np
import torch
import nbjit
from nbjit.gpu.host import current_host

d = np.load(sys.argv[2])
k = lambda name: nbjit.load_bundle(sys.argv[1], name=name)[name]
t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()
res = {}
o = torch.empty(d["x"].size, dtype=torch.float32, device="cuda")
k("axpy")[8, 128](o, np.float32(1.5), t(d["x"]), t(d["y"]))
res["axpy"] = o.cpu().numpy()
m = t(d["m"])
rowsum = k("rowsum")
for name, view in (("rowsum_C", m), ("rowsum_F", m.t().contiguous().t()), ("rowsum_strided", m[:, ::3])):
    r = torch.zeros(m.shape[0], dtype=torch.float64, device="cuda")
    rowsum[m.shape[0], 128](view, r)
    res[name] = r.cpu().numpy()
i = t(d["i"])
k("scale_int")[4, 256](i, 3)
res["scale_int"] = i.cpu().numpy()
np.savez(sys.argv[3], **res)
print(json.dumps({"host": current_host().name, "numba": sorted(
    m for m in sys.modules if m.split(".")[0] in ("numba", "numba_cuda", "numba_cuda_mlir", "llvmlite"))}))
"""


def test_numba_cuda_mlirs_kernels_from_a_bundle_run_without_it(cuda, tmp_path):
    """tests/data/numba/bundle_kernels_mlir.nbjit (numba-cuda-mlir's build of bundle_kernels.py,
    made by tests/data/numba_src/make_mlir_bundle.py): its memref ABI packed from PyTorch
    tensors in a process without any Numba, against numpy."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs PyTorch (the arrays of the bare process)")
    if cuda.get_current_device().compute_capability != (9, 0):
        pytest.skip("the fixture holds SASS for sm_90 (and PTX for compute_80)")
    rng = np.random.default_rng(5)
    d = {"x": rng.standard_normal(1000, dtype=np.float32), "y": rng.standard_normal(1000, dtype=np.float32),
         "m": rng.standard_normal((37, 300)), "i": rng.integers(-1000, 1000, 1000, dtype=np.int64)}
    np.savez(tmp_path / "in.npz", **d)
    env = {**os.environ, "NBJIT_HOST": "bare"}
    r = subprocess.run([sys.executable, "-c", NO_NUMBA + MLIR_CHILD, str(DATA / "numba" / "bundle_kernels_mlir.nbjit"),
                        str(tmp_path / "in.npz"), str(tmp_path / "out.npz")], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"host": "bare", "numba": []}
    got = dict(np.load(tmp_path / "out.npz"))
    np.testing.assert_allclose(got["axpy"], np.float32(1.5) * d["x"] + d["y"], rtol=1e-6)
    for name, view in (("rowsum_C", d["m"]), ("rowsum_F", d["m"]), ("rowsum_strided", d["m"][:, ::3])):
        np.testing.assert_allclose(got[name], view.sum(axis=1), rtol=1e-12, err_msg=name)
    np.testing.assert_array_equal(got["scale_int"], d["i"] * 3)
