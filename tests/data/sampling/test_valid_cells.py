"""Valid pixels per 16×16 cell: exact, independent of the row chunks, compact."""

import json

import numpy as np
import pytest
import tifffile

from segscale.data.sampling.valid_cells import (
    CELL,
    TileValidCells,
    ValidCellCounter,
    Validity,
    ValidPixels,
)
from segscale.data.storage.nodata import GDAL_NODATA, nodata_pixels


def counted(valid: np.ndarray, rows_per_chunk: int) -> TileValidCells:
    counter = ValidCellCounter(*valid.shape)
    for start in range(0, valid.shape[0], rows_per_chunk):
        counter.add(valid[start : start + rows_per_chunk], start)
    return TileValidCells.from_facts({"shape": list(valid.shape), "valid_cells": counter.facts()})


@pytest.mark.parametrize("shape", [(64, 64), (50, 37), (16, 3), (1, 1)])
def test_counts_are_exact_whatever_the_chunks(shape):
    valid = np.random.default_rng(0).random(shape) < 0.6
    cells = counted(valid, rows_per_chunk=shape[0])
    height, width = shape
    padded = np.zeros((-(-height // CELL) * CELL, -(-width // CELL) * CELL), np.int64)
    padded[:height, :width] = valid
    expected = padded.reshape(padded.shape[0] // CELL, CELL, -1, CELL).sum(axis=(1, 3))
    np.testing.assert_array_equal(cells.counts, expected)
    assert cells.shape == shape and cells.counts.dtype == np.uint16
    for rows in (1, 7, 16, 23):
        np.testing.assert_array_equal(counted(valid, rows).counts, cells.counts)
    assert cells.cell_sizes(0).sum() == height and cells.cell_sizes(1).sum() == width


def test_a_full_cell_counts_256_and_a_nodata_border_compresses():
    valid = np.ones((1024, 1024), bool)
    valid[:, :300] = False  # a no-data border
    counter = ValidCellCounter(*valid.shape)
    counter.add(valid, 0)
    cells = TileValidCells.from_facts({"shape": [1024, 1024], "valid_cells": counter.facts()})
    assert cells.counts.max() == CELL * CELL  # 256: more than a uint8 holds
    assert cells.counts[0, 18] == 4 * CELL  # the border's edge crosses it: 4 columns valid
    assert cells.nbytes == 64 * 64 * 2  # 1/128 of a uint8 mask's bytes
    assert len(json.dumps(counter.facts())) < 300


def test_valid_means_a_class_in_the_mask_and_not_nodata_in_every_band():
    image = np.full((32, 32, 3), 9, np.uint8)
    image[:16, :, :] = 0  # no-data rows
    image[20, :, 1] = 0  # one band 0: not no-data
    classes = np.zeros((32, 32), np.uint8)
    classes[:, 28:] = 255  # ignored columns
    classes[30, :4] = 6  # no class of 6 (what decoding makes of unknown values is 255)
    pixels = ValidPixels(32, 32, 6)
    for start in (0, 10, 20, 30):
        rows = image[start : start + 10]
        pixels.add(classes[start : start + 10], start, nodata_pixels(rows, 0.0))
    # Rows 16-31: 4 pixels of 6 in the left cell, 4 ignored columns in the right one.
    np.testing.assert_array_equal(pixels.counter.counts, [[0, 0], [256 - 4, 256 - 4 * 16]])
    without = ValidPixels(32, 32, 6)  # no no-data value: the image's zeros are valid
    without.add(classes, 0, None)
    assert without.counter.counts.sum() == (classes < 6).sum()


def test_the_setting_overrides_the_tag_and_a_nan_tag_matches_nothing(tmp_path):
    path = tmp_path / "a.tif"
    tifffile.imwrite(
        path, np.zeros((8, 8, 3), np.uint8), extratags=[(GDAL_NODATA, "s", 0, "3", True)]
    )
    assert Validity().nodata_of(path) == 3.0
    assert Validity(nodata=7).nodata_of(path) == 7.0
    nan = tmp_path / "nan.tif"
    tifffile.imwrite(
        nan, np.zeros((8, 8), np.float32), extratags=[(GDAL_NODATA, "s", 0, "nan", True)]
    )
    assert Validity().nodata_of(nan) is None
    bad = tmp_path / "bad.tif"
    tifffile.imwrite(
        bad, np.zeros((8, 8), np.uint8), extratags=[(GDAL_NODATA, "s", 0, "n/a", True)]
    )
    with pytest.raises(ValueError, match="GDAL_NODATA tag holds 'n/a'"):
        Validity().nodata_of(bad)
    assert Validity(nodata=0).nodata_of(bad) == 0.0  # the setting: the tag is not read
