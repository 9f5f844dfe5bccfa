"""Bin counts of 8- and 16-bit pixels: OpenCV's, exactly NumPy's, in bands where needed."""

import numpy as np
import pytest

from segscale.data.checks import histograms
from segscale.data.checks.histograms import value_counts


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
    monkeypatch.setattr(histograms, "EXACT_COUNT", 100)  # bands of 100 // 30 = 3 rows
    calls = []
    calc = histograms.cv2.calcHist
    monkeypatch.setattr(
        histograms.cv2,
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
