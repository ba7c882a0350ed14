"""Tune two kernels with nbjit.tune, and find the answers again in a new process without timing.

    python examples/tune_reduction.py            # the first run searches (64 + 5 variants)
    python examples/tune_reduction.py            # a second run finds both answers in the cache

1. A CUB block reduction, a CUDA C++ template over block size x items per thread x CUB's
   reduction algorithm (64 variants): compiled at once by NVRTC, the ones that cannot run
   pruned by their registers and shared memory, the others timed with CUDA events.
2. A @cuda.jit kernel's block size (nbjit.from_numba: the same kernel, launched by nbjit).

Each answer is a cache entry keyed by the GPU's model, the driver, the source and the space
(and a key of the input's size, here): `nbjit tune --list` shows them; `nbjit cache export`
and the remote tier carry them to other machines of the same GPU model.
"""
import argparse
import time

import numpy as np
from numba import cuda

import nbjit

if not cuda.is_available():
    raise SystemExit("tune_reduction.py needs a CUDA GPU and driver (examples/inspect_kernels.py runs without one)")

SUM = r"""
#include <cub/block/block_reduce.cuh>

template <int BLOCK, int ITEMS, cub::BlockReduceAlgorithm ALGO>
__global__ void __launch_bounds__(BLOCK) block_sum(const float* __restrict__ x, float* out, long long n) {
  using Reduce = cub::BlockReduce<float, BLOCK, ALGO>;
  __shared__ typename Reduce::TempStorage tmp;
  float acc = 0.0f;
  const long long step = (long long)gridDim.x * BLOCK * ITEMS;
  for (long long base = (long long)blockIdx.x * BLOCK * ITEMS + threadIdx.x; base < n; base += step) {
    #pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      long long j = base + (long long)i * BLOCK;
      acc += j < n ? x[j] : 0.0f;
    }
  }
  float total = Reduce(tmp).Sum(acc);
  if (threadIdx.x == 0) atomicAdd(out, total);
}
"""
SPACE = {"BLOCK": [128, 256, 512, 1024], "ITEMS": [1, 2, 4, 8],
         "ALGO": ["cub::BLOCK_REDUCE_RAKING", "cub::BLOCK_REDUCE_RAKING_COMMUTATIVE_ONLY",
                  "cub::BLOCK_REDUCE_WARP_REDUCTIONS", "cub::BLOCK_REDUCE_WARP_REDUCTIONS_NONDETERMINISTIC"]}
DEFAULT = {"BLOCK": 256, "ITEMS": 1, "ALGO": "cub::BLOCK_REDUCE_WARP_REDUCTIONS"}  # what one would write untuned
MAX_BLOCKS = 4096


@cuda.jit
def scale(out, x, a):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = a * x[i]


def grid_for(n):
    return lambda c: min(MAX_BLOCKS, -(-n // (c["BLOCK"] * c["ITEMS"])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 26, help="elements to sum (default 2**26: 256 MiB)")
    ap.add_argument("--retune", action="store_true", help="search again, replacing the answers kept")
    opts = ap.parse_args()
    n, retune = opts.n, opts.retune

    x_host = np.random.default_rng(0).random(n, dtype=np.float32)
    x, out = cuda.to_device(x_host), cuda.to_device(np.zeros(1, np.float32))
    key = ("float32", n.bit_length())  # a bucket of sizes that share an answer

    t0 = time.perf_counter()
    best = nbjit.tune(nbjit.Template(SUM, "block_sum<{BLOCK}, {ITEMS}, {ALGO}>", program="block_sum.cu"), SPACE,
                      (x, out, n), key=key, grid=grid_for(n), block=lambda c: c["BLOCK"], retune=retune)
    took = time.perf_counter() - t0
    how = "found in the cache, 0 variants timed" if best.from_cache else \
        f"searched: {best.answer.counts['timed']} timed, {best.answer.counts['pruned']} pruned, " \
        f"{best.answer.counts['failed']} failed"
    print(f"CUB reduction: {how}, in {took * 1e3:.1f} ms (the process's first nbjit call: imports included)")
    print(f"  answer: {' '.join(f'{k}={v}' for k, v in best.config.items())}: {best.ms * 1e3:.1f} us a launch")
    default = best.answer.times.get(" ".join(f"{k}={v}" for k, v in DEFAULT.items()))
    if default:
        print(f"  the default choice ({DEFAULT['BLOCK']} threads, 1 item, warp reductions): {default * 1e3:.1f} us; "
              f"the answer is {default / best.ms:.2f}x faster")
    assert out.copy_to_host()[0] == 0.0, "the search put the output back as it was given"
    best(x, out, n)
    got, want = float(out.copy_to_host()[0]), float(x_host.sum(dtype=np.float64))
    assert abs(got - want) <= 1e-3 * want, (got, want)
    print(f"  sum of {n} floats: {got:.6g} (numpy: {want:.6g})")

    y = cuda.device_array_like(x)
    kernel = nbjit.from_numba(scale, "void(float32[:], float32[:], float32)")
    t0 = time.perf_counter()
    tuned = nbjit.tune(kernel, {"block": [64, 128, 256, 512, 1024]}, (y, x, np.float32(2.0)), key=key,
                       grid=lambda c: -(-n // c["block"]), retune=retune)
    took = time.perf_counter() - t0
    print(f"@cuda.jit scale: {'found in the cache' if tuned.from_cache else f'{tuned.timed} timed'} in "
          f"{took * 1e3:.1f} ms: block={tuned.config['block']}, {tuned.ms * 1e3:.1f} us a launch")
    tuned(y, x, np.float32(2.0))
    assert np.array_equal(y.copy_to_host(), 2 * x_host)


if __name__ == "__main__":
    main()
