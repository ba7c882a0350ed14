"""Kernel bundles without a GPU: built from NVRTC sources and from compiled images, read back
verified, loaded lazily (typed as a direct compile is), and refused when damaged or hostile."""
from __future__ import annotations

import hashlib
import io
import json
import pickle
import re
import struct
import sys
import warnings
import zipfile

import pytest

import nbjit
from nbjit import BundleError, build_bundle, inspect_bundle, load_bundle
from nbjit.bundles.build import MAX_MEMBERS, read_bundle
from nbjit.params.signature import RESOURCES, KernelSignature, replace
from nbjit.cache.store import Cache
from nbjit.toolchain.identity import _toolchain_fingerprint
from nbjit.toolchain.nvrtc import nvrtc_version
from nbjit.read.fatbin import inspect_fatbin

from conftest import DATA  # noqa: E402

TMPL = DATA / "src/nvrtc_tmpl.cu"
HDR = {"scale.cuh": (DATA / "src/scale.cuh").read_text()}
EXPRS = ["fill<float>", "fill<int>", "ns::op<float, 4>"]
ARCHS = ["sm_80", "sm_90", "sm_90a", "sm_100", "sm_120"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One bundle of the NVRTC fixture for five architectures and PTX for compute_80."""
    d = tmp_path_factory.mktemp("bundle")
    cache = Cache(d / "cache")
    info = build_bundle(TMPL, d / "tmpl.nbjit", archs=",".join(ARCHS), ptx="compute_80", name_expressions=EXPRS,
                        headers=HDR, options=["-DUNUSED=1"], cache=cache)
    return d / "tmpl.nbjit", info, cache


def test_build_from_source_holds_every_arch_and_the_manifest(built):
    path, info, cache = built
    img = info.image()
    assert img.name == "nvrtc_tmpl" and info.source == str(path)
    assert img.archs == (*ARCHS, "compute_80")
    assert [e.kind for e in img.entries] == ["cubin"] * 5 + ["ptx"]
    assert img.lowered_names == {"fill<float>": "_Z4fillIfEvPT_S0_i", "fill<int>": "_Z4fillIiEvPT_S0_i",
                                 "ns::op<float, 4>": "_ZN2ns2opIfLi4EEEvPT_PKS1_i"}
    assert img.producer == "NVRTC %d.%d" % nvrtc_version()
    assert img.toolchain == _toolchain_fingerprint()
    assert img.options == ("-DUNUSED=1",)
    assert img.sources == ({"name": "nvrtc_tmpl.cu", "kind": "cuda",
                            "sha256": hashlib.sha256(TMPL.read_bytes()).hexdigest()},)
    assert img.declarations["plain"][0] == "source"
    # the payloads are NVRTC's own output, byte for byte, and readable as they are
    with zipfile.ZipFile(path) as zf:
        assert zf.namelist() == ["manifest.json"] + [f"nvrtc_tmpl/{a}.cubin" for a in ARCHS] + \
            ["nvrtc_tmpl/compute_80.ptx"]
        assert all(zi.compress_type == zipfile.ZIP_STORED for zi in zf.infolist())
        for a in ARCHS:
            direct = nbjit.compile_image(TMPL, name_expressions=EXPRS, headers=HDR, options=["-DUNUSED=1"], arch=a,
                                         output="cubin", cache=cache)
            assert zf.read(f"nvrtc_tmpl/{a}.cubin") == direct.data
            assert nbjit.inspect_cubin(direct.data).arch == a
        ptx = zf.read("nvrtc_tmpl/compute_80.ptx")
        assert nbjit.inspect_ptx(ptx).arch == "sm_80"
        manifest = json.loads(zf.read("manifest.json"))
    assert (manifest["format"], manifest["version"], manifest["nbjit"]) == ("nbjit-bundle", 1, nbjit.__version__)
    assert manifest["images"] == [img.to_json()]
    for e in manifest["images"][0]["entries"]:
        with zipfile.ZipFile(path) as zf:
            assert hashlib.sha256(zf.read(e["file"])).hexdigest() == e["sha256"]
    sig = manifest["images"][0]["kernels"]["_Z4fillIfEvPT_S0_i"]
    assert [p["ctype"] for p in sig["params"]] == ["float*", "float", "int"]
    assert "registers" not in sig  # per-architecture facts are the cubins' own


def test_the_same_inputs_give_the_same_bytes(built, tmp_path):
    path, _, cache = built
    again = build_bundle(TMPL, tmp_path / "again.nbjit", archs=ARCHS, ptx=["compute_80"], name_expressions=EXPRS,
                         headers=HDR, options="-DUNUSED=1", cache=cache)
    assert (tmp_path / "again.nbjit").read_bytes() == path.read_bytes()
    assert again.image().archs == inspect_bundle(path).image().archs
    # compiled afresh (a cache hit and NVRTC list name expressions in other orders), the
    # expressions given in another order: the same bytes
    build_bundle(TMPL, tmp_path / "cold.nbjit", archs=ARCHS, ptx=["compute_80"], name_expressions=EXPRS[::-1],
                 headers=HDR, options="-DUNUSED=1", cache=Cache(tmp_path / "cold-cache"))
    assert (tmp_path / "cold.nbjit").read_bytes() == path.read_bytes()


def test_lazy_load_is_typed_as_a_direct_compile(built):
    path, _, cache = built
    mod = load_bundle(path, lazy=True)
    assert repr(mod).endswith("(fatbin): loads on first use>") and mod.name == f"{path}:nvrtc_tmpl"
    assert set(mod.kernels) == {"_Z4fillIfEvPT_S0_i", "_Z4fillIiEvPT_S0_i", "_ZN2ns2opIfLi4EEEvPT_PKS1_i", "plain"}
    direct = nbjit.compile(TMPL, name_expressions=EXPRS, headers=HDR, options=["-DUNUSED=1"], arch="sm_90",
                           lazy=True, cache=cache)
    for k in ("fill<float>", "fill<int>", "ns::op<float, 4>", "plain"):
        ours = [(p.ctype, p.size, p.offset, p.pointer, p.const, p.pointee) for p in mod[k].params]
        theirs = [(p.ctype, p.size, p.offset, p.pointer, p.const, p.pointee) for p in direct[k].params]
        assert ours == theirs and all(c is not None for c, *_ in ours), k
    # the manifest lists what the module shows (its layouts merged from every entry)
    seen = lambda ps: [(p.name, p.type, p.ctype, p.size, p.offset, p.pointer, p.const) for p in ps]
    listed = {k.name: seen(k.params) for k in inspect_bundle(path).image().kernels}
    assert listed == {k: seen(mod[k].params) for k in mod.kernels}
    # a kernel pickles as the whole fatbin (each worker's device picks its entry), typed alike
    k2 = pickle.loads(pickle.dumps(mod["fill<float>"]))
    assert k2.params == mod["fill<float>"].params
    shipped = inspect_fatbin(k2.module.image.data).entries
    assert sorted(str(e.arch) for e in shipped) == sorted([*ARCHS, "compute_80"])


def test_loads_from_bytes_and_from_a_zip_imported_package(built, tmp_path, monkeypatch):
    path, _, _ = built
    assert load_bundle(path.read_bytes(), lazy=True).kernels == load_bundle(path, lazy=True).kernels
    wheel_like = tmp_path / "pkgs.zip"
    with zipfile.ZipFile(wheel_like, "w") as zf:
        zf.writestr("zpkg_bundle/__init__.py", "")
        zf.write(path, "zpkg_bundle/k.nbjit")
    monkeypatch.syspath_prepend(str(wheel_like))
    import importlib.resources
    res = importlib.resources.files(importlib.import_module("zpkg_bundle")) / "k.nbjit"
    assert not isinstance(res, type(path))  # a zipfile.Path: no file on disk
    mod = load_bundle(res, lazy=True)
    assert mod["fill<float>"].params[0].ctype == "float*" and mod.name == "k.nbjit:nvrtc_tmpl"
    assert inspect_bundle(res).image().archs == (*ARCHS, "compute_80")
    sys.modules.pop("zpkg_bundle", None)


def test_inputs_as_they_are(tmp_path):
    """PTX, cubins and fatbins go in at their own architectures; a dict names images and
    gathers several files into one."""
    nv = DATA / "nvcc"
    info = build_bundle({"kernels": [nv / "kernels_sm_80.cubin", nv / "kernels_sm_90a.cubin", nv / "kernels_sm80.ptx"],
                         "multi": nv / "kernels_multi_none.fatbin", "tmpl": DATA / "nvrtc/tmpl_sm90.cubin"},
                        tmp_path / "k.nbjit")
    assert [(i.name, i.archs) for i in info.images] == [
        ("kernels", ("sm_80", "sm_90a", "compute_80")), ("multi", ("sm_80", "compute_90", "sm_90")),
        ("tmpl", ("sm_90",))]
    assert [s["kind"] for s in info.image("kernels").sources] == ["cubin", "cubin", "ptx"]
    assert info.image("kernels").producer is None
    with zipfile.ZipFile(tmp_path / "k.nbjit") as zf:
        assert zf.read("kernels/sm_90a.cubin") == (nv / "kernels_sm_90a.cubin").read_bytes()
        assert zf.read("multi/compute_90.ptx") == inspect_fatbin((nv / "kernels_multi_none.fatbin").read_bytes()
                                                                 ).entries[1].payload
    # a fatbin's LTO-IR is linked, never loaded: a bundle keeps what loads (the cubin beside it)
    lto = build_bundle(nv / "lto_sm90.fatbin", tmp_path / "lto.nbjit")
    assert [(i.name, i.archs) for i in lto.images] == [("lto_sm90", ("sm_90",))]
    # without a name, an image is named after its file
    one = build_bundle([nv / "pdl_sm_90.cubin", nv / "cluster_sm90.ptx"], tmp_path / "two.nbjit")
    assert [i.name for i in one.images] == ["pdl_sm_90", "cluster_sm90"]
    with pytest.raises(BundleError, match=r"holds 2 images \(pdl_sm_90, cluster_sm90\): say which with name="):
        load_bundle(tmp_path / "two.nbjit", lazy=True)
    with pytest.raises(BundleError, match=r"no image 'pdl'; it holds pdl_sm_90, cluster_sm90"):
        load_bundle(tmp_path / "two.nbjit", name="pdl", lazy=True)
    assert load_bundle(tmp_path / "two.nbjit", name="cluster_sm90", lazy=True).kernels


def test_text_in_a_dict_is_source_even_on_one_line(tmp_path, monkeypatch):
    """A dict gives CUDA source text (or PTX) as a str: one line of code was taken for a path
    and refused as "no such file"; a str naming no file and holding no code still is."""
    monkeypatch.chdir(tmp_path)
    info = build_bundle({"one": 'extern "C" __global__ void z(int* p) { *p = 1; }'}, tmp_path / "k.nbjit",
                        archs="sm_90")
    assert [(i.name, i.archs, [k.name for k in i.kernels]) for i in info.images] == [("one", ("sm_90",), ["z"])]
    assert info.image("one").sources[0]["kind"] == "cuda"
    with pytest.raises(BundleError, match=r"^nothing_here\.ptx: no such file$"):
        build_bundle({"p": "nothing_here.ptx"}, tmp_path / "x.nbjit")
    with pytest.raises(BundleError, match=r"^out/k\.entry\.ptx: no such file$"):  # (a path, not PTX: no parameters)
        build_bundle({"p": "out/k.entry.ptx"}, tmp_path / "x.nbjit")


def test_triton_kernel_keeps_its_metadata_and_ir_types(tmp_path):
    src = DATA / "triton/add_kernel"
    info = build_bundle(src, tmp_path / "t.nbjit")
    img = info.image()
    assert img.name == "add_kernel" and img.archs == ("sm_90a", "compute_90a")
    assert img.triton == json.loads((src / "add_kernel.json").read_text())
    assert img.declarations["add_kernel"][0] == "triton ir"
    mod = load_bundle(tmp_path / "t.nbjit", lazy=True)
    assert [p.ctype for p in mod.add_kernel.params][:4] == ["float*", "float*", "float*", "int"]


def test_build_refuses(tmp_path):
    nv = DATA / "nvcc"
    copy = tmp_path / "other/kernels_sm_80.cubin"
    copy.parent.mkdir()
    copy.write_bytes((nv / "kernels_sm_80.cubin").read_bytes())
    cases = [
        (lambda: build_bundle({"x": [nv / "kernels_sm_80.cubin", DATA / "nvrtc/tmpl_sm90.cubin"]}, tmp_path / "a"),
         "hold different kernels"),
        (lambda: build_bundle({"x": [nv / "kernels_sm_80.cubin", nv / "kernels_sm_80.cubin"]}, tmp_path / "a"),
         "kernels_sm_80.cubin: given twice for image 'x'$"),
        (lambda: build_bundle({"x": [nv / "kernels_sm_80.cubin", nv / "kernels129_sm_80.cubin"]}, tmp_path / "a"),
         "kernels129_sm_80.cubin: image 'x' has a cubin for sm_80 already, from .*/kernels_sm_80.cubin: one cubin "
         "per architecture"),
        (lambda: build_bundle([nv / "kernels_sm_80.cubin", DATA / "expected/nvcc__kernels_sm_80.cubin.json"],
                              tmp_path / "a"), "unreadable Triton metadata|no Triton|metadata"),
        (lambda: build_bundle([nv / "kernels_sm_80.cubin", nv / "kernels_sm_80.cubin"], tmp_path / "a"),
         "kernels_sm_80.cubin: given twice$"),
        (lambda: build_bundle([nv / "kernels_sm_80.cubin", copy], tmp_path / "a"),
         "nvcc/kernels_sm_80.cubin and .*/other/kernels_sm_80.cubin: two images would be called 'kernels_sm_80'"),
        (lambda: build_bundle(nv / "kernels_sm_80.cubin", tmp_path / "a", archs="sm_90"), "the inputs hold none"),
        (lambda: build_bundle(nv / "kernels_sm80.ptx", tmp_path / "a", name_expressions="f<int>"),
         r"name_expressions \('f<int>'\) instantiate templates of CUDA C\+\+ sources; the inputs hold none"),
        (lambda: build_bundle(TMPL, tmp_path / "a"), "say what to compile it for"),
        (lambda: build_bundle(TMPL, tmp_path / "a", archs="compute_90"), "virtual architecture"),
        (lambda: build_bundle(TMPL, tmp_path / "a", archs="sm_9x"), "not an architecture"),
        (lambda: build_bundle({"../up": nv / "kernels_sm_80.cubin"}, tmp_path / "a"), "image name '../up'"),
        (lambda: build_bundle(b"\x7fELF" + bytes(60), tmp_path / "a"), "give it a name|cubin|ELF"),
        (lambda: build_bundle(tmp_path / "missing.ptx", tmp_path / "a"), "no such file"),
        (lambda: build_bundle([], tmp_path / "a"), "no inputs"),
        (lambda: build_bundle(42, tmp_path / "a"), "not int"),
        (lambda: build_bundle(nv / "kernels_sm_80.cubin", tmp_path / "no/such/dir/a"),
         "cannot write .*/a: no directory .*no/such/dir$"),
    ]
    for call, msg in cases:
        with pytest.raises(BundleError, match=msg):
            call()
    assert not (tmp_path / "a").exists()


def test_build_never_overwrites_an_input(tmp_path):
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes((DATA / "nvcc/kernels_sm_80.cubin").read_bytes())
    with pytest.raises(BundleError, match="is an input"):
        build_bundle(cubin, cubin)
    assert cubin.read_bytes() == (DATA / "nvcc/kernels_sm_80.cubin").read_bytes()
    build_bundle(cubin, tmp_path / "out.nbjit")
    build_bundle(cubin, tmp_path / "out.nbjit")  # replaced whole; no temporary file stays
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.cubin", "out.nbjit"]


# ------------------------------------------------------------------ damaged and hostile bundles


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    build_bundle({"k": [DATA / "nvcc/kernels_sm_80.cubin", DATA / "nvcc/kernels_sm80.ptx"]}, d / "k.nbjit")
    return (d / "k.nbjit").read_bytes()


def _rezip(data: bytes, change) -> bytes:
    """The bundle's members, passed through ``change({name: bytes})``, in a new archive."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members = change(members)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for n, b in members.items():
            zf.writestr(n, b)
    return buf.getvalue()


def _manifest(change):
    def edit(members):
        m = json.loads(members["manifest.json"])
        change(m)
        members["manifest.json"] = json.dumps(m).encode()
        return members
    return edit


def test_a_changed_payload_is_found_before_the_driver(small):
    def tamper(members):
        b = bytearray(members["k/sm_80.cubin"])
        b[-1] ^= 1
        members["k/sm_80.cubin"] = bytes(b)
        return members
    with pytest.raises(BundleError, match=r"member 'k/sm_80.cubin': its bytes do not match the manifest's size and "
                                          r"SHA-256 \(the bundle is damaged or was altered\)"):
        load_bundle(_rezip(small, tamper), lazy=True)
    # a flipped byte in the archive itself: the ZIP's own CRC names the member
    raw = bytearray(small)
    at = raw.index((DATA / "nvcc/kernels_sm_80.cubin").read_bytes()[:64]) + 100
    raw[at] ^= 0xFF
    with pytest.raises(BundleError, match=r"member 'k/sm_80.cubin' is damaged"):
        read_bundle(bytes(raw))


def test_members_are_read_as_zipfile_reads_them_and_a_damaged_local_header_is_named(small):
    """A member's bytes come from the archive's bytes (its local header, extent and CRC-32
    checked), equal to what ``ZipFile.read`` gives; each way a local header can be damaged is a
    BundleError naming the member and what is wrong."""
    from nbjit.bundles.archive import open_bundle

    example = (DATA.parent.parent / "examples/bundle_package/src/nbjit_demo_kernels/kernels.nbjit").read_bytes()
    for data in (small, example):
        archive = open_bundle(data)
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            assert archive.names and all(archive.read(n) == zf.read(n) for n in zf.namelist())
    with zipfile.ZipFile(io.BytesIO(small)) as zf:
        zi = zf.getinfo("k/sm_80.cubin")
    at, name = zi.header_offset, b"k/sm_80.cubin"
    assert small[at:at + 4] == b"PK\x03\x04" and small[at + 30:at + 30 + len(name)] == name

    def changed(offset: int, value: bytes) -> bytes:
        raw = bytearray(small)
        raw[offset:offset + len(value)] = value
        return bytes(raw)
    for raw, why in ((changed(at, b"PK\x05\x06"), "bad magic number for its local header"),
                     (changed(at + 6, b"\x01\x00"), "it is encrypted"),
                     (changed(at + 30, b"q"), "the names in its central directory entry and its local header differ"),
                     (changed(at + 28, b"\xff\xff"), "it runs past the end of the archive|bad CRC-32"),
                     (changed(at + 30 + len(name) + 200, b"\x00\x01\x02\x03"), "bad CRC-32")):
        with pytest.raises(BundleError, match=rf"member 'k/sm_80.cubin' is damaged: ({why})"):
            open_bundle(raw).read("k/sm_80.cubin")


def test_member_names_and_flags_zipfile_refuses_are_refused(small):
    """A local header whose name does not decode as its flags say (a UTF-8 name outside code
    page 437, the UTF-8 flag cleared) differs from its central directory entry; flag bits for
    strong encryption (0x40) and compressed patched data (0x20) are refused as ZipFile refuses them."""
    from nbjit.bundles.archive import open_bundle

    def renamed(members):
        m = json.loads(members["manifest.json"])
        m["images"][0]["entries"][0]["file"] = "k/\u6f22.cubin"
        members["k/\u6f22.cubin"] = members.pop("k/sm_80.cubin")
        members["manifest.json"] = json.dumps(m).encode()
        return members
    raw = bytearray(_rezip(small, renamed))
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as zf:
        zi = zf.getinfo("k/\u6f22.cubin")
    assert raw[zi.header_offset + 7] & 0x08  # (0x800: UTF-8 names)
    raw[zi.header_offset + 7] &= ~0x08
    with pytest.raises(BundleError, match=r"is damaged: the names in its central directory entry and its local "
                                          r"header differ"):
        open_bundle(bytes(raw)).read("k/\u6f22.cubin")
    for bit, why in ((0x20, "compressed patched data"), (0x40, "encrypted")):
        raw = bytearray(small)
        at = raw.index(b"PK\x01\x02")  # the first central directory entry: its flags at +8
        raw[at + 8] |= bit
        with pytest.raises(BundleError, match=why):
            load_bundle(bytes(raw), lazy=True)


def test_only_the_loaded_images_payloads_are_read_at_load(small, tmp_path):
    """load_bundle checks every payload of the image it loads (they all go into the module's
    fatbin, which a pickle carries to other devices) and reads no other image's;
    read_bundle checks them all."""
    two = tmp_path / "two.nbjit"
    build_bundle({"k": DATA / "nvcc/kernels_sm_80.cubin", "p": DATA / "nvcc/kernels_sm80.ptx"}, two)

    def tamper(members):
        members["p/compute_80.ptx"] = members["p/compute_80.ptx"].replace(b"k_basic", b"k_bas1c")
        return members
    damaged = _rezip(two.read_bytes(), tamper)
    assert load_bundle(damaged, name="k", lazy=True).kernels == load_bundle(two, name="k", lazy=True).kernels
    with pytest.raises(BundleError, match=r"image 'p': member 'p/compute_80.ptx': its bytes do not match"):
        load_bundle(damaged, name="p", lazy=True)
    with pytest.raises(BundleError, match=r"image 'p': member 'p/compute_80.ptx': its bytes do not match"):
        read_bundle(damaged)


def test_a_lazy_module_describes_its_kernels_from_the_manifest(built, monkeypatch):
    """No payload is parsed to describe a bundle's kernels: they are the manifest's, exactly
    the kernels read_bundle merges from every entry."""
    path, _, _ = built
    listed = inspect_bundle(path).image().kernels
    import nbjit.read.cubin
    import nbjit.read.ptx
    for mod, name in ((nbjit.read.ptx, "inspect_ptx"), (nbjit.read.cubin, "inspect_cubin")):
        monkeypatch.setattr(mod, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} was called"))
    mod = load_bundle(path, lazy=True)
    assert list(mod.kernels) == [k.name for k in listed]
    for k in listed:
        # (to_json leaves out a pointer's pointee alignment, a cubin's, which nothing shows)
        assert mod[k.name].info == replace(k, signature=KernelSignature(
            tuple(replace(p, pointee_align=None) for p in k.params), k.param_size)), k.name


def test_the_manifest_records_each_cubins_own_facts(built):
    """Each cubin entry carries its kernels' resources and its globals, so that loading it
    reads no ELF: the loaded module types its kernels as the manifest lists them (as they
    were described while it waited), with that cubin's resources, at the cubin's layout."""
    from nbjit.loading import module
    from nbjit.loading.plan import plan
    path, info, _ = built
    img = info.image()
    assert all((e.resources is None) == (e.globals is None) == (e.kind == "ptx") for e in img.entries)
    mod = load_bundle(path, lazy=True)
    cubins = [(arch, mod.image.data[off:off + n], facts) for kind, arch, off, n, facts in mod.image.entries
              if kind == "cubin"]
    assert len(cubins) == 5
    for arch, payload, facts in cubins:
        own = nbjit.inspect_cubin(payload)
        e = next(e for e in img.entries if e.arch == str(arch))
        assert e.resources == {k.name: {r: getattr(k, r) for r in RESOURCES if getattr(k, r) is not None}
                               for k in own.entries}
        assert list(e.globals) == [g.to_json() for g in own.globals] and facts.arch == own.arch == str(arch)
        for k in own.entries:
            loaded = module._kernel_info("m", k.name, [("cubin", facts.entry(k.name))], None, False,
                                         img.declarations, {}, {})[0]
            assert loaded.params == mod[k.name].info.params, (arch, k.name)
            assert [(q.offset, q.size) for q in loaded.params] == [(q.offset, q.size) for q in k.params]
            assert all(getattr(loaded, r) == getattr(k, r) for r in RESOURCES), (arch, k.name)
    p = plan(mod.image, (9, 0), 13000)  # the sm_90a build on 9.0, by the manifest's facts of it
    assert (p.kind, p.info.arch, p.data) == ("cubin", "sm_90a", cubins[2][1])


def test_a_bundle_without_cubin_facts_loads_its_cubin_read(small):
    """A manifest that records no facts of a cubin (an older nbjit's) still loads: the loader
    reads that cubin."""
    from nbjit.read.cubin import CubinInfo
    from nbjit.loading.plan import plan

    def older(m):
        for e in m["images"][0]["entries"]:
            e.pop("resources", None)
            e.pop("globals", None)
    mod = load_bundle(_rezip(small, _manifest(older)), lazy=True)
    p = plan(mod.image, (8, 0), 13000)
    assert p.kind == "cubin" and isinstance(p.info, CubinInfo) and p.info.arch == "sm_80"


@pytest.mark.parametrize("change,where,msg", [
    (lambda m: m["images"][0]["kernels"]["k_basic"]["params"][0].update(offset=8), "read",
     r"kernel 'k_basic': the manifest lays out its parameters as \(offset, size\) \[\(8, 8\)"),
    (lambda m: m["images"][0]["kernels"].pop("k_basic"), "read",
     r"the manifest lists kernels k_basic that its entries"),
    (lambda m: m["images"][0]["entries"][0]["resources"]["k_basic"].update(registers=255), "read",
     r"entry 'k/sm_80.cubin': the manifest records the resources of kernel 'k_basic' as \{'registers': 255"),
    (lambda m: m["images"][0]["entries"][0]["globals"].append({"name": "g", "size": 4}), "read",
     r"entry 'k/sm_80.cubin': the manifest records the globals"),
    (lambda m: m["images"][0]["kernels"]["k_basic"].update(param_size="8"), "load",
     r"image 'k': kernels: kernel 'k_basic': param_size is str, not int"),
    (lambda m: m["images"][0]["entries"][0].update(resources={"k_basic": {"registers": "10"}}), "load",
     r"entry 'k/sm_80.cubin': resources is not \{kernel: \{resource: count\}\} of a cubin"),
    (lambda m: m["images"][0]["entries"][1].update(globals=[]), "load",
     r"entry 'k/compute_80.ptx': globals is not a list of a cubin's"),
    # each payload's architecture is what it says itself (a cubin's ELF header, PTX's .target)
    *[(lambda m, i=i, a=a: m["images"][0]["entries"][i].update(arch=a), where, msg)
      for i, a, msg in ((0, "sm_90", r"member 'k/sm_80.cubin': the manifest lists it for sm_90, but it is cubin for "
                                     r"sm_80 \(its ELF header\): the bundle was altered"),
                        (1, "compute_90", r"member 'k/compute_80.ptx': the manifest lists it for compute_90, but it is "
                                          r"ptx for compute_80 \(its .target\)"))
      for where in ("load", "read")],
])
def test_a_manifest_that_is_not_its_payloads_is_refused(small, change, where, msg):
    """What loading takes from the manifest is checked: its form at load, its agreement with
    the payloads (each kernel's layout, each cubin's resources and globals) by read_bundle
    (nbjit inspect)."""
    data = _rezip(small, _manifest(change))
    with pytest.raises(BundleError, match=msg):
        read_bundle(data) if where == "read" else load_bundle(data, lazy=True)


def test_an_arch_specific_cubin_listed_as_plain_is_refused(tmp_path):
    """Where a cubin's ELF header marks it arch-specific (sm_90a), the manifest may not list
    it as a plain sm_90, which would send it to other devices."""
    build_bundle({"k": DATA / "nvcc/kernels129_sm_90a.cubin"}, tmp_path / "a.nbjit")
    data = _rezip((tmp_path / "a.nbjit").read_bytes(),
                  _manifest(lambda m: m["images"][0]["entries"][0].update(arch="sm_90")))
    with pytest.raises(BundleError, match=r"member 'k/sm_90a.cubin': the manifest lists it for sm_90, but it is "
                                          r"cubin for sm_90a \(its ELF header\)"):
        load_bundle(data, lazy=True)


def test_member_names_are_marked_utf8(small):
    """(so that reading a bundle needs no cp437 codec: ~0.5 ms of a process's first load)"""
    with zipfile.ZipFile(io.BytesIO(small)) as zf:
        assert all(zi.flag_bits & 0x800 for zi in zf.infolist())


def test_a_newer_format_is_refused_plainly(small):
    data = _rezip(small, _manifest(lambda m: m.update(version=2)))
    said = "<bundle>: manifest.json: made by a newer nbjit (format 2; this one reads 1): upgrade nbjit"
    with pytest.raises(BundleError, match=re.escape(said)):
        load_bundle(data, lazy=True)


def _stored(names_payloads, compress=zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compress) as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (zipfile warns of the duplicate name it writes)
        for n, b in names_payloads:
            zf.writestr(n, b)
    return buf.getvalue()


def _deflated(small: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(small)) as zf:
        members = [(n, zf.read(n)) for n in zf.namelist()]
    return _stored(members, zipfile.ZIP_DEFLATED)


def _encrypted(small: bytes) -> bytes:
    raw = bytearray(small)
    for sig, at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # the general-purpose flags, bit 0
        i = raw.index(sig)
        raw[i + at] |= 1
    return bytes(raw)


@pytest.mark.parametrize("make,msg", [
    (lambda s: _deflated(s), "is compressed; bundle members are stored uncompressed"),
    (lambda s: _encrypted(s), "is encrypted"),
    (lambda s: _rezip(s, lambda m: {**m, "../evil": b"x"}), r"member '../evil': a name outside the archive"),
    (lambda s: _rezip(s, lambda m: {**m, "/etc/x": b"x"}), r"member '/etc/x': a name outside the archive"),
    (lambda s: _rezip(s, lambda m: {**m, "k/extra.cubin": b"x"}), "member 'k/extra.cubin' is in no image"),
    (lambda s: _rezip(s, lambda m: {k: v for k, v in m.items() if k != "k/compute_80.ptx"}),
     "entry 'k/compute_80.ptx': the archive has no such member"),
    (lambda s: _rezip(s, lambda m: {k: v for k, v in m.items() if k != "manifest.json"}), "no manifest.json"),
    (lambda s: _rezip(s, lambda m: {**m, "manifest.json": b"{not json"}), "manifest.json is not JSON"),
    (lambda s: _rezip(s, lambda m: {**m, "manifest.json": b'{"format": "nbjit-bundle", "version": NaN}'}),
     "not JSON"),
    (lambda s: _rezip(s, _manifest(lambda m: m.update(format="zip"))), "not an nbjit bundle manifest"),
    (lambda s: _rezip(s, _manifest(lambda m: m.update(version="1"))), "format version '1'"),
    (lambda s: _rezip(s, _manifest(lambda m: m.update(images=[]))), "no images"),
    (lambda s: _rezip(s, _manifest(lambda m: m["images"][0].update(name="../k"))), "not an image name"),
    (lambda s: _rezip(s, _manifest(lambda m: m["images"].append(m["images"][0]))), "two images are called 'k'"),
    (lambda s: _rezip(s, _manifest(lambda m: m["images"][0]["entries"][0].update(kind="elf"))),
     "kind 'elf' is not 'cubin' or 'ptx'"),
    (lambda s: _rezip(s, _manifest(lambda m: m["images"][0]["entries"][0].update(arch="compute_80"))),
     "'compute_80' is not a real"),
    (lambda s: _rezip(s, _manifest(lambda m: m["images"][0]["entries"][0].update(sha256="00"))), "no sha256"),
    (lambda s: _rezip(s, _manifest(lambda m: m["images"][0].update(declarations={"k_basic": [1]}))),
     "declaration of 'k_basic' is not"),
    (lambda s: _rezip(s, _manifest(lambda m: m["images"][0].update(name_expressions={"a": 1}))),
     "name_expressions is not"),
    (lambda s: _stored([("manifest.json", b"{}"), ("manifest.json", b"{}")]), "appears twice"),
    (lambda s: _stored([(f"m{i}", b"") for i in range(MAX_MEMBERS + 1)]), "more than a bundle has"),
    (lambda s: s[: len(s) // 2], "a damaged bundle"),
    (lambda s: (DATA / "nvcc/kernels_sm_80.cubin").read_bytes(), r"not an nbjit bundle .*it is a cubin: load it with "
                                                                 "nbjit.load"),
    (lambda s: b"", "not an nbjit bundle"),
])
def test_hostile_bundles_are_refused(small, make, msg):
    with pytest.raises(BundleError, match=msg):
        read_bundle(make(small))


def _directory(n: int, count: int, zip64: bool = False) -> bytes:
    """An archive whose central directory holds ``n`` entries and whose end record says
    ``count`` (in its zip64 form where ``zip64``): a few bytes per member."""
    head = b"PK\x03\x04" + bytes(26)
    cd = (struct.pack("<4s24xHHH12x", b"PK\x01\x02", 1, 0, 0) + b"a") * n
    end = b""
    if zip64:
        at = len(head) + len(cd)
        end = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, len(cd), len(head)) + \
            struct.pack("<4sLQL", b"PK\x06\x07", 0, at, 1)
        count = 0xFFFF
    return head + cd + end + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(cd), len(head), 0)


def test_too_many_members_are_refused_before_zipfile_reads_them(monkeypatch):
    """The member count comes from the end record (its zip64 form too) and the central
    directory's entries counted, before ``zipfile`` makes a ZipInfo of each (a 210 MB
    directory of millions of entries is refused at once, not read into gigabytes)."""
    cases = [(_directory(MAX_MEMBERS + 1, MAX_MEMBERS + 1), rf"{MAX_MEMBERS + 1} members, more than a bundle has"),
             (_directory(10, 1 << 40, zip64=True), rf"{1 << 40} members, more than a bundle has"),
             (_directory(MAX_MEMBERS + 1, 1), rf"more than {MAX_MEMBERS} members in its central directory \(its end "
                                              r"record says 1\)"),
             (_directory(MAX_MEMBERS + 1, 1, zip64=True) + b"comment", "more than 4096 members")]
    assert len(zipfile.ZipFile(io.BytesIO(cases[-2][0])).infolist()) == MAX_MEMBERS + 1  # (as zipfile reads it)

    def read_whole(*a, **k):
        raise AssertionError("zipfile read the whole central directory")
    monkeypatch.setattr(zipfile, "ZipFile", read_whole)
    for data, msg in cases:
        with pytest.raises(BundleError, match=msg):
            read_bundle(data)


class _Counted(str):
    """A name that counts how often it is compared (a quadratic reader compares each with all)."""
    compared = 0

    def __eq__(self, other):
        _Counted.compared += 1
        return str.__eq__(self, other)

    def __ne__(self, other):
        _Counted.compared += 1
        return str.__ne__(self, other)

    __hash__ = str.__hash__


def test_a_manifest_is_read_in_linear_time(small):
    """Each image's name and each entry's member are looked up, never compared with all
    before them: n images cost O(n) comparisons, not O(n^2) (16,000 images would take seconds,
    a 64 MiB manifest hours); more images than a bundle can have are refused before any is
    read, and so is a member two images list."""
    from nbjit.bundles.archive import MAX_IMAGES, Archive, open_bundle, records

    archive = open_bundle(small)
    one = archive.manifest["images"][0]
    zi = archive._members["k/sm_80.cubin"]
    n = 1500

    def many(count: int, entries_each: int = 1) -> Archive:
        images, members = [], {"manifest.json": archive._members["manifest.json"]}
        for i in range(count):
            entries = []
            for j in range(entries_each):
                file = _Counted(f"i{i}/sm_{80 + j}.cubin")
                members[str(file)] = zi
                entries.append({**one["entries"][0], "file": file, "arch": f"sm_{80 + j}"})
            images.append({"name": _Counted(f"i{i}"), "entries": entries})
        return Archive("<many>", {**archive.manifest, "images": images}, members, b"")
    for count, each in ((n, 1), (1, n)):  # many images; one image of many entries
        _Counted.compared = 0
        assert len(records(many(count, each))) == count
        assert _Counted.compared <= 4 * n, (count, each, _Counted.compared)
    with pytest.raises(BundleError, match=rf"<many>: manifest.json: {MAX_IMAGES + 1} images, more than a bundle has "
                                          rf"\({MAX_IMAGES}"):
        records(Archive("<many>", {**archive.manifest, "images": [{}] * (MAX_IMAGES + 1)}, {}, b""))
    shared = many(2)
    shared.manifest["images"][1]["entries"] = shared.manifest["images"][0]["entries"]
    with pytest.raises(BundleError, match=r"member 'i0/sm_80.cubin' is listed by images 'i0' and 'i1' \(each image "
                                          r"has members of its own\)"):
        records(shared)


def test_what_is_not_a_bundle(tmp_path):
    with pytest.raises(BundleError, match="no such file"):
        read_bundle(tmp_path / "nope.nbjit")
    with pytest.raises(BundleError, match="a directory, not a regular file"):
        read_bundle(tmp_path)
    with pytest.raises(BundleError, match="not int"):
        read_bundle(3)
    assert issubclass(BundleError, ValueError) and issubclass(BundleError, nbjit.NbjitError)


# ------------------------------------------------------------------ the command line


def test_name_expressions_per_image(tmp_path, capsys):
    """--expr EXPR goes to every CUDA source, --expr IMAGE=EXPR to that image's only (Python:
    name_expressions={image: [...]}): bundling a template's source with one that lacks the
    template needs the second; the first says so where NVRTC cannot instantiate it."""
    from nbjit.cli.main import main

    plain = tmp_path / "plain.cu"
    plain.write_text('extern "C" __global__ void plain(float* y) { y[threadIdx.x] = 1.0f; }\n')
    out = tmp_path / "k.nbjit"
    assert main(["bundle", str(TMPL), str(plain), "--arch", "sm_90", "--expr", "fill<float>", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nbjit bundle: error: plain.cu: NVRTC") and "__nv_name_map" in err and not out.exists()
    assert err.endswith("\n\nThe name expressions ('fill<float>') go to every CUDA source of the bundle unless "
                        "given per image: name_expressions={'plain': [...], ...}, or on the command line --expr "
                        "IMAGE=EXPR.\n")
    # the same from Python: NVRTC's error (CompileFailure) with that hint; one str is one expression
    with pytest.raises(nbjit.CompileFailure, match=r"(?s)__nv_name_map.*go to every CUDA source") as e:
        build_bundle([TMPL, plain], out, archs="sm_90", name_expressions="fill<float>")
    assert e.value.name == "plain.cu" and "('fill<float>')" in e.value.hint
    # one source, or one image: a mistyped expression is NVRTC's error alone
    for inputs in ([TMPL], {"one": [TMPL, plain]}):
        with pytest.raises(nbjit.CompileFailure) as e:
            build_bundle(inputs, out, archs="sm_90", name_expressions=iter(["fil<float>"]))
        assert "__nv_name_map" in e.value.log and e.value.hint == ""
    # expressions given as a generator are read once, for every architecture
    info = build_bundle([TMPL], out, archs="sm_80,sm_90", name_expressions=(x for x in ["fill<float>"]))
    assert info.image().lowered_names == {"fill<float>": "_Z4fillIfEvPT_S0_i"} and len(info.image().entries) == 2
    assert main(["bundle", str(TMPL), str(plain), "--arch", "sm_90", "--expr", "nvrtc_tmpl=fill<float>",
                 "--expr", "nvrtc_tmpl=fill<int>", "-o", str(out)]) == 0
    capsys.readouterr()
    info = inspect_bundle(out)
    assert set(info.image("nvrtc_tmpl").lowered_names) == {"fill<float>", "fill<int>"}
    assert info.image("plain").lowered_names == {} and [k.name for k in info.image("plain").kernels] == ["plain"]
    assert main(["bundle", str(TMPL), str(plain), "--arch", "sm_90", "--expr", "tmpl=fill<float>", "-o",
                 str(tmp_path / "x.nbjit")]) == 2
    assert capsys.readouterr().err == ("nbjit bundle: error: --expr tmpl=fill<float>: no CUDA source makes image "
                                       "'tmpl' (they make: nvrtc_tmpl, plain)\n")
    # the same from Python (an image name nothing makes was ignored: fill<int> silently missing)
    with pytest.raises(BundleError, match=r"^name_expressions: no CUDA source makes image 'nope' \(they make: "
                       r"nvrtc_tmpl, plain\)$"):
        build_bundle([TMPL, plain], tmp_path / "y.nbjit", archs="sm_90",
                     name_expressions={"nvrtc_tmpl": ["fill<float>"], "nope": ["fill<int>"]})
    with pytest.raises(BundleError, match=r"they make: none\)$"):
        build_bundle([DATA / "nvcc/kernels_sm_90.cubin"], tmp_path / "y.nbjit", name_expressions={"x": ["f<int>"]})
    assert not (tmp_path / "y.nbjit").exists()


def test_name_expressions_name_images_before_anything_compiles(tmp_path, counted):
    """An image name that no CUDA source makes is refused before NVRTC runs (it compiled every
    source for every architecture first); the names are those the sources' images get."""
    text = TMPL.read_text()
    with pytest.raises(BundleError, match=r"no CUDA source makes image 'c' \(they make: nvrtc_tmpl, kernel, t2\)"):
        build_bundle({"nvrtc_tmpl": TMPL, "kernel": text, "t2": [text, DATA / "nvcc/kernels_sm_90.cubin"]},
                     tmp_path / "y.nbjit", archs="sm_80,sm_90", ptx="compute_80", name_expressions={"c": ["f"]})
    assert counted == []
    # unnamed: a file's image is named after it, source text's is "kernel", as the build names them
    inline = "template <typename T> __global__ void fill(T* y, T v, int n) { y[threadIdx.x] = v; }\n"
    for inputs, image in ((TMPL, "nvrtc_tmpl"), (inline, "kernel")):
        info = build_bundle(inputs, tmp_path / "z.nbjit", archs="sm_90", name_expressions={image: ["fill<float>"]})
        assert info.image(image).lowered_names == {"fill<float>": "_Z4fillIfEvPT_S0_i"}


def test_bad_inputs_and_destinations_are_named_briefly(tmp_path):
    """Unnamed bytes are named by their length in the message (it held their whole repr: 19 KB
    for a cubin); a destination that is not a path is a BundleError (a TypeError from pathlib)."""
    data = (DATA / "nvcc/kernels_sm_90.cubin").read_bytes()
    with pytest.raises(BundleError, match=rf"^unnamed data \({len(data)} bytes\): give it a name") as e:
        build_bundle(data, tmp_path / "k.nbjit")
    assert len(str(e.value)) < 200
    ptx = (DATA / "nvcc/kernels_sm90.ptx").read_text()
    with pytest.raises(BundleError, match=rf"^unnamed text \({len(ptx)} characters\): give it a name"):
        build_bundle(ptx, tmp_path / "k.nbjit")
    for dest in (3, None, b"k.nbjit"):
        with pytest.raises(BundleError, match=f"dest must be the bundle file's path .*not {type(dest).__name__}"):
            build_bundle({"k": data}, dest)
    assert build_bundle({"k": data}, tmp_path / "k.nbjit").image("k").entries


def test_cli_bundle_and_inspect(tmp_path, capsys):
    from nbjit.cli.main import main

    out = tmp_path / "k.nbjit"
    assert main(["bundle", str(TMPL), "--arch", "sm_91", "-o", str(out)]) == 2
    assert "nbjit bundle: error: " in capsys.readouterr().err and not out.exists()
    assert main(["bundle", str(TMPL), "--arch", "sm_80,sm_90", "--ptx", "compute_80", "--expr", "fill<float>",
                 "-I", str(DATA / "src"), "-D", "UNUSED=1", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{out}: nvrtc_tmpl: sm_80, sm_90, compute_80 (2 kernels)" in err and "fill<float> ->" in err
    img = inspect_bundle(out).image()
    assert img.options[-1] == "-DUNUSED=1" and img.lowered_names == {"fill<float>": "_Z4fillIfEvPT_S0_i"}

    assert main(["inspect", str(out), "--arch", "sm_86"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{out}: nbjit bundle (format 1, made by nbjit {nbjit.__version__}), 1 image")
    assert "image nvrtc_tmpl: from nvrtc_tmpl.cu (cuda), NVRTC" in text
    assert re.search(r"cubin\s+sm_80\s+\d+\s+nvrtc_tmpl/sm_80.cubin  <- sm_86", text)
    assert re.search(r"ptx\s+compute_80\s+\d+\s+nvrtc_tmpl/compute_80.ptx\n", text)
    assert "= void fill<float>(float*, float, int)" in text and "resources:" not in text
    assert main(["inspect", str(out), "--json", "--arch", "sm_120"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["kind"] == "bundle" and j["selected"] == {"nvrtc_tmpl": "nvrtc_tmpl/compute_80.ptx"}
    assert j["images"] == [img.to_json()]

    cubin = DATA / "nvcc/kernels_sm_80.cubin"
    assert main(["bundle", str(cubin), "-o", str(cubin)]) == 2
    assert "is the input file: refusing to overwrite it" in capsys.readouterr().err
    assert main(["bundle", str(cubin), str(DATA / "nvcc/kernels_sm_90.cubin"), "--name", "kernels",
                 "-o", str(tmp_path / "two.nbjit")]) == 0
    assert inspect_bundle(tmp_path / "two.nbjit").image("kernels").archs == ("sm_80", "sm_90")
    damaged = tmp_path / "bad.nbjit"
    damaged.write_bytes(out.read_bytes()[:-100])
    assert main(["inspect", str(damaged)]) == 2
    assert f"nbjit inspect: error: {damaged}: a damaged bundle" in capsys.readouterr().err


@pytest.mark.parametrize("entry", ["add_kernel", "softmax_kernel", "copy_desc_kernel", "copy_hostdesc_kernel"])
def test_a_bundled_triton_kernel_loads_as_one(tmp_path, entry):
    """load_triton(bundle) gives the TritonKernel load_triton(cache entry) gives: the same
    metadata, launch rules and parameter types (no GPU: lazily)."""
    from nbjit.loading.triton import TritonKernel, describe, read_triton

    src = DATA / "triton" / entry
    build_bundle(src, tmp_path / "t.nbjit")
    want, rules = read_triton(src).meta, describe(src)
    zpath = tmp_path / "pkg.zip"  # a bundle inside a zip import, as importlib.resources gives it
    with zipfile.ZipFile(zpath, "w") as z:
        z.write(tmp_path / "t.nbjit", "pkg/t.nbjit")
    for given in (tmp_path / "t.nbjit", str(tmp_path / "t.nbjit"), (tmp_path / "t.nbjit").read_bytes(),
                  zipfile.Path(zpath, "pkg/t.nbjit")):
        k = nbjit.load_triton(given, lazy=True)
        assert isinstance(k, TritonKernel) and k.meta == want and k.name == want.name
        assert k.rules == rules["launch"]
        assert [p.to_json() for p in k.kernel.params] == rules["params"]
        assert k.route is None and "the route chosen at first use" in repr(k)  # the fatbin picks when it loads
    again = pickle.loads(pickle.dumps(k))
    assert again.meta == want and again.rules == k.rules


def test_load_triton_picks_the_bundles_triton_image(tmp_path):
    t, nv = DATA / "triton", DATA / "nvcc"
    build_bundle({"add": t / "add_kernel", "soft": t / "softmax_kernel", "plain": nv / "cluster_sm90.ptx"},
                 tmp_path / "b.nbjit")
    with pytest.raises(BundleError, match=r"b.nbjit: holds 2 Triton kernels \(add, soft\): say which with name="):
        nbjit.load_triton(tmp_path / "b.nbjit", lazy=True)
    assert nbjit.load_triton(tmp_path / "b.nbjit", name="soft", lazy=True).meta.name == "softmax_kernel"
    with pytest.raises(BundleError, match=r"image 'plain' holds no Triton metadata \(its Triton kernels are add, "
                                          r"soft\): load it with nbjit.load_bundle"):
        nbjit.load_triton(tmp_path / "b.nbjit", name="plain", lazy=True)
    with pytest.raises(BundleError, match=r"no image 'add_kernel'; its Triton kernels are add, soft"):
        nbjit.load_triton(tmp_path / "b.nbjit", name="add_kernel", lazy=True)
    build_bundle(nv / "cluster_sm90.ptx", tmp_path / "p.nbjit")
    with pytest.raises(BundleError, match=r"p.nbjit: no image holds Triton metadata \(it holds cluster_sm90\): load "
                                          "it with nbjit.load_bundle"):
        nbjit.load_triton(tmp_path / "p.nbjit", lazy=True)
    with pytest.raises(nbjit.NbjitLoadError, match="name= and lazy= are for a kernel bundle"):
        nbjit.load_triton(t / "add_kernel", lazy=True)
    with pytest.raises(BundleError, match="not an nbjit bundle"):  # bytes are a bundle's or nothing
        nbjit.load_triton((t / "add_kernel/add_kernel.cubin").read_bytes(), lazy=True)


@pytest.mark.parametrize("change,msg", [
    ({"warp_size": 7}, "'warp_size': 7 is not a CUDA warp's size (32)"),
    ({"num_warps": "4"}, "'num_warps': expected a whole number, got str"),
    ({"global_scratch_align": 3}, "'global_scratch_align': 3 is not a power of two"),
    ({"arch": "sm_xyz"}, "'arch': 'sm_xyz' is not an architecture"),
    ({"target": {"backend": "cuda", "arch": "sm_xyz"}}, "'target.arch': expected a whole number, got str"),
])
def test_triton_metadata_in_a_bundle_follows_load_triton_rules(tmp_path, change, msg):
    """A bundle's Triton metadata is checked by load_triton's one validator, in read_bundle
    (nbjit inspect) and load_triton(bundle), as a cache entry's is."""
    from nbjit.loading.triton import read_triton

    build_bundle(DATA / "triton/add_kernel", tmp_path / "t.nbjit")
    data = _rezip((tmp_path / "t.nbjit").read_bytes(), _manifest(lambda m: m["images"][0]["triton"].update(change)))
    with pytest.raises(BundleError, match=re.escape(f"<bundle>: manifest.json: image 'add_kernel': Triton metadata "
                                                    f"{msg}")):
        read_bundle(data)
    with pytest.raises(nbjit.NbjitLoadError, match=re.escape(msg)):
        nbjit.load_triton(data, lazy=True)
    entry = tmp_path / "entry"  # the same metadata in a cache entry
    entry.mkdir()
    for f in (DATA / "triton/add_kernel").iterdir():
        (entry / f.name).write_bytes(f.read_bytes())
    meta = json.loads((entry / "add_kernel.json").read_text())
    (entry / "add_kernel.json").write_text(json.dumps({**meta, **change}))
    with pytest.raises(nbjit.NbjitLoadError, match=re.escape(msg)):
        read_triton(entry)


def test_a_fatbin_entry_python_cannot_decompress_is_refused(tmp_path, no_lz4):
    """A bundle holds raw cubin and PTX bytes: an LZ4 entry unread (no lz4 package) stops the
    build, naming the entry and what to install, and writes nothing."""
    with pytest.raises(BundleError, match=r"kernels_multi_lz4.fatbin: entry 1 \(compute_90\) is lz4-compressed and "
                                          r"'lz4' is not installed \(pip install lz4\)"):
        build_bundle(DATA / "nvcc/kernels_multi_lz4.fatbin", tmp_path / "k.nbjit")
    assert not (tmp_path / "k.nbjit").exists()
