"""nbjit.compile on a real GPU: NVRTC output, loaded and launched (marker `gpu`)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import nbjit

pytestmark = pytest.mark.gpu
from conftest import DATA, HOST_CUDA  # noqa: E402
SRC = (DATA / "src/nvrtc_tmpl.cu").read_text()
HDR = {"scale.cuh": (DATA / "src/scale.cuh").read_text()}


def test_compile_templates_and_launch_by_expression(cuda):
    m = nbjit.compile(SRC, name="nvrtc_tmpl.cu", headers=HDR,
                      name_expressions=["fill<float>", "fill<int>", "ns::op<float, 4>"])
    assert m.prepared_kind == "cubin"  # NVRTC targets this device: SASS, no JIT
    n = 1000
    f = cuda.device_array(n, np.float32)
    m["fill<float>"][(n + 127) // 128, 128](f, np.float32(1.25), n)
    i = cuda.device_array(n, np.int32)
    m["fill<int>"][(n + 127) // 128, 128](i, 7, n)
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    out = cuda.device_array(n, np.float32)
    m["ns::op<float, 4>"][(n + 127) // 128, 128](out, x, n)
    np.testing.assert_array_equal(f.copy_to_host(), np.full(n, 1.25, np.float32))
    np.testing.assert_array_equal(i.copy_to_host(), np.full(n, 7))
    np.testing.assert_array_equal(out.copy_to_host(), 4 * np.arange(n, dtype=np.float32))
    assert m["_Z4fillIfEvPT_S0_i"].name == m["fill<float>"].name  # the mangled name works too
    with pytest.raises(nbjit.KernelNotFoundError, match="fill<float>"):
        m["fill<double>"]


@pytest.mark.parametrize("arch", ["sm_90", "compute_90", "compute_80"])
def test_sm90_cubin_and_compute90_ptx_both_run(cuda, arch):
    """SASS for the device, its own PTX, and an older architecture's PTX the driver compiles
    for it. (sm_85, which no chip has, once compiled to compute_80 PTX: it is refused now.)"""
    src = 'extern "C" __global__ void k(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; ' \
          'if (i < n) x[i] = 3.0f * i; }'
    img = nbjit.compile_image(src, name=f"k_{arch}.cu", arch=arch)
    assert (img.kind, img.arch) == {"sm_90": ("cubin", "sm_90"), "compute_90": ("ptx", "compute_90"),
                                    "compute_80": ("ptx", "compute_80")}[arch]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nbjit.NbjitWarning)  # newer NVRTC than driver: a route note
        m = nbjit.load(img)
    x = cuda.device_array(300, np.float32)
    m["k"][3, 128](x, 300)
    np.testing.assert_array_equal(x.copy_to_host(), 3.0 * np.arange(300, dtype=np.float32))


def test_warm_cache_in_a_fresh_process(tmp_path):
    import os
    import subprocess
    import sys
    code = (f"import nbjit, numpy as np; {HOST_CUDA}; "
            "m = nbjit.compile('extern \"C\" __global__ void k(int* x) { x[threadIdx.x] = threadIdx.x; }'); "
            "x = cuda.device_array(32, np.int32); m['k'][1, 32](x); "
            "assert (x.copy_to_host() == np.arange(32)).all(); print(len(nbjit.default_cache().entries()))")
    env = {**os.environ, "NBJIT_CACHE_DIR": str(tmp_path)}
    root = str(Path(__file__).resolve().parent.parent)
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "1"


CUB_SRC = (Path(__file__).resolve().parent / "data/src/cub_reduce_sort.cu").read_text()


@pytest.mark.parametrize("pch", [True, False])
def test_cub_kernels_compiled_with_and_without_a_pch_run_alike(cuda, tmp_path, pch):
    """Two instantiations of a CUB source: with pch=True the second uses the PCH the first
    made; each sorts its block and sums the first items as CUB says, either way."""
    from nbjit.toolchain import pch as P
    from nbjit.toolchain.identity import cccl_include_dir
    if cccl_include_dir() is None:
        pytest.skip("no CCCL headers beside CUDA's (the nvidia-cuda-cccl wheel, which nbjit's cu13 extra brings)")
    cache = nbjit.Cache(tmp_path)
    used = P.STORE.stats["used"]
    m1 = nbjit.compile(CUB_SRC, name="cub_rs.cu", name_expressions=["reduce_sort<int, 128, 4>"], cache=cache, pch=pch)
    m2 = nbjit.compile(CUB_SRC, name="cub_rs.cu", name_expressions=["reduce_sort<float, 128, 4>"], cache=cache,
                       pch=pch)
    assert (P.STORE.stats["used"] > used) == pch
    rng = np.random.default_rng(1)
    for m, expr, dtype in ((m1, "reduce_sort<int, 128, 4>", np.int32), (m2, "reduce_sort<float, 128, 4>", np.float32)):
        blocks = 3
        x = rng.integers(-1000, 1000, blocks * 128 * 4).astype(dtype)
        out = cuda.device_array_like(x)
        sums = cuda.device_array(blocks, dtype)
        m[expr][blocks, 128](cuda.to_device(x), out, sums)
        got = out.copy_to_host().reshape(blocks, 128 * 4)
        # BlockRadixSort with a blocked arrangement: each block's 512 items sorted
        np.testing.assert_array_equal(got, np.sort(x.reshape(blocks, 128 * 4), axis=1))
        first = x.reshape(blocks, 128, 4)[:, :, 0]
        np.testing.assert_allclose(sums.copy_to_host(), first.sum(axis=1, dtype=np.float64).astype(dtype))


def test_the_target_on_a_gpu(cuda, tmp_path):
    """With a GPU, a named architecture still loads at once (only a machine without one waits
    for first use); without one, the device's is compiled for; a repeated call is the module
    the first one made in this context."""
    cc = cuda.get_current_device().compute_capability
    device_arch = f"sm_{cc[0]}{cc[1]}"
    src = 'extern "C" __global__ void k(int* x) { x[threadIdx.x] = 2 * threadIdx.x; }'
    cache = nbjit.Cache(tmp_path)
    named = nbjit.compile(src, arch=device_arch, cache=cache)
    assert "loads on first use" not in repr(named) and named.prepared_kind == "cubin"
    assert nbjit.compile(src, arch=device_arch, cache=cache) is named
    assert nbjit.compile_image(src, cache=cache).arch == device_arch
    default = nbjit.compile(src, cache=cache)
    assert default.image.data == named.image.data and nbjit.compile(src, cache=cache) is default
    x = cuda.device_array(32, np.int32)
    named["k"][1, 32](x)
    np.testing.assert_array_equal(x.copy_to_host(), 2 * np.arange(32))


def _needs_report(img) -> None:
    """Skip where NVRTC gave no ptxas report for a -Xptxas=-v compile: NVRTC 13.0 on the H200
    (driver 580) leaves it out of the program log in some processes and not others: raw NVRTC
    calls in such a process get none either, so it is NVRTC's doing; whether the CUDA driver
    was initialised did not decide it. NVRTC 13.5 has always given it. What nbjit does with a
    report is tested here where there is one, and without a GPU on every CI run."""
    if "ptxas" not in (img.log or ""):
        pytest.skip("NVRTC gave no ptxas report for -Xptxas=-v in this process (NVRTC 13.0 does so at times)")


def test_attributes_of_a_spilling_kernel(cuda, tmp_path):
    """kernel.attributes carries the spill bytes ptxas reported (asked with -Xptxas=-v) beside
    the driver's numbers, from a compile and from a cache hit in a fresh cache object."""
    for _ in range(2):
        m = nbjit.compile(DATA / "src/spill.cu", options=["-Xptxas=-v"], cache=nbjit.Cache(tmp_path))
        _needs_report(m.image)
        a = m["spills"].attributes
        told = m.image.resources["spills"]
        assert (a.spill_stores, a.spill_loads, a.frame) == (told["spill_stores"], told["spill_loads"],
                                                            told["stack_frame"])
        assert a.spill_stores > 0 and a.registers <= 32


def test_a_compile_keeps_its_ptxas_report_where_its_bytes_were_loaded_already(cuda, tmp_path):
    """The same cubin loaded first without ptxas's report (as a file: spill_sm90.cubin is NVRTC's
    -v output byte for byte, and test_occupancy loads it), then compiled with -Xptxas=-v for the
    device: the compile's module has its image (log, report, spill bytes) and shares the copy
    loaded already; the first module keeps its own image."""
    from nbjit.toolchain.nvrtc import compile_image
    src = DATA / "src/spill.cu"
    cc = cuda.get_current_device().compute_capability
    made = compile_image(src, arch=f"sm_{cc[0]}{cc[1]}", options=["-Xptxas=-v"], cache=nbjit.Cache(tmp_path))
    _needs_report(made)
    plain = nbjit.load(made.data, name="spill_sm90.cubin")
    assert plain["spills"].attributes.spill_stores is None and not plain.image.log
    m = nbjit.compile(src, options=["-Xptxas=-v"], cache=nbjit.Cache(tmp_path))
    assert m.image.name == "spill.cu" and "ptxas info" in m.image.log, (m, m.image.name, m.image.log[:200])
    told = m.image.resources["spills"]
    a = m["spills"].attributes
    assert (a.spill_stores, a.spill_loads, a.frame) == (told["spill_stores"], told["spill_loads"], told["stack_frame"])
    assert m._live is plain._live and plain["spills"].attributes.spill_stores is None
    out = cuda.device_array(32, np.float32)
    m["plain"][1, 32](out)
    np.testing.assert_array_equal(out.copy_to_host(), np.ones(32, np.float32))


def test_a_repeated_compile_sees_an_edited_header_in_the_working_directory(cuda, tmp_path, monkeypatch):
    """nbjit.compile's memo of modules holds no source that reads a header from disk: the
    header's edit is the next call's kernel."""
    monkeypatch.chdir(tmp_path)
    src = '#include "v.h"\nextern "C" __global__ void k(int* x) { x[0] = V; }\n'
    out, cache = cuda.device_array(1, np.int32), nbjit.Cache(tmp_path / "c")
    for v in (1, 2):
        (tmp_path / "v.h").write_text(f"#define V {v}\n")
        nbjit.compile(src, cache=cache)["k"][1, 1](out)
        assert out.copy_to_host()[0] == v
