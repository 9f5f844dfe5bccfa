import numpy as np
import pytest

from segscale.data.checks.value_range import (
    MAX_SHARE_OUTSIDE,
    ValueHistogram,
    ValueRange,
    value_range_problem,
)


def _percentiles(image: np.ndarray, rows: int = 7) -> list[list[float]] | None:
    """``ValueHistogram``'s ranges of ``image``, filled ``rows`` rows at a time."""
    histogram = ValueHistogram(image.shape[2], image.dtype)
    for start in range(0, image.shape[0], rows):
        histogram.add(image[start : start + rows])
    return histogram.percentiles()


@pytest.mark.parametrize(
    ("dtype", "low", "high"),
    [("uint8", 0, 255), ("uint16", 100, 4095), ("float32", -3.5, 250.0)],
)
def test_an_image_s_range_is_its_percentiles_per_channel(dtype: str, low: float, high: float):
    rng = np.random.default_rng(0)
    image = rng.uniform(low, high, (60, 50, 2)).astype(dtype)
    image[:, :, 1] = image[:, :, 1] // 2  # channels of their own
    image[0, 0, 0] = high  # one pixel: not the range
    found = _percentiles(image)
    expected = np.percentile(image.astype(np.float64), [0.1, 99.9], axis=(0, 1)).T
    binned = 0 if dtype != "float32" else 1 / 128  # floats are binned to 0.8%
    for channel, ((lo, hi), (want_lo, want_hi)) in enumerate(zip(found, expected, strict=True)):
        assert abs(lo - want_lo) <= binned * abs(want_lo) + 1
        assert abs(hi - want_hi) <= binned * abs(want_hi) + 1
        values = image[:, :, channel]
        assert ((values >= lo) & (values <= hi)).mean() >= 0.997


def test_nan_and_infinity_are_counted_and_left_out_of_the_range():
    image = np.full((10, 10, 3), 0.5, np.float32)
    image[0, 0, 0], image[1, 1, 1], image[2, 2, 2] = np.nan, np.inf, -np.inf
    histogram = ValueHistogram(3, image.dtype)
    histogram.add(image)
    assert histogram.nonfinite() == 3
    assert all(lo <= 0.5 <= hi < 0.51 for lo, hi in histogram.percentiles())
    empty = ValueHistogram(1, np.float32)
    empty.add(np.full((2, 2, 1), np.nan, np.float32))
    assert empty.percentiles() is None and empty.nonfinite() == 4


def test_the_range_of_images_spans_theirs():
    spanned = ValueRange.spanning([[[0.0, 0.8], [0.1, 0.5]], [[0.2, 1.0], [0.0, 0.4]]])
    assert spanned == ValueRange((0.0, 0.0), (1.0, 0.5))
    assert ValueRange.from_record(spanned.record()) == spanned


@pytest.mark.parametrize(
    "record", [[], [[1.0]], [[2.0, 1.0]], [[0.0, float("nan")]], [[0, True]], "0-1", [["0", 1]]]
)
def test_a_record_that_is_no_range_is_refused(record):
    with pytest.raises(ValueError):
        ValueRange.from_record(record)


ZERO_ONE = ValueRange((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))


def test_a_float_image_of_0_to_255_is_far_outside_a_range_of_0_to_1():
    rng = np.random.default_rng(0)
    image = rng.random((64, 64, 3), dtype=np.float32)
    assert value_range_problem(image, ZERO_ONE) is None
    problem = value_range_problem(image * 255, ZERO_ONE)
    assert problem is not None
    assert "of its channel" in problem and "far from the training images' 0 to 1" in problem


def test_brighter_images_and_a_few_hot_pixels_are_not_another_scale():
    rng = np.random.default_rng(0)
    brighter = rng.random((64, 64, 3), dtype=np.float32) * 2.5  # within the margin
    assert value_range_problem(brighter, ZERO_ONE) is None
    hot = rng.random((100, 100, 3), dtype=np.float32)
    hot.reshape(-1, 3)[: int(MAX_SHARE_OUTSIDE * 100 * 100)] = 1000.0  # 1%: a flare
    assert value_range_problem(hot, ZERO_ONE) is None
    hot.reshape(-1, 3)[: int(MAX_SHARE_OUTSIDE * 100 * 100) + 10] = 1000.0
    assert value_range_problem(hot, ZERO_ONE) is not None


def test_one_channel_far_out_is_enough_and_named():
    image = np.random.default_rng(0).random((32, 32, 3), dtype=np.float32)
    image[:, :, 2] -= 50
    assert "of its channel 2 values" in value_range_problem(image, ZERO_ONE)


def test_16_bit_data_of_another_bit_depth_is_another_scale():
    twelve_bit = ValueRange((0.0,), (4095.0,))
    rng = np.random.default_rng(0)
    image = rng.integers(0, 4096, (40, 40, 1)).astype(np.uint16)
    assert value_range_problem(image, twelve_bit) is None
    assert value_range_problem(image * 16, twelve_bit) is not None  # stretched to 16 bits


def test_8_bit_images_are_not_checked_their_type_fixes_the_scale():
    dark = ValueRange((0.0,), (20.0,))
    image = np.full((8, 8, 1), 255, np.uint8)
    assert value_range_problem(image, dark) is None
    assert value_range_problem(image.astype(np.uint16), dark) is not None


def test_a_training_channel_of_zeros_admits_any_value_and_2d_arrays_are_one_channel():
    zeros = ValueRange((0.0,), (0.0,))
    assert value_range_problem(np.full((8, 8), 7.0, np.float32), zeros) is None
    assert value_range_problem(np.full((8, 8), 7.0, np.float32), ValueRange((0.0,), (1.0,)))


def test_a_huge_image_is_checked_from_rows_spread_over_it(monkeypatch):
    from segscale.data.checks import value_range

    monkeypatch.setattr(value_range, "SAMPLE_VALUES", 1000)
    image = np.random.default_rng(0).random((400, 30, 3), dtype=np.float32)
    image[200:] *= 255  # the lower half only
    reads = []
    original = value_range._sampled_bands

    def counted(pixels):
        for band in original(pixels):
            reads.append(band.shape[0])
            yield band

    monkeypatch.setattr(value_range, "_sampled_bands", counted)
    assert value_range_problem(image, ZERO_ONE) is not None
    assert sum(reads) * 30 * 3 <= 1000 + 30 * 3  # a sample, not every row


@pytest.mark.parametrize("dtype", ["uint8", "uint16"])
def test_an_integer_image_s_sums_come_exactly_from_its_histogram(dtype: str):
    rng = np.random.default_rng(3)
    image = rng.integers(0, np.iinfo(dtype).max + 1, (70, 40, 3), dtype=dtype)
    histogram = ValueHistogram(3, image.dtype)
    for start in range(0, 70, 32):
        histogram.add(image[start : start + 32])
    sums, squares = histogram.moments()
    wide = image.astype(np.int64)
    assert sums == [float(s) for s in wide.sum((0, 1)).tolist()]
    assert squares == [float(s) for s in (wide**2).sum((0, 1)).tolist()]
    # What summing the pixels in float64 gave, bit for bit, while its sums are exact.
    assert sums == image.astype(np.float64).sum((0, 1)).tolist()


def test_sums_past_int64_are_summed_exactly_in_python():
    histogram = ValueHistogram(1, np.uint16)
    histogram.counts[0, 65535] = 1 << 42  # 4 * 10**12 pixels of 65535: squares past 2**63
    sums, squares = histogram.moments()
    assert squares == [float(65535**2 * (1 << 42))] and sums == [float(65535 * (1 << 42))]
    with pytest.raises(ValueError, match="float image"):
        ValueHistogram(1, np.float32).moments()
