"""The crop class-ratio cap: ``datamodule.sampling.max_class_ratio``.

mmseg's ``RandomCrop(cat_max_ratio=0.75)`` for aerial imagery: a training patch whose
largest class covers ``max_class_ratio`` or more of its labelled pixels (ignored pixels
do not count) is drawn again, at most ``CLASS_RATIO_TRIES`` times in all, and the last
draw is kept. A patch with no labelled pixel, or with one class only, is drawn again
too, as in mmseg. Each draw is an index-addressed patch of its own
(``RandomPatchDataset``), so which patch comes out stays a pure function of
``(seed, epoch, index)`` on every rank and DataLoader worker.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from segscale.errors import require

MAX_CLASS_RATIO_KEY = "datamodule.sampling.max_class_ratio"
CLASS_RATIO_TRIES = 10
"""Draws of one patch before the last is kept whatever its classes (mmseg's 10)."""


def check_max_class_ratio(value: Any) -> float | None:
    """``max_class_ratio`` checked: ``None`` (off) or a share in (0, 1]."""
    require(value, MAX_CLASS_RATIO_KEY, _is_ratio, "null (off) or a share in (0, 1], e.g. 0.75")
    return None if value is None else float(value)


def _is_ratio(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and 0.0 < value <= 1.0)


def within_class_ratio(mask: np.ndarray, ignore_index: int, max_class_ratio: float) -> bool:
    """Whether ``mask``'s largest class covers less than ``max_class_ratio`` of its labels.

    False for a mask with fewer than two classes (mmseg's rule).
    """
    labels = mask[mask != ignore_index]
    counts = np.bincount(labels.ravel())
    counts = counts[counts > 0]
    return bool(len(counts) > 1 and counts.max() < max_class_ratio * counts.sum())
