"""A mask's values and classes, counted chunk by chunk: what decoding pixel by pixel gives."""

import numpy as np
import pytest

from segscale.data.checks.mask_counts import MaskCounts
from segscale.data.classes.labels import LabelMap, mask_codes

RNG = np.random.default_rng(0)
PALETTE = np.array([[255, 255, 255], [0, 0, 255], [0, 255, 0], [9, 9, 9]], np.uint8)

MASKS = {
    "class indices": (RNG.integers(0, 8, (40, 30)).astype(np.uint8), LabelMap(6)),
    "grey levels": (
        RNG.choice(np.array([0, 128, 255, 77], np.uint8), (40, 30)),
        LabelMap(3, 255, label_ids=[0, 128, 255]),
    ),
    "16-bit": (
        RNG.integers(0, 3000, (40, 30)).astype(np.uint16),
        LabelMap(4, 255, [0, 7, 300, 2999]),
    ),
    "colours": (
        PALETTE[RNG.integers(0, 4, (40, 30))],
        LabelMap(3, 255, label_ids=[[255, 255, 255], [0, 0, 255], [0, 255, 0]]),
    ),
}


@pytest.mark.parametrize("kind", MASKS)
def test_values_classes_and_class_pixels_are_those_of_pixel_by_pixel_decoding(kind):
    mask, labels = MASKS[kind]
    counts = MaskCounts(mask.dtype, mask.ndim, labels)
    for start in range(0, 40, 13):
        rows = mask[start : start + 13]
        classes, per_class = counts.add(rows, classes=True)
        expected = labels.decode(rows)
        # A mask of class indices is taken as it is: what is no class stays no class.
        named = expected < labels.num_classes
        np.testing.assert_array_equal(classes[named], expected[named])
        assert (classes[~named] >= labels.num_classes).all()
        assert classes.dtype == np.uint8 and classes.shape == rows.shape[:2]
        np.testing.assert_array_equal(per_class, np.bincount(expected.ravel(), minlength=256))
    values, pixels = counts.values()
    expected_values, expected_pixels = np.unique(mask_codes(mask), return_counts=True)
    np.testing.assert_array_equal(values, expected_values)
    np.testing.assert_array_equal(pixels, expected_pixels)
    assert values.dtype == pixels.dtype == np.int64


def test_values_are_counted_without_labels_and_classes_need_them():
    mask = MASKS["grey levels"][0]
    counts = MaskCounts(mask.dtype, mask.ndim)
    assert counts.add(mask) is None
    assert counts.values()[1].sum() == mask.size
    with pytest.raises(ValueError, match="without labels"):
        counts.add(mask, classes=True)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_a_palette_mask_s_classes_are_its_colours_through_the_palette_table(dtype):
    # Indices in an order of the file's own (entry i: the colour of class order[i]); index
    # 4 holds a colour no class has, 6 lies beyond the palette: both are no class.
    colours = [[255, 255, 255], [0, 0, 255], [0, 255, 0]]
    order = [2, 0, 1]
    palette = np.array([colours[c] for c in order] + [[9, 9, 9]], np.uint8)
    labels = LabelMap(3, 255, label_ids=colours)
    table = labels.palette_table(palette)
    assert table is not None
    mask = RNG.choice(np.array([0, 1, 2, 3, 6]), (40, 30)).astype(dtype)
    counts = MaskCounts(mask.dtype, mask.ndim, labels, table)
    for start in range(0, 40, 13):
        rows = mask[start : start + 13]
        classes, per_class = counts.add(rows, classes=True)
        expected = labels.decode(rows, table)  # what training reads of the file
        np.testing.assert_array_equal(classes, expected)
        np.testing.assert_array_equal(classes[rows == 1], 0)  # entry 1: class 0's colour
        np.testing.assert_array_equal(per_class, np.bincount(expected.ravel(), minlength=256))
    # The values are the stored indices, as mask_codes gives a one-channel mask's: the
    # palette's colours are applied to them later, from the facts (values_as_read).
    values, pixels = counts.values()
    expected_values, expected_pixels = np.unique(mask_codes(mask), return_counts=True)
    np.testing.assert_array_equal(values, expected_values)
    np.testing.assert_array_equal(pixels, expected_pixels)
    np.testing.assert_array_equal(mask_codes(mask), mask.astype(np.int64))
