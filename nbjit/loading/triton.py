"""Triton kernels compiled ahead of time, launched from Numba without importing Triton.

Reads the metadata Triton writes beside its PTX / cubin (``<name>.json`` in a cache entry
directory) or the ``// meta:`` comments of a PTX, and applies Triton's launch rules:
block = num_warps x warp size, dynamic shared memory = ``shared``, a grid of programs
(times num_ctas in x for clusters), and the scratch pointers Triton appends after the
user's parameters (none up to 3.2; global scratch from 3.3; profile scratch from 3.5).
"""
from __future__ import annotations

import json
import os
import re
import stat
import threading
import warnings
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from nbjit.launch.entry import CEntry
    from nbjit.loading.module import Module
    from nbjit.params.signature import Param

import numpy as np

from nbjit.arch import Arch
from nbjit.errors import NbjitArgumentError, NbjitLoadError, NbjitWarning
from nbjit.gpu import driver as _driver
from nbjit.gpu.host import current_host
from nbjit.launch.arrays import device_pointer
from nbjit.launch import nvtx
from nbjit.launch.config import LaunchConfig
from nbjit.launch.tma import _SWIZZLE, TensorMap, plan_tiled, whole_numbers
from nbjit.read.image import Image
from nbjit.files import MAX_FILE_BYTES, read_regular
from nbjit.read.ptx import PtxInfo, inspect_ptx
from nbjit.records import field, record

# Triton's launch metadata where a PTX's // meta: comments say nothing.
DEFAULTS: dict[str, int] = {
    "num_warps": 4,
    "num_ctas": 1,
    "shared": 0,
    "tmem_size": 0,
    "global_scratch_size": 0,
    "global_scratch_align": 1,
    "profile_scratch_size": 0,
    "profile_scratch_align": 1,
}

__all__ = ["TritonMeta", "TritonKernel", "read_triton", "load_triton", "from_module", "launch_rules"]


@record
class TritonMeta:
    """Triton's launch metadata for one compiled kernel."""

    name: str
    num_warps: int = 4
    num_ctas: int = 1
    warp_size: int = 32
    shared: int = 0
    tmem_size: int = 0
    global_scratch_size: int = 0
    global_scratch_align: int = 1
    profile_scratch_size: int = 0
    profile_scratch_align: int = 1
    scratch_params: int = 2  # trailing pointer parameters Triton appended
    arch: Arch | None = None  # the target's architecture, e.g. sm_90 (Triton's JSON says 90)
    ptx_version: int | None = None
    triton_version: str | None = None
    cluster_dims: tuple[int, ...] | None = None
    cooperative: bool = False
    pdl: bool = False
    source: str = "json"  # "json" or "ptx comments"
    tensordescs: tuple = ()  # TensorDescMeta per host-side tensor descriptor argument, in order
    extra: dict = field(default_factory=dict)

    @property
    def block(self) -> tuple[int, int, int]:
        """Threads per block: ``num_warps`` warps."""
        return (self.num_warps * self.warp_size, 1, 1)

    def scratch_bytes(self, grid: tuple[int, int, int]) -> tuple[int, int]:
        """(global, profile) scratch bytes a launch of ``grid`` programs needs."""
        programs = grid[0] * grid[1] * grid[2] * self.num_ctas
        return self.global_scratch_size * programs, self.profile_scratch_size * programs


@record
class TensorDescMeta:
    """How Triton compiled one host-side tensor descriptor argument (its ``tensordesc_meta``):
    the tensor map's swizzle (0 none, 1 32B, 2 64B, 3 128B), element size and type (Triton's
    device numbering), the box it loads (``block_size``, which Triton may have clamped)."""

    swizzle: int
    elem_size: int
    elem_type: int
    block_size: tuple[int, ...]
    fp4_padded: bool = False
    is_im2col: bool = False


def _tensordescs(d: dict, source: str) -> tuple:
    raw = d.get("tensordesc_meta")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad(source, "tensordesc_meta", f"expected a list, got {type(raw).__name__}")
    out = []
    for i, x in enumerate(raw):
        key = f"tensordesc_meta[{i}]"
        if not isinstance(x, dict):
            raise _bad(source, key, f"expected an object, got {type(x).__name__}")
        block = x.get("block_size")
        if not isinstance(block, list) or not 1 <= len(block) <= 5:
            raise _bad(source, f"{key}.block_size", f"expected 1 to 5 numbers, got {str(block)[:40]}")
        out.append(TensorDescMeta(
            swizzle=_int(x, "swizzle", 0, source, 0, 3), elem_size=_int(x, "elem_size", 1, source, 1, 16),
            elem_type=_int(x, "elem_type", 0, source, 0, 15),
            block_size=tuple(_int({"v": b}, "v", 1, source, 1, 256) for b in block),
            fp4_padded=x.get("fp4_padded") is True, is_im2col=x.get("is_im2col") is True))
    return tuple(out)


def _scratch_params(meta: dict) -> int:
    """How many scratch pointers this Triton version appends (its metadata keys say)."""
    if "profile_scratch_size" in meta:
        return 2
    if "global_scratch_size" in meta:
        return 1
    return 0


_NAME_OK = re.compile(r"[A-Za-z_$][\w$]{0,1023}")


def _bad(source: str, key: str, why: str) -> NbjitLoadError:
    return NbjitLoadError(f"{source}: Triton metadata {key!r}: {why}")


def _arch(d: dict, target: dict, source: str) -> Arch | None:
    """The architecture of Triton's ``target.arch`` (a number, 90 for sm_90; None where it
    is 0 or absent), which Triton's own ``arch`` option (``"sm90"``), where given, names too."""
    n = _int(target, "arch", 0, source, 0, 9999, shown="target.arch")
    if 0 < n < 10:
        raise _bad(source, "target.arch", f"{n} is not an architecture's number (90 for sm_90)")
    option = d.get("arch")
    if option is not None:
        try:
            a = Arch.parse(option) if isinstance(option, str) else None
        except ValueError:
            a = None
        if a is None or a.virtual:
            raise _bad(source, "arch", f"{str(option)[:40]!r} is not an architecture (as 'sm90' or 'sm_90a')")
        if n and a.number != n:
            raise _bad(source, "arch", f"{option!r} is not the architecture of target.arch ({n})")
    return Arch(n) if n else None


def _int(d: dict, key: str, default: int, source: str, lo: int = 0, hi: int = 1 << 31, *,
         shown: str | None = None) -> int:
    """A whole number from the metadata (a JSON number, never text), in [lo, hi]; None or
    absent gives ``default``. ``shown``: the key as messages name it."""
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(source, shown or key, f"expected a whole number, got {type(v).__name__}")
    try:
        n = int(v)
    except (ValueError, OverflowError):
        n = None
    if n is None or (isinstance(v, float) and n != v) or not lo <= n <= hi:
        raise _bad(source, shown or key, f"{str(v)[:40]!r} is not a whole number from {lo} to {hi}")
    return n


def _align(d: dict, key: str, source: str) -> int:
    """An alignment from the metadata: a power of two (1 where absent)."""
    n = _int(d, key, 1, source, 1)
    if n & (n - 1):
        raise _bad(source, key, f"{n} is not a power of two")
    return n


def _warp_size(d: dict, target: dict, source: str) -> int:
    """The warp size the metadata says (its own, else its target's): a CUDA warp's, 32."""
    for where, key in ((d, "warp_size"), (target, "warp_size")):
        n = _int(where, key, 0, source, 0, 1 << 31, shown=key if where is d else "target.warp_size")
        if n and n != 32:
            raise _bad(source, key if where is d else "target.warp_size", f"{n} is not a CUDA warp's size (32)")
    return 32


def _from_json(d, source: str) -> TritonMeta:
    """TritonMeta from the metadata of any JSON shape: what is not Triton's is an
    NbjitLoadError naming the file and the key."""
    if not isinstance(d, dict):
        raise NbjitLoadError(f"{source}: Triton metadata must be a JSON object, not {type(d).__name__}")
    target = d.get("target") if d.get("target") is not None else {}
    if isinstance(target, (list, tuple)):  # older Triton: ["cuda", 90, 32]
        if not target:
            raise _bad(source, "target", "an empty list")
        target = {"backend": target[0], **({"arch": target[1]} if len(target) > 1 else {}),
                  **({"warp_size": target[2]} if len(target) > 2 else {})}
    if not isinstance(target, dict):
        raise _bad(source, "target", f"expected an object or a list, got {type(target).__name__}")
    if target.get("backend", "cuda") != "cuda":
        raise NbjitLoadError(f"{source}: a Triton kernel for {str(target.get('backend'))[:40]!r}, not CUDA")
    name = d.get("name")
    if not isinstance(name, str) or not _NAME_OK.fullmatch(name):
        raise _bad(source, "name", f"{str(name)[:60]!r} is not a kernel name" if name is not None else "missing")
    cluster = d.get("cluster_dims")
    if cluster is not None and (not isinstance(cluster, (list, tuple)) or len(cluster) > 3):
        raise _bad(source, "cluster_dims", f"expected up to 3 numbers, got {str(cluster)[:40]}")
    ptx_version = d.get("ptx_version")
    version = d.get("triton_version")
    return TritonMeta(
        name=name,
        num_warps=_int(d, "num_warps", 4, source, 1, 1024),
        num_ctas=_int(d, "num_ctas", 1, source, 1, 1024),
        warp_size=_warp_size(d, target, source),
        shared=_int(d, "shared", 0, source),
        tmem_size=_int(d, "tmem_size", 0, source),
        global_scratch_size=_int(d, "global_scratch_size", 0, source),
        global_scratch_align=_align(d, "global_scratch_align", source),
        profile_scratch_size=_int(d, "profile_scratch_size", 0, source),
        profile_scratch_align=_align(d, "profile_scratch_align", source),
        scratch_params=_scratch_params(d),
        arch=_arch(d, target, source),
        ptx_version=ptx_version if isinstance(ptx_version, int) and not isinstance(ptx_version, bool) else None,
        triton_version=str(version)[:64] if isinstance(version, (str, int, float)) else None,
        cluster_dims=tuple(_int({"v": c}, "v", 1, source, 1, 1024) for c in cluster) if cluster else None,
        cooperative=d.get("launch_cooperative_grid") is True,
        pdl=d.get("launch_pdl") is True,
        source="json",
        tensordescs=_tensordescs(d, source),
    )


def ptx_meta(info: PtxInfo) -> dict:
    """Triton's metadata from a PTX's comments, with Triton's fallbacks: the kernel is the
    first visible entry, ``num_warps`` follows from ``.reqntid``, the rest from ``DEFAULTS``."""
    out = dict(info.metadata)
    if "name" not in out:
        visible = [e for e in info.entries if e.linkage == "visible"] or list(info.entries)
        if visible:
            out["name"] = visible[0].name
    if "num_warps" not in out:
        req = next((e.directives.reqntid for e in info.entries if e.directives.reqntid), None)
        if req:
            threads = 1
            for r in req:
                threads *= r
            out["num_warps"] = -(-threads // 32)
    for k, v in DEFAULTS.items():
        out.setdefault(k, v)
    return out


def _from_ptx_comments(meta: dict, source: str) -> TritonMeta:
    if not meta.get("name"):
        raise _bad(source, "name", "the '// meta: name=' comment names no kernel")
    full = {**DEFAULTS, **meta}
    # (the comments' numbers are text: whole numbers read as JSON's, the rest refused as text)
    d = {k: int(v) if k != "name" and isinstance(v, str) and v.isdecimal() and len(v) <= 19 else v
         for k, v in full.items() if k in ("name", "num_warps", "num_ctas", "shared", "tmem_size",
                                           "global_scratch_size", "global_scratch_align", "profile_scratch_size",
                                           "profile_scratch_align")}
    m = _from_json(d, source)
    return TritonMeta(**{**m.__dict__, "source": "ptx comments"})


@record
class TritonArtifacts:
    """Where a Triton kernel's files are: metadata and the images beside it."""

    meta: TritonMeta
    cubin: Path | None
    ptx: Path | None
    ptx_text: bytes | None = None
    ttir: Path | None = None

    def declarations(self) -> dict:
        """C parameter types from the Triton IR beside the images (``!tt.ptr<f32>`` ->
        ``float*``), with Triton's trailing scratch pointers: ``{name: ("triton ir",
        params)}``, or {} without IR."""
        if self.ttir is None:
            return {}
        from nbjit.params.cdecl import CParam
        from nbjit.params.declarations import triton_ir_signatures
        sigs = triton_ir_signatures(_read(self.ttir, TTIR_BYTES).decode(errors="replace"))
        names = ("global_scratch", "profile_scratch")[: self.meta.scratch_params]
        return {k: ("triton ir", v + tuple(CParam("void", True, False, n) for n in names))
                for k, v in sigs.items() if k == self.meta.name}


def _no_constant(word: str):
    raise ValueError(f"{word} is not a JSON number")


# Triton IR is read for its parameter types only: the largest kernels' is a few hundred KiB.
TTIR_BYTES = 1 << 24


def _read(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of one of a Triton kernel's files; what is not a regular file of at most
    ``limit`` bytes is an ``NbjitLoadError`` naming it."""
    try:
        return read_regular(path, limit)
    except OSError as e:
        raise NbjitLoadError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise NbjitLoadError(f"{path}: {e}") from None


def _beside(stem: Path, suffix: str) -> Path | None:
    """``stem`` + ``suffix`` where that file exists. Something else of that name (a
    directory, a FIFO, a device) is an ``NbjitLoadError``, found without opening it: a FIFO
    would block whoever opens it to read."""
    p = stem.with_suffix(suffix)
    try:
        mode = os.stat(p).st_mode
    except OSError:  # absent, or a dangling link
        return None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
            "a device or other special file"
        raise NbjitLoadError(f"{p}: {kind}, not a regular file: a Triton kernel's {suffix} is a file its compiler "
                             "wrote (remove or replace this one)")
    return p


def read_triton(path: str | os.PathLike) -> TritonArtifacts:
    """Find a Triton kernel's metadata and images: a cache entry directory, its
    ``<name>.json``, or a PTX file carrying ``// meta:`` comments."""
    p = Path(path)
    if p.is_dir():
        jsons = [j for j in sorted(p.glob("*.json")) if not j.name.startswith("__grp__")]
        if not jsons:
            ptxs = sorted(p.glob("*.ptx"))
            if len(ptxs) != 1:
                raise NbjitLoadError(f"{p}: no Triton metadata (<name>.json) in this directory: give a Triton "
                                     "cache entry's directory or its .json, or an image file (PTX, cubin, fatbin)")
            p = ptxs[0]  # read below as a file, whatever it turns out to be
        elif len(jsons) > 1:
            raise NbjitLoadError(f"{p}: several kernels' metadata here ({', '.join(j.name for j in jsons)}): "
                                 "pass the .json of the one to load")
        else:
            p = jsons[0]
    if not p.exists():
        raise NbjitLoadError(f"{p}: no such file or directory")
    if p.suffix == ".json":
        try:
            d = json.loads(read_regular(p, 1 << 24), parse_constant=_no_constant)
        except (OSError, ValueError, RecursionError) as e:
            raise NbjitLoadError(f"{p}: unreadable Triton metadata: {str(e)[:200]}") from None
        meta = _from_json(d, str(p))
        stem = p.parent / meta.name
        cubin, ptx, ttir = (_beside(stem, x) for x in (".cubin", ".ptx", ".ttir"))
        if cubin is None and ptx is None:
            raise NbjitLoadError(f"{p}: neither {meta.name}.cubin nor {meta.name}.ptx is beside it")
        return TritonArtifacts(meta, cubin, ptx, ttir=ttir)
    data = _read(p)
    info = inspect_ptx(data, source=str(p))
    if not info.metadata:
        raise NbjitLoadError(f"{p}: PTX without '// meta:' comments and no Triton JSON beside it: load it with "
                             "nbjit.load() and launch it with explicit grid and block instead")
    return TritonArtifacts(_from_ptx_comments(ptx_meta(info), str(p)), None, p, data, ttir=_beside(p, ".ttir"))


def launch_rules(meta: TritonMeta, params: Sequence[Param]) -> dict:
    """Triton's launch rules for a kernel with these parameters (a plain dict, for
    ``nbjit inspect`` and the tests)."""
    n = len(params)
    k = meta.scratch_params
    if n < k or any(not (p.pointer or p.size == 8) for p in params[n - k:]):
        raise NbjitLoadError(
            f"Triton kernel {meta.name!r}: its metadata ({meta.triton_version or 'version unknown'}) means "
            f"{k} trailing scratch pointer parameter(s), but its parameter list ends in "
            f"{[f'{p.size} bytes' for p in params[max(0, n - k):]]}")
    descs = _descriptor_params(meta, params[:n - k])
    return {"block": list(meta.block), "dynamic_shared": meta.shared, "num_ctas": meta.num_ctas,
            "user_params": n - k - sum(2 * d["ndim"] for d in descs), "kernel_params": n - k,
            "descriptors": descs, "scratch_params": k,
            "global_scratch": {"bytes_per_program": meta.global_scratch_size, "align": meta.global_scratch_align},
            "profile_scratch": {"bytes_per_program": meta.profile_scratch_size, "align": meta.profile_scratch_align},
            "cooperative": meta.cooperative}


# Triton's host-side tensor descriptors: how a version passes one to the kernel. Triton 3.9
# (backends/nvidia/driver.py, make_tensordesc_arg): a CUtensorMap (128 bytes by value), then
# the shape (one i32 per dimension) and the strides in elements (one i64 each).
_DESCRIPTOR_ABI = ("3.9",)
# Triton's device numbering of TMA element types -> (numpy dtype for sizes, the driver's type)
_TMA_DEVICE_TYPES = {0: ("u1", "UINT8"), 1: ("u2", "UINT16"), 2: ("u4", "UINT32"), 3: ("i4", "INT32"),
                     4: ("u8", "UINT64"), 5: ("i8", "INT64"), 6: ("f2", "FLOAT16"), 7: ("f4", "FLOAT32"),
                     8: ("f4", "FLOAT32_FTZ"), 9: ("f8", "FLOAT64"), 10: ("u2", "BFLOAT16")}
_TMA_SWIZZLE = ("none", "32B", "64B", "128B")  # Triton's numbers, nbjit.tensor_map's names


def _descriptor_params(meta: TritonMeta, params: Sequence[Param]) -> list:
    """Where each host-side tensor descriptor's parameters are (a CUtensorMap, then the
    shape and strides): ``[{param, arg, ndim, block, swizzle, dtype}]``; an NbjitLoadError
    where the version's way of passing them is not known or the parameters do not fit."""
    if not meta.tensordescs:
        return []
    version = meta.triton_version or "unknown"
    if not version.startswith(_DESCRIPTOR_ABI):
        raise NbjitLoadError(f"Triton kernel {meta.name!r} takes host-side tensor descriptors; nbjit knows how Triton "
                             f"{', '.join(_DESCRIPTOR_ABI)} passes them, this kernel was compiled by Triton {version}")
    out, i, extra = [], 0, 0
    for j, d in enumerate(meta.tensordescs):
        what = f"Triton kernel {meta.name!r}, tensor descriptor {j}"
        if d.is_im2col or d.fp4_padded:
            raise NbjitLoadError(f"{what}: {'im2col' if d.is_im2col else 'padded fp4'} descriptors are not supported")
        if d.elem_type not in _TMA_DEVICE_TYPES:
            raise NbjitLoadError(f"{what}: element type {d.elem_type} (Triton's numbering) is not supported")
        while i < len(params) and params[i].size != 128:
            i += 1
        n = len(d.block_size)
        sizes = [p.size for p in params[i + 1:i + 1 + 2 * n]]
        if i == len(params) or sizes != [4] * n + [8] * n:
            raise NbjitLoadError(f"{what}: expected a 128-byte tensor map then {n} 4-byte sizes and {n} 8-byte "
                                 f"strides among the parameters, found {[p.size for p in params[i:i + 1 + 2 * n]]}")
        np_type, data_type = _TMA_DEVICE_TYPES[d.elem_type]
        out.append({"param": i, "arg": i - extra, "ndim": n, "block": list(d.block_size),
                    "swizzle": _TMA_SWIZZLE[d.swizzle], "dtype": np_type, "data_type": data_type,
                    "elem_size": d.elem_size})
        extra += 2 * n
        i += 1 + 2 * n
    return out


def _descriptor_args(a: Any, d: dict, kernel: str) -> tuple:
    """One tensor descriptor argument as the kernel takes it: (TensorMap, *shape, *strides).
    ``a``: an ``nbjit.TensorMap`` made with the kernel's box and swizzle, or an object with
    ``base``, ``shape``, ``strides`` and ``block_shape`` (Triton's ``TensorDescriptor``)."""
    what = f"Triton kernel {kernel!r}, argument {d['arg']} (a tensor descriptor)"
    n, block = d["ndim"], tuple(d["block"])
    if isinstance(a, TensorMap):
        p = a.plan
        if len(p.shape) != n or p.box_shape != block or p.swizzle != _SWIZZLE[d["swizzle"]][0]:
            raise NbjitArgumentError(f"{what}: the kernel was compiled for boxes of {list(block)} with swizzle "
                                     f"{d['swizzle']!r}; this tensor map has boxes of {list(p.box_shape)}, swizzle "
                                     f"{p.swizzle}: make it with nbjit.tensor_map(array, {block}, swizzle="
                                     f"{d['swizzle']!r})")
        size = np.dtype(p.dtype).itemsize
        return (a, *p.shape, *(s // size for s in p.strides[::-1]), 1)
    if not all(hasattr(a, x) for x in ("base", "shape", "strides", "block_shape")):
        raise NbjitArgumentError(f"{what}: pass a triton.tools.tensor_descriptor.TensorDescriptor (base, shape, "
                                 f"strides, block_shape) or nbjit.tensor_map(array, {block}, swizzle="
                                 f"{d['swizzle']!r}), not {type(a).__name__}")
    if getattr(a, "round_f32_to_tf32", False):
        raise NbjitArgumentError(f"{what}: round_f32_to_tf32 descriptors are not supported")
    shape, strides = whole_numbers(a.shape, f"{what}: its shape"), whole_numbers(a.strides, f"{what}: its strides")
    if len(shape) != n or len(strides) != n:
        raise NbjitArgumentError(f"{what}: the kernel takes a {n}-D descriptor, this one has shape {list(shape)} and "
                                 f"strides {list(strides)}")
    size = d["elem_size"]
    plan = plan_tiled(device_pointer(a.base), shape, tuple(s * size for s in strides), d["dtype"], block,
                      swizzle=d["swizzle"], l2_promotion="128B",
                      oob_fill="nan" if getattr(a, "padding", "zero") == "nan" else None, data_type=d["data_type"])
    return (TensorMap(_driver.encode_tensor_map_tiled(plan), plan, a.base), *shape, *strides)


class TritonKernel:
    """A Triton kernel loaded into the current Numba context: ``kernel[grid](*args)`` with
    Triton's grid of programs; the user passes the runtime arguments only (constexprs are
    compiled in, scratch buffers nbjit supplies)."""

    def __init__(self, kernel, meta: TritonMeta, route: str | None, rules: dict | None = None):
        self.kernel = kernel
        self.meta = meta
        self._route = route  # None: the module's (a bundle's fatbin picks the entry)
        self.rules = rules if rules is not None else launch_rules(meta, kernel.params)
        self._n = self.rules["user_params"]
        self._nk = self.rules.get("kernel_params", self._n)  # after descriptors are expanded
        self._descs = {d["arg"]: d for d in self.rules.get("descriptors", ())}
        self._scratch: dict[Any, Any] = {}
        self._grids: dict[Any, _TritonLaunch] = {}
        self._lock = threading.Lock()

    def __reduce__(self):
        # pickles as its kernel (loaded on first use where it is unpickled) and metadata
        return (TritonKernel, (self.kernel, self.meta, self.route, self.rules))

    @property
    def name(self) -> str:
        """The kernel's name (Triton's metadata)."""
        return self.meta.name

    @property
    def route(self) -> str | None:
        """How the code was loaded: "cubin", or the PTX route ("driver", "nvjitlink",
        "lowered"); None while a module loaded lazily waits for first use."""
        if self._route is not None:
            return self._route
        m = self.kernel.module
        return (m.route or m.prepared_kind) if m.loaded else None

    def __repr__(self) -> str:
        return (f"<nbjit.TritonKernel {self.name}: {self._n} arguments, block {self.meta.block[0]}, "
                f"{self.meta.shared} B shared, via {self.route or 'the route chosen at first use'}>")

    @property
    def compiled_refusal(self) -> str | None:
        """What keeps this kernel from a launch by compiled code (``@njit``, ``nbjit.jax.call``,
        ``c_entry``), which passes its arguments alone: None where nothing does."""
        m = self.meta
        if self._descs:
            return "it takes tensor descriptors (nbjit makes their tensor maps on the host)"
        if m.num_ctas != 1:
            return "it runs several blocks per program (num_ctas > 1)"
        if m.cooperative:
            return "it is a cooperative launch"
        if any(m.scratch_bytes((1, 1, 1))):
            return "it needs scratch memory (nbjit allocates it per stream on the host)"
        return None

    @property
    def c_entry(self) -> "CEntry":
        """The kernel's C entry point (``Kernel.c_entry``'s, its trailing scratch pointers NULL),
        with Triton's launch_pdl as its Python launch takes it."""
        from nbjit.launch.entry import kernel_entry  # (a cold concern: compiled callers only)
        if self.meta.pdl:
            self.kernel.default_pdl(True)
        return kernel_entry(self.kernel, tail=self.meta.scratch_params)

    def __getitem__(self, grid) -> "_TritonLaunch":
        try:
            return self._grids[grid]
        except (KeyError, TypeError):  # TypeError: an unhashable grid (a list)
            pass
        launch = _TritonLaunch(self, grid)
        try:
            if len(self._grids) >= 256:
                self._grids.clear()
            self._grids[grid] = launch
        except TypeError:
            pass
        return launch

    def launch(self, grid: int | tuple, *args: Any, stream: Any = None) -> None:
        """``kernel[grid](*args, stream=stream)``."""
        self[grid](*args, stream=stream)

    def _buffer(self, kind: str, nbytes: int, align: int, stream) -> int:
        """A scratch buffer of at least ``nbytes`` for launches on ``stream`` (kept, grown)."""
        if nbytes == 0:
            return 0
        key = (kind, id(stream) if stream is not None and not isinstance(stream, int) else stream)
        with self._lock:
            have = self._scratch.get(key)
            if have is None or have[1] < nbytes:
                arr = current_host().allocate(nbytes + align)
                self._scratch[key] = (arr, nbytes, stream)
                have = self._scratch[key]
        ptr = device_pointer(have[0])
        return (ptr + align - 1) // align * align


class _TritonLaunch:
    """A Triton kernel with its grid of programs; call it with the runtime arguments."""

    __slots__ = ("k", "grid", "config", "fixed_tail", "launchers")

    def __init__(self, k: TritonKernel, grid):
        m = k.meta
        self.k = k
        self.grid = LaunchConfig.make(grid, m.block, kernel=k.name).grid  # the grid of programs
        # Triton's rules: num_ctas blocks per program in x, a cluster of them where the code does not fix one
        cluster = None if (m.num_ctas == 1 or k.kernel.info.directives.cluster) else (m.num_ctas, 1, 1)
        self.config = LaunchConfig.make((self.grid[0] * m.num_ctas, *self.grid[1:]), m.block, None, m.shared,
                                        cluster, m.cooperative, kernel=k.name)
        # without scratch memory the trailing scratch pointers are NULL whatever the stream
        g, p = m.scratch_bytes(self.grid)
        self.fixed_tail = (0,) * m.scratch_params if not (g or p) else None
        # stream -> launcher: a group of the kernel's launchers (so they follow a change of kernel.pdl)
        self.launchers: dict = _NONE_YET

    @property
    def by_stream(self) -> dict:
        """stream -> the launcher configured for this grid on it."""
        return dict(self.launchers)

    def _tail(self, stream) -> tuple:
        if self.fixed_tail is not None:
            return self.fixed_tail
        k, m = self.k, self.k.meta
        g, p = m.scratch_bytes(self.grid)
        extra = [k._buffer("global", g, max(1, m.global_scratch_align), stream)]
        if m.scratch_params >= 2:
            extra.append(k._buffer("profile", p, max(1, m.profile_scratch_align), stream))
        return tuple(extra)

    def count_error(self, got: int) -> NbjitArgumentError:
        k = self.k
        params = k.kernel.params
        descs = {d["param"] for d in k._descs.values()}
        expanded = {d["param"] + j for d in k._descs.values() for j in range(1, 1 + 2 * d["ndim"])}
        names = ", ".join(p.name + (" (tensor descriptor)" if i in descs else "")
                          for i, p in enumerate(params[: k._nk]) if i not in expanded)
        return NbjitArgumentError(f"Triton kernel {k.name!r} takes {k._n} runtime arguments ({names}), got {got} "
                                  "(constexpr arguments are compiled in; scratch buffers are nbjit's to pass)")

    def __call__(self, *args, stream=None) -> None:
        k = self.k
        if k._descs:  # host-side tensor descriptors: each becomes a tensor map, its shape and strides
            if len(args) != k._n:
                raise self.count_error(len(args))
            args = tuple(x for i, a in enumerate(args)
                         for x in (_descriptor_args(a, k._descs[i], k.name) if i in k._descs else (a,)))
        try:
            launch = self.launchers[stream]
        except (KeyError, TypeError):  # TypeError: an unhashable stream object
            launch = self._configure(stream)
        launch(*args)

    def _configure(self, stream):
        """What launches on ``stream``: the kernel's launcher for this grid, told to leave the
        scratch pointers zero where they are NULL (no Python in the way); else that launcher
        behind a step that passes the stream's scratch buffers."""
        k = self.k
        kernel = k.kernel
        if k.meta.pdl:  # Triton's launch_pdl: programmatic dependent launches unless the user said otherwise
            kernel.default_pdl(True)
        cfg = replace(self.config, stream=stream)
        if self.fixed_tail is not None:
            launch = kernel.configure(cfg, tail=len(self.fixed_tail), count_error=self.count_error)
        else:
            launcher = kernel.configure(cfg)

            def launch(*args):
                if len(args) != k._nk:
                    raise self.count_error(len(args))
                launcher(*args, *self._tail(stream))
        launch = nvtx.ranged(launch, k.name, cfg)
        if self.launchers is _NONE_YET:
            self.launchers = kernel.launcher_group()
        self.launchers.keep(stream, launch)
        return launch


_NONE_YET: dict = {}  # a grid's launchers before its first launch (never written)


def load_triton(path: str | os.PathLike) -> TritonKernel:
    """Load the Triton kernel of a cache entry into the current Numba context (``nbjit.load_triton``
    takes bundles too, and comes here for the rest).

    ``path``: a Triton cache entry directory (``<name>.json`` beside ``<name>.cubin`` /
    ``<name>.ptx``), the ``.json`` itself, or a PTX file with ``// meta:`` comments. The
    cubin is used when it runs on this device, else the PTX (assembled by nvJitLink when it
    is newer than the driver). Raises ``NbjitLoadError`` for unusable metadata.
    """
    from nbjit.loading.module import load

    art = read_triton(path)
    meta = art.meta
    decls = art.declarations()
    dev = current_host().device_arch()
    errors = []
    ptx = None
    if art.ptx is not None:
        ptx = (art.ptx_text or _read(art.ptx), str(art.ptx))
    if art.cubin is not None and (meta.arch is None or meta.arch == dev):
        try:
            img = Image.from_path(art.cubin)
            mod = load(Image(img.data, img.kind, img.name, declarations=decls))
            return from_module(mod, meta, route="cubin", ptx=ptx)
        except NbjitLoadError as e:  # e.g. a cubin for another chip: try the PTX
            errors.append(str(e))
    if ptx is not None:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always", NbjitWarning)
            mod = load(Image(ptx[0], "ptx", ptx[1], declarations=decls))
        for x in w:
            warnings.warn_explicit(x.message, x.category, x.filename, x.lineno)
        return from_module(mod, meta, route=mod.route or "ptx")
    built = meta.arch or "another device"
    raise NbjitLoadError(f"{path}: Triton kernel {meta.name!r} was built for {built}; this device is {dev} and "
                         "there is no PTX to fall back on" + (f" ({errors[0]})" if errors else ""))


def from_module(module: Module, meta: TritonMeta | dict, *, route: str | None = None,
                ptx: tuple[bytes, str] | None = None) -> TritonKernel:
    """A ``TritonKernel`` of the kernel ``meta`` names in ``module`` (loaded, or waiting for
    first use), with Triton's launch rules.

    ``meta``: a ``TritonMeta``, or Triton's metadata JSON as a dict. ``route``: how the code
    was loaded, or None for the module's own (a fatbin's entry, known once loaded). ``ptx``:
    (the kernel's PTX, its name for messages) where the module may run a cubin: the PTX gives
    the parameters' alignment (a tensor map's 64 bytes) that a cubin does not record.
    """
    if not isinstance(meta, TritonMeta):
        meta = _from_json(meta, module.name)
    if meta.name not in module.kernels:
        raise NbjitLoadError(f"{module.name}: no kernel {meta.name!r} (the metadata's name); it has "
                             f"{', '.join(module.kernels)}")
    extra = []
    if ptx is not None:
        extra.append(("triton ptx", inspect_ptx(ptx[0], source=ptx[1]).entry(meta.name)))
    return TritonKernel(module._kernel(meta.name, extra_layouts=extra), meta, route)


def describe(path: str | os.PathLike) -> dict:
    """The metadata and launch rules of a Triton kernel on disk (no GPU): for ``nbjit inspect``."""
    from nbjit.params.signature import typed_entries

    art = read_triton(path)
    image = art.ptx_text or (_read(art.ptx) if art.ptx else None)
    if image is not None:
        info, label = inspect_ptx(image, source=str(art.ptx)), "ptx"
    else:
        from nbjit.read.cubin import inspect_cubin
        info, label = inspect_cubin(_read(art.cubin), source=str(art.cubin)), "cubin"
    entry = next((e for e in info.entries if e.name == art.meta.name), None)
    if entry is None:
        raise NbjitLoadError(f"{path}: the metadata names kernel {art.meta.name!r}; the image has "
                             f"{', '.join(e.name for e in info.entries) or 'none'}")
    params = typed_entries([entry], label, art.declarations())[0].params
    m = art.meta
    return {"kind": "triton", "name": m.name, "triton_version": m.triton_version,
            "arch": m.arch.number if m.arch is not None else None,
            "metadata_from": m.source, "num_warps": m.num_warps, "num_ctas": m.num_ctas, "shared": m.shared,
            "cubin": str(art.cubin) if art.cubin else None, "ptx": str(art.ptx) if art.ptx else None,
            "ttir": str(art.ttir) if art.ttir else None, "launch_pdl": m.pdl,
            "griddepcontrol": list(entry.griddepcontrol),
            "params": [p.to_json() for p in params], "launch": launch_rules(m, params)}
