"""Programmatic dependent launch on the GPU (marker `gpu`): a producer/consumer pair that
uses griddepcontrol gives the same, correct results with and without PDL, through every
launch form (indexing with the kernel's default, launch(pdl=...), bind, graph capture)."""
from __future__ import annotations

import numpy as np
import pytest

import nbjit

pytestmark = pytest.mark.gpu
from conftest import DATA, expected_path  # noqa: E402

N = (1 << 20) + 5
BLOCK = 256
GRID = (N + BLOCK - 1) // BLOCK


@pytest.fixture(scope="module")
def pair(cuda):
    if cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90")
    m = nbjit.load(DATA / "nvcc/pdl_sm90.ptx")
    x = cuda.to_device(np.arange(N, dtype=np.float32) % 1000)
    y, z = cuda.device_array(N, np.float32), cuda.device_array(N, np.float32)
    return m, x, y, z, cuda.stream()


def want(x):
    return 2 * (np.arange(N, dtype=np.float32) % 1000) + 1 + 3


def test_default_explicit_and_plain_launches_agree(pair):
    m, x, y, z, s = pair
    prod, cons, zero = m["pdl_producer"], m["pdl_consumer"], m["pdl_none"]
    assert prod.pdl and cons.pdl and not zero.pdl
    for form in ("default", True, False):
        for _ in range(20):
            zero[GRID, BLOCK, s](z, N)
            if form == "default":
                prod[GRID, BLOCK, s](y, x, N)
                cons[GRID, BLOCK, s](z, y, N)
            else:
                prod.launch(GRID, BLOCK, y, x, N, stream=s, pdl=form)
                cons.launch(GRID, BLOCK, z, y, N, stream=s, pdl=form)
        s.synchronize()
        np.testing.assert_array_equal(z.copy_to_host(), want(x), err_msg=str(form))
    cfg = cons[GRID, BLOCK, s]
    # the C launcher calls cuLaunchKernelEx itself; the Python path goes through cuda.bindings
    assert cfg.config.pdl and cfg.path == ("c" if expected_path() == "c" else "python (cuLaunchKernelEx)")
    assert not zero[GRID, BLOCK, s].config.pdl
    # launch(...) configures once per configuration, as kernel[...] does
    n = len(cons._configs)
    for _ in range(3):
        cons.launch(GRID, BLOCK, z, y, N, stream=s, pdl=True)
    assert len(cons._configs) == n


def test_bound_and_captured_pdl_launches(pair):
    m, x, y, z, s = pair
    prod, cons, zero = m["pdl_producer"], m["pdl_consumer"], m["pdl_none"]
    bound = [zero.bind(GRID, BLOCK, z, N, stream=s), prod.bind(GRID, BLOCK, y, x, N, stream=s),
             cons.bind(GRID, BLOCK, z, y, N, stream=s)]
    for _ in range(10):
        for b in bound:
            b()
    s.synchronize()
    np.testing.assert_array_equal(z.copy_to_host(), want(x))
    with nbjit.capture(s) as g:
        zero[GRID, BLOCK, s](z, N)
        prod[GRID, BLOCK, s](y, x, N)
        cons[GRID, BLOCK, s](z, y, N)
    for _ in range(10):
        g.launch()
    s.synchronize()
    np.testing.assert_array_equal(z.copy_to_host(), want(x))


def test_a_cubin_launches_plainly_until_told(pair, cuda):
    _, x, y, z, s = pair
    c = nbjit.load(DATA / "nvcc/pdl_sm_90.cubin")
    prod, cons = c.get_kernel("pdl_producer", "float*, const float*, int"), \
        c.get_kernel("pdl_consumer", "float*, const float*, int")
    assert not prod.pdl and not cons.pdl  # a cubin does not say it uses griddepcontrol
    prod.pdl = cons.pdl = True
    for _ in range(10):
        c.get_kernel("pdl_none", "float*, int")[GRID, BLOCK, s](z, N)
        prod[GRID, BLOCK, s](y, x, N)
        cons[GRID, BLOCK, s](z, y, N)
    s.synchronize()
    np.testing.assert_array_equal(z.copy_to_host(), want(x))
