"""Conjugate gradients for a 2-D Poisson problem, written with @cuda.jit kernels and one CUB
dot-product kernel compiled by nbjit, run three ways (needs a GPU):

1. eager: a Python loop launching each iteration's kernels, copying the residual to the host
   and testing it there (a host synchronisation per iteration);
2. replay: one iteration captured with nbjit.capture and replayed per iteration, the same
   test on the host after each;
3. one graph: the whole solve in a CUDA graph, the iterations a while_loop whose condition a
   @cuda.jit kernel sets on the GPU (nbjit.set_condition) when the residual is small enough:
   one launch, one host synchronisation in total.

All three take the same number of iterations and give the same solution.

    python examples/cg_solver_graph.py [n]        # an n x n grid (default 128)
    NBJIT_HOST=numba-cuda-mlir python examples/cg_solver_graph.py
"""
import math
import os
import sys
import time

import numpy as np

if os.environ.get("NBJIT_HOST") == "numba-cuda-mlir":
    from numba_cuda_mlir import cuda
else:
    from numba import cuda

import nbjit

if not cuda.is_available():
    raise SystemExit("cg_solver_graph.py needs a CUDA GPU and driver (examples/inspect_kernels.py runs without one)")

# one block of 1024 threads, a fixed order of additions: every run sums alike (the same iteration counts)
DOT = r'''
#include <cub/block/block_reduce.cuh>
extern "C" __global__ void __launch_bounds__(1024) dot(const double* a, const double* b, double* out, int slot, int n) {
    typedef cub::BlockReduce<double, 1024> Reduce;
    __shared__ typename Reduce::TempStorage tmp;
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += 1024) s += a[i] * b[i];
    double total = Reduce(tmp).Sum(s);
    if (threadIdx.x == 0) out[slot] = total;
}
'''
set_condition = nbjit.set_condition
RS_OLD, P_AP, RS_NEW = 0, 1, 2  # the scalars the solve keeps on the GPU (sc[...])


@cuda.jit
def laplace(p, ap, n):  # ap = A p, A the 5-point Laplacian (Dirichlet boundary)
    k = cuda.grid(1)
    if k < n * n:
        i, j = k // n, k % n
        v = 4.0 * p[k]
        if i > 0:
            v -= p[k - n]
        if i < n - 1:
            v -= p[k + n]
        if j > 0:
            v -= p[k - 1]
        if j < n - 1:
            v -= p[k + 1]
        ap[k] = v


@cuda.jit
def update_xr(x, r, p, ap, sc):  # x += alpha p, r -= alpha A p
    k = cuda.grid(1)
    if k < x.shape[0]:
        alpha = sc[0] / sc[1]
        x[k] += alpha * p[k]
        r[k] -= alpha * ap[k]


@cuda.jit
def update_p(p, r, sc):  # p = r + beta p
    k = cuda.grid(1)
    if k < p.shape[0]:
        p[k] = r[k] + (sc[2] / sc[0]) * p[k]


@cuda.jit
def next_step(sc, it):  # count the iteration; rs_old = rs_new
    if cuda.grid(1) == 0:
        it[0] += 1
        sc[0] = sc[2]


@cuda.jit
def next_step_on_gpu(sc, it, tol2, maxit, again):  # the same, and the loop goes on while not converged
    if cuda.grid(1) == 0:
        it[0] += 1
        set_condition(again, sc[2] > tol2 and it[0] < maxit)
        sc[0] = sc[2]


class Solve:
    """One problem's arrays and the kernels of one iteration."""

    def __init__(self, n: int, dot, s):
        self.n, self.size, self.dot, self.s = n, n * n, dot, s
        self.grid, self.block = (self.size + 255) // 256, 256
        self.b = np.ones(self.size)
        self.x = cuda.device_array(self.size, np.float64)
        self.r = cuda.device_array(self.size, np.float64)
        self.p = cuda.device_array(self.size, np.float64)
        self.ap = cuda.device_array(self.size, np.float64)
        self.sc = cuda.device_array(3, np.float64)
        self.it = cuda.device_array(1, np.int32)
        self.tol2 = (1e-8 * math.sqrt(self.size)) ** 2  # |r| < 1e-8 |b|
        self.maxit = 10 * n

    def start(self) -> None:  # x = 0, r = p = b, rs_old = r.r
        s = self.s
        self.x.copy_to_device(np.zeros(self.size), stream=s)
        self.r.copy_to_device(self.b, stream=s)
        self.p.copy_to_device(self.b, stream=s)
        self.it.copy_to_device(np.zeros(1, np.int32), stream=s)
        self.dot[1, 1024, s](self.r, self.r, self.sc, RS_OLD, self.size)

    def iteration(self) -> None:
        g, b, s, size = self.grid, self.block, self.s, self.size
        laplace[g, b, s](self.p, self.ap, self.n)
        self.dot[1, 1024, s](self.p, self.ap, self.sc, P_AP, size)
        update_xr[g, b, s](self.x, self.r, self.p, self.ap, self.sc)
        self.dot[1, 1024, s](self.r, self.r, self.sc, RS_NEW, size)
        update_p[g, b, s](self.p, self.r, self.sc)

    def result(self) -> tuple[np.ndarray, int]:
        self.s.synchronize()
        return self.x.copy_to_host(), int(self.it.copy_to_host()[0])


def eager(solve: Solve) -> tuple[np.ndarray, int, int]:
    solve.start()
    syncs = 0
    rs = np.zeros(3)
    while True:
        solve.iteration()
        next_step[1, 1, solve.s](solve.sc, solve.it)
        solve.sc.copy_to_host(rs, stream=solve.s)
        solve.s.synchronize()
        syncs += 1
        if rs[RS_OLD] <= solve.tol2 or syncs >= solve.maxit:
            return (*solve.result(), syncs)


def replay(solve: Solve) -> tuple[np.ndarray, int, int]:
    with nbjit.capture(solve.s) as step:
        solve.iteration()
        next_step[1, 1, solve.s](solve.sc, solve.it)
    solve.start()
    syncs = 0
    rs = np.zeros(3)
    while True:
        step.launch()
        solve.sc.copy_to_host(rs, stream=solve.s)
        solve.s.synchronize()
        syncs += 1
        if rs[RS_OLD] <= solve.tol2 or syncs >= solve.maxit:
            return (*solve.result(), syncs)


def solve_graph(solve: Solve, step):
    """The graph of a whole solve: a while loop of iterations, until the residual is small."""
    with nbjit.capture(solve.s) as g:
        again = g.condition(default=1)
        with g.while_loop(again):
            solve.iteration()
            step[1, 1, solve.s](solve.sc, solve.it, solve.tol2, solve.maxit, again)
    return g


def one_graph(solve: Solve, step) -> tuple[np.ndarray, int, int]:
    g = solve_graph(solve, step)
    solve.start()
    g.launch()
    return (*solve.result(), 1)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    dot = nbjit.compile(DOT, name="cg_dot.cu")["dot"]
    step = nbjit.from_numba(next_step_on_gpu, "void(float64[::1], int32[::1], float64, int32, uint64)")
    s = cuda.stream()
    solve = Solve(n, dot, s)
    eager(Solve(8, dot, s))  # compile and load every kernel before timing (and before any capture)
    results = {}
    for name, run in (("eager", eager), ("replay", replay), ("one graph", lambda v: one_graph(v, step))):
        t0 = time.perf_counter()
        x, iterations, syncs = run(solve)
        results[name] = (x, iterations, syncs, time.perf_counter() - t0)
    x0, it0 = results["eager"][:2]
    residual = np.linalg.norm(solve.b - laplacian(x0, n)) / np.linalg.norm(solve.b)
    print(f"CG on a {n}x{n} Poisson grid: {it0} iterations, relative residual {residual:.1e}")
    for name, (x, iterations, syncs, seconds) in results.items():
        diff = float(np.max(np.abs(x - x0)))
        print(f"  {name:10s} {iterations:5d} iterations  {syncs:5d} host synchronisations  {seconds * 1e3:8.2f} ms  "
              f"({seconds / iterations * 1e6:6.1f} us/iteration)  max |x - x_eager| = {diff:.1e}")
        assert iterations == it0 and diff <= 1e-9 * max(1.0, float(np.max(np.abs(x0)))), name
    assert residual < 1e-7 and results["one graph"][2] == 1
    print(f"the while_loop graph: {results['eager'][3] / results['one graph'][3]:.1f}x the eager loop's speed")


def laplacian(x: np.ndarray, n: int) -> np.ndarray:
    """A x on the host (the check)."""
    u = np.pad(x.reshape(n, n), 1)
    return (4 * u[1:-1, 1:-1] - u[:-2, 1:-1] - u[2:, 1:-1] - u[1:-1, :-2] - u[1:-1, 2:]).ravel()


if __name__ == "__main__":
    main()
