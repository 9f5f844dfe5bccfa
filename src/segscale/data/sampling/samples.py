"""A patch as the DataLoader collates it: image, mask, key, and the tile it left out if any."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from segscale.data.storage.rasters import UnreadableWindowError

LEFT_OUT = "left_out"
"""A sample's field: the file of a tile it left out (``skip_unreadable``), or ``""``."""
LEFT_OUT_REASON = "left_out_reason"
"""A sample's field: why that file was left out (what could not be read), or ``""``."""


def as_sample(
    image: np.ndarray,
    mask: np.ndarray,
    key: tuple[int, ...],
    left_out: UnreadableWindowError | None = None,
) -> dict[str, Any]:
    """A sample as the DataLoader collates it: tensors, and the tile it left out if any.

    The left-out tile travels with the sample because a DataLoader worker's own record
    of it never reaches the training process, which lists it in ``summary.json``
    (``LeftOutTiles``); two strings a sample, empty almost always.
    """
    # Images and masks stay in their file's types (uint8 masks, uint8/uint16 images) on
    # their way through the DataLoader: 4× (images) and 8× (masks) less to copy between
    # processes than float32 and int64. The LightningModule converts them on the device.
    return {
        "image": torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))),
        "mask": torch.from_numpy(np.ascontiguousarray(mask)),
        "key": torch.tensor(key, dtype=torch.long),
        LEFT_OUT: "" if left_out is None else str(left_out.path),
        LEFT_OUT_REASON: "" if left_out is None else str(left_out),
    }
