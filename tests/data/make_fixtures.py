#!/usr/bin/env python3
"""Regenerate nbjit's compiler-produced test fixtures under tests/data/.

Needs: nvcc (CUDA 13.0) on PATH; the project installed with its cu13 extra (NVRTC
through cuda-bindings, numba-cuda); Triton (``pip install triton``, only for the
``triton/`` fixtures; point TRITON_PATH at a separate install dir if you keep it apart).
No GPU is needed. Run from anywhere:

    python tests/data/make_fixtures.py [nvcc] [cuda12] [nvrtc] [numba] [triton[:TAG,...]] [expected]

``cuda12`` needs Triton's bundled ptxas 12.9; ``expected`` needs cuobjdump (pip
nvidia-cuda-cuobjdump) and records what it says about every cubin.

Hand-written fixtures (``hand/``) are not generated; edit them directly.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"


def run(*cmd: str) -> None:
    print("+", " ".join(cmd))
    subprocess.run(cmd, check=True)


def nvcc() -> None:
    out = HERE / "nvcc"
    out.mkdir(exist_ok=True)
    k, c = str(SRC / "kernels.cu"), str(SRC / "cluster.cu")
    run("nvcc", "-ptx", "-arch=sm_90", k, "-o", str(out / "kernels_sm90.ptx"))
    run("nvcc", "-ptx", "-arch=sm_80", k, "-o", str(out / "kernels_sm80.ptx"))
    run("nvcc", "-ptx", "-arch=sm_90", "-G", k, "-o", str(out / "kernels_G_sm90.ptx"))
    run("nvcc", "-ptx", "-arch=sm_90", "-lineinfo", k, "-o", str(out / "kernels_lineinfo_sm90.ptx"))
    run("nvcc", "-ptx", "-arch=sm_90", c, "-o", str(out / "cluster_sm90.ptx"))
    for arch in ("sm_80", "sm_90", "sm_90a", "sm_100"):
        run("nvcc", "-cubin", f"-arch={arch}", k, "-o", str(out / f"kernels_{arch}.cubin"))
    run("nvcc", "-cubin", "-arch=sm_90", c, "-o", str(out / "cluster_sm90.cubin"))
    pdl = str(SRC / "pdl.cu")  # programmatic dependent launch (griddepcontrol)
    run("nvcc", "-ptx", "-arch=sm_90", pdl, "-o", str(out / "pdl_sm90.ptx"))
    run("nvcc", "-cubin", "-arch=sm_90", pdl, "-o", str(out / "pdl_sm_90.cubin"))
    # -G: called functions' stacks (EIATTR_MIN_STACK_SIZE); -rdc: globals as CUDA_OBJECT symbols
    run("nvcc", "-cubin", "-arch=sm_90", "-G", k, "-o", str(out / "kernels_G_sm_90.cubin"))
    run("nvcc", "-cubin", "-arch=sm_90", "-rdc=true", k, "-o", str(out / "kernels_rdc_sm_90.cubin"))
    gencode = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
               "-gencode", "arch=compute_90,code=compute_90"]
    run("nvcc", "-fatbin", *gencode, k, "-o", str(out / "kernels_multi.fatbin"))
    run("nvcc", "-fatbin", *gencode, "--compress-mode=none", k, "-o", str(out / "kernels_multi_none.fatbin"))
    run("nvcc", "-fatbin", *gencode, "--compress-mode=speed", k, "-o", str(out / "kernels_multi_lz4.fatbin"))
    run("nvcc", "-fatbin", "-gencode", "arch=compute_90a,code=sm_90a", "-gencode",
        "arch=compute_90,code=compute_90", "--compress-mode=none", k, "-o", str(out / "kernels_90a.fatbin"))
    # LTO-IR entries (kind 8) beside an sm_90 cubin: nvcc's default compression (the LTO-IR
    # compressed, flag 0x10000) and none; and LTO-IR alone, relocatable (what a link takes)
    lto = str(SRC / "lto.cu")
    run("nvcc", "-fatbin", "-gencode", "arch=compute_90,code=[sm_90,lto_90]", lto, "-o", str(out / "lto_sm90.fatbin"))
    run("nvcc", "-fatbin", "-gencode", "arch=compute_90,code=[sm_90,lto_90]", "--compress-mode=none", lto, "-o",
        str(out / "lto_sm90_none.fatbin"))
    run("nvcc", "-fatbin", "-rdc=true", "-gencode", "arch=compute_90,code=lto_90", "--compress-mode=none", lto, "-o",
        str(out / "lto_rdc.fatbin"))
    run("nvcc", "-dc", "-arch=sm_90", lto, "-o", str(out / "lto_host.o"))  # a host object with device code


def cuda12() -> None:
    """CUDA 12.9 ("V1" ELF ABI) cubins, assembled by the ptxas 12.9 that Triton bundles from
    nvcc's sm_80 PTX with its .version lowered to 8.7 (it uses nothing newer)."""
    tp = os.environ.get("TRITON_PATH")
    ptxas = next((str(Path(p) / "triton/backends/nvidia/bin/ptxas") for p in ([tp] if tp else []) + sys.path
                  if (Path(p) / "triton/backends/nvidia/bin/ptxas").exists()), None)
    if ptxas is None:
        raise SystemExit("cuda12: Triton's bundled ptxas 12.9 not found (set TRITON_PATH)")
    out = HERE / "nvcc"
    text = (out / "kernels_sm80.ptx").read_text().replace(".version 9.0", ".version 8.7", 1)
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k87.ptx"
        src.write_text(text)
        for arch in ("sm_80", "sm_90a"):
            run(ptxas, f"-arch={arch}", str(src), "-o", str(out / f"kernels129_{arch}.cubin"))


def expected() -> None:
    """What cuobjdump says about every cubin fixture, for tests on machines without it."""
    sys.path.insert(0, str(HERE.parent))
    from cuobjdump_oracle import describe, find_cuobjdump

    exe = find_cuobjdump()
    if exe is None:
        raise SystemExit("expected: cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    out = HERE / "expected"
    out.mkdir(exist_ok=True)
    for cubin in sorted(HERE.rglob("*.cubin")):
        rel = cubin.relative_to(HERE).as_posix()
        (out / (rel.replace("/", "__") + ".json")).write_text(json.dumps(describe(str(cubin), exe), indent=1) + "\n")


def nvrtc() -> None:
    from cuda.bindings import nvrtc as N

    out = HERE / "nvrtc"
    out.mkdir(exist_ok=True)
    src = (SRC / "nvrtc_tmpl.cu").read_bytes()
    hdr = (SRC / "scale.cuh").read_bytes()
    exprs = ["fill<float>", "fill<int>", "ns::op<float, 4>", "&plain"]

    def check(res):
        err, *rest = res
        if err != N.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC: {err}")
        return rest[0] if len(rest) == 1 else rest

    def compile_one(tag: str, opts: list[str], cubin: bool) -> None:
        prog = check(N.nvrtcCreateProgram(src, b"nvrtc_tmpl.cu", 1, [hdr], [b"scale.cuh"]))
        for e in exprs:
            check(N.nvrtcAddNameExpression(prog, e.encode()))
        res = N.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        size = check(N.nvrtcGetProgramLogSize(prog))
        log = bytearray(size)  # NVRTC writes here: b" " * 1 would be the shared b" "
        check(N.nvrtcGetProgramLog(prog, log))
        if res[0] != N.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(log.decode())
        names = {e: check(N.nvrtcGetLoweredName(prog, e.encode())).decode() for e in exprs}
        size = check(N.nvrtcGetPTXSize(prog))
        ptx = bytearray(size)
        check(N.nvrtcGetPTX(prog, ptx))
        (out / f"tmpl_{tag}.ptx").write_bytes(ptx.rstrip(b"\0"))
        if cubin:
            size = check(N.nvrtcGetCUBINSize(prog))
            cub = bytearray(size)
            check(N.nvrtcGetCUBIN(prog, cub))
            (out / f"tmpl_{tag}.cubin").write_bytes(cub)
        (out / f"tmpl_{tag}.names.json").write_text(json.dumps(names, indent=1) + "\n")
        check(N.nvrtcDestroyProgram(prog))

    compile_one("sm90", ["-arch=sm_90"], cubin=True)
    compile_one("compute90", ["-arch=compute_90"], cubin=False)
    compile_one("G_sm90", ["-arch=sm_90", "-G"], cubin=False)
    compile_one("lineinfo_sm90", ["-arch=sm_90", "-lineinfo"], cubin=False)

    # known spills, stack frames and shared memory (spill.cu); ptxas -v's report beside each cubin
    spill = (SRC / "spill.cu").read_bytes()
    for arch in ("sm_90", "sm_80"):
        prog = check(N.nvrtcCreateProgram(spill, b"spill.cu", 0, [], []))
        opts = [f"-arch={arch}".encode(), b"--ptxas-options=-v"]
        res = N.nvrtcCompileProgram(prog, len(opts), opts)
        log = bytearray(check(N.nvrtcGetProgramLogSize(prog)))
        check(N.nvrtcGetProgramLog(prog, log))
        if res[0] != N.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(log.decode())
        cub = bytearray(check(N.nvrtcGetCUBINSize(prog)))
        check(N.nvrtcGetCUBIN(prog, cub))
        tag = arch.replace("_", "")
        (out / f"spill_{tag}.cubin").write_bytes(cub)
        (out / f"spill_{tag}.log").write_text(log.rstrip(b"\0").decode().strip() + "\n")
        check(N.nvrtcDestroyProgram(prog))


def numba() -> None:
    from numba import cuda

    out = HERE / "numba"
    out.mkdir(exist_ok=True)
    sys.path.insert(0, str(SRC))
    from numba_kernels import axpy  # noqa: E402

    sig = "float32[::1], float32[::1], float32, int32"
    for tag, kw in (("plain", {}), ("debug", {"debug": True, "opt": False}), ("lineinfo", {"lineinfo": True})):
        ptx, _ = cuda.compile_ptx(axpy, sig, cc=(9, 0), **kw)
        (out / f"axpy_{tag}.ptx").write_text(ptx)


TRITON_KERNELS = {
    # name: (function, signature, constexprs, options, grid note)
    "add_kernel": ("add_kernel",
                   {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32",
                    "alpha": "fp32", "BLOCK": "constexpr"},
                   {"BLOCK": 1024}, {"num_warps": 4}),
    "softmax_kernel": ("softmax_kernel",
                       {"out_ptr": "*fp32", "in_ptr": "*fp32", "in_row_stride": "i32",
                        "out_row_stride": "i32", "n_cols": "i32", "BLOCK": "constexpr"},
                       {"BLOCK": 1024}, {"num_warps": 8}),
    "matmul_kernel": ("matmul_kernel",
                      {**{n: "*fp16" for n in ("a_ptr", "b_ptr", "c_ptr")},
                       **{n: "i32" for n in "M N K stride_am stride_ak stride_bk stride_bn stride_cm stride_cn".split()},
                       "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"},
                      {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128}, {"num_warps": 8, "num_stages": 3}),
    "matmul_ctas2": ("matmul_kernel",
                     {**{n: "*fp16" for n in ("a_ptr", "b_ptr", "c_ptr")},
                      **{n: "i32" for n in "M N K stride_am stride_ak stride_bk stride_bn stride_cm stride_cn".split()},
                      "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"},
                     {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}, {"num_warps": 4, "num_stages": 2, "num_ctas": 2}),
    "copy_desc_kernel": ("copy_desc_kernel",
                         {"in_ptr": "*fp32", "out_ptr": "*fp32", "M": "i32", "N": "i32",
                          "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"},
                         {"BLOCK_M": 32, "BLOCK_N": 32}, {"num_warps": 4}),
    # programmatic dependent launch: griddepcontrol in the kernel, launch_pdl in the metadata
    "pdl_step_kernel": ("pdl_step_kernel",
                        {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32", "BLOCK": "constexpr"},
                        {"BLOCK": 1024}, {"num_warps": 4, "launch_pdl": True}),
    # host-side tensor descriptors (TMA): each passed as CUtensorMap, shape (i32s), strides (i64s)
    "copy_hostdesc_kernel": ("copy_hostdesc_kernel",
                             {"in_desc": "tensordesc<fp32[32, 64]>", "out_desc": "tensordesc<fp32[32, 64]>",
                              "scale": "fp32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"},
                             {"BLOCK_M": 32, "BLOCK_N": 64}, {"num_warps": 4}),
}


def triton(only: tuple[str, ...] = ()) -> None:
    """Triton 3.9's cache entries for TRITON_KERNELS (``only``: those tags, the others kept)."""
    tp = os.environ.get("TRITON_PATH")
    if tp:
        sys.path.insert(0, tp)
    sys.path.insert(0, str(SRC))
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        import triton as T
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        import triton_kernels

        out = HERE / "triton"
        if not only:
            shutil.rmtree(out, ignore_errors=True)
        out.mkdir(exist_ok=True)
        target = GPUTarget("cuda", 90, 32)
        for tag, (fn, sig, consts, opts) in TRITON_KERNELS.items():
            if only and tag not in only:
                continue
            shutil.rmtree(out / tag, ignore_errors=True)
            src = ASTSource(fn=getattr(triton_kernels, fn), signature=sig, constexprs=consts)
            k = T.compile(src, target=target, options=opts)
            name = k.metadata.name
            # Copy the cache entry as Triton wrote it: <name>.json beside .ptx/.cubin, and the
            # Triton IR (.ttir) whose signature names pointer element types.
            entry = next(j.parent for j in Path(cache).glob(f"*/{name}.json")
                         if json.loads(j.read_text())["hash"] == k.metadata.hash)
            dest = out / tag
            dest.mkdir()
            for suffix in (".json", ".ptx", ".cubin", ".ttir"):
                shutil.copy(entry / f"{name}{suffix}", dest / f"{name}{suffix}")
            print(tag, "shared", k.metadata.shared, "warps", k.metadata.num_warps, "ctas", k.metadata.num_ctas,
                  "global scratch", k.metadata.global_scratch_size, k.metadata.global_scratch_align)


def main(argv: list[str]) -> None:
    """Steps by name (default: all); ``triton:TAG,TAG`` rebuilds only those Triton kernels."""
    steps = {"nvcc": nvcc, "cuda12": cuda12, "nvrtc": nvrtc, "numba": numba, "triton": triton,
             "expected": expected}
    for name in argv or list(steps):
        step, _, tags = name.partition(":")
        steps[step](*((tuple(tags.split(",")),) if tags else ()))


if __name__ == "__main__":
    main(sys.argv[1:])
