"""One pair read in row chunks: the image's no-data pixels counted and left out of its sums."""

import numpy as np
import pytest
import tifffile
from PIL import Image

from segscale.data.checks import pair_inspection
from segscale.data.checks.pair_inspection import inspect_pair
from segscale.data.storage.sources import ImageMaskPair


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "float32"])
def test_chunks_without_nodata_in_a_band_are_skipped_and_counts_stay_exact(
    tmp_path, monkeypatch, dtype
):
    # Chunks of 8 rows: rows 0-7 are no-data; rows 8-15 hold the value in two bands of
    # one pixel (data) and in all three of another; rows 16 on never hold it.
    monkeypatch.setattr(pair_inspection, "ROWS_PER_CHUNK", 8)
    rng = np.random.default_rng(2)
    if dtype == "float32":
        image = (rng.random((40, 24, 3), dtype=np.float32) + 1).astype(dtype)
    else:
        image = rng.integers(1, 200, (40, 24, 3)).astype(dtype)
    image[:8] = 0
    image[10, 3, :2] = 0
    image[12, 5] = 0
    path, mask = tmp_path / "a.tif", tmp_path / "a.png"
    tifffile.imwrite(path, image, extratags=[(42113, "s", 0, "0", True)])
    Image.fromarray(np.zeros((40, 24), np.uint8)).save(mask)
    facts = inspect_pair(ImageMaskPair(path, mask))
    empty = (image == 0).all(axis=2)
    assert facts["nodata"] == {
        "setting": None,
        "value": 0.0,
        "from": "GDAL_NODATA",
        "pixels": 8 * 24 + 1,
    }
    data = image[~empty].astype(np.float64)
    np.testing.assert_allclose(facts["sum"], data.sum(0), rtol=1e-12)
    np.testing.assert_allclose(facts["squares"], (data**2).sum(0), rtol=1e-12)
    assert facts["pixels"] == 40 * 24
    none = inspect_pair(ImageMaskPair(path, mask), nodata=255)  # no pixel holds 255
    assert none["nodata"]["pixels"] == 0 and none["nodata"]["from"] == "datamodule.sampling.nodata"
    np.testing.assert_allclose(none["sum"], image.astype(np.float64).sum((0, 1)), rtol=1e-12)
