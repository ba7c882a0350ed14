"""Saved graphs on a GPU (marker `gpu`): a graph of NVRTC and @cuda.jit kernels (through
from_numba), a while loop whose condition a C++ kernel sets, a memset and a copy, saved with
its arrays as bindings and rebuilt in a fresh process (no NVRTC there) with other arrays, the
results equal to the replay here; rebinding in place; a tampered file, a wrong or missing
binding refused before anything runs. The file format's checks: test_graph_file_format.py."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import nbjit
from nbjit import BundleError, NbjitGraphError

from conftest import HOST_CUDA  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:(Grid size|Host array used):Warning")]

N = 512
CPP = r'''
extern "C" __global__ void countdown(int* left, cudaGraphConditionalHandle again) {
    if (threadIdx.x == 0 && blockIdx.x == 0) { int v = --left[0]; cudaGraphSetConditional(again, v > 0); }
}
extern "C" __global__ void add(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
'''

CHILD = HOST_CUDA + r"""
import json, sys, time
t0 = time.perf_counter()
import nbjit
import numpy as np
x = cuda.to_device(np.full(512, 2.0, np.float32))
y = cuda.to_device(np.ones(512, np.float32))
z = cuda.device_array(512, np.float32)
left = cuda.to_device(np.array([4], np.int32))
cuda.synchronize()
t1 = time.perf_counter()
g = nbjit.load_graph(sys.argv[1], bindings={"x": x, "y": y, "z": z, "left": left})
g.launch()
cuda.synchronize()
t2 = time.perf_counter()
out = {"y": y.copy_to_host().tolist(), "z": z.copy_to_host().tolist(), "left": int(left.copy_to_host()[0]),
       "nvrtc": "nbjit.toolchain.nvrtc" in sys.modules, "load_and_first_replay_ms": (t2 - t1) * 1e3,
       "names": [n.name for n in g.nodes]}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def kit(cuda):
    @cuda.jit
    def scale(y, a):
        i = cuda.grid(1)
        if i < y.shape[0]:
            y[i] *= a

    m = nbjit.compile(CPP, name="graph_saved.cu")
    return m["countdown"], m["add"], nbjit.from_numba(scale, "void(float32[::1], float32)")


def capture(cuda, kit, x, y, z, left):
    countdown, add, scale = kit
    s = cuda.stream()
    from nbjit.gpu.host import current_host
    device_memset = current_host().module("driver").device_memset
    with nbjit.capture(s) as g:
        device_memset(z, 0, z.nbytes, stream=s)
        again = g.condition(default=1)
        with g.while_loop(again):
            add[(N + 127) // 128, 128, s](y, x, 0.5, N)
            countdown[1, 1, s](left, again)
        scale[(N + 127) // 128, 128, s](y, 3.0)
        z.copy_to_device(y, stream=s)
    return g, s


def arrays(cuda, left=4):
    return (cuda.to_device(np.full(N, 2.0, np.float32)), cuda.to_device(np.ones(N, np.float32)),
            cuda.device_array(N, np.float32), cuda.to_device(np.array([left], np.int32)))


def test_saved_graph_runs_in_a_fresh_process(cuda, kit, tmp_path):
    x, y, z, left = arrays(cuda)
    g, s = capture(cuda, kit, x, y, z, left)
    path = tmp_path / "program.nbjit"
    g.save(path, bindings={"x": x, "y": y, "z": z, "left": left})
    g.launch()
    s.synchronize()
    want = y.copy_to_host()
    assert (want == (1 + 4 * 0.5 * 2) * 3).all() and (z.copy_to_host() == want).all()
    info = nbjit.inspect_bundle(path)  # a bundle: its images read as any bundle's
    assert len(info.images) == 2
    r = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert np.array_equal(np.array(out["y"], np.float32), want) and np.array_equal(np.array(out["z"]), want)
    assert out["left"] == 0 and not out["nvrtc"]
    assert out["names"][:2] == ["add", "countdown"] and out["names"][2].endswith(".scale")
    print(f"load_graph + first replay in a fresh process: {out['load_and_first_replay_ms']:.1f} ms")


def test_rebind_swaps_arrays_in_place(cuda, kit, tmp_path):
    x, y, z, left = arrays(cuda)
    g, s = capture(cuda, kit, x, y, z, left)
    path = tmp_path / "rebind.nbjit"
    g.save(path, bindings={"x": x, "y": y, "z": z, "left": left})
    x2, y2, z2, left2 = arrays(cuda, left=2)
    exe = nbjit.load_graph(path, bindings={"x": x2, "y": y2, "z": z2, "left": left2})
    assert exe.bindings["y"] == "a float32 array of shape (512,), strides (4,)"
    x3, y3, z3, left3 = arrays(cuda, left=1)
    exe.rebind(y=y3, z=z3, left=left3)
    exe.launch(s)
    s.synchronize()
    assert (y3.copy_to_host() == (1 + 0.5 * 2) * 3).all() and (z3.copy_to_host() == y3.copy_to_host()).all()
    assert (y2.copy_to_host() == 1).all()  # the arrays bound before are left alone


def test_bad_bindings_and_tampered_files_are_refused(cuda, kit, tmp_path):
    x, y, z, left = arrays(cuda)
    g, s = capture(cuda, kit, x, y, z, left)
    path = tmp_path / "g.nbjit"
    g.save(path, bindings={"x": x, "y": y, "z": z, "left": left})
    b = {"x": x, "y": y, "z": z, "left": left}
    with pytest.raises(NbjitGraphError, match=r"bindings \['left'\] are missing"):
        nbjit.load_graph(path, bindings={k: v for k, v in b.items() if k != "left"})
    with pytest.raises(NbjitGraphError, match="binding 'y' takes a float32 array of shape \\(512,\\)"):
        nbjit.load_graph(path, bindings={**b, "y": cuda.device_array(N, np.float64)})
    with pytest.raises(NbjitGraphError, match="binding 'y' takes"):
        nbjit.load_graph(path, bindings={**b, "y": cuda.device_array(N + 1, np.float32)})
    with pytest.raises(NbjitGraphError, match="no binding 'w'"):
        nbjit.load_graph(path, bindings=b).rebind(w=y)
    data = bytearray(path.read_bytes())
    at = data.find(b"\x7fELF") + 200  # a byte of the first cubin
    data[at] ^= 0xFF
    with pytest.raises(BundleError, match="damaged|digest|SHA-256"):
        nbjit.load_graph(bytes(data), bindings=b)
    assert (y.copy_to_host() == 1).all()  # nothing ran
    with pytest.raises(NbjitGraphError, match="no binding covers"):
        g.save(tmp_path / "h.nbjit", bindings={"x": x, "y": y, "z": z})  # `left` unnamed


def test_kernels_of_every_source_are_saved(cuda, kit, tmp_path):
    """A Triton kernel (a committed cache entry), a kernel of nvcc's PTX, one of a bundle and a
    @cuda.jit one through from_numba, in one saved graph loaded again with other arrays."""
    from conftest import DATA
    triton_add = nbjit.load_triton(DATA / "triton" / "add_kernel")  # out = alpha * x + y
    k_basic = nbjit.load((DATA / "nvcc" / "kernels_sm90.ptx").read_text())["k_basic"]  # y = a * x + y
    nbjit.build_bundle({"axpy": CPP}, tmp_path / "b.nbjit", archs="sm_90")
    add = nbjit.load_bundle(tmp_path / "b.nbjit")["add"]  # y += a * x
    scale = kit[2]

    def run(x, y, out, s):
        triton_add[(N + 1023) // 1024](x, y, out, N, np.float32(2.0), stream=s)
        k_basic[(N + 127) // 128, 128, s](out, x, 3.0, N)
        add[(N + 127) // 128, 128, s](out, y, 0.5, N)
        scale[(N + 127) // 128, 128, s](out, 10.0)

    rng = np.random.default_rng(0)
    hx, hy = rng.random(N, dtype=np.float32), rng.random(N, dtype=np.float32)
    x, y, out = cuda.to_device(hx), cuda.to_device(hy), cuda.device_array(N, np.float32)
    s = cuda.stream()
    with nbjit.capture(s) as g:
        run(x, y, out, s)
    g.save(tmp_path / "every.nbjit", bindings={"x": x, "y": y, "out": out})
    x2, y2, out2 = cuda.to_device(hy), cuda.to_device(hx), cuda.device_array(N, np.float32)
    exe = nbjit.load_graph(tmp_path / "every.nbjit", bindings={"x": x2, "y": y2, "out": out2})
    exe.launch(s)
    s.synchronize()
    want = ((2 * hy + hx) + 3 * hy + 0.5 * hx) * 10
    np.testing.assert_allclose(out2.copy_to_host(), want, rtol=1e-5)
    assert len(exe.nodes) == 4 and exe.nodes[0].name == triton_add.kernel.name


def test_a_condition_given_before_other_work_is_saved_with_its_kernel(cuda, kit, tmp_path):
    """The kernel that sets the condition is followed by other work in the body (a kernel and
    a copy): the condition still goes with its own node, and the loaded loop stops."""
    countdown, add, scale = kit
    s = cuda.stream()
    x, y, z, left = arrays(cuda, left=3)
    with nbjit.capture(s) as g:
        again = g.condition(default=1)
        with g.while_loop(again):
            countdown[1, 1, s](left, again)
            add[(N + 127) // 128, 128, s](y, x, 1.0, N)
            z.copy_to_device(y, stream=s)
    g.save(tmp_path / "c.nbjit", bindings={"x": x, "y": y, "z": z, "left": left})
    x2, y2, z2, left2 = arrays(cuda, left=4)
    exe = nbjit.load_graph(tmp_path / "c.nbjit", bindings={"x": x2, "y": y2, "z": z2, "left": left2})
    exe.launch(s)
    s.synchronize()
    assert (y2.copy_to_host() == 1 + 4 * 2.0).all() and (z2.copy_to_host() == y2.copy_to_host()).all()
    exe.close()
    with pytest.raises(NbjitGraphError, match="closed"):
        exe.rebind(y=y)
