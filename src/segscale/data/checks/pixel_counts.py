"""Pixels counted: bin counts of 8/16-bit pixels (OpenCV's, exact), a mask's values and classes.

Bin counts of 8- and 16-bit pixels, exact, counted by OpenCV outside Python's lock.

The validation pass counts every pixel of a dataset once: each image channel's values
(``segscale.data.checks.value_range``) and each mask's values
(below).
NumPy's ``bincount`` of a strided channel copies it first and holds the GIL, so threads
reading other files wait for it; OpenCV's ``calcHist`` reads the channel in place, some
8× faster for 8-bit pixels, and releases the GIL. Its counts are float32, exact up to
``EXACT_COUNT``: larger arrays are counted in bands of rows below it.

A mask's values counted chunk by chunk, and the class index of each of its pixels.

The validation pass reads each mask once, in row chunks, and needs of every chunk the
pixels of each value (``mask_codes``'s codes) and, when it keeps class locations or
counts valid pixels, each pixel's class. Grey masks of 8 or 16 bits are counted with
one bin per value (above) and their classes looked up in a table
of every value's class, which ``LabelMap.decode_codes`` fills once per mask; colour
masks (and other pixel types) are counted by ``np.unique``, whose inverse gives each
pixel's code, and only their distinct codes are decoded. Either way a pixel's class is
``LabelMap.decode_codes`` of its code, as decoding the chunk pixel by pixel gives it;
a mask of class indices is used as it is, its values that are no class left at or
above ``num_classes`` (decoding would make them ``ignore_index``).

A palette mask's values are its indices, counted as a grey mask's are; when the labels
read it by its colours, its classes come from the table they make of its palette
(``LabelMap.palette_table``), as ``LabelMap.decode`` reads such a mask.
"""

from __future__ import annotations

import cv2
import numpy as np

from segscale.data.classes.labels import LabelMap, mask_codes

EXACT_COUNT = 1 << 24
"""Counts that float32 holds exactly: no band of rows counted at once holds more pixels."""

CV_MAX_CHANNELS = 512
"""The most channels an OpenCV array has; arrays of more are counted by NumPy."""

BINS = {np.dtype(np.uint8): 256, np.dtype(np.uint16): 65536}
"""The pixel types counted with one bin per value, and their bins."""


def value_counts(
    pixels: np.ndarray, channel: int | None = None, where: np.ndarray | None = None
) -> np.ndarray:
    """How many pixels hold each value (int64, one bin per value of the type).

    ``pixels``: H×W (``channel`` None) or H×W×C of uint8 or uint16 (``BINS``);
    ``where``: H×W bool, the pixels counted (``None``: all).
    """
    bins = BINS[pixels.dtype]
    plane = pixels if channel is None else pixels[..., channel]
    width = max(1, plane.shape[1] if plane.ndim > 1 else 1)
    rows = EXACT_COUNT // width
    channels = pixels.shape[2] if pixels.ndim == 3 else 1
    if rows == 0 or channels > CV_MAX_CHANNELS:
        return np.bincount((plane if where is None else plane[where]).ravel(), minlength=bins)
    counts = np.zeros(bins, np.int64)
    # OpenCV reads a channel of interleaved pixels in place, and a contiguous plane; any
    # other layout it would copy whole, every channel: the channel alone is copied then.
    source, index = (pixels, [0 if channel is None else channel])
    if not pixels.flags.c_contiguous:
        source, index = (plane if plane.flags.c_contiguous else np.ascontiguousarray(plane)), [0]
    for start in range(0, source.shape[0], rows):
        band = source[start : start + rows]
        mask = None if where is None else where[start : start + rows].astype(np.uint8)
        counted = cv2.calcHist([band], index, mask, [bins], [0, bins])
        counts += counted.ravel().astype(np.int64)
    return counts


class MaskCounts:
    """The values of one mask (``dtype``, H×W or H×W×3), fed chunk by chunk.

    ``labels``: what ``classes`` decodes with (``None``: no classes are asked for);
    ``palette_table``: a palette mask's class of each index, when ``labels`` read it by
    its colours (``LabelMap.palette_table``; an index beyond it is ``ignore_index``).
    """

    def __init__(
        self,
        dtype: np.dtype,
        ndim: int,
        labels: LabelMap | None = None,
        palette_table: np.ndarray | None = None,
    ) -> None:
        self.labels = labels
        self.palette_table = palette_table
        self.binned = ndim == 2 and np.dtype(dtype) in BINS
        self.bins = np.zeros(BINS[np.dtype(dtype)], np.int64) if self.binned else None
        self.totals: dict[int, int] = {}
        self._table: np.ndarray | None = None

    def add(
        self, chunk: np.ndarray, classes: bool = False, covered: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Count ``chunk``'s values; with ``classes``, return its pixels' class indices.

        Those (H×W uint8) and the chunk's pixels of each class index (int64, 256 of them:
        ``ignore_index`` and unknown values among them). ``covered`` (H×W bool): the
        pixels that hold a value of the mask (a warped mask's); the others are counted
        in no value, and are ``ignore_index`` in no class.
        """
        if covered is not None and covered.all():
            covered = None
        if self.bins is not None:
            counted = value_counts(chunk, where=covered)
            self.bins += counted
            if not classes:
                return None
            found, per_class = self._classes_of_values(chunk, counted)
        else:
            unique = self._unique_values(chunk, classes, covered)
            if unique is None:
                return None
            found, per_class = unique
        if covered is not None:
            found = np.where(covered, found, np.uint8(self._labels().ignore_index))
        return found, per_class

    def _unique_values(
        self, chunk: np.ndarray, classes: bool, covered: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Count a colour (or other) chunk's codes; with ``classes``, its classes and pixels."""
        codes = mask_codes(chunk)
        if not classes:
            self._count(
                *np.unique(codes if covered is None else codes[covered], return_counts=True)
            )
            return None
        values, inverse, counts = np.unique(codes, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(codes.shape)
        if covered is not None:
            counts = np.bincount(inverse[covered], minlength=len(values))
        self._count(values, counts)
        decoded = self._decoded(values)
        return decoded[inverse], _per_class(decoded, counts)

    def _count(self, values: np.ndarray, pixels: np.ndarray) -> None:
        """Add distinct values and their pixels to the totals (a value of no pixel left out)."""
        for value, count in zip(values.tolist(), pixels.tolist(), strict=True):
            if count:
                self.totals[value] = self.totals.get(value, 0) + count

    def _classes_of_values(
        self, chunk: np.ndarray, counted: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The class of each pixel of a grey chunk, and the chunk's pixels of each class.

        Looked up in the table of every value's class; the pixels per class come from
        the chunk's ``counted`` values.
        """
        labels = self._labels()
        if self._table is None:
            self._table = self._decoded(np.arange(len(counted), dtype=np.int64))
        per_class = _per_class(self._table, counted)
        if self.palette_table is None and labels.is_identity(chunk):  # class indices already
            return chunk, per_class
        if chunk.dtype == np.uint8:
            return cv2.LUT(np.ascontiguousarray(chunk), self._table), per_class  # in C
        return self._table[chunk], per_class

    def _decoded(self, codes: np.ndarray) -> np.ndarray:
        """The class index (uint8) of each of ``codes``: through the palette's table if any."""
        labels = self._labels()
        if self.palette_table is None:
            return labels.decode_codes(codes)
        table = self.palette_table
        inside = codes < len(table)
        return np.where(inside, table[np.where(inside, codes, 0)], labels.ignore_index).astype(
            np.uint8
        )

    def _labels(self) -> LabelMap:
        if self.labels is None:
            raise ValueError("classes asked of a mask counted without labels")
        return self.labels

    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct values (as ``mask_codes``) and their pixels, in increasing order (int64)."""
        if self.bins is not None:
            present = np.flatnonzero(self.bins)
            return present.astype(np.int64), self.bins[present]
        values = np.array(sorted(self.totals), np.int64)
        return values, np.array([self.totals[v] for v in values.tolist()], np.int64)


def _per_class(classes: np.ndarray, pixels: np.ndarray) -> np.ndarray:
    """The pixels of each class index (256), from values' ``classes`` and their ``pixels``."""
    return np.bincount(classes, weights=pixels, minlength=256).astype(np.int64)
