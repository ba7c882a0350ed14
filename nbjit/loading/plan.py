"""The load plan: what to hand the driver for an image on a given device and driver, pure data
in, a ``Plan`` out (``plan``), so every route is tested without a GPU; and the plan carried
out where it has a host step (``carry_out``: PTX newer than the driver assembled with
nvJitLink, through the cache).

PTX routes (FORMATS.md §8: on the CUDA 13.0 driver the ISA version is what blocks external
PTX, and a ``debug`` target compiles unoptimised):
* ``"driver"``: the driver's JIT takes the PTX as it is (debug information stripped unless
  asked to keep it);
* ``"nvjitlink"``: the PTX is newer than the driver accepts, and nvJitLink (same version as
  the PTX's producer or newer) assembles it to a cubin for the device on the host;
* ``"lowered"``: no such nvJitLink; ``.version`` is rewritten to the newest the driver
  takes, which works whenever the PTX uses no newer instruction."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from nbjit.arch import Arch, pick
from nbjit.errors import NbjitCompileError, NbjitLoadError
from nbjit.read.image import Image
from nbjit.records import field, record

if TYPE_CHECKING:
    from nbjit.read.cubin import CubinInfo
    from nbjit.read.fatbin import FatbinInfo
    from nbjit.read.ptx import PtxInfo
# (each reader is imported where a plan needs it: loading a cubin, the warm path of
# nbjit.compile, never reads PTX or a fatbin; a kernel bundle's image, none but the cubin or
# PTX its device runs)

__all__ = ["Plan", "Assemble", "plan"]



@record
class Plan:
    """What to load: ``data`` of ``kind`` ("ptx" NUL-terminated, "cubin", "fatbin"), the
    inspection that gives kernel layouts (``info``), the ``route`` a PTX takes, a ``note`` for
    the user, the fatbin entry used, the PTX's own inspection (``ptx``), and a host step still
    to do (``assemble``: then ``data`` is the PTX and ``kind`` "cubin" once it is done)."""

    data: bytes
    kind: str
    info: PtxInfo | CubinInfo | None
    route: str | None = None
    note: str | None = None
    entry: int | None = None
    ptx: PtxInfo | None = None
    details: dict = field(default_factory=dict)
    assemble: Assemble | None = None


def plan(img: Image, cc: tuple[int, int], driver: int, *, keep_debug: bool = False,
         nvjitlink: tuple[int, int] | Callable[[], tuple[int, int] | None] | None = None) -> Plan:
    """Plan the load of ``img`` on a device of compute capability ``cc`` under a driver of
    CUDA version ``driver`` (e.g. 13000), with the nvJitLink of version ``nvjitlink`` (None:
    there is none; a function: asked only for PTX newer than the driver accepts, as finding
    the library takes milliseconds)."""
    if img.kind == "ptx":
        return _plan_ptx(img.data, img.name, cc, driver, keep_debug, nvjitlink)
    if img.kind == "cubin":
        from nbjit.read import cubin  # (loading PTX reads no cubin)
        info = img.info if isinstance(img.info, cubin.CubinInfo) else cubin.inspect_cubin(img.data, source=img.name)
        if not info.arch.runs_on(cc):
            dev = Arch.parse(cc)
            raise NbjitLoadError(
                f"{img.name}: a cubin for {info.arch} cannot run on this {dev} device (cubins run on the same major "
                f"version at an equal or newer minor, 'a' builds only on their own chip): build it for {dev} or "
                "load PTX instead")
        return Plan(img.data, "cubin", info)
    if img.entries:  # a kernel bundle's fatbin: its manifest says what each entry is and where
        return _plan_listed(img, cc, driver, keep_debug, nvjitlink)
    from nbjit.read.fatbin import inspect_fatbin
    return _plan_fatbin(img, inspect_fatbin(img.data, source=img.name), cc, driver, keep_debug, nvjitlink)


def _plan_listed(img: Image, cc, driver, keep_debug, nvjitlink) -> Plan:
    """The plan for a fatbin whose entries ``img.entries`` lists: the one ``arch.pick``
    chooses for the device, planned as the cubin or PTX it is (no container to read; a cubin
    whose facts are listed too is not read either: they are the plan's ``info``)."""
    i = pick([(kind, arch) for kind, arch, *_ in img.entries], cc)
    if i is None:
        have = ", ".join(str(arch) for _, arch, *_ in img.entries)
        raise NbjitLoadError(f"{img.name}: no image in this fatbin runs on {Arch.parse(cc)} (it holds {have})")
    kind, arch, offset, length, facts = img.entries[i]
    data = img.data[offset:offset + length]
    if kind == "cubin" and facts is not None:
        return Plan(data, "cubin", facts, entry=i)
    sub = Image(data, kind, f"{img.name}[{i}:{arch}]")
    p = plan(sub, cc, driver, keep_debug=keep_debug, nvjitlink=nvjitlink)
    return Plan(p.data, p.kind, p.info, p.route, p.note, i, p.ptx, p.details, p.assemble)


def _assemble_target(cc: tuple[int, int], ptx_arch: Arch) -> Arch:
    """The SASS to assemble PTX into for this device, keeping an 'a' or 'f' target."""
    return Arch(Arch.parse(cc).number, ptx_arch.variant)


def _plan_ptx(raw: bytes, name: str, cc, driver: int, keep_debug: bool, nvjitlink) -> Plan:
    from nbjit.read.ptx import cuda_for_ptx, inspect_ptx, max_ptx_for_cuda, set_version, strip_debug
    text = raw.decode("utf-8", errors="strict").rstrip("\0") if isinstance(raw, bytes) else raw
    info = inspect_ptx(text, source=name)
    try:
        target = Arch.parse(info.arch, virtual=True)
    except ValueError:
        raise NbjitLoadError(f"{name}: PTX .target {info.arch!r} is not an architecture") from None
    if not target.runs_on(cc):
        raise NbjitLoadError(f"{name}: PTX for {info.arch} cannot run on this {Arch.parse(cc)} device")
    if not keep_debug and info.debug.kind != "none":
        text = strip_debug(text)
    driver_cuda = (driver // 1000, driver % 1000 // 10)
    limit = max_ptx_for_cuda(driver_cuda)
    details = {"ptx_version": info.version, "driver_accepts": limit, "target": info.arch}
    if info.version <= limit:
        return Plan(text.encode() + b"\0", "ptx", info, "driver", None, ptx=info, details=details)

    need = cuda_for_ptx(info.version)
    if callable(nvjitlink):
        nvjitlink = nvjitlink()
    details["nvjitlink"] = nvjitlink
    if nvjitlink is not None and tuple(nvjitlink) >= need:
        arch = _assemble_target(cc, target)
        note = (f"{name}: PTX {info.version[0]}.{info.version[1]} is newer than the driver accepts "
                f"({limit[0]}.{limit[1]}); assembled to a {arch} cubin with nvJitLink {nvjitlink[0]}.{nvjitlink[1]}")
        step = Assemble(text, arch, tuple(nvjitlink), name, driver_cuda, limit, info.version)
        return Plan(text.encode(), "cubin", None, "nvjitlink", note, ptx=info, details=details, assemble=step)
    lowered = set_version(text, limit)
    note = (f"{name}: PTX {info.version[0]}.{info.version[1]} is newer than the driver accepts "
            f"({limit[0]}.{limit[1]}) and no nvJitLink >= {need[0]}.{need[1]} is installed; "
            f".version lowered to {limit[0]}.{limit[1]} (fine unless the PTX uses newer instructions; "
            f"'pip install -U nvidia-nvjitlink' assembles it properly)")
    return Plan(lowered.encode() + b"\0", "ptx", info, "lowered", note, ptx=info, details=details)


def _plan_fatbin(img: Image, fb: FatbinInfo, cc, driver, keep_debug, nvjitlink) -> Plan:
    from nbjit.read.fatbin import select_entry, undecoded
    entry = select_entry(fb.entries, cc)
    if entry is None:
        have = ", ".join(e.arch_name for e in fb.entries)
        lto = " (LTO-IR is linked, not loaded: nbjit.compile(source, link=[this fatbin]))" \
            if any(e.kind == "ltoir" for e in fb.entries) else ""
        raise NbjitLoadError(f"{img.name}: no image in this fatbin runs on {Arch.parse(cc)} (it holds {have}){lto}")
    if entry.payload is None:
        # compressed in a way Python cannot undo: the driver reads the whole container;
        # signatures come from any entry we can read, else from the driver
        readable = next((e for e in fb.entries if e.payload is not None and e.kind == "cubin"), None)
        from nbjit.read.cubin import inspect_cubin
        info = inspect_cubin(readable.payload, source=img.name) if readable else None
        return Plan(img.data, "fatbin", info, None,
                    f"{img.name}: image {entry.index} ({entry.arch_name}) is {undecoded(entry)}; the driver loads "
                    "the whole fatbin", entry.index)
    sub = Image(entry.payload, entry.kind, f"{img.name}[{entry.index}:{entry.arch_name}]")
    p = plan(sub, cc, driver, keep_debug=keep_debug, nvjitlink=nvjitlink)
    return Plan(p.data, p.kind, p.info, p.route, p.note, entry.index, p.ptx, p.details, p.assemble)


@record
class Assemble:
    """A step the plan needs done on the host: PTX assembled to a cubin by nvJitLink."""

    ptx: str
    arch: Arch  # sm_90, sm_90a
    nvjitlink: tuple[int, int]
    name: str
    driver_cuda: tuple[int, int]
    driver_ptx: tuple[int, int]  # the newest PTX the driver takes
    ptx_version: tuple[int, int]


def carry_out(p: Plan, cache=None) -> Plan:
    """The plan with its host step done: PTX newer than the driver assembled to a cubin by
    nvJitLink, through the cache (``cache``, default ``nbjit.default_cache()``)."""
    a = p.assemble
    if a is None:
        return p
    from nbjit.read.cubin import inspect_cubin
    from nbjit.toolchain.nvjitlink import assemble_cached  # (here: a cubin's or a bundle's load imports no compiler)
    try:
        cubin = assemble_cached(a.ptx, a.arch, name=a.name, cache=cache)
    except NbjitCompileError as e:
        raise NbjitLoadError(
            f"{a.name}: PTX {a.ptx_version[0]}.{a.ptx_version[1]} is newer than this driver takes (CUDA "
            f"{a.driver_cuda[0]}.{a.driver_cuda[1]}: PTX up to {a.driver_ptx[0]}.{a.driver_ptx[1]}), and nvJitLink "
            f"{a.nvjitlink[0]}.{a.nvjitlink[1]} could not assemble it:\n{e}") from None
    return Plan(cubin, "cubin", inspect_cubin(cubin, source=a.name), p.route, p.note, p.entry, p.ptx, p.details)
