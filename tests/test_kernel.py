"""The kernel stage without a GPU: launch configurations and the programmatic dependent
launch default (the launches themselves are tested on the GPU: test_gpu_pdl.py)."""
from __future__ import annotations

import types

import pytest

from nbjit import NbjitLaunchError, _driver, inspect_ptx
from nbjit import kernel as K

from conftest import DATA  # noqa: E402


def test_launch_config_pdl():
    c = K.LaunchConfig.make(4, 128, pdl=True)
    assert c.pdl and c.extended
    assert not K.LaunchConfig.make(4, 128).extended
    with pytest.raises(NbjitLaunchError, match="pdl must be True or False, got 1"):
        K.LaunchConfig.make(4, 128, pdl=1, kernel="k")


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
    _launch = pytest.importorskip("nbjit._launch")
    with pytest.raises(ValueError, match="up to 4 blocks of 72 bytes"):
        _launch.launch(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, b"x" * 71)
    with pytest.raises(ValueError, match="up to 4 blocks of 72 bytes"):
        _launch.launch(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, b"\0" * 72 * 5)


@pytest.fixture
def pdl_kernels(monkeypatch):
    """Kernels of the PDL fixture over a fake function handle, on a device of chosen arch."""
    monkeypatch.setattr(K, "_MULTI", [False])
    cc = {"value": (9, 0)}
    monkeypatch.setattr(_driver, "device_info", lambda ordinal: types.SimpleNamespace(cc=cc["value"]))
    info = inspect_ptx((DATA / "nvcc/pdl_sm90.ptx").read_text())
    ks = {e.name: K.Kernel(None, K._State(e.name, None, e, 0, 0)) for e in info.entries}
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
    none._configs[("cfg",)] = "configured before"
    none._set_pdl(True, chosen=False)  # Triton's launch_pdl
    assert none.pdl and not none._configs  # configured launchers follow the new default
    cons.pdl = False  # the user's word
    cons._set_pdl(True, chosen=False)
    assert cons.pdl is False


def test_devices_before_hopper_launch_plainly_unless_asked(pdl_kernels):
    ks, cc = pdl_kernels
    cc["value"] = (8, 0)
    assert ks["pdl_consumer"]._pdl(None) is False  # the default: a plain launch
    ks["pdl_none"]._set_pdl(True, chosen=False)
    assert ks["pdl_none"]._pdl(None) is False
    with pytest.raises(NbjitLaunchError, match=r"pdl=True\) needs a device of compute capability 9.0 .* is 8.0"):
        ks["pdl_none"]._pdl(True)


def test_setting_pdl_drops_configured_launchers(pdl_kernels):
    ks, _ = pdl_kernels
    k = ks["pdl_none"]
    k._s.configs[(1, 32)] = object()
    k.pdl = True
    assert k.pdl and k._s.configs == {}
    with pytest.raises(NbjitLaunchError, match="pdl must be True or False"):
        k.pdl = "yes"


def test_c_entry_points_are_named():
    _launch = pytest.importorskip("nbjit._launch")
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
    cfg = object.__new__(K._PyLauncher)
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
    base = K._PyIndexing if pure else K._indexing_base()
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
