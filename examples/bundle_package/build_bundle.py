"""Regenerate src/nbjit_demo_kernels/kernels.nbjit from kernels/axpy.cu (needs NVRTC: nbjit-core's
cu13 extra, pip install -e '.[cu13]' in nbjit's checkout; no GPU). The package's users need
neither NVRTC nor a compiler."""
from pathlib import Path

import nbjit

HERE = Path(__file__).resolve().parent
ARCHS = ["sm_80", "sm_90", "sm_100", "sm_120"]
PTX = "compute_80"  # the fallback for every newer device the cubins do not cover
NAME_EXPRESSIONS = ["scale<float>", "scale<double>"]


def main() -> None:
    out = HERE / "src" / "nbjit_demo_kernels" / "kernels.nbjit"
    info = nbjit.build_bundle(HERE / "kernels" / "axpy.cu", out, archs=ARCHS, ptx=PTX,
                              name_expressions=NAME_EXPRESSIONS)
    img = info.image()
    archs = ", ".join(map(str, img.archs))
    print(f"{out.relative_to(HERE)}: {out.stat().st_size} bytes, image {img.name!r} for {archs}")
    for k in img.kernels:
        print(f"  {k.name}{k.signature}")


if __name__ == "__main__":
    main()
