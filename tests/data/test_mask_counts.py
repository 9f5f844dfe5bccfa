"""A mask's values and classes, counted chunk by chunk: what decoding pixel by pixel gives."""

import numpy as np
import pytest

from segscale.data.labels import LabelMap, mask_codes
from segscale.data.mask_counts import MaskCounts

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
