"""Windows that hold min_valid of valid pixels: a bound never above the truth, draws in them."""

import logging

import numpy as np
import pytest

from segscale.data.augment import patch_rng
from segscale.data.sampling.class_locations import (
    LocationSampler,
    TileClassLocations,
    centre_on_pixel,
    centre_rng,
)
from segscale.data.sampling.valid_cells import CELL
from segscale.data.sampling.valid_windows import TileWindows, centrable, qualifying_tiles, valid_rng
from segscale.errors import ConfigError
from tests.data.valid_maps import cells_of


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
