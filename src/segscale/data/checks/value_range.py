"""The values of images per channel: each image's robust range, and inputs far outside one.

Not every pixel type fixes its value scale: float images may hold 0-1 or 0-255, 16-bit
ones 12-bit or 16-bit data. A network trained on one scale and given another predicts
an unrelated mask, without an error. So the validation pass measures each training
image's range per channel (``ValueHistogram``: its ``LOW_PERCENTILE`` and
``HIGH_PERCENTILE``, from a histogram filled in the pass's row chunks), a checkpoint
records the lowest and highest of them over the training images (``ValueRange``), and
an input of which more than ``MAX_SHARE_OUTSIDE`` of a channel's values lie far beyond
that range (``ValueRange.limits``) is on another scale (``value_range_problem``).
8-bit images are 0-255 by their type, and are not checked.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from segscale.data.checks.pixel_counts import value_counts
from segscale.data.storage.rasters import Pixels

LOW_PERCENTILE = 0.1
HIGH_PERCENTILE = 99.9
"""An image's range per channel: these percentiles of its values (a few odd pixels aside)."""

MARGIN = 2.0
"""How far past a training range an input's values may go, in the range's scale (its
width, or its largest magnitude if that is more): 0-1 admits -2 to 3."""

MAX_SHARE_OUTSIDE = 0.01
"""The share of a channel's values that may lie past the margin: hot pixels, a flare."""

UNCHECKED_TYPES = ("uint8",)
"""Pixel types whose value scale is their type's (0-255): an input of one is not checked."""

SAMPLE_VALUES = 1 << 22
"""Values of an input read for its check, at most: rows spread over the image."""

_FLOAT_KEPT_BITS = 16
"""Float32 values are binned by their top 16 bits (sign, exponent, 7 of the mantissa):
65536 bins, each 2**-7 (0.8%) of its values' magnitude wide."""


class ValueHistogram:
    """An image's values per channel, counted in bins: exact for integers, to 0.8% for floats.

    Filled chunk by chunk (``add``), so that a memory-mapped image is never loaded whole.
    """

    def __init__(self, channels: int, dtype: np.dtype | str) -> None:
        self.dtype = np.dtype(dtype)
        self.integer = self.dtype in (np.uint8, np.uint16)
        self.bins = 256 if self.dtype == np.uint8 else 1 << _FLOAT_KEPT_BITS
        self.channels = channels
        self.counts = np.zeros((channels, self.bins), np.int64)

    def add(self, chunk: np.ndarray) -> None:
        """Count the values of ``chunk`` (rows × width × channels of the image)."""
        for channel, counts in enumerate(self.counts):
            if self.integer:  # OpenCV counts a channel in place (segscale.data.checks.pixel_counts)
                counts += value_counts(chunk, channel)
                continue
            # A float32's bits, whose top ones order it by magnitude.
            bits = np.asarray(chunk[..., channel], np.float32).view(np.uint32)
            counts += np.bincount((bits >> (32 - _FLOAT_KEPT_BITS)).ravel(), minlength=self.bins)

    def bin_of(self, value: float) -> int | None:
        """The bin ``add`` counts ``value`` in; ``None`` for a value no pixel can hold.

        Integers: the value's own bin, if the type holds it (a whole number in range);
        floats: the bin of the value as a float32.
        """
        if not math.isfinite(value):
            return None
        if self.integer:
            if value != int(value) or not 0 <= value < self.bins:
                return None
            return int(value)
        bits = np.asarray(value, np.float32).view(np.uint32)
        return int(bits >> (32 - _FLOAT_KEPT_BITS))

    def remove(self, value: float, count: int) -> None:
        """Uncount ``count`` pixels that hold ``value`` in every channel (no-data pixels).

        Exact: those pixels were counted in ``value``'s bin of each channel (``bin_of``).
        """
        if not count:
            return
        index = self.bin_of(value)
        if index is None or (self.counts[:, index] < count).any():
            raise ValueError(f"fewer than {count} pixels of {value!r} were counted")
        self.counts[:, index] -= count

    def moments(self) -> tuple[list[float], list[float]]:
        """Per channel, the sum of the values and of their squares, of an integer image.

        Exact sums of the counted values (Python's integers where int64 could overflow),
        then rounded once to float64: what summing the pixels in float64 gives whenever
        its partial sums stay below 2**53, as they do for 8-bit images.
        """
        if not self.integer:
            raise ValueError("the moments of a float image are summed from its pixels")
        values = np.arange(self.bins, dtype=np.int64)
        sums = [_exact_dot(counts, values) for counts in self.counts]
        squares = [_exact_dot(counts, values * values) for counts in self.counts]
        return [float(s) for s in sums], [float(s) for s in squares]

    def nonfinite(self) -> int:
        """How many values are NaN or infinite (none in an integer image)."""
        if self.integer:
            return 0
        return int(self.counts.sum() - _finite_in_order(self.counts).sum())

    def percentiles(self) -> list[list[float]] | None:
        """Per channel ``[low, high]``: the ``LOW_PERCENTILE``'s and ``HIGH_PERCENTILE``'s bins.

        The low end of the one and the high end of the other, so the range holds them.
        ``None`` if a channel has no finite value.
        """
        counts = self.counts
        if self.integer:
            lows = highs = np.arange(self.bins, dtype=np.float64)
        else:
            counts = _finite_in_order(counts)
            lows, highs = _float_bins()
        ranges = []
        for ordered in counts:
            cumulative = np.cumsum(ordered)
            total = int(cumulative[-1])
            if total == 0:
                return None
            low = np.searchsorted(cumulative, total * LOW_PERCENTILE / 100, side="right")
            high = np.searchsorted(cumulative, total * HIGH_PERCENTILE / 100, side="left")
            ranges.append([float(lows[low]), float(highs[high])])
        return ranges


def _exact_dot(counts: np.ndarray, weights: np.ndarray) -> int:
    """``sum(counts * weights)`` exactly: in int64 where it cannot overflow, else in Python."""
    if int(counts.sum()) * int(weights.max(initial=0)) < 1 << 63:
        return int(np.dot(counts, weights))
    kept = np.flatnonzero(counts)
    return sum(int(c) * int(w) for c, w in zip(counts[kept], weights[kept], strict=True))


_HALF = 1 << (_FLOAT_KEPT_BITS - 1)
"""Float32 bins from this one on hold negative values (the sign bit is the top one)."""

_NONFINITE_BINS = 1 << (_FLOAT_KEPT_BITS - 9)
"""Bins of each sign whose exponent bits are all set (NaN, infinity): the top ones."""


def _finite_in_order(counts: np.ndarray) -> np.ndarray:
    """Per channel, the float32 bins' counts from the most negative value to the most positive.

    Negative values' bins run from the largest magnitude down; NaN and infinity are left out.
    """
    negative = counts[:, _HALF : 2 * _HALF - _NONFINITE_BINS][:, ::-1]
    return np.concatenate([negative, counts[:, : _HALF - _NONFINITE_BINS]], axis=1)


@cache
def _float_bins() -> tuple[np.ndarray, np.ndarray]:
    """The lowest and highest value of each finite float32 bin, in ``_finite_in_order``'s order."""
    top = np.arange(1 << _FLOAT_KEPT_BITS, dtype=np.uint32) << (32 - _FLOAT_KEPT_BITS)
    with np.errstate(invalid="ignore"):  # the NaN bins' values, left out
        nearest_zero = top.view(np.float32).astype(np.float64)
        farthest = (top | ((1 << (32 - _FLOAT_KEPT_BITS)) - 1)).view(np.float32).astype(np.float64)
    edges = np.stack([np.fmin(nearest_zero, farthest), np.fmax(nearest_zero, farthest)])
    ordered = _finite_in_order(edges)
    return ordered[0], ordered[1]


@dataclass(frozen=True)
class ValueRange:
    """Per channel, the range of the training images' values: the ends of their ranges.

    ``low`` and ``high`` are raw pixel values (as the files hold them, before scaling).
    """

    low: tuple[float, ...]
    high: tuple[float, ...]

    @classmethod
    def spanning(cls, ranges: Sequence[Sequence[Sequence[float]]]) -> ValueRange:
        """The range of images whose ranges (per image, ``[low, high]`` per channel) are given."""
        array = np.asarray(ranges, np.float64)
        return cls(tuple(array[:, :, 0].min(0).tolist()), tuple(array[:, :, 1].max(0).tolist()))

    @classmethod
    def from_record(cls, record: object) -> ValueRange:
        """A range as ``record`` writes it; ``ValueError`` if ``record`` is no such thing."""
        if not isinstance(record, list) or not record:
            raise ValueError("expected a [low, high] pair per channel")
        for pair in record:
            if not (isinstance(pair, list) and len(pair) == 2 and all(map(_finite, pair))):
                raise ValueError(f"{pair!r} is not a [low, high] pair of finite numbers")
            if pair[0] > pair[1]:
                raise ValueError(f"{pair!r}: low above high")
        return cls(tuple(float(p[0]) for p in record), tuple(float(p[1]) for p in record))

    def record(self) -> list[list[float]]:
        """Plain values for a checkpoint: ``[low, high]`` per channel."""
        return [[float(lo), float(hi)] for lo, hi in zip(self.low, self.high, strict=True)]

    @property
    def channels(self) -> int:
        """The channels the range has."""
        return len(self.low)

    def limits(self) -> tuple[np.ndarray, np.ndarray]:
        """Per channel, the values an input may reach: the range widened by ``MARGIN``.

        The margin is ``MARGIN`` times the range's scale: its width, or its largest
        magnitude if that is more (a narrow range far from zero). A channel that held
        zeros only has no scale: any value is admitted.
        """
        low, high = np.asarray(self.low), np.asarray(self.high)
        scale = np.maximum(high - low, np.maximum(np.abs(low), np.abs(high)))
        unbounded = scale == 0
        low = np.where(unbounded, -np.inf, low - MARGIN * scale)
        high = np.where(unbounded, np.inf, high + MARGIN * scale)
        return low, high

    def describe(self, channel: int) -> str:
        """The range of one channel, for messages."""
        return f"{self.low[channel]:.4g} to {self.high[channel]:.4g}"


def value_range_problem(image: Pixels, trained: ValueRange) -> str | None:
    """Why ``image``'s values are on another scale than ``trained``; ``None`` if they are not.

    ``image``: H×W×C (or H×W) of finite values, read in rows spread over it
    (``SAMPLE_VALUES``). More than ``MAX_SHARE_OUTSIDE`` of one channel's values past
    ``trained.limits()`` is a problem; 8-bit images (``UNCHECKED_TYPES``) and images of
    another channel count (refused for that elsewhere) have none.
    """
    pixels = image if image.ndim == 3 else np.asarray(image)[:, :, None]
    if image.dtype.name in UNCHECKED_TYPES or pixels.shape[2] != trained.channels:
        return None
    low, high = trained.limits()
    outside = np.zeros(trained.channels, np.int64)
    smallest = np.full(trained.channels, np.inf)
    largest = np.full(trained.channels, -np.inf)
    seen = 0
    for band in _sampled_bands(pixels):
        least, most = band.min((0, 1)), band.max((0, 1))
        smallest, largest = np.minimum(smallest, least), np.maximum(largest, most)
        if (least < low).any() or (most > high).any():  # else none is outside: not counted
            outside += np.count_nonzero((band < low) | (band > high), axis=(0, 1))
        seen += band.shape[0] * band.shape[1]
    share = outside / max(seen, 1)
    channel = int(np.argmax(share))
    if share[channel] <= MAX_SHARE_OUTSIDE:
        return None
    return (
        f"{share[channel]:.0%} of its channel {channel} values lie outside "
        f"{low[channel]:.4g} to {high[channel]:.4g} (they span {smallest[channel]:.4g} to "
        f"{largest[channel]:.4g}), far from the training images' {trained.describe(channel)}"
    )


def _sampled_bands(pixels: Pixels) -> Iterator[np.ndarray]:
    """Bands of every ``step``-th row of ``pixels``, at most ``SAMPLE_VALUES`` values in all."""
    row_values = max(1, int(np.prod(pixels.shape[1:])))
    step = max(1, math.ceil(pixels.shape[0] * row_values / SAMPLE_VALUES))
    rows = max(1, (1 << 22) // row_values) * step  # ~4 M values read at a time
    for y in range(0, pixels.shape[0], rows):
        yield np.asarray(pixels[y : y + rows : step])


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
