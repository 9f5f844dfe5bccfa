"""Bin counts of 8- and 16-bit pixels: OpenCV's, exactly NumPy's, in bands where needed.

A mask's values and classes, counted chunk by chunk: what decoding pixel by pixel gives.
"""

import numpy as np
import pytest

from segscale.data.checks import pixel_counts
from segscale.data.checks.pixel_counts import MaskCounts, value_counts
from segscale.data.classes.labels import LabelMap, mask_codes


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_counts_are_numpys_for_planes_and_each_channel(dtype):
    rng = np.random.default_rng(0)
    top = np.iinfo(dtype).max
    image = rng.integers(0, top + 1, (37, 53, 4), dtype=dtype)
    image[0, 0] = top  # the last bin
    planar = np.moveaxis(np.ascontiguousarray(np.moveaxis(image, 2, 0)), 0, -1)  # GDAL's
    for channel in range(4):
        expected = np.bincount(image[..., channel].ravel(), minlength=top + 1)
        np.testing.assert_array_equal(value_counts(image, channel), expected)
        np.testing.assert_array_equal(value_counts(planar, channel), expected)
        every_other = np.bincount(image[:, ::2, channel].ravel(), minlength=top + 1)
        np.testing.assert_array_equal(value_counts(image[:, ::2], channel), every_other)
    plane = np.ascontiguousarray(image[..., 2])
    counts = value_counts(plane)
    assert counts.dtype == np.int64 and len(counts) == top + 1
    np.testing.assert_array_equal(counts, np.bincount(plane.ravel(), minlength=top + 1))


def test_more_pixels_than_float32_counts_exactly_are_counted_in_bands(monkeypatch):
    # calcHist counts in float32: past 2**24 pixels of a value a count would round.
    monkeypatch.setattr(pixel_counts, "EXACT_COUNT", 100)  # bands of 100 // 30 = 3 rows
    calls = []
    calc = pixel_counts.cv2.calcHist
    monkeypatch.setattr(
        pixel_counts.cv2,
        "calcHist",
        lambda images, *a: calls.append(len(images[0])) or calc(images, *a),
    )
    plane = np.random.default_rng(1).integers(0, 256, (10, 30), dtype=np.uint8)
    np.testing.assert_array_equal(value_counts(plane), np.bincount(plane.ravel(), minlength=256))
    assert calls == [3, 3, 3, 1]


def test_arrays_opencv_cannot_take_are_counted_by_numpy():
    wide = np.random.default_rng(2).integers(0, 256, (3, 4, 600), dtype=np.uint8)  # > 512 bands
    np.testing.assert_array_equal(
        value_counts(wide, 599), np.bincount(wide[..., 599].ravel(), minlength=256)
    )


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
