"""Regenerate src/nbjit_demo_kernels/kernels.nbjit: image "axpy" from kernels/axpy.cu (needs NVRTC:
nbjit-core's cu13 extra, pip install -e '.[cu13]' in nbjit's checkout) and image "scale_rows",
the @cuda.jit kernel of kernels/numba_kernels.py (compiled by numba-cuda, which that extra brings).
No GPU needed. The package's users need neither a compiler nor Numba."""
import sys
from pathlib import Path

import nbjit

HERE = Path(__file__).resolve().parent
ARCHS = ["sm_80", "sm_90", "sm_100", "sm_120"]
PTX = "compute_80"  # the fallback for every newer device the cubins do not cover
NAME_EXPRESSIONS = ["scale<float>", "scale<double>"]


def main() -> None:
    sys.path.insert(0, str(HERE / "kernels"))
    import numba_kernels

    out = HERE / "src" / "nbjit_demo_kernels" / "kernels.nbjit"
    info = nbjit.build_bundle({"axpy": HERE / "kernels" / "axpy.cu",
                               "scale_rows": (numba_kernels.scale_rows, numba_kernels.SIGNATURE)},
                              out, archs=ARCHS, ptx=PTX, name_expressions={"axpy": NAME_EXPRESSIONS})
    print(f"{out.relative_to(HERE)}: {out.stat().st_size} bytes")
    for img in info.images:
        print(f"  image {img.name!r} for {', '.join(map(str, img.archs))}")
        for k in img.kernels:
            print(f"    {k.name[:60]}{k.signature if not img.numba else ''}")


if __name__ == "__main__":
    main()
