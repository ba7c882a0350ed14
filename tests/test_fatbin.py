"""nbjit.read.fatbin on nvcc -fatbin containers (uncompressed, LZ4, zstd, arch-specific)."""
from __future__ import annotations

import re
import struct
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nbjit import ImageFormatError, inspect_ptx
from nbjit.read.cubin import inspect_cubin
from nbjit.read.fatbin import FatbinEntry, build_fatbin, inspect_fatbin, parse_arch, select_entry, undecoded

from conftest import DATA  # noqa: E402
from cuobjdump_oracle import find_cuobjdump  # noqa: E402


def fatbin(name: str):
    return inspect_fatbin((DATA / "nvcc" / name).read_bytes(), source=name)


def test_json_names_the_entries_as_the_api_does():
    """inspect_fatbin(data).entries were "images" in its JSON: one name, entries."""
    fb = fatbin("kernels_multi.fatbin")
    j = fb.to_json()
    assert sorted(j) == ["entries", "kind"] and j["entries"] == [e.to_json() for e in fb.entries]


@pytest.mark.parametrize("name,compression", [
    ("kernels_multi_none.fatbin", None), ("kernels_multi_lz4.fatbin", "lz4"), ("kernels_multi.fatbin", "zstd")])
def test_entries(name, compression):
    fb = fatbin(name)
    assert [(e.kind, e.arch) for e in fb.entries] == [("cubin", "sm_80"), ("ptx", "compute_90"), ("cubin", "sm_90")]
    ptx = fb.entries[1]
    assert ptx.compression == compression and ptx.compressed == (compression is not None)
    assert ptx.ptx_version == (9, 0)
    # the cubins are byte-identical to nvcc -cubin output for the same arch
    for e in (fb.entries[0], fb.entries[2]):
        assert e.compression is None
        assert e.payload == (DATA / f"nvcc/kernels_{e.arch}.cubin").read_bytes()
        assert inspect_cubin(e.payload).arch == e.arch
    # the PTX (decompressed where needed) is the same module nvcc wrote
    assert [k.name for k in inspect_ptx(ptx.payload).entries] == \
        [k.name for k in inspect_ptx((DATA / "nvcc/kernels_sm90.ptx").read_text()).entries]


def test_arch_specific_entry():
    fb = fatbin("kernels_90a.fatbin")
    assert [(e.kind, e.arch, e.arch_specific) for e in fb.entries] == [
        ("cubin", "sm_90a", True), ("ptx", "compute_90", False)]


@pytest.mark.parametrize("name,compression,readable", [
    ("lto_sm90.fatbin", "zstd", False), ("lto_sm90_none.fatbin", None, True)])
def test_ltoir_entries_are_listed_and_never_chosen_to_load(name, compression, readable):
    """nvcc -gencode arch=compute_90,code=[sm_90,lto_90]: kind 8 (NVVM LTO-IR, "nvvm code"
    to cuobjdump) beside the sm_90 cubin, once 'unknown kind 8'. Compressed, nvcc 13.0 sets
    flag 0x10000 and the payload is no zstd frame: nbjit leaves it to nvJitLink."""
    fb = fatbin(name)
    assert [(e.kind, e.arch_name, e.compression) for e in fb.entries] == [("cubin", "sm_90", None),
                                                                   ("ltoir", "lto_90", compression)]
    lto = fb.entries[1]
    assert (lto.target.number, lto.target.virtual, lto.ptx_version) == (90, True, None)
    assert lto.size >= 2048 and (lto.stored_size < lto.size) == (compression is not None)
    assert (lto.payload is not None) == readable
    if readable:
        assert lto.payload[:4] == b"\xed\x43\x4e\x7f" and len(lto.payload) == lto.size
    assert fb.select("sm_90") is fb.entries[0] and fb.select("sm_100") is None
    assert lto.to_json()["kind"] == "ltoir" and lto.to_json()["arch"] == "lto_90"
    rdc = fatbin("lto_rdc.fatbin")
    assert [(e.kind, e.arch_name) for e in rdc.entries] == [("ltoir", "lto_90")] and rdc.select("sm_90") is None


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
def test_ltoir_entry_agrees_with_cuobjdump():
    out = subprocess.run([find_cuobjdump(), "-all", str(DATA / "nvcc/lto_sm90.fatbin")], capture_output=True,
                         text=True, check=True).stdout
    assert "Fatbin nvvm code" in out and re.search(r"nvvm code:\n=+\narch = sm_90\n", out)
    assert "compressed" in out.split("Fatbin nvvm code")[1]


@pytest.mark.parametrize("device,expect", [
    ("sm_90", "sm_90"), ("sm_80", "sm_80"), ("sm_86", "sm_80"), ("sm_89", "sm_80"),
    ((10, 0), "compute_90"), (120, "compute_90"), ("sm_75", None)])
def test_select_multi(device, expect):
    chosen = fatbin("kernels_multi_none.fatbin").select(device)
    assert (chosen.arch if chosen else None) == expect


@pytest.mark.parametrize("device,expect", [("sm_90", "sm_90a"), ("sm_100", "compute_90"), ("sm_80", None)])
def test_select_never_a_on_another_chip(device, expect):
    chosen = fatbin("kernels_90a.fatbin").select(device)
    assert (chosen.arch if chosen else None) == expect


def entry(index, kind, sm, a=False, f=False):
    return FatbinEntry(index, kind, sm, a, f, None, 0, 0, 0, False, None, b"")


def test_select_rules_synthetic():
    es = [entry(0, "cubin", 86), entry(1, "cubin", 80), entry(2, "cubin", 89, a=True), entry(3, "ptx", 80),
          entry(4, "ptx", 90, a=True), entry(5, "ptx", 100, f=True), entry(6, "cubin", 100, f=True)]
    assert select_entry(es, "sm_89").index == 2  # exact (arch-specific build of this chip)
    assert select_entry(es, "sm_87").index == 0  # newest older minor of the same major
    assert select_entry(es, "sm_90").index == 4  # PTX: compute_90a only on exactly 9.0
    assert select_entry(es, "sm_103").index == 6  # family SASS within its family
    assert select_entry(es, "sm_120").index == 3  # compute_100f is not for 12.x; compute_80 is


def test_parse_arch():
    assert parse_arch("sm_90a") == parse_arch("compute_90") == parse_arch((9, 0)) == parse_arch(90) == 90
    with pytest.raises(ValueError):
        parse_arch("volta")


def test_zstd_without_zstandard(no_zstd):
    fb = fatbin("kernels_multi.fatbin")
    ptx = fb.entries[1]
    assert ptx.compression == "zstd" and ptx.payload is None
    assert ptx.to_json()["decompressed"] is False
    assert fb.select("sm_100") is ptx  # the loader then hands the whole fatbin to the driver
    assert undecoded(ptx) == "zstd-compressed and 'zstandard' is not installed (pip install zstandard)"


def test_lz4_without_lz4(no_lz4):
    """lz4 is a dependency, yet a missing one is treated as zstandard is: the entry stays
    unread, the others are read (it was a ModuleNotFoundError that lost the whole fatbin)."""
    fb = fatbin("kernels_multi_lz4.fatbin")
    assert [(e.compression, e.payload is None) for e in fb.entries] == [(None, False), ("lz4", True), (None, False)]
    assert fb.select("sm_100") is fb.entries[1] and fb.select("sm_90") is fb.entries[2]
    assert undecoded(fb.entries[1]) == "lz4-compressed and 'lz4' is not installed (pip install lz4)"


def container(*entries) -> bytes:
    """A fatbin container of (kind, payload, flags, compressed size, uncompressed size) entries."""
    body = b""
    for kind, payload, flags, csize, usize in entries:
        body += struct.pack("<HHIQIIHHIIIQQQ", kind, 0x0101, 64, len(payload), csize, 0, 0, 0, 90, 0, 0, flags, 0,
                            usize) + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


LZ4, ZSTD = 0x2000, 0x8000


def peak_alloc(fn) -> int:
    import tracemalloc
    tracemalloc.start()
    try:
        fn()
    except ImageFormatError:
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_lz4_payloads_decode():
    import lz4.block
    cubin = (DATA / "nvcc/kernels_sm_90.cubin").read_bytes()
    blob = lz4.block.compress(cubin, store_size=False)
    e = inspect_fatbin(container((2, blob, LZ4, len(blob), len(cubin)))).entries[0]
    assert e.payload == cubin and e.compression == "lz4" and "payload" not in repr(e)


@pytest.mark.parametrize("name,data,msg", [
    # a 105-byte fatbin whose zstd frame claims 1 TiB
    ("zstd 1 TiB", lambda z: container((1, z.ZstdCompressor().compress(b"x")[:4] + b"\0" * 9, ZSTD, 13, 1 << 40)),
     "declare 1099511627776 bytes in all"),
    # the header says 100 bytes, the frame says 1 GiB
    ("zstd frame larger than declared",
     lambda z: container((1, _frame_with_content_size(z, 1 << 30), ZSTD, len(_frame_with_content_size(z, 1 << 30)),
                       100)),
     "zstd frame holds 1073741824 bytes, the fatbin header says 100"),
    # a frame that does not say its size and expands past the declared 100 bytes
    ("zstd stream larger than declared",
     lambda z: container((1, _zstd_unsized(z, 1 << 24), ZSTD, len(_zstd_unsized(z, 1 << 24)), 100)),
     "decompressed to 101 bytes, the header says 100"),
    # 32 KB of LZ4 declaring 100 bytes
    ("lz4 larger than declared", lambda z: container((2, _lz4(1 << 30)[: 32 << 10], LZ4, 32 << 10, 100)),
     "corrupt LZ4 payload, or one larger than the 100 bytes declared"),
    # 4 MB of LZ4 declaring 1 GiB
    ("lz4 1 GiB", lambda z: container((2, b"\0" * (4 << 20), LZ4, 4 << 20, 1 << 30)), "more than nbjit reads"),
    # many entries whose declared sizes add up past the cap
    ("lz4 total", lambda z: container(*[(2, b"\0" * (1 << 20), LZ4, 1 << 20, 200 << 20)] * 3),
     "its entries declare 629145600 bytes in all"),
    ("lz4 entry cap", lambda z: container((2, b"\0" * (2 << 20), LZ4, 2 << 20, 300 << 20)),
     "declares 314572800 bytes uncompressed, more than nbjit reads"),
    ("lz4 ratio", lambda z: container((2, b"\0" * 100, LZ4, 100, 1 << 20)), "cannot expand to the 1048576 declared"),
])
def test_decompression_bombs_fail_before_allocating(name, data, msg):
    z = pytest.importorskip("zstandard")
    raw = data(z)
    with pytest.raises(ImageFormatError, match=re.escape(msg)):
        inspect_fatbin(raw)
    assert peak_alloc(lambda: inspect_fatbin(raw)) < (8 << 20) + 2 * len(raw), name


def _frame_with_content_size(z, size: int) -> bytes:
    import io
    buf = io.BytesIO()
    w = z.ZstdCompressor().stream_writer(buf, size=size, closefd=False)
    w.write(b"\0" * 1024)
    w.flush(z.FLUSH_BLOCK)  # the frame header says `size`; the data stops short (never read)
    return buf.getvalue()


def _zstd_unsized(z, size: int) -> bytes:
    return z.ZstdCompressor(write_content_size=False).compress(b"\0" * size)


def _lz4(size: int) -> bytes:
    import lz4.block
    return lz4.block.compress(b"\0" * (1 << 20), store_size=False) * (size >> 20)


GOOD = (DATA / "nvcc/kernels_multi_lz4.fatbin").read_bytes()


@pytest.mark.parametrize("data,msg", [
    (b"", "no entries"),
    (b"\x50\xed\x55\xba\x01\x00", "truncated fatbin header"),
    (b"\x00" * 3 + GOOD, "bad fatbin magic"),
    (GOOD[:-100], "truncated"),
    (GOOD[:16] + (60000).to_bytes(2, "little") + GOOD[18:], "unknown kind"),
    (GOOD[:16 + 8] + (10**9).to_bytes(8, "little") + GOOD[32:], "overrun"),
    (GOOD[:8] + (16).to_bytes(8, "little") + GOOD[16:32], "header truncated"),
])
def test_bad_fatbins(data, msg):
    with pytest.raises(ImageFormatError, match=msg):
        inspect_fatbin(data, source="bad.fatbin")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=st.sampled_from(["kernels_multi_lz4.fatbin", "kernels_multi.fatbin", "kernels_90a.fatbin"]),
       data=st.data())
def test_fuzz_mutated_fatbins(src, data):
    raw = bytearray((DATA / "nvcc" / src).read_bytes())
    fb = inspect_fatbin(bytes(raw))
    heads = [16] + [e.offset - 64 for e in fb.entries] + [e.offset for e in fb.entries]
    for _ in range(data.draw(st.integers(1, 6))):
        base = data.draw(st.sampled_from(heads))
        i = min(len(raw) - 1, base + data.draw(st.integers(0, 72)))
        raw[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del raw[data.draw(st.integers(0, len(raw))):]
    try:
        inspect_fatbin(bytes(raw))
    except ImageFormatError:
        pass


# ------------------------------------------------------------------ the writer


def _triples(entries):
    return [(e.kind, e.target, e.payload) for e in entries]


@pytest.mark.parametrize("name", ["kernels_multi_none.fatbin", "kernels_multi_lz4.fatbin", "kernels_multi.fatbin",
                                  "kernels_90a.fatbin"])
def test_build_fatbin_round_trips_nvcc_entries(name):
    """nvcc's entries (decompressed) written again read back as the same entries."""
    before = fatbin(name).entries
    after = inspect_fatbin(build_fatbin(_triples(before))).entries
    assert [(e.kind, e.arch, e.ptx_version, e.payload) for e in after] == \
        [(e.kind, e.arch, e.ptx_version, e.payload) for e in before]
    assert not any(e.compressed or e.debug for e in after)


MIXED = [("cubin", "sm_90", "nvrtc/tmpl_sm90.cubin"),  # 8340 bytes: not a multiple of 8
         ("ptx", "compute_90a", "nvrtc/tmpl_compute90.ptx"),
         ("cubin", "sm_90a", "nvcc/kernels_sm_90a.cubin"),
         ("ptx", "compute_80", "nvcc/kernels_sm80.ptx"),
         ("cubin", "sm_100", "nvcc/kernels_sm_100.cubin"),
         ("ptx", "compute_100f", "nvcc/kernels_sm80.ptx"),
         ("cubin", "sm_80", "nvcc/kernels_sm_80.cubin")]


def test_build_fatbin_kinds_variants_and_versions():
    data = build_fatbin([(k, a, (DATA / f).read_bytes()) for k, a, f in MIXED])
    got = inspect_fatbin(data).entries
    assert [(e.kind, e.arch) for e in got] == [(k, a) for k, a, _ in MIXED]
    for e, (_, _, f) in zip(got, MIXED):
        raw = (DATA / f).read_bytes()
        assert e.payload == (raw.rstrip(b"\0") if e.kind == "ptx" else raw)
        want = inspect_ptx(e.payload).version if e.kind == "ptx" else None
        assert e.ptx_version == want
    assert [e.arch_specific for e in got] == [False, True, True, False, False, False, False]
    assert [e.family for e in got] == [False, False, False, False, False, True, False]
    # what a device picks from it follows the Arch rules
    assert select_entry(got, "sm_90").arch == "sm_90a"
    assert select_entry(got, "sm_89").arch == "sm_80"
    assert select_entry(got, "sm_103").arch == "sm_100"
    assert select_entry(got, "sm_120").arch == "compute_80"


@pytest.mark.skipif(find_cuobjdump() is None, reason="cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
def test_build_fatbin_against_cuobjdump(tmp_path):
    """cuobjdump, an independent reader, lists and extracts the same entries."""
    path = tmp_path / "mixed.fatbin"
    path.write_bytes(build_fatbin([(k, a, (DATA / f).read_bytes()) for k, a, f in MIXED]))
    exe = find_cuobjdump()
    listed = subprocess.run([exe, "-lelf", "-lptx", str(path)], capture_output=True, text=True, check=True).stdout
    # cuobjdump lists ELF and PTX files each numbered on their own; an ELF by its own flags'
    # architecture (sm_100 for any sm_100 cubin), a PTX entry by the header's
    names = re.findall(r"(ELF|PTX) file\s+\d+: mixed\.\d+\.(\w+)\.(?:cubin|ptx)", listed)
    assert names == [("ELF", "sm_90"), ("PTX", "sm_90a"), ("ELF", "sm_90a"), ("PTX", "sm_80"), ("ELF", "sm_100"),
                     ("PTX", "sm_100f"), ("ELF", "sm_80")], listed
    subprocess.run([exe, "-xelf", "all", "-xptx", "all", str(path)], cwd=tmp_path, capture_output=True, check=True)
    assert (tmp_path / "mixed.1.sm_90.cubin").read_bytes() == (DATA / "nvrtc/tmpl_sm90.cubin").read_bytes()
    assert (tmp_path / "mixed.2.sm_90a.cubin").read_bytes() == (DATA / "nvcc/kernels_sm_90a.cubin").read_bytes()
    assert (tmp_path / "mixed.1.sm_90a.ptx").read_bytes() == (DATA / "nvrtc/tmpl_compute90.ptx").read_bytes()
    assert (tmp_path / "mixed.2.sm_80.ptx").read_bytes() == (DATA / "nvcc/kernels_sm80.ptx").read_bytes()


@pytest.mark.parametrize("entries,msg", [
    ([], "at least one entry"),
    ([("elf", "sm_90", b"\x7fELF")], "kind must be 'cubin' or 'ptx'"),
    ([("cubin", "compute_90", (DATA / "nvcc/kernels_sm_90.cubin").read_bytes())], "real architecture"),
    ([("cubin", "sm_9x", (DATA / "nvcc/kernels_sm_90.cubin").read_bytes())], "not an architecture"),
    ([("cubin", "sm_90", b"not an elf at all")], "not a CUDA ELF"),
    ([("ptx", "compute_90", b".target sm_90\n.entry k() { ret; }")], "no '.version'"),
    ([("ptx", "compute_90", "\n.version 9.0\n")], "payload is bytes, not str"),
    ([("ptx", "compute_90")], "not (kind, arch, payload)"),
    ([None], "not (kind, arch, payload)"),
])
def test_build_fatbin_refuses(entries, msg):
    with pytest.raises(ImageFormatError, match=re.escape(msg)):
        build_fatbin(entries, source="x.fatbin")


def test_layout_says_where_each_payload_lies():
    """layout_fatbin's spans are the payloads inspect_fatbin reads back (PTX: its text, without
    the NUL and padding the container adds), so a bundle's loader slices the container instead
    of reading it; build_fatbin writes the same bytes."""
    from nbjit.read.fatbin import layout_fatbin
    cubin = (DATA / "nvcc/kernels_sm_90.cubin").read_bytes()
    ptx = (DATA / "nvcc/kernels_sm80.ptx").read_bytes()
    entries = [("ptx", "compute_80", ptx + b"\0\0"), ("cubin", "sm_90", cubin),
               ("ptx", "compute_90", b".version 8.0\n")]
    data, spans = layout_fatbin(entries, source="k")
    assert data == build_fatbin(entries, source="k")
    back = inspect_fatbin(data).entries
    assert [data[o:o + n] for o, n in spans] == [ptx, cubin, b".version 8.0\n"] == [e.payload for e in back]
    assert [e.offset for e in back] == [o for o, _ in spans]
