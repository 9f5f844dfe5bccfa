"""Bin counts of 8- and 16-bit pixels, exact, counted by OpenCV outside Python's lock.

The validation pass counts every pixel of a dataset once: each image channel's values
(``segscale.data.checks.value_range``) and each mask's values
(``segscale.data.checks.mask_counts``).
NumPy's ``bincount`` of a strided channel copies it first and holds the GIL, so threads
reading other files wait for it; OpenCV's ``calcHist`` reads the channel in place, some
8× faster for 8-bit pixels, and releases the GIL. Its counts are float32, exact up to
``EXACT_COUNT``: larger arrays are counted in bands of rows below it.
"""

from __future__ import annotations

import cv2
import numpy as np

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
