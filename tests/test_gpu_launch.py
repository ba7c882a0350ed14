"""Loading and launching on a real GPU (marker `gpu`; skipped where there is none)."""
from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import warnings
import weakref

import numpy as np
import pytest

import nbjit
from nbjit.gpu.driver import as_int
from nbjit import (KernelNotFoundError, NbjitArgumentError, NbjitLaunchError, NbjitLoadError, NbjitWarning)

pytestmark = pytest.mark.gpu
from conftest import DATA, HOST_CUDA  # noqa: E402


def axpy_check(cuda, k, n=10_000, stream=None, sync=None):
    rng = np.random.default_rng(0)
    x = rng.random(n, dtype=np.float32)
    y = rng.random(n, dtype=np.float32)
    dx, dy = cuda.to_device(x), cuda.to_device(y)
    grid = (n + 255) // 256
    if stream is None:
        k[grid, 256](dy, dx, np.float32(2.5), n)
    else:
        k[grid, 256, stream](dy, dx, 2.5, n)
        (sync or stream.synchronize)()
    np.testing.assert_allclose(dy.copy_to_host(), 2.5 * x + y, rtol=1e-6)


# ------------------------------------------------------------------ loading


def test_load_ptx_and_launch(cuda, kernels):
    assert "k_basic" in kernels.kernels and kernels.route == "driver"
    axpy_check(cuda, kernels["k_basic"])
    axpy_check(cuda, kernels.k_basic)  # attribute access


@pytest.mark.parametrize("rel", ["nvcc/kernels_sm_90.cubin", "nvcc/kernels_sm_90a.cubin",
                                 "nvcc/kernels_multi.fatbin", "nvcc/kernels_90a.fatbin",
                                 "nvcc/kernels_multi_lz4.fatbin", "nvcc/kernels_G_sm90.ptx",
                                 "nvcc/kernels_lineinfo_sm90.ptx"])
def test_load_other_images(cuda, rel):
    m = nbjit.load(DATA / rel)
    k = m.get_kernel("k_basic", signature="ptr, ptr, f32, i32") if rel.endswith(("cubin", "fatbin")) \
        else m["k_basic"]
    axpy_check(cuda, k)


def test_cubin_unknown_types_take_numpy_scalars(cuda):
    m = nbjit.load(DATA / "nvcc/kernels_sm_90.cubin")
    k = m["k_basic"]
    assert [p.type for p in k.params] == ["unknown"] * 4
    axpy_check(cuda, k)  # np.float32 for the 4-byte float, a Python int for the 4-byte int


def test_whole_fatbin_when_zstd_unreadable(cuda, no_zstd):
    from nbjit.read.fatbin import inspect_fatbin
    raw = (DATA / "nvcc/kernels_multi.fatbin").read_bytes()
    fb = inspect_fatbin(raw)
    ptx = fb.entries[1]
    assert ptx.payload is None
    # keep the sm_80 cubin and the zstd PTX, drop the sm_90 cubin: this device must JIT the PTX
    end = ptx.offset + ptx.stored_size
    small = raw[:8] + (end - 16).to_bytes(8, "little") + raw[16:end]
    with pytest.warns(NbjitWarning, match="whole fatbin"):
        m = nbjit.load(small, name="multi-no-sm90.fatbin")
    assert m.prepared_kind == "fatbin"
    axpy_check(cuda, m.get_kernel("k_basic", signature="ptr, ptr, f32, i32"))


def test_same_bytes_same_module_and_unload(cuda):
    raw = (DATA / "nvcc/cluster_sm90.ptx").read_bytes()
    a = nbjit.load(raw)
    b = nbjit.load(raw.decode())
    assert a is b
    ref = weakref.ref(a)
    fin = a._live.finalizer
    k = a["k_cluster"]
    del a, b
    gc.collect()
    assert ref() is not None  # the kernel keeps its module loaded
    del k
    gc.collect()
    assert ref() is None and not fin.alive


def test_interpreter_exit_is_quiet():
    code = (f"import nbjit, numpy as np; {HOST_CUDA}; "
            f"m = nbjit.load({str(DATA / 'nvcc/kernels_sm90.ptx')!r}); k = m['k_basic']; "
            "y = cuda.to_device(np.zeros(4, np.float32)); k[1, 4](y, y, 1.0, 4); cuda.synchronize()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


def test_debug_ptx_is_stripped_by_default(cuda):
    stripped = nbjit.load(DATA / "nvcc/kernels_G_sm90.ptx")
    kept = nbjit.load(DATA / "nvcc/kernels_G_sm90.ptx", keep_debug=True)
    assert stripped is not kept
    r1, r2 = stripped["k_lb"].attributes.registers, kept["k_lb"].attributes.registers
    assert r1 < r2, (r1, r2)  # a debug target compiles unoptimised
    axpy_check(cuda, kept["k_basic"])


def test_jit_log_and_load_error(cuda):
    m = nbjit.load(DATA / "nvcc/kernels_sm90.ptx")
    assert isinstance(m.jit_log, str)
    bad = (DATA / "nvcc/kernels_sm90.ptx").read_text().replace("fma.rn.f32", "fma.bogus.f32", 1)
    with pytest.raises(NbjitLoadError) as e:
        nbjit.load(bad, name="bad.ptx")
    msg = str(e.value)
    assert "bad.ptx" in msg and "PTX 9.0 for sm_90" in msg and "CUDA_ERROR_INVALID_PTX" in msg
    assert "Unknown modifier '.bogus'" in msg  # the JIT's own error log


def test_cubins_load_without_logs_and_refused_ones_say_why(cuda):
    from nbjit.gpu import driver as _driver
    m = nbjit.load(DATA / "nvcc/kernels_sm_90.cubin")
    assert m.prepared_kind == "cubin" and m.jit_log == ""
    with pytest.raises(NbjitLoadError, match=r"^not a cubin: the driver could not load it: CUDA_ERROR_INVALID_IMAGE"):
        _driver.load_module(b"\x7fELF" + bytes(60), "not a cubin", "cubin")


def test_newer_ptx_nvjitlink_or_lowered(cuda):
    from nbjit.toolchain.nvjitlink import nvjitlink_version
    with pytest.warns(NbjitWarning) as w:
        m = nbjit.load(DATA / "nvrtc/tmpl_compute90.ptx")  # PTX 9.5 from NVRTC 13.5
    nv = nvjitlink_version()
    assert m.route == ("nvjitlink" if nv and nv >= (13, 5) else "lowered")
    assert len([x for x in w if issubclass(x.category, NbjitWarning)]) == 1
    k = m["_Z4fillIfEvPT_S0_i"]
    out = cuda.device_array(100, np.float32)
    k[1, 128](out, np.float32(3.0), 100)
    np.testing.assert_array_equal(out.copy_to_host(), np.full(100, 3.0, np.float32))


def test_lowered_route(cuda, monkeypatch):
    monkeypatch.setattr("nbjit.toolchain.nvjitlink.nvjitlink_version", lambda: None)  # (as if nvJitLink were missing)
    text = (DATA / "nvrtc/tmpl_sm90.ptx").read_text() + "\n// lowered-route copy\n"
    with pytest.warns(NbjitWarning, match="lowered"):
        m = nbjit.load(text, name="tmpl_lowered.ptx")
    assert m.route == "lowered"
    out = cuda.device_array(64, np.int32)
    m["_Z4fillIiEvPT_S0_i"][1, 64](out, 7, 64)
    np.testing.assert_array_equal(out.copy_to_host(), np.full(64, 7))


def test_triton_ptx_and_cubin(cuda):
    n = 5000
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, dtype=np.float32)
    for rel in ("triton/add_kernel/add_kernel.ptx", "triton/add_kernel/add_kernel.cubin"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NbjitWarning)
            m = nbjit.load(DATA / rel)
        k = m["add_kernel"]
        dx, dy, out = cuda.to_device(x), cuda.to_device(y), cuda.device_array(n, np.float32)
        args = (dx, dy, out, n, np.float32(0.5), None, None)
        if rel.endswith("cubin"):
            args = (dx, dy, out, n, np.float32(0.5), 0, 0)
        k[(n + 1023) // 1024, 128](*args)
        np.testing.assert_allclose(out.copy_to_host(), 0.5 * x + y)


# ------------------------------------------------------------------ arguments


class S24(ctypes.Structure):
    _fields_ = [("d", ctypes.c_double), ("i", ctypes.c_int), ("f", ctypes.c_float), ("l", ctypes.c_longlong)]


def test_struct_by_value(cuda, kernels):
    k = kernels["k_struct"]
    out = cuda.device_array(1, np.float64)
    dt = np.dtype([("d", "<f8"), ("i", "<i4"), ("f", "<f4"), ("l", "<i8")])
    for value in (S24(1.5, 2, 0.25, 10), np.array((1.5, 2, 0.25, 10), dtype=dt)[()], bytes(S24(1.5, 2, 0.25, 10))):
        out.copy_to_device(np.zeros(1))
        k[1, 1](value, out)
        assert out.copy_to_host()[0] == 1.5 + 2 + 0.25 + 10
    with pytest.raises(NbjitArgumentError, match="parameter 0.*24"):
        k[1, 1](b"\0" * 16, out)


def test_small_types(cuda, kernels):
    out = cuda.device_array(1, np.float32)
    bf16 = np.float32(2.0).view(np.uint32) >> 16
    k = kernels["k_small"]
    k[1, 1](np.float16(1.5), int(bf16).to_bytes(2, "little"), True, 3, np.int16(-4), out)
    assert out.copy_to_host()[0] == 1.5 + 2.0 + 1 + 3 - 4
    with pytest.raises(NbjitArgumentError, match="parameter 4.*np.int16"):  # nvcc writes short as .u16
        k[1, 1](np.float16(1.5), b"\0\0", True, 3, -4, out)


def test_widths(cuda, kernels):
    out = cuda.device_array(10, np.float64)
    kernels["k_widths"][1, 1](np.int8(-5), 250, np.int16(-300), 60000, np.int32(-70000), 4_000_000_000,
                              np.int64(-(2 ** 40)), 2 ** 63, np.float32(0.5), 0.125, out)
    np.testing.assert_array_equal(out.copy_to_host(),
                                  [-5, 250, -300, 60000, -70000, 4e9, -(2 ** 40), 2.0 ** 63, 0.5, 0.125])


def test_every_ptx_param_type_packs(cuda):
    # ptxas accepts a `.ptr .shared` kernel parameter, the driver refuses the module
    # (CUDA_ERROR_INVALID_IMAGE, seen on the H200): drop that one parameter here
    text = (DATA / "hand/traps.ptx").read_text().replace("\t.param .u64 .ptr .shared p_sptr,\n", "")
    m = nbjit.load(text, name="traps-no-shared-ptr.ptx")
    k = m["k_all"]  # pointers, every scalar width, .f16, arrays, .b128: verified against the driver at load
    k[1, 32](0, 0, None, 1, -1, 2, -2, 3, -3, 4, -4, 1.0, 1.0, 1.0, 5, 6, 7, b"\0" * 12, b"\0" * 40,
             b"\0" * 24, b"\0" * 16)
    cuda.synchronize()


def test_argument_errors(cuda, kernels):
    k = kernels["k_basic"]
    dy = cuda.device_array(4, np.float32)
    with pytest.raises(NbjitArgumentError, match=r"takes 4 arguments, got 3.*k_basic\(ptr|takes 4 arguments"):
        k[1, 4](dy, dy, 1.0)
    with pytest.raises(NbjitArgumentError, match="copy it to the device"):
        k[1, 4](dy, np.zeros(4, np.float32), 1.0, 4)
    with pytest.raises(NbjitArgumentError, match="parameter 3.*negative"):
        k[1, 4](dy, dy, 1.0, -1)
    with pytest.raises(NbjitArgumentError, match="parameter 2.*not a number"):
        k[1, 4](dy, dy, "a", 4)
    with pytest.raises(NbjitArgumentError, match="parameter 3.*float"):
        k[1, 4](dy, dy, 1.0, 4.0)
    with pytest.raises(NbjitArgumentError, match="parameter 3.*does not fit"):
        k[1, 4](dy, dy, 1.0, 2 ** 40)
    k[1, 4](dy, dy, 1.0, np.int32(-1))  # a typed signed value is sent as its bits


def test_missing_kernel_lists_names(kernels):
    with pytest.raises(KernelNotFoundError) as e:
        kernels["k_basik"]
    assert isinstance(e.value, KeyError)
    assert str(e.value).index("k_basic") < str(e.value).index("k_widths")
    with pytest.raises(AttributeError):
        getattr(kernels, "nothing_like_this")  # noqa: B009


# ------------------------------------------------------------------ launching


def test_streams(cuda, kernels):
    k = kernels["k_basic"]
    s = cuda.stream()
    axpy_check(cuda, k, stream=s)

    class Proto:
        def __cuda_stream__(self):
            return (0, as_int(s.handle))

    axpy_check(cuda, k, stream=Proto(), sync=s.synchronize)
    axpy_check(cuda, k, stream=as_int(s.handle), sync=s.synchronize)
    axpy_check(cuda, k, stream=cuda.default_stream())


def test_dynamic_shared_memory_and_optin(cuda, kernels):
    k = kernels["k_dyn"]
    n = 256
    out = cuda.device_array(n, np.float32)
    static = k.attributes.shared
    k[1, n, 0, 48 * 1024 - static](out, n)  # exactly the default limit: no opt-in
    assert k.shared_optin == 0
    k[1, n, 0, 48 * 1024 - static + 1](out, n)  # one byte more: opted in
    assert k.shared_optin == 48 * 1024 - static + 1
    np.testing.assert_array_equal(out.copy_to_host(), np.arange(n, dtype=np.float32)[::-1])
    from nbjit.gpu import driver as _driver
    top = _driver.device_info(0).max_shared_optin - static
    k[1, n, 0, top](out, n)
    cuda.synchronize()
    with pytest.raises(NbjitLaunchError, match="exceed"):
        k[1, n, 0, top + 1](out, n)


def test_globals(cuda):
    m = nbjit.load(DATA / "nvcc/kernels_sm90.ptx")
    g = m.get_global("g_arr")
    assert g.size == 64 and g.ptr
    arr = g.as_array(np.float32)
    from nbjit.gpu.host import current_host
    assert type(arr) is current_host().module("devicearray").DeviceNDArray  # the host's own array type
    arr.copy_to_device(np.arange(16, dtype=np.float32))
    counter = m.get_global("g_counter").as_array(np.uint32)
    counter.copy_to_device(np.zeros(1, np.uint32))
    out = cuda.device_array(16, np.float32)
    m["k_globals"][1, 32](out)
    tab = np.zeros(8, np.float32)
    tab[:2] = [0.5, 1.5]
    np.testing.assert_array_equal(out.copy_to_host(), np.arange(16) + tab[np.arange(16) % 8])
    assert counter.copy_to_host()[0] == 1
    with pytest.raises(KernelNotFoundError, match="g_arr"):
        m.get_global("g_ar")


def test_launch_failure_names_config(cuda, kernels):
    dy = cuda.device_array(4, np.float32)
    with pytest.raises(NbjitLaunchError) as e:
        kernels["k_basic"][1, 2048](dy, dy, 1.0, 4)
    msg = str(e.value)
    assert "k_basic" in msg and "(2048, 1, 1)" in msg and "CUDA_ERROR_INVALID_VALUE" in msg
    with pytest.raises(NbjitLaunchError, match="grid"):
        kernels["k_basic"][0, 32]
    with pytest.raises(NbjitLaunchError, match="kernel\\[grid, block\\]"):
        kernels["k_basic"][1]


def test_cluster_and_cooperative(cuda):
    m = nbjit.load(DATA / "nvcc/cluster_sm90.ptx")
    out = cuda.device_array(4 * 32, np.float32)
    m["k_cluster"][4, 32](out)
    np.testing.assert_array_equal(out.copy_to_host(), np.repeat(np.arange(4, dtype=np.float32), 32))
    with pytest.raises(NbjitLaunchError, match="multiple of its cluster"):
        m["k_cluster"][3, 32](out)
    k = nbjit.load(DATA / "nvcc/kernels_sm90.ptx")["k_basic"]
    n = 1024
    x = np.arange(n, dtype=np.float32)
    dx, dy = cuda.to_device(x), cuda.to_device(np.zeros(n, np.float32))
    k.launch(8, 128, dy, dx, 2.0, n, cluster=(2, 1, 1))
    np.testing.assert_array_equal(dy.copy_to_host(), 2 * x)
    k.launch(8, 128, dy, dx, 1.0, n, cooperative=True)
    np.testing.assert_array_equal(dy.copy_to_host(), 3 * x)


def test_attributes_and_occupancy(kernels):
    from nbjit.read.cubin import inspect_cubin
    k = kernels["k_lb"]
    a = k.attributes
    cub = inspect_cubin((DATA / "nvcc/kernels_sm_90.cubin").read_bytes()).entry("k_lb")
    assert a.registers == cub.registers and a.max_threads_per_block == 256
    assert a.shared == cub.shared  # the driver does not count the 1 KiB reserve
    assert a.ptx_version == 90 and a.binary_version == 90
    assert 1 <= k.max_active_blocks_per_sm(256) <= 8
    grid, block = k.suggested_block_size()
    assert grid >= 1 and 32 <= block <= 256


def test_bind_relaunch(cuda, kernels):
    n = 1000
    x = np.arange(n, dtype=np.float32)
    dx, dy = cuda.to_device(x), cuda.to_device(np.zeros(n, np.float32))
    b = kernels["k_basic"].bind(4, 256, dy, dx, 1.0, n)
    for _ in range(3):
        b()
    np.testing.assert_array_equal(dy.copy_to_host(), 3 * x)


# ------------------------------------------------------------------ working with @cuda.jit


def test_pipeline_with_cuda_jit_on_one_stream(cuda, kernels):
    @cuda.jit
    def fill(a):
        i = cuda.grid(1)
        if i < a.size:
            a[i] = i

    @cuda.jit
    def square(a):
        i = cuda.grid(1)
        if i < a.size:
            a[i] = a[i] * a[i]

    n = 1 << 16
    s = cuda.stream()
    x = cuda.device_array(n, np.float32, stream=s)
    y = cuda.device_array(n, np.float32, stream=s)
    g = (n + 255) // 256
    fill[g, 256, s](x)
    fill[g, 256, s](y)
    kernels["k_basic"][g, 256, s](y, x, 3.0, n)  # y = 3x + y = 4i
    square[g, 256, s](y)
    s.synchronize()
    i = np.arange(n, dtype=np.float32)
    np.testing.assert_array_equal(y.copy_to_host(), (4 * i) ** 2)


def test_pure_python_launch_path(cuda, monkeypatch):
    """The same launches without the C extension (what a build without a compiler runs)."""
    from nbjit.gpu import extension as _native
    from nbjit.gpu import driver as _driver
    monkeypatch.setenv("NBJIT_PURE_PYTHON", "1")
    _native.extension.cache_clear()
    _driver.backend.cache_clear()
    try:
        m = nbjit.load(DATA / "nvcc/kernels_sm90.ptx")
        k = m.get_kernel("k_basic")
        k._s.launchers.clear()  # launchers cached by earlier tests were made for the C path
        assert type(k[1, 32]).__name__ == "_PyLauncher"
        axpy_check(cuda, k)
        out = cuda.device_array(10, np.float64)
        m["k_widths"][1, 1](np.int8(-5), 250, np.int16(-300), 60000, np.int32(-70000), 4_000_000_000,
                            np.int64(-(2 ** 40)), 2 ** 63, np.float32(0.5), 0.125, out)
        assert out.copy_to_host()[0] == -5
        with pytest.raises(NbjitArgumentError, match="negative"):
            k[1, 4](out, out, 1.0, -1)
        b = k.bind(1, 4, out, out, 1.0, 4)
        b()
        cuda.synchronize()
    finally:
        _native.extension.cache_clear()
        _driver.backend.cache_clear()
        m["k_basic"]._s.launchers.clear()


def test_the_current_context_from_c_is_the_bindings(cuda):
    """current_context_key (the memo of nbjit.compile, the several-GPU check) asks the driver
    through nbjit's C extension once a context has been found current twice: the same handle
    as cuda.bindings'."""
    from cuda.bindings import driver as cu

    from nbjit.gpu import extension as _native
    from nbjit.gpu import driver as _driver
    from nbjit.gpu.host import current_host
    ctx = cuda.current_context()
    key = current_host().context_key(ctx)
    assert _driver.current_context_key() == int(cu.cuCtxGetCurrent()[1]) == key
    assert _driver.current_context_key() == key  # (the C call is set up by the second ask, where built)
    assert _driver.context_key_source() == ("c" if _native.extension() is not None else "python")
    assert _driver.current_context_key() == key  # and answers from then on


CONTEXTS = r'''
import threading
from cuda.bindings import driver as cu
import cupy as cp
import nbjit
from nbjit.gpu.host import current_host
host = current_host()
cp.zeros(1)  # CuPy makes the device's primary context current; Numba has made nothing yet
print(f"cupy-first|{host._primary_current() is None}")
cuda = host.module("cuda")
ctx = host.current_context()  # Numba's own call makes its object for that context
print(f"numba|{ctx is cuda.current_context()}|{host.context_key(ctx) == int(cu.cuCtxGetCurrent()[1])}")
print(f"fast|{host._primary_current() is ctx}|{host.current_context() is ctx}")
out = []
def thread():
    out.append(host._primary_current() is None)  # no context in a new thread
    out.append(host.current_context() is ctx)  # Numba's call makes it current there
    out.append(host._primary_current() is ctx)
t = threading.Thread(target=thread)
t.start(); t.join()
print("thread|" + "|".join(map(str, out)))
err, other = cu.cuCtxCreate(None, 0, cu.cuDeviceGet(0)[1])  # a context Numba did not make, made current
print(f"other|{int(err)}|{host._primary_current() is None}")
try:
    host.current_context()
    print("refused|no")
except nbjit.NbjitError as e:
    print(f"refused|{type(e).__name__}|{'is not a device' in str(e)}")
cu.cuCtxPopCurrent()
cu.cuCtxDestroy(other)
print(f"back|{host.current_context() is ctx}")
'''


def test_the_current_context_is_numbas_object_found_cheaply_or_by_numba(cuda):
    """What nbjit loads into is what cuda.current_context() returns: found with two driver
    calls where Numba has made the current context (a warm start's first call), by Numba's own
    call otherwise (a context CuPy made first, a new thread, and a context Numba did not make,
    which Numba refuses: nbjit says what to do)."""
    pytest.importorskip("cupy")
    r = subprocess.run([sys.executable, "-c", CONTEXTS], capture_output=True, text=True, timeout=120)
    rows = [line.split("|") for line in r.stdout.splitlines() if "|" in line]
    assert rows == [["cupy-first", "True"], ["numba", "True", "True"], ["fast", "True", "True"],
                    ["thread", "True", "True", "True"], ["other", "0", "True"],
                    ["refused", "NbjitLoadError", "True"], ["back", "True"]], r.stdout + r.stderr


FAULT = r'''
import numpy as np, nbjit
from nbjit.gpu.host import current_host
cuda = current_host().module("cuda")
m = nbjit.compile('extern "C" __global__ void poke(float* p) { p[0] = 1.0f; }\n'
                  'extern "C" __global__ void other(float* p) { }')
m["poke"][1, 1](None)  # NULL: the kernel faults on the device
try:
    cuda.synchronize()
except Exception as e:
    print(f"sync|{type(e).__name__}")
for what, f in (("lookup", lambda: m["other"]), ("launch", lambda: m["poke"][1, 1](None))):
    try:
        f()
        print(f"{what}|ok")
    except nbjit.NbjitError as e:
        print(f"{what}|{type(e).__name__} " + str(e).replace("\n", " "))
'''


def test_after_a_kernel_faulted_errors_say_so(cuda):
    """A kernel that faults breaks the context for good (a sticky error): what fails after it
    says that, not "no kernel 'other'" (a look-up the broken context refused)."""
    r = subprocess.run([sys.executable, "-c", FAULT], capture_output=True, text=True, timeout=120)
    lines = dict(line.split("|", 1) for line in r.stdout.splitlines() if "|" in line)
    assert {"sync", "lookup", "launch"} <= set(lines), r.stdout + r.stderr
    hint = nbjit.gpu.driver.STICKY_HINT
    assert lines["lookup"].startswith("NbjitLoadError looking up kernel 'other' failed: CUDA_ERROR_ILLEGAL_ADDRESS")
    assert lines["lookup"].endswith(f"({hint})")
    assert lines["launch"].startswith("NbjitLaunchError ") and lines["launch"].endswith(f"({hint})")


def test_launch_shapes_past_cuda_limits_are_named(cuda, kernels):
    k = kernels["k_basic"]
    y = cuda.device_array(4, np.float32)
    with pytest.raises(NbjitLaunchError) as e:
        k[1, 2048](y, y, 1.0, 4)
    assert str(e.value).endswith("invalid argument: a block of 2048 threads, and this kernel runs at most "
                                 f"{k.attributes.max_threads_per_block} per block")
    with pytest.raises(NbjitLaunchError, match="grid y is 70000, and CUDA allows at most 65535$"):
        k[(1, 70000), 32](y, y, 1.0, 4)
    k[1, 4](y, y, 1.0, 4)  # the refusals left the context usable
    cuda.synchronize()


FRESH_THREAD = r'''
import sys, threading, numpy as np, nbjit
from nbjit.gpu.host import current_host
cuda = current_host().module("cuda")
k = nbjit.load(sys.argv[1])["k_basic"]  # y = a*x + y
n = 1000
x = cuda.to_device(np.arange(n, dtype=np.float32))
ways = {"index": lambda y: k[4, 256](y, x, np.float32(1), n),
        "bind": lambda y: k.bind(4, 256, y, x, np.float32(1), n)(),
        "launch": lambda y: k.launch(4, 256, y, x, np.float32(1), n, pdl=True),
        "twice": lambda y: (k[4, 256](y, x, np.float32(1), n), k[4, 256](y, x, np.float32(1), n)),
        "cooperative": lambda y: k.launch(4, 256, y, x, np.float32(1), n, cooperative=True),
        "occupancy": lambda y: k.max_active_blocks_per_sm(256) > 0 and k.suggested_block_size()[1] > 0
                               and k[4, 256](y, x, np.float32(1), n)}
ys = {w: cuda.to_device(np.zeros(n, np.float32)) for w in ways}
said = {}
def run(w):  # a thread that has made no CUDA call: no context is current in it
    try:
        ways[w](ys[w])
        cuda.synchronize()
        said[w] = "ok"
    except Exception as e:
        said[w] = repr(e)
for w in ways:
    t = threading.Thread(target=run, args=(w,))
    t.start()
    t.join()
for w in ways:
    right = np.allclose(ys[w].copy_to_host(), (2 if w == "twice" else 1) * np.arange(n))
    print(f"{w}|{said[w]}|{right}")
'''


@pytest.mark.parametrize("pure", [False, True], ids=["c", "python"])
def test_a_thread_that_made_no_cuda_call_launches(cuda, pure):
    """As with Numba's kernels, a thread needs no CUDA call of its own before launching: the
    kernel's context is made current there (the launch failed with CUDA_ERROR_INVALID_CONTEXT)."""
    import os
    env = {**os.environ, "NBJIT_PURE_PYTHON": "1" if pure else "0"}
    r = subprocess.run([sys.executable, "-c", FRESH_THREAD, str(DATA / "nvcc/kernels_sm90.ptx")], env=env,
                       capture_output=True, text=True, timeout=120)
    rows = [line.split("|") for line in r.stdout.splitlines() if line.count("|") == 2]
    ways = ("index", "bind", "launch", "twice", "cooperative", "occupancy")
    assert rows == [[w, "ok", "True"] for w in ways], r.stdout + r.stderr


def test_launch_keywords_refuse_floats_after_the_ints(cuda, kernels):
    """kernel.launch(4.0, ...) after kernel.launch(4, ...): refused as on its own (the cached
    launcher of the equal ints is not taken)."""
    k = kernels["k_basic"]
    y = cuda.device_array(4, np.float32)
    k.launch(1, 4, y, y, 1.0, 4)
    for grid, block, kw in ((1.0, 4, {}), (1, 4.0, {}), (True, 4, {}), (1, 4, {"cooperative": 0})):
        with pytest.raises(NbjitLaunchError):
            k.launch(grid, block, y, y, 1.0, 4, **kw)
    cuda.synchronize()
