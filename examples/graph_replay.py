"""A step of @cuda.jit and nbjit kernels and a copy, captured once into a CUDA graph with
nbjit.capture and replayed 1,000 times; then updated in place with new scalars (needs a GPU).

    python examples/graph_replay.py
    NBJIT_HOST=numba-cuda-mlir python examples/graph_replay.py   # numba-cuda-mlir's @cuda.jit
"""
import os

import numpy as np

if os.environ.get("NBJIT_HOST") == "numba-cuda-mlir":
    from numba_cuda_mlir import cuda
else:
    from numba import cuda

import nbjit

if not cuda.is_available():
    raise SystemExit("graph_replay.py needs a CUDA GPU and driver (examples/inspect_kernels.py runs without one)")

AXPY = r'''extern "C" __global__ void axpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}'''


@cuda.jit
def damp(v, f):
    i = cuda.grid(1)
    if i < v.shape[0]:
        v[i] *= f


def main() -> None:
    n = 1 << 16
    grid, block = (n + 255) // 256, 256
    axpy = nbjit.compile(AXPY)["axpy"]
    s = cuda.stream()
    x = cuda.to_device(np.ones(n, np.float32))
    y = cuda.to_device(np.zeros(n, np.float32))
    snapshot = cuda.device_array(n, np.float32)
    damp[grid, block, s](y, np.float32(1.0))  # compile before capturing
    axpy[grid, block, s](y, x, 0.0, n)

    with nbjit.capture(s) as step:
        axpy[grid, block, s](y, x, 1.0, n)        # nbjit: y += x
        damp[grid, block, s](y, np.float32(0.5))  # @cuda.jit: y *= 0.5
        snapshot.copy_to_device(y, stream=s)      # a copy on the stream
    for _ in range(1000):
        step.launch()
    s.synchronize()
    print(f"{step.node_count} nodes replayed 1000 times: y converges to {y.copy_to_host()[0]:.4f} (expected 1.0)")

    with step.update():                            # the same work with other scalars: updated in place
        axpy[grid, block, s](y, x, 3.0, n)
        damp[grid, block, s](y, np.float32(0.25))
        snapshot.copy_to_device(y, stream=s)
    for _ in range(1000):
        step.launch()
    s.synchronize()
    print(f"after update ({step.instantiations} instantiation): y -> {snapshot.copy_to_host()[0]:.4f} "
          "(expected 1.0)")


if __name__ == "__main__":
    main()
