"""Windows that hold min_valid of valid pixels: a bound never above the truth, draws in them.

Valid pixels per 16×16 cell: exact, independent of the row chunks, compact.
"""

import json
import logging

import numpy as np
import pytest
import tifffile

from segscale.data.augment import patch_rng
from segscale.data.sampling.class_locations import (
    LocationSampler,
    TileClassLocations,
    centre_on_pixel,
    centre_rng,
)
from segscale.data.sampling.valid_windows import (
    CELL,
    TileValidCells,
    TileWindows,
    ValidCellCounter,
    Validity,
    ValidPixels,
    centrable,
    qualifying_tiles,
    valid_rng,
)
from segscale.data.storage.nodata import GDAL_NODATA, nodata_pixels
from segscale.errors import ConfigError
from tests.helpers.valid_maps import cells_of


def true_valid(valid: np.ndarray, x0: float, y0: float, size: int) -> float:
    """The valid area of the window [x0, x0 + size) × [y0, y0 + size); pixel j spans [j, j+1)."""
    j = np.arange(valid.shape[1])
    i = np.arange(valid.shape[0])
    over_x = np.clip(np.minimum(x0 + size, j + 1) - np.maximum(x0, j), 0, 1)
    over_y = np.clip(np.minimum(y0 + size, i + 1) - np.maximum(y0, i), 0, 1)
    return float(over_y @ valid.astype(np.float64) @ over_x)


def bordered(height: int = 150, width: int = 200, seed: int = 0) -> np.ndarray:
    """Valid pixels: a ragged no-data border on the left, unlabelled blobs, salt."""
    rng = np.random.default_rng(seed)
    valid = rng.random((height, width)) > 0.05
    edge = 60 + (10 * np.sin(np.arange(height) / 9)).astype(int)
    valid[np.arange(width)[None, :] < edge[:, None]] = False
    valid[100:130, 120:170] = False
    return valid


@pytest.mark.parametrize(("shape", "size"), [((150, 200), 48), ((97, 131), 40), ((64, 80), 64)])
def test_the_lattice_bound_is_the_windows_bound_and_never_above_the_truth(shape, size):
    valid = bordered(*shape)
    windows = TileWindows(cells_of(valid), size, 0.5)
    bounds = windows._lattice_bounds()
    rows, cols = np.mgrid[0 : bounds.shape[0], 0 : bounds.shape[1]]
    at = windows.valid_at_least(cols.ravel() * 16.0, rows.ravel() * 16.0)
    np.testing.assert_array_equal(at.reshape(bounds.shape), bounds)
    rng = np.random.default_rng(1)
    x0 = rng.uniform(-8, shape[1] - size + 8, 300)  # fractional, some past the border
    y0 = rng.uniform(-8, shape[0] - size + 8, 300)
    found = windows.valid_at_least(x0, y0)
    truth = [true_valid(valid, x, y, size) for x, y in zip(x0, y0, strict=True)]
    assert (found <= np.asarray(truth) + 1e-9).all()
    assert np.mean(found) > 0.9 * np.mean(truth)  # and close to it


def test_the_bound_is_exact_where_cells_are_all_valid_or_all_invalid():
    valid = np.ones((96, 128), bool)
    valid[:, :32] = False  # along cell edges
    valid[64:, 96:] = False
    windows = TileWindows(cells_of(valid), 40, 1.0)  # 40: no multiple of the cell
    for x0, y0 in [(0.0, 0.0), (33.5, 7.25), (50.0, 56.0), (88.0, 20.0), (-3.0, 60.5)]:
        assert windows.valid_at_least(np.array([x0]), np.array([y0]))[0] == pytest.approx(
            true_valid(valid, x0, y0, 40)
        )
    # Every fully valid window on the lattice qualifies at min_valid=1.
    assert windows.count == (windows._lattice_bounds() == 40 * 40).sum() > 0


@pytest.mark.parametrize("min_valid", [0.6, 0.85])
def test_drawn_windows_qualify_and_spread_over_the_qualifying_ones(min_valid):
    valid = bordered()
    size = 48
    windows = TileWindows(cells_of(valid), size, min_valid)
    centres = np.array([windows.draw(valid_rng(3, 0, i)) for i in range(600)])
    x0, y0 = centres[:, 0] - size / 2, centres[:, 1] - size / 2
    shares = [true_valid(valid, x, y, size) / size**2 for x, y in zip(x0, y0, strict=True)]
    assert min(shares) >= min_valid
    assert (x0 >= 0).all() and (x0 <= 200 - size).all() and (y0 <= 150 - size).all()
    assert len(np.unique(centres, axis=0)) > 500  # not the lattice points alone
    # Over the qualifying lattice windows' cells, about as often each (not piled on a few).
    cells = np.floor(y0 / CELL).astype(int) * 100 + np.floor(x0 / CELL).astype(int)
    assert np.bincount(np.unique(cells, return_inverse=True)[1]).max() < 600 / windows.count * 4


def test_the_valid_stream_is_index_addressed_and_its_own():
    assert valid_rng(3, 1, 7).random() == valid_rng(3, 1, 7).random()
    assert valid_rng(3, 1, 8).random() != valid_rng(3, 1, 7).random()
    firsts = {
        valid_rng(3, 1, 7).random(),
        centre_rng(3, 1, 7).random(),
        patch_rng(3, 1, 7).random(),
    }
    assert len(firsts) == 3


def test_tiles_without_a_window_are_left_out_and_a_dataset_without_any_is_refused(caplog):
    good, empty = bordered(), np.zeros((150, 200), bool)
    with caplog.at_level(logging.WARNING):
        kept, windows = qualifying_tiles(
            [cells_of(empty), cells_of(good)], ["a.tif", "b.tif"], 48, 0.8
        )
    assert kept == [1] and windows[0].count > 0
    assert "a.tif holds no 48-pixel window with datamodule.sampling.min_valid=0.8" in caplog.text
    assert "b.tif" not in caplog.text
    best = TileWindows(cells_of(good), 48, 0.8).best
    with pytest.raises(
        ConfigError, match=rf"datamodule.sampling.min_valid=1 is not allowed.*{best:.3f}"
    ):
        qualifying_tiles([cells_of(empty), cells_of(good)], ["a.tif", "b.tif"], 48, 1.0)


def test_class_pixels_are_kept_where_their_centred_window_qualifies():
    valid = bordered()
    classes = (np.arange(200)[None, :] >= 100).repeat(150, axis=0).astype(np.uint8)
    mask = np.where(valid, classes, 255).astype(np.uint8)  # class 0 beside the border
    sampler = LocationSampler(2, 64, 200)
    sampler.add(mask, 0)
    counts = np.bincount(mask[mask < 2], minlength=2)
    facts = {"class_locations": sampler.facts(), "class_counts": counts.tolist()}
    tile = TileClassLocations.from_facts(facts)
    windows = TileWindows(cells_of(valid), 48, 0.8)
    kept = centrable(tile, windows)
    shares = []
    for before, after, count, new in zip(
        tile.points, kept.points, tile.counts, kept.counts, strict=True
    ):
        x, y = centre_on_pixel(before[:, 0], before[:, 1], 48, 150, 200)
        truth = [true_valid(valid, a - 24, b - 24, 48) for a, b in zip(x, y, strict=True)]
        qualifying = {tuple(p) for p, t in zip(before, truth, strict=True) if t >= 0.8 * 48**2}
        assert set(map(tuple, after)) <= qualifying
        assert windows.holds(*centre_on_pixel(after[:, 0], after[:, 1], 48, 150, 200)).all()
        assert new == max(round(count * len(after) / len(before)), 1)
        shares.append(len(after) / len(before))
    assert 0 < shares[0] < shares[1] < 1  # the border keeps most of class 0's windows out


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
