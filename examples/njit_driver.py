"""An adaptive time-stepping loop compiled with @numba.njit that launches GPU kernels itself
(needs a GPU and Numba core).

N independent decaying, forced quantities y' = -r(t) y + w, with a stiffness r(t) that changes
over time. The step size follows the stiffness (dt = min(dt_max, 0.5 / r(t)): explicit Euler
stays stable), so the host decides every step's dt, and every step launches two kernels:

* ``step``, CUDA C++ compiled by NVRTC (nbjit.compile): y += dt * (w - r y)
* ``accumulate``, a @cuda.jit kernel (nbjit.from_numba): the time integral of y, acc += dt * y

The same loop runs twice, in Python (launching with kernel[grid, block, stream](...)) and in
@njit (the same syntax, nbjit.device_view for the arrays, nbjit.StreamHandle for the stream):
the results are the same bits, and the host time per step is printed for both.

    python examples/njit_driver.py [n] [t_end]
    NBJIT_HOST=numba-cuda-mlir python examples/njit_driver.py
"""
import math
import os
import sys
import time

import numba
import numpy as np

if os.environ.get("NBJIT_HOST") == "numba-cuda-mlir":
    from numba_cuda_mlir import cuda
    from numba_cuda_mlir.numba_cuda import types
else:
    from numba import cuda, types

import nbjit

if not cuda.is_available():
    raise SystemExit("njit_driver.py needs a CUDA GPU and driver (examples/inspect_kernels.py runs without one)")

STEP = r"""
extern "C" __global__ void step(float *y, const float *w, float dt, float rate, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += dt * (w[i] - rate * y[i]);
}
"""
DT_MAX = 0.01
BLOCK = 256


@cuda.jit
def accumulate(acc, y, dt):
    i = cuda.grid(1)
    if i < acc.shape[0]:
        acc[i] += dt * y[i]


@numba.njit
def rate(t):
    """The stiffness at time t."""
    return 1.0 + 40.0 * math.sin(t) ** 2


def loop(step, acc_k, y, w, acc, n, t_end, stream):
    """Steps until t_end, each dt following the stiffness; the number of steps."""
    t, steps, grid = 0.0, 0, (n + BLOCK - 1) // BLOCK
    while t < t_end:
        r = rate(t)
        dt = min(DT_MAX, 0.5 / r, t_end - t)
        step[grid, BLOCK, stream](y, w, dt, r, n)
        acc_k[grid, BLOCK, stream](acc, y, dt)
        t += dt
        steps += 1
    return steps


python_loop = loop  # launching from Python
njit_loop = numba.njit(nogil=True)(loop)  # the same loop compiled: launching from machine code


def run(loop, step, acc_k, w, n, t_end, wrap):
    """One run of ``loop`` from the same start; (y, acc, steps, host seconds)."""
    y = cuda.to_device(np.ones(n, np.float32))
    acc = cuda.to_device(np.zeros(n, np.float32))
    s = cuda.stream()
    t0 = time.perf_counter()
    steps = loop(step, acc_k, wrap(y), wrap(w), wrap(acc), n, t_end, nbjit.StreamHandle(s))
    host = time.perf_counter() - t0
    s.synchronize()
    return y.copy_to_host(), acc.copy_to_host(), steps, host


def main(n: int = 1 << 16, t_end: float = 20.0) -> None:
    step = nbjit.compile(STEP)["step"]
    acc_k = nbjit.from_numba(accumulate, (types.float32[::1], types.float32[::1], types.float32))
    w = cuda.to_device(np.linspace(0.0, 1.0, n, dtype=np.float32))
    run(njit_loop, step, acc_k, w, n, 0.1, nbjit.device_view)  # (compiled once before timing)
    run(python_loop, step, acc_k, w, n, 0.1, lambda a: a)
    y_py, acc_py, steps_py, host_py = run(python_loop, step, acc_k, w, n, t_end, lambda a: a)
    y_nj, acc_nj, steps_nj, host_nj = run(njit_loop, step, acc_k, w, n, t_end, nbjit.device_view)
    assert steps_py == steps_nj
    assert np.array_equal(y_py, y_nj) and np.array_equal(acc_py, acc_nj), "the two loops disagree"
    assert np.all((y_nj > 0) & (y_nj <= 1)) and np.all(acc_nj > 0)  # decaying from 1, forced by w >= 0
    print(f"{steps_nj} adaptive steps, 2 launches each, {n} quantities")
    print(f"host time per step: Python loop {host_py / steps_py * 1e6:.2f} us, @njit loop "
          f"{host_nj / steps_nj * 1e6:.2f} us ({host_py / host_nj:.1f}x); the same results")


if __name__ == "__main__":
    main(*[int(sys.argv[1])] if len(sys.argv) > 1 else [], *[float(sys.argv[2])] if len(sys.argv) > 2 else [])
