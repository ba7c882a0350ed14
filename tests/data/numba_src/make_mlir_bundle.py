"""Regenerate tests/data/numba/bundle_kernels_mlir.nbjit: bundle_kernels.py's @cuda.jit kernels
compiled by numba-cuda-mlir (its `cuda` imported instead of numba-cuda's) for sm_90 and PTX for
compute_80. Run with a Python that has numba-cuda-mlir (nbjit-core's mlir extra); no GPU needed.
tests/test_gpu_bare.py launches them in a process without any Numba."""
import importlib
import sys
import tempfile
from pathlib import Path

import nbjit

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "numba" / "bundle_kernels_mlir.nbjit"


def main() -> None:
    source = (HERE / "bundle_kernels.py").read_text()
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "bundle_kernels_mlir.py").write_text(
            source.replace("from numba import cuda", "from numba_cuda_mlir import cuda", 1))
        sys.path.insert(0, d)
        k = importlib.import_module("bundle_kernels_mlir")
        from numba_cuda_mlir.numba_cuda import types
        from numba_cuda_mlir.numba_cuda.np.numpy_support import from_dtype
        inputs = {name: (getattr(k, name), sig) for name, sig in k.SIGNATURES.items()}
        inputs["weigh"] = (k.weigh, (from_dtype(k.POINT)[::1], types.float32[::1]))
        info = nbjit.build_bundle(inputs, OUT, archs="sm_90", ptx="compute_80")
    print(f"{OUT}: {OUT.stat().st_size} bytes, images {', '.join(i.name for i in info.images)}")


if __name__ == "__main__":
    main()
