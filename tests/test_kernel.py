"""The kernel stage without a GPU: launch configurations and the programmatic dependent
launch default (the launches themselves are tested on the GPU: test_gpu_pdl.py)."""
from __future__ import annotations

import types

import pytest

from nbjit import NbjitLaunchError, inspect_ptx
from nbjit.launch import launchers
from nbjit.launch import config
from nbjit.gpu import driver as _driver
from nbjit.launch import kernel as K

from conftest import DATA  # noqa: E402


def test_launch_config_pdl():
    c = config.LaunchConfig.make(4, 128, pdl=True)
    assert c.pdl and c.extended
    assert config.LaunchConfig.make(4, 128).pdl is None  # the kernel's, decided by Kernel.configure
    assert not config.LaunchConfig.make(4, 128).extended and not config.LaunchConfig.make(4, 128, pdl=False).extended
    with pytest.raises(NbjitLaunchError, match=r"kernel 'k': pdl must be True, False or None \(the kernel's\), got 1"):
        config.LaunchConfig.make(4, 128, pdl=1, kernel="k")


def test_launch_attributes_are_the_drivers_struct():
    """The C launcher hands cuLaunchKernelEx attribute bytes built in Python: byte for byte
    what cuda.bindings' own CUlaunchAttribute holds for the same attribute."""
    import ctypes
    cu = pytest.importorskip("cuda.bindings.driver")

    def theirs(name, fill):
        a = cu.CUlaunchAttribute()
        a.id = getattr(cu.CUlaunchAttributeID, f"CU_LAUNCH_ATTRIBUTE_{name}")
        fill(a.value)
        return ctypes.string_at(a.getPtr(), 72)

    def cluster(v):
        v.clusterDim.x, v.clusterDim.y, v.clusterDim.z = 2, 3, 4
    coop = theirs("COOPERATIVE", lambda v: setattr(v, "cooperative", 1))
    clus = theirs("CLUSTER_DIMENSION", cluster)
    pdl = theirs("PROGRAMMATIC_STREAM_SERIALIZATION", lambda v: setattr(v, "programmaticStreamSerializationAllowed", 1))
    assert _driver.launch_attributes(cooperative=False, cluster=None, pdl=True) == pdl
    assert _driver.launch_attributes(cooperative=True, cluster=(2, 3, 4), pdl=True) == coop + clus + pdl
    assert _driver.launch_attributes(cooperative=False, cluster=None, pdl=False) == b""


def test_c_launcher_refuses_malformed_attributes():
    _launch = pytest.importorskip("nbjit.gpu._launcher")
    with pytest.raises(ValueError, match="up to 4 blocks of 72 bytes"):
        _launch.launch(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, b"x" * 71)
    with pytest.raises(ValueError, match="up to 4 blocks of 72 bytes"):
        _launch.launch(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, b"\0" * 72 * 5)


@pytest.fixture
def pdl_kernels(monkeypatch):
    """Kernels of the PDL fixture over a fake function handle, on a device of chosen arch."""
    monkeypatch.setattr(launchers, "_MULTI", [False])
    cc = {"value": (9, 0)}
    monkeypatch.setattr(_driver, "device_info", lambda ordinal: types.SimpleNamespace(cc=cc["value"]))
    info = inspect_ptx((DATA / "nvcc/pdl_sm90.ptx").read_text())
    ks = {e.name: K.Kernel(None, (e.name, None, ()), K._State(e.name, None, e, 0, 0)) for e in info.entries}
    return ks, cc


def test_kernels_that_wait_for_the_grid_before_default_to_pdl(pdl_kernels):
    ks, cc = pdl_kernels
    assert ks["pdl_producer"].pdl and ks["pdl_consumer"].pdl and not ks["pdl_none"].pdl
    assert ks["pdl_consumer"]._pdl(None) is True
    assert ks["pdl_none"]._pdl(None) is False
    assert ks["pdl_none"]._pdl(True) is True  # asked for
    assert ks["pdl_consumer"]._pdl(False) is False


def test_a_producers_default_yields_to_the_users_choice(pdl_kernels):
    ks, _ = pdl_kernels
    none, cons = ks["pdl_none"], ks["pdl_consumer"]
    none._configs.keep(("cfg",), "configured before")
    group = none.launcher_group()  # a Triton grid's launchers
    group.keep(7, "configured before")
    none.default_pdl(True)  # Triton's launch_pdl
    assert none.pdl and not none._configs and not group  # configured launchers follow the new default
    cons.pdl = False  # the user's word
    cons.default_pdl(True)
    assert cons.pdl is False


def test_devices_before_hopper_launch_plainly_unless_asked(pdl_kernels):
    ks, cc = pdl_kernels
    cc["value"] = (8, 0)
    assert ks["pdl_consumer"]._pdl(None) is False  # the default: a plain launch
    ks["pdl_none"].default_pdl(True)
    assert ks["pdl_none"]._pdl(None) is False
    with pytest.raises(NbjitLaunchError, match=r"pdl=True\) needs a device of compute capability 9.0 .* is 8.0"):
        ks["pdl_none"]._pdl(True)


def test_setting_pdl_drops_configured_launchers(pdl_kernels):
    ks, _ = pdl_kernels
    k = ks["pdl_none"]
    k._s.launchers[(1, 32)] = object()
    k.pdl = True
    assert k.pdl and k._s.launchers == {}
    with pytest.raises(NbjitLaunchError, match="pdl must be True or False"):
        k.pdl = "yes"


def test_c_entry_points_are_named():
    _launch = pytest.importorskip("nbjit.gpu._launcher")
    with pytest.raises(ValueError, match="no entry point called cuNothing"):
        _launch.set_entry_point("cuNothing", 0)


@pytest.mark.parametrize("grid,block,most,said", [
    ((4, 1, 1), (2048, 1, 1), 1024, ": a block of 2048 threads, and this kernel runs at most 1024 per block"),
    ((4, 1, 1), (512, 1, 1), 256, ": a block of 512 threads, and this kernel runs at most 256 per block"),
    ((4, 1, 1), (1, 1, 128), 1024, ": block z is 128, and CUDA allows at most 64"),
    ((4, 70000, 1), (32, 1, 1), 1024, ": grid y is 70000, and CUDA allows at most 65535"),
    ((4, 1, 1), (32, 1, 1), 1024, "")])
def test_an_invalid_launch_shape_is_named(monkeypatch, grid, block, most, said):
    """A launch the driver refuses as an invalid value says which limit the shape passes (the
    kernel's own thread limit asked of the driver only then)."""
    monkeypatch.setattr(_driver, "function_attributes", lambda f: {"max_threads_per_block": most})
    monkeypatch.setattr(_driver, "error_text", lambda err: f"E{int(err)}")
    cfg = object.__new__(launchers._Launcher)
    cfg.grid, cfg.block, cfg.shared, cfg._s = grid, block, 0, types.SimpleNamespace(name="k", label="k", func=None)
    e = cfg.error(1)
    head = f"launch of kernel 'k' failed (grid {grid}, block {block}, 0 bytes dynamic shared memory)"
    assert str(e) == f"{head}: E1{said}"
    assert e.code == 1
    assert str(cfg.error(700)).endswith("memory): E700")  # another error: no shapes looked at


@pytest.mark.parametrize("pure", [False, True])
def test_a_cached_configuration_answers_only_exact_ints(pure):
    """kernel[4.0, 256] equals kernel[4, 256] as a dict key (4.0 == 4, True == 1): once (4, 256)
    is configured it must still be refused, as it is before, not find (4, 256)'s launcher."""
    base = K._PyIndexing if pure else K.Kernel.__base__
    made = []

    class Indexed(base):
        __slots__ = ()

        def _configure_cached(self, config):
            made.append(config)
            if K._inexact(config):
                raise NbjitLaunchError(f"refused {config!r}")
            self._configs[config] = ("launcher", config)
            return self._configs[config]

    k = object.__new__(Indexed)
    k._configs = {}
    assert k[4, 256] == ("launcher", (4, 256)) and k[4, 256] is k[4, 256] and made == [(4, 256)]
    k[1, 256], k[(4, 1), 256]
    for bad in [(4.0, 256), (4, 256.0), (True, 256), ((4, 1.0), 256), (4 + 0j, 256)]:
        assert bad in k._configs  # the trap: an equal key is cached
        with pytest.raises(NbjitLaunchError, match="refused"):
            k[bad]


# ------------------------------------------------------------ one launcher protocol

@pytest.fixture
def fake_launch(monkeypatch):
    """The Python launch path over a stand-in for cuLaunchKernel: ``calls`` records each
    launch, ``results`` the CUresults to return in turn (then 0)."""
    calls, results = [], []

    def launch(*a):
        calls.append(a)
        return results.pop(0) if results else 0
    monkeypatch.setattr(_driver, "backend", lambda: _driver.Backend("python", launch, int))
    monkeypatch.setattr(_driver, "error_text", lambda err: f"E{int(err)}")
    monkeypatch.setattr(_driver, "device_info", lambda ordinal: types.SimpleNamespace(
        cc=(9, 0), max_shared_optin=227 << 10, max_shared_default=48 << 10))
    monkeypatch.setattr(_driver, "function_attributes", lambda func: dict(
        registers=16, shared=0, const=0, local=0, max_threads_per_block=1024, ptx_version=90, binary_version=90,
        max_dynamic_shared=0))
    monkeypatch.setattr(_driver, "launch_ex", lambda *a, **kw: launch(*a, kw))
    monkeypatch.setattr(launchers, "_MULTI", [False])
    info = inspect_ptx((DATA / "nvcc/kernels_sm90.ptx").read_text()).entry("k_basic")
    k = K.Kernel(None, ("k_basic", None, ()), K._State("k_basic", 0x1234, info, 0, 0))
    return types.SimpleNamespace(kernel=k, calls=calls, results=results)


def test_every_launch_form_gets_its_launcher_from_configure(fake_launch, monkeypatch):
    k = fake_launch.kernel
    configured = []
    real = K.Kernel.configure
    monkeypatch.setattr(K.Kernel, "configure", lambda self, cfg, **kw: configured.append(cfg) or real(self, cfg, **kw))
    for _ in range(2):  # the second time: each form's cached launcher
        k[4, 256](0x10, 0x20, 1.0, 5)
        k.launch(4, 256, 0x10, 0x20, 1.0, 5, shared_mem=16)
    k.bind(2, 32, 0x10, 0x20, 1.0, 5)()
    assert [(c.grid, c.block, c.shared, c.pdl) for c in configured] == [
        ((4, 1, 1), (256, 1, 1), 0, None), ((4, 1, 1), (256, 1, 1), 16, None), ((2, 1, 1), (32, 1, 1), 0, None)]
    plain, shared = (0x1234, 4, 1, 1, 256, 1, 1, 0), (0x1234, 4, 1, 1, 256, 1, 1, 16)
    assert [c[:8] for c in fake_launch.calls] == [plain, shared, plain, shared, (0x1234, 2, 1, 1, 32, 1, 1, 0)]
    launcher = k[4, 256]
    assert launcher.config.pdl is False and launcher is k[4, 256]  # configure decided the kernel's pdl


def test_configure_decides_pdl_by_the_kernel_and_the_device(fake_launch, monkeypatch):
    info = inspect_ptx((DATA / "nvcc/pdl_sm90.ptx").read_text()).entry("pdl_consumer")
    k = K.Kernel(None, (info.name, None, ()), K._State(info.name, 0x99, info, 0, 0))
    cfg = config.LaunchConfig.make(1, 32, kernel=info.name)
    on = k.configure(cfg)
    assert on.config.pdl is True and on.path == "python (cuLaunchKernelEx)"
    assert k.configure(config.LaunchConfig.make(1, 32, pdl=False)).config.pdl is False
    on(0x10, 0x20, 3)
    assert fake_launch.calls[-1][-1]["pdl"] is True
    monkeypatch.setattr(_driver, "device_info", lambda ordinal: types.SimpleNamespace(cc=(8, 0)))
    assert k.configure(cfg).config.pdl is False and k.configure(cfg).path == "python"
    with pytest.raises(NbjitLaunchError, match="needs a device of compute capability 9.0"):
        k.configure(config.LaunchConfig.make(1, 32, pdl=True))


def test_a_refused_launch_goes_again_once_where_a_context_was_made_current(fake_launch, monkeypatch):
    """CUDA_ERROR_INVALID_CONTEXT in a thread without a context: the kernel's context made
    current, the launch goes again, once; any other failure raises at once. For a
    configured launcher and a bound launch alike."""
    k, calls, results = fake_launch.kernel, fake_launch.calls, fake_launch.results
    adopted = []
    monkeypatch.setattr(launchers, "adopt_context", lambda s: adopted.append(s) or True)
    for launch in (lambda: k[4, 256](0x10, 0x20, 1.0, 5), k.bind(4, 256, 0x10, 0x20, 1.0, 5)):
        calls.clear()
        results[:] = [201, 0]
        launch()
        assert len(calls) == 2 and calls[0] == calls[1]
        calls.clear()
        results[:] = [201, 201]
        with pytest.raises(NbjitLaunchError, match=r"kernel 'k_basic' failed .*: E201") as e:
            launch()
        assert e.value.code == 201 and len(calls) == 2
        calls.clear()
        results[:] = [700]
        with pytest.raises(NbjitLaunchError, match="E700"):
            launch()
        assert len(calls) == 1
    assert len(adopted) == 4


def test_launcher_groups_are_dropped_with_their_kernels_launchers():
    own = K.Launchers()
    grid = own.group()
    own.keep((1, 32), "a")
    grid.keep("stream", "b")
    assert own[(1, 32)] == "a" and grid["stream"] == "b" and own[grid._token] is grid
    own.clear()  # kernel.pdl changed
    assert not own and not grid
    grid.keep("stream", "c")
    assert own[grid._token] is grid  # kept again with the kernel's
    for i in range(K._MAX_CONFIGS):
        own.keep(i, i)
    assert len(own) == 1 and not grid  # too many: all dropped together
    grid.keep(["unhashable"], "d")
    assert not grid and grid._token not in own


def test_attributes_carry_what_ptxas_reported(fake_device, monkeypatch, tmp_path):
    """kernel.attributes: the driver's numbers, the cubin's frame and spill instructions, and
    the spill bytes ptxas reported compiling it (None for code nbjit did not compile)."""
    import nbjit
    driver_says = dict(registers=32, shared=0, const=0, local=0, max_threads_per_block=1024, ptx_version=90,
                       binary_version=90, max_dynamic_shared=0)  # (a stand-in for the driver's answer)
    monkeypatch.setattr(_driver, "function_attributes", lambda func: driver_says)
    m = nbjit.compile(DATA / "src/spill.cu", arch="sm_90", options=["-Xptxas=-v"], cache=nbjit.Cache(tmp_path))
    told = m.image.resources["spills"]
    a = m["spills"].attributes
    assert (a.spill_stores, a.spill_loads, a.frame) == (told["spill_stores"], told["spill_loads"], told["stack_frame"])
    assert a.spill_stores > 0 and a.spills > 0 and a.registers == 32
    b = nbjit.load(DATA / "nvcc/kernels_sm_90.cubin")["k_basic"].attributes
    assert b.spill_stores is None and b.spill_loads is None and b.frame == 0
