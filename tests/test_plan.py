"""nbjit.loading.plan: what is handed to the driver, per image, device and driver version (CPU)."""
from __future__ import annotations


import pytest

from nbjit import NbjitLoadError, inspect_cubin, inspect_ptx
from nbjit.toolchain.nvjitlink import nvjitlink_version
from nbjit.read.image import Image
from nbjit.cache.store import Cache
from nbjit.loading.plan import plan
from nbjit.loading.module import carry_out


def prepare(image, cc, driver, *, keep_debug=False, cache=None, nvjitlink=True):
    """What loading does: plan, then carry the plan out (nvjitlink=True: the installed one)."""
    have = nvjitlink_version() if nvjitlink is True else nvjitlink
    return carry_out(plan(image, cc, driver, keep_debug=keep_debug, nvjitlink=have), cache)

from conftest import DATA  # noqa: E402
H200 = (9, 0)
DRIVER_13_0 = 13000
needs_nvjitlink_135 = pytest.mark.skipif((nvjitlink_version() or (0, 0)) < (13, 5),
                                         reason="needs nvJitLink >= 13.5 (pip nvidia-nvjitlink)")


def img(rel: str) -> Image:
    return Image.from_path(DATA / rel)


def test_plain_ptx_goes_to_the_driver():
    p = prepare(img("nvcc/kernels_sm90.ptx"), H200, DRIVER_13_0)
    assert (p.kind, p.route, p.note) == ("ptx", "driver", None)
    assert p.data.endswith(b"\0") and p.data[:-1] == (DATA / "nvcc/kernels_sm90.ptx").read_bytes()


def test_debug_is_stripped_unless_kept():
    p = prepare(img("nvcc/kernels_G_sm90.ptx"), H200, DRIVER_13_0)
    assert inspect_ptx(p.data).debug.kind == "none"
    k = prepare(img("nvcc/kernels_G_sm90.ptx"), H200, DRIVER_13_0, keep_debug=True)
    assert inspect_ptx(k.data).debug.kind == "dwarf"


@needs_nvjitlink_135
@pytest.mark.parametrize("rel,arch", [("nvrtc/tmpl_compute90.ptx", "sm_90"),
                                      ("triton/add_kernel/add_kernel.ptx", "sm_90a"),
                                      ("numba/axpy_debug.ptx", "sm_90")])
def test_newer_ptx_is_assembled_with_nvjitlink(rel, arch, tmp_path):
    cache = Cache(tmp_path)
    p = prepare(img(rel), H200, DRIVER_13_0, cache=cache)
    assert (p.kind, p.route) == ("cubin", "nvjitlink")
    assert inspect_cubin(p.data).arch == arch
    assert "nvJitLink" in p.note and "newer than the driver" in p.note
    assert sorted(e.name for e in p.ptx.entries) == sorted(e.name for e in p.info.entries)
    again = prepare(img(rel), H200, DRIVER_13_0, cache=cache)
    assert again.data is p.data  # assembled once, then from the in-process layer
    fresh = prepare(img(rel), H200, DRIVER_13_0, cache=Cache(tmp_path))
    assert fresh.data == p.data and len(Cache(tmp_path).entries()) == 1  # and from disk


@pytest.mark.parametrize("have", [None, (13, 0)])
def test_no_new_enough_nvjitlink_lowers_the_version(have):
    p = prepare(img("nvrtc/tmpl_compute90.ptx"), H200, DRIVER_13_0, nvjitlink=have)
    assert (p.kind, p.route) == ("ptx", "lowered")
    assert inspect_ptx(p.data).version == (9, 0)
    assert "lowered to 9.0" in p.note and "nvidia-nvjitlink" in p.note


def test_nvjitlink_is_looked_for_only_when_the_ptx_needs_it():
    asked = []

    def version():
        asked.append(1)
        return (13, 0)
    assert plan(img("nvcc/kernels_sm90.ptx"), H200, DRIVER_13_0, nvjitlink=version).route == "driver"
    assert plan(img("nvcc/kernels_sm_90.cubin"), H200, DRIVER_13_0, nvjitlink=version).kind == "cubin"
    assert asked == []  # finding the library costs milliseconds: a warm load must not pay them
    p = plan(img("nvrtc/tmpl_compute90.ptx"), H200, DRIVER_13_0, nvjitlink=version)
    assert (p.route, asked, p.details["nvjitlink"]) == ("lowered", [1], (13, 0))


@needs_nvjitlink_135
def test_older_driver_gets_a_cubin_too():
    p = prepare(img("nvcc/kernels_sm90.ptx"), H200, 12040)  # CUDA 12.4 driver: PTX up to 8.4
    assert p.route == "nvjitlink" and p.details["driver_accepts"] == (8, 4)


@needs_nvjitlink_135
def test_nvjitlink_failure_names_versions():
    bad = (DATA / "nvrtc/tmpl_compute90.ptx").read_text().replace("st.global.f32", "st.bogus.f32", 1)
    with pytest.raises(NbjitLoadError, match=r"PTX 9.5 is newer than this driver takes .*9.0.*nvJitLink 13.5"):
        prepare(Image(bad.encode(), "ptx", "bad.ptx"), H200, DRIVER_13_0)


@pytest.mark.parametrize("rel,cc,ok", [
    ("nvcc/kernels_sm_80.cubin", (8, 0), True), ("nvcc/kernels_sm_80.cubin", (8, 6), True),
    ("nvcc/kernels_sm_80.cubin", (9, 0), False), ("nvcc/kernels_sm_90a.cubin", (9, 0), True),
    ("nvcc/kernels_sm_90.cubin", (8, 9), False), ("nvcc/kernels_sm_100.cubin", (9, 0), False)])
def test_cubin_arch_checks(rel, cc, ok):
    if ok:
        assert prepare(img(rel), cc, DRIVER_13_0).kind == "cubin"
    else:
        with pytest.raises(NbjitLoadError, match="cannot run on this sm_"):
            prepare(img(rel), cc, DRIVER_13_0)


def test_ptx_arch_checks():
    with pytest.raises(NbjitLoadError, match="PTX for sm_90 cannot run on this sm_80"):
        prepare(img("nvcc/kernels_sm90.ptx"), (8, 0), DRIVER_13_0)
    with pytest.raises(NbjitLoadError, match="sm_90a cannot run on this sm_100"):
        prepare(img("triton/add_kernel/add_kernel.ptx"), (10, 0), DRIVER_13_0)


def test_fatbin_entry_choice():
    p = prepare(img("nvcc/kernels_multi_lz4.fatbin"), H200, DRIVER_13_0)
    assert (p.kind, p.entry) == ("cubin", 2)
    p = prepare(img("nvcc/kernels_multi_lz4.fatbin"), (10, 0), DRIVER_13_0)
    assert (p.kind, p.entry, p.route) == ("ptx", 1, "driver")
    with pytest.raises(NbjitLoadError, match="no image in this fatbin runs on sm_75"):
        prepare(img("nvcc/kernels_multi.fatbin"), (7, 5), DRIVER_13_0)


def test_fatbin_with_ltoir_loads_its_cubin():
    """An sm_90 cubin beside an lto_90 entry (nvcc code=[sm_90,lto_90]) loads the cubin; a
    fatbin of LTO-IR alone says it must be linked."""
    for name in ("lto_sm90.fatbin", "lto_sm90_none.fatbin"):
        p = prepare(img(f"nvcc/{name}"), H200, DRIVER_13_0)
        assert (p.kind, p.entry) == ("cubin", 0) and [e.name for e in p.info.entries] == ["k_triple"]
    with pytest.raises(NbjitLoadError, match=r"no image in this fatbin runs on sm_90 \(it holds lto_90\) \(LTO-IR is "
                                             r"linked, not loaded: nbjit.compile\(source, link=\[this fatbin\]\)\)"):
        prepare(img("nvcc/lto_rdc.fatbin"), H200, DRIVER_13_0)


def test_fatbin_whole_when_entry_unreadable(no_zstd):
    p = prepare(img("nvcc/kernels_multi.fatbin"), (10, 0), DRIVER_13_0)
    assert p.kind == "fatbin" and p.entry == 1 and "whole fatbin" in p.note
    assert "image 1 (compute_90) is zstd-compressed and 'zstandard' is not installed (pip install zstandard)" in p.note
    assert p.data == (DATA / "nvcc/kernels_multi.fatbin").read_bytes()
    assert {e.name for e in p.info.entries} >= {"k_basic"}  # signatures from the readable sm_80 cubin


def test_lz4_fatbin_without_lz4(no_lz4):
    """The device's own cubin loads; a device that needs the LZ4 PTX gets the whole fatbin."""
    p = prepare(img("nvcc/kernels_multi_lz4.fatbin"), H200, DRIVER_13_0)
    assert (p.kind, p.entry, p.note) == ("cubin", 2, None)
    p = prepare(img("nvcc/kernels_multi_lz4.fatbin"), (10, 0), DRIVER_13_0)
    assert p.kind == "fatbin" and p.entry == 1
    assert "is lz4-compressed and 'lz4' is not installed (pip install lz4); the driver loads the whole fatbin" in p.note


def test_load_without_a_gpu_is_one_nbjit_error():
    from conftest import gpu_available
    if gpu_available()[0]:
        pytest.skip("this machine has a GPU")
    import nbjit
    with pytest.raises(nbjit.NbjitLoadError, match="no usable CUDA GPU or driver") as e:
        nbjit.load(DATA / "nvcc/kernels_sm90.ptx")
    assert len(str(e.value).splitlines()) == 1 and "explicit arch=" in str(e.value)


def test_family_ptx_stays_in_its_family():
    text = (DATA / "nvcc/kernels_sm90.ptx").read_text().replace(".target sm_90", ".target sm_100f")
    im = Image(text.encode(), "ptx", "fam.ptx")
    assert plan(im, (10, 3), DRIVER_13_0).route == "driver"
    with pytest.raises(NbjitLoadError, match="PTX for sm_100f cannot run on this sm_120 device"):
        plan(im, (12, 0), DRIVER_13_0)


@pytest.mark.parametrize("cc", [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0), (7, 5)])
def test_listed_entries_choose_as_the_container_does(cc):
    """A fatbin whose Image lists its entries (a kernel bundle's) is planned from the list: the
    same entry, route and bytes as reading the container gives, for every device."""
    from nbjit.bundles.archive import fatbin_image
    from nbjit.arch import Arch
    entries = [("cubin", Arch.parse("sm_80"), (DATA / "nvcc/kernels_sm_80.cubin").read_bytes(), None),
               ("cubin", Arch.parse("sm_90a"), (DATA / "nvcc/kernels_sm_90a.cubin").read_bytes(), None),
               ("cubin", Arch.parse("sm_100"), (DATA / "nvcc/kernels_sm_100.cubin").read_bytes(), None),
               ("ptx", Arch.parse("compute_90"), (DATA / "nvcc/kernels_sm90.ptx").read_bytes(), None)]
    listed = fatbin_image("k", entries, {}, {})
    read = Image(listed.data, "fatbin", "k")
    try:
        want = plan(read, cc, DRIVER_13_0, nvjitlink=None)
    except NbjitLoadError as e:
        with pytest.raises(NbjitLoadError) as got:
            plan(listed, cc, DRIVER_13_0, nvjitlink=None)
        assert str(got.value) == str(e) and "no image in this fatbin runs on" in str(e)
        return
    got = plan(listed, cc, DRIVER_13_0, nvjitlink=None)
    assert (got.kind, got.entry, got.route, got.data) == (want.kind, want.entry, want.route, want.data)
    assert got.info.to_json() == want.info.to_json()


def test_listed_cubin_facts_are_the_plan_and_no_cubin_is_read(monkeypatch):
    """Where the list gives a cubin's facts (a bundle's manifest records them), the plan takes
    them as the inspection: the cubin is not read."""
    import nbjit.read.cubin
    from nbjit.bundles.archive import EntryFacts, fatbin_image
    from nbjit.arch import Arch
    cubin = (DATA / "nvcc/kernels_sm_90.cubin").read_bytes()
    facts = EntryFacts("sm_90", {}, {}, ())
    listed = fatbin_image("k", [("cubin", Arch.parse("sm_90"), cubin, facts),
                                ("ptx", Arch.parse("compute_90"), (DATA / "nvcc/kernels_sm90.ptx").read_bytes(), None)],
                          {}, {})
    monkeypatch.setattr(nbjit.read.cubin, "inspect_cubin", lambda *a, **k: pytest.fail("the cubin was read"))
    p = plan(listed, (9, 0), DRIVER_13_0)
    assert (p.kind, p.data, p.info, p.entry) == ("cubin", cubin, facts, 1)  # (PTX first in the container)
