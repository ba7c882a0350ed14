"""TMA tensor maps on the GPU (marker `gpu`): a CUDA C++ kernel compiled with nbjit.compile
for sm_90 copies 2-D tiles through cp.async.bulk.tensor into a padded output, for two dtypes
and shapes that are not multiples of the tile, with zero and NaN out-of-bounds fill,
checked against numpy."""
from __future__ import annotations

import numpy as np
import pytest

import nbjit
from nbjit import NbjitArgumentError

pytestmark = pytest.mark.gpu
from conftest import DATA  # noqa: E402

CASES = [(np.float32, "tma_tile<float, 32, 32>", (32, 32), (100, 72)),
         (np.uint16, "tma_tile<unsigned short, 16, 64>", (16, 64), (50, 136))]


@pytest.fixture(scope="module")
def tma(cuda):
    if cuda.get_current_device().compute_capability < (9, 0):
        pytest.skip("TMA needs sm_90")
    return nbjit.compile((DATA / "src/tma.cu").read_text(), name="tma.cu",
                         name_expressions=[c[1] for c in CASES])


@pytest.mark.parametrize("dtype, expr, box, shape", CASES, ids=["float32", "uint16"])
@pytest.mark.parametrize("fill", ["zero", "nan"])
def test_tiles_through_tma_with_out_of_bounds_fill(tma, cuda, dtype, expr, box, shape, fill):
    if fill == "nan" and np.dtype(dtype).kind != "f":
        with pytest.raises(NbjitArgumentError, match="oob_fill 'nan' is for floating-point"):
            nbjit.tensor_map(cuda.device_array(shape, dtype), box, oob_fill=fill)
        return
    rows, cols = shape
    a = (np.arange(rows * cols) % 977).astype(dtype).reshape(shape)
    src = cuda.to_device(a)
    tm = nbjit.tensor_map(src, box, oob_fill=fill)
    gy, gx = -(-rows // box[0]), -(-cols // box[1])
    out = cuda.to_device(np.full((gy * box[0], gx * box[1]), 7, dtype))
    k = tma[expr]
    assert k.params[0].ctype == "CUtensorMap_st"
    k[(gx, gy), 128](tm, out, gx * box[1])
    got = out.copy_to_host()
    np.testing.assert_array_equal(got[:rows, :cols], a)
    pad = np.concatenate([got[rows:, :].ravel(), got[:rows, cols:].ravel()])
    assert pad.size and (np.isnan(pad).all() if fill == "nan" else (pad == 0).all())


def test_tensor_maps_from_cupy_and_misuse(tma, cuda):
    cp = pytest.importorskip("cupy")
    a = cp.arange(100 * 72, dtype=cp.float32).reshape(100, 72)
    tm = nbjit.tensor_map(a, (32, 32))
    out = cp.zeros((128, 96), cp.float32)
    k = tma["tma_tile<float, 32, 32>"]
    k[(3, 4), 128](tm, out, 96)
    cp.cuda.runtime.deviceSynchronize()
    assert cp.array_equal(out[:100, :72], a)
    with pytest.raises(NbjitArgumentError, match="parameter 1 .*a tensor map fits only"):
        k[(3, 4), 128](tm, tm, 96)
    with pytest.raises(NbjitArgumentError, match="parameter 0 .*is not a tensor map"):
        k[(3, 4), 128](out, out, 96)
    with pytest.raises(NbjitArgumentError, match="axis 0 has a stride of 280 bytes"):
        nbjit.tensor_map(cp.zeros((10, 70), cp.float32), (8, 8))
