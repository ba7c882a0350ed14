"""The bare host (nbjit.gpu.host.Bare): nbjit with no Numba at all. Chosen by NBJIT_HOST=bare or
where no Numba is installed (a fresh process whose imports of numba, numba_cuda, numba_cuda_mlir
and llvmlite fail stands for a machine without them); bundles, images and compiled sources load
lazily and describe themselves there, and nothing imports a Numba. Its contexts and arrays on a
GPU: tests/test_gpu_bare.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nbjit import NbjitHostError
from nbjit.gpu.host import HOSTS, Bare, BareContext

from conftest import DATA  # noqa: E402

BUNDLE = DATA.parent.parent / "examples/bundle_package/src/nbjit_demo_kernels/kernels.nbjit"

# a machine without any Numba: their imports fail, as they do where none is installed
NO_NUMBA = r"""
import sys
class NoNumba:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("numba", "numba_cuda", "numba_cuda_mlir", "llvmlite"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoNumba())
"""


def run(code: str, **env: str) -> dict:
    """``code`` in a fresh interpreter without Numba; what it printed last, as JSON."""
    e = {k: v for k, v in os.environ.items() if k not in ("NBJIT_HOST", "PYTHONWARNINGS")}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", NO_NUMBA + code], capture_output=True, text=True, env=e, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_without_numba_the_bare_host_serves_and_bundles_describe_themselves():
    out = run(f"""
import json, pickle, nbjit
from nbjit.gpu.host import current_host
mod = nbjit.load_bundle({str(BUNDLE)!r}, name="axpy", lazy=True)
numba_kernel = nbjit.load_bundle({str(BUNDLE)!r}, name="scale_rows", lazy=True)["scale_rows"]
again = pickle.loads(pickle.dumps(numba_kernel))
try:  # (where NVRTC is installed: nbjit-core's cu13 extra; the CI's bare leg has none)
    compiled = list(nbjit.compile("extern \\"C\\" __global__ void k(float *a) {{ a[0] = 1; }}", arch="sm_90").kernels)
except nbjit.NbjitCompileError as e:
    compiled = str(e)
print(json.dumps({{"host": current_host().name, "kernels": sorted(mod.kernels),
                  "numba_params": [p.ctype for p in numba_kernel.params],
                  "pickled": [p.ctype for p in again.params], "compiled": compiled,
                  "numba_modules": sorted(m for m in sys.modules if m.split(".")[0] in
                                          ("numba", "numba_cuda", "numba_cuda_mlir", "llvmlite"))}}))
""")
    assert out["host"] == "bare"
    assert "axpy" in out["kernels"]
    assert out["numba_params"] == out["pickled"] == ["array(float32, 2d, A)", "array(float32, 1d, C)"]
    assert out["compiled"] == ["k"] or out["compiled"].startswith("NVRTC is not installed")
    assert out["numba_modules"] == []


def test_asked_for_a_gpu_without_one_it_says_so_in_one_line():
    out = run(f"CUBIN = {str(DATA / 'nvcc' / 'kernels129_sm_80.cubin')!r}\n" + """
import json, nbjit
from nbjit.gpu.host import current_host
try:
    import cuda.bindings.driver as cu
    has_gpu = cu.cuInit(0)[0] == 0 and cu.cuDeviceGetCount()[1] > 0
except Exception:
    has_gpu = False
said = None
if not has_gpu:
    try:
        nbjit.load(CUBIN)
    except nbjit.NbjitError as e:
        said = [type(e).__name__, str(e)]
try:
    nbjit.from_numba(len, "void()")
except nbjit.NbjitError as e:
    refused = [type(e).__name__, str(e)]
print(json.dumps({"host": current_host().name, "gpu": has_gpu, "said": said, "refused": refused}))
""", NBJIT_HOST="bare")
    assert out["host"] == "bare"
    assert out["refused"][0] == "NbjitLoadError"
    assert out["refused"][1].startswith("builtin_function_or_method is not a @cuda.jit kernel (and no Numba serves "
                                        "in this process: nbjit-core's 'numba' extra: pip install")
    if out["gpu"]:
        pytest.skip("this machine has a GPU (its contexts: test_gpu_bare.py)")
    kind, text = out["said"]
    assert kind == "NbjitLoadError" and text.startswith("no usable CUDA driver (") and "\n" not in text, text


def test_named_it_serves_beside_an_installed_numba_and_imports_none():
    pytest.importorskip("numba.cuda")
    code = ("import sys, json, nbjit\nfrom nbjit.gpu.host import current_host\n"
            f"nbjit.load_bundle({str(BUNDLE)!r}, name='scale_rows', lazy=True)['scale_rows'].params\n"
            "print(json.dumps([current_host().name, 'numba' in sys.modules]))")
    e = {**os.environ, "NBJIT_HOST": "bare"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)
    assert json.loads(r.stdout.splitlines()[-1]) == ["bare", False], r.stderr


def test_what_needs_a_numba_names_what_to_install():
    bare = HOSTS[-1]
    assert isinstance(bare, Bare) and bare.name == "bare"
    with pytest.raises(NbjitHostError, match=r"nbjit serves no Numba in this process \(the bare host: "
                                             r"NBJIT_HOST=bare, or no Numba installed\), and compiling or "
                                             r"typing a @cuda.jit kernel needs one: install .* or numba-cuda-mlir, "
                                             r"or ship the kernel in a bundle"):
        bare.kernel_types("void(float32[::1])")
    ctx = BareContext(0x1234, 0, (9, 0))
    assert (bare.context_key(ctx), bare.context_ordinal(ctx), bare.context_cc(ctx)) == (0x1234, 0, (9, 0))
    assert repr(ctx) == "<nbjit context 0x1234 on device 0>"
    assert bare.pointer_getter(int) is None and bare.error_code(ValueError()) is None
