"""Class-balanced patches: each class's kept pixels, centres drawn on a class, the ratio cap."""

import json

import numpy as np
import pytest

from segscale.data.augment import patch_rng
from segscale.data.datasets.synthetic import CAR, CLASS_NAMES, draw_tile
from segscale.data.sampling.class_locations import (
    ClassCentres,
    LocationSampler,
    TileClassLocations,
    _priority,
    centre_rng,
    check_max_class_ratio,
    class_probabilities,
    within_class_ratio,
)
from segscale.errors import ConfigError


def kept(mask: np.ndarray, per_class: int, rows_per_chunk: int | None = None) -> dict:
    sampler = LocationSampler(len(CLASS_NAMES), per_class, mask.shape[1])
    step = rows_per_chunk or mask.shape[0]
    for start in range(0, mask.shape[0], step):
        sampler.add(mask[start : start + step], start)
    counts = np.bincount(mask[mask < len(CLASS_NAMES)], minlength=len(CLASS_NAMES))
    return {"class_locations": sampler.facts(), "class_counts": counts.tolist()}


def test_kept_pixels_are_of_their_class_and_do_not_depend_on_the_chunks():
    mask = draw_tile(192, seed=0, index=3)[1].copy()
    mask[:5] = 255  # ignored pixels belong to no class
    facts = kept(mask, 64)
    tile = TileClassLocations.from_facts(facts)
    for c, points in enumerate(tile.points):
        assert points.dtype == np.int32 and points.shape == (min(64, tile.counts[c]), 2)
        assert (mask[points[:, 0], points[:, 1]] == c).all()
        assert len(np.unique(points, axis=0)) == len(points)  # without replacement
    assert kept(mask, 64, rows_per_chunk=7) == facts  # a pure function of the mask


def test_kept_pixels_are_spread_uniformly_over_the_class():
    mask = np.zeros((200, 300), np.uint8)
    mask[:, 100:] = 1  # class 1: two thirds of the tile, class 0 one third
    tile = TileClassLocations.from_facts(kept(mask, 2000, rows_per_chunk=50))
    rows, cols = tile.points[1].T
    # 2000 of 40000 pixels: each half of the rows and of the columns holds about half.
    assert abs((rows < 100).mean() - 0.5) < 0.05
    assert abs((cols < 200).mean() - 0.5) < 0.05


def test_locations_are_compact():
    mask = draw_tile(512, seed=0, index=0)[1]
    facts = kept(mask, 64)
    tile = TileClassLocations.from_facts(facts)
    assert tile.nbytes <= len(CLASS_NAMES) * 64 * 2 * 4  # int32 (row, col) pairs
    stored = len(json.dumps(facts["class_locations"]))
    assert stored < tile.nbytes * 1.5 < mask.nbytes / 40


def test_class_probabilities_by_rule_and_by_weight():
    counts = np.array([600, 300, 0, 100])
    names = ["a", "b", "c", "d"]
    np.testing.assert_allclose(
        class_probabilities("present", counts, names), [1 / 3, 1 / 3, 0, 1 / 3]
    )
    inverse = class_probabilities("inverse_frequency", counts, names)
    np.testing.assert_allclose(inverse, np.array([1 / 6, 1 / 3, 0, 1]) / 1.5)
    np.testing.assert_allclose(class_probabilities([1, 0, 0, 3], counts, names), [0.25, 0, 0, 0.75])
    with pytest.raises(
        ConfigError, match=r"datamodule.sampling.class_weights=.* without pixels .*\(c\)"
    ):
        class_probabilities([1, 1, 1, 1], counts, names)


def test_centres_follow_the_class_shares_and_each_tiles_share_of_a_class():
    counts = [np.array([10, 30]), np.array([90, 0])]
    points = [
        (np.array([[0, 0]], np.int32), np.array([[1, 1]], np.int32)),
        (np.array([[2, 2]], np.int32), np.zeros((0, 2), np.int32)),
    ]
    tiles = [TileClassLocations(c, p) for c, p in zip(counts, points, strict=True)]
    centres = ClassCentres(tiles, np.array([0.25, 0.75]), p=0.8)
    draws = [centres.draw(np.random.default_rng([9, i])) for i in range(8000)]
    picked = [d for d in draws if d is not None]
    assert abs(len(picked) / len(draws) - 0.8) < 0.02
    classes = np.array([c for _, c, _, _ in picked])
    assert abs((classes == 1).mean() - 0.75) < 0.02
    # Class 0: tile 1 holds 90% of its pixels; class 1 lies in tile 0 only.
    zero = [t for t, c, _, _ in picked if c == 0]
    assert abs(np.mean(zero) - 0.9) < 0.03
    assert {(t, r, k) for t, c, r, k in picked if c == 1} == {(0, 1, 1)}


def test_the_centre_stream_is_index_addressed_and_not_the_patch_stream():
    a, b = centre_rng(3, 1, 7), centre_rng(3, 1, 7)
    assert a.random() == b.random()
    assert centre_rng(3, 1, 8).random() != centre_rng(3, 1, 7).random()
    assert centre_rng(3, 1, 7).random() != patch_rng(3, 1, 7).random()


def test_the_rare_car_class_is_kept_too():
    tile = TileClassLocations.from_facts(kept(draw_tile(256, seed=0, index=0)[1], 32))
    assert 0 < tile.counts[CAR] < tile.counts.sum() / 20
    assert len(tile.points[CAR]) == min(32, tile.counts[CAR])


def test_kept_pixels_are_each_class_s_lowest_priorities_rare_classes_too():
    # The pixels kept are those of lowest priority of each class over the whole mask,
    # whether a class is common (found among a chunk's lowest priorities) or rare
    # (looked for among all its pixels), whatever the chunks.
    rng = np.random.default_rng(5)
    mask = rng.choice(np.array([0, 1, 2, 255], np.uint8), (300, 257), p=[0.6, 0.3, 0.099, 0.001])
    mask[7, 9] = mask[250, 3] = 3  # a class of two pixels
    positions = np.arange(mask.size)
    for per_class, rows in ((16, 300), (16, 64), (40, 11), (3000, 128)):
        sampler = LocationSampler(4, per_class, mask.shape[1])
        for start in range(0, mask.shape[0], rows):
            sampler.add(mask[start : start + rows], start)
        stored = TileClassLocations.from_facts(
            {"class_locations": sampler.facts(), "class_counts": [0] * 4}
        )
        for c in range(4):
            members = positions[mask.ravel() == c]
            lowest = members[np.argsort(_priority(members))[:per_class]]
            expected = np.stack(np.divmod(np.sort(lowest), mask.shape[1]), axis=1)
            np.testing.assert_array_equal(stored.points[c], expected)


def mask_of(*counts: int, ignored: int = 0) -> np.ndarray:
    """A mask with ``counts[c]`` pixels of class ``c`` and ``ignored`` pixels of 255."""
    values = [np.full(n, c) for c, n in enumerate(counts)] + [np.full(ignored, 255)]
    return np.concatenate(values).astype(np.uint8).reshape(1, -1)


@pytest.mark.parametrize(
    ("mask", "ratio", "within"),
    [
        (mask_of(74, 26), 0.75, True),
        (mask_of(75, 25), 0.75, False),  # mmseg: the largest share must be below the ratio
        (mask_of(0, 29, 11, ignored=60), 0.75, True),  # ignored pixels do not count
        (mask_of(70, 10, ignored=20), 0.75, False),  # 70 of 80 labelled pixels
        (mask_of(100), 1.0, False),  # one class only: drawn again whatever the ratio
        (mask_of(ignored=100), 1.0, False),  # no labelled pixel
        (mask_of(99, 1), 1.0, True),
    ],
)
def test_the_largest_class_share_of_the_labelled_pixels_is_capped(mask, ratio, within):
    assert within_class_ratio(mask, 255, ratio) is within


@pytest.mark.parametrize("value", [0, 0.0, -0.5, 1.01, float("nan"), float("inf"), True, "0.75"])
def test_a_ratio_outside_zero_to_one_is_refused(value):
    with pytest.raises(ConfigError, match=r"datamodule\.sampling\.max_class_ratio=.* not allowed"):
        check_max_class_ratio(value)


@pytest.mark.parametrize(("value", "checked"), [(None, None), (0.75, 0.75), (1, 1.0)])
def test_null_or_a_share_in_zero_to_one_is_taken(value, checked):
    assert check_max_class_ratio(value) == checked
