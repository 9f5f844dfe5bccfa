"""Class predictions of a whole validation tile, stitched from its validation grid.

The training layer cannot use ``segscale.inference``'s sliding window, and need not:
the validation grid (``GridPatchDataset``) already cuts each tile into patches that
score every pixel exactly once. Predicting those patches and keeping, for each pixel,
the prediction of the patch that scores it gives the whole-tile prediction that the
validation metrics counted, with no second tiling rule to keep in step with the first.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from segscale.data.sampling.patches import GridPatchDataset

Classify = Callable[[torch.Tensor], torch.Tensor]
"""Images (N×C×P×P, raw pixel values, on the CPU) to class indices (N×P×P)."""


def display_stride(shape: tuple[int, int], max_side: int) -> int:
    """The pixel step that shows a tile of ``shape`` in at most ``max_side`` pixels a side."""
    return max(1, math.ceil(max(shape) / max_side))


def predict_whole_tile(
    classify: Classify, grid: GridPatchDataset, tile: int, stride: int = 1, batch_size: int = 8
) -> np.ndarray:
    """The class of every ``stride``-th pixel of tile ``tile``, as validation predicts it.

    ``classify`` runs on the tile's grid patches, ``batch_size`` at a time; the result is
    ``ceil(H / stride) × ceil(W / stride)`` (uint8): pixel ``(r, c)`` is the class of the
    tile's pixel ``(r·stride, c·stride)`` from the patch that scores it. Only that
    subsampled canvas and one batch's predictions are held at once, so memory stays
    small for large tiles.
    """
    canvas = tile_canvas(grid, tile, stride)
    indices = tile_windows(grid, tile)
    for start in range(0, len(indices), batch_size):
        chunk = indices[start : start + batch_size]
        images = torch.stack([grid[i]["image"] for i in chunk])
        classes = classify(images).cpu().numpy()
        for i, patch in zip(chunk, classes, strict=True):
            paste_window(canvas, grid, i, patch, stride)
    return canvas


def tile_windows(grid: GridPatchDataset, tile: int) -> list[int]:
    """The indices of the grid patches of tile ``tile``."""
    return [i for i, window in enumerate(grid.windows) if window[0] == tile]


def tile_canvas(grid: GridPatchDataset, tile: int, stride: int = 1) -> np.ndarray:
    """Every ``stride``-th pixel of tile ``tile``, all the ignore index (uint8), to paste into."""
    height, width = grid.tiles[tile].shape
    shape = (math.ceil(height / stride), math.ceil(width / stride))
    return np.full(shape, grid.ignore_index, np.uint8)


def paste_window(
    canvas: np.ndarray, grid: GridPatchDataset, index: int, classes: np.ndarray, stride: int = 1
) -> None:
    """Paste the classes (P×P) of grid patch ``index`` where that patch scores its tile."""
    _, y, x, skip_y, skip_x = grid.windows[index]
    _paste(canvas, classes, (y, x), (skip_y, skip_x), stride)


def _paste(
    canvas: np.ndarray,
    patch: np.ndarray,
    origin: tuple[int, int],
    skip: tuple[int, int],
    stride: int,
) -> None:
    """Copy the pixels ``patch`` scores (past its ``skip`` leading rows and columns)."""
    (y, x), size = origin, patch.shape[0]
    first_row, end_row = _canvas_span(y + skip[0], y + size, stride)
    first_col, end_col = _canvas_span(x + skip[1], x + size, stride)
    if first_row < end_row and first_col < end_col:
        canvas[first_row:end_row, first_col:end_col] = patch[
            first_row * stride - y : end_row * stride - y : stride,
            first_col * stride - x : end_col * stride - x : stride,
        ]


def _canvas_span(start: int, stop: int, stride: int) -> tuple[int, int]:
    """Canvas indices ``k`` with ``start <= k·stride < stop``, as ``(first, end)``."""
    return -(-start // stride), -(-stop // stride)
