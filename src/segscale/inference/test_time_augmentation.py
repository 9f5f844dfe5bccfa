"""Test-time augmentation of a batch of tiles: flips, the 8 symmetries of the square, scales.

Each view of the batch (a transform at a scale) goes through the network; its softmax is
mapped back onto the tile (the inverse transform, then a resize to the tile's size) and
the views' probabilities are averaged, as mmsegmentation's ``--tta`` and nnU-Net's
mirroring average them. Work is per batch of tiles, so memory does not grow with the
image. Tiles are square (``SlidingWindow`` pads them to ``tile_size × tile_size``), so a
quarter turn of a tile is a tile of the same shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from segscale.errors import ConfigError

Softmax = Callable[[torch.Tensor], torch.Tensor]
"""Float32 ``N×C×h×w`` tiles → class probabilities ``N×K×h×w``."""

Transform = tuple[int, int | None]
"""A symmetry of the square: ``(quarter turns, then the dimension flipped or None)``."""

TRANSFORMS: dict[str, tuple[Transform, ...]] = {
    "none": ((0, None),),
    # The original and its left-right mirror, as mmseg's flip: street scenes have an up.
    "hflip": ((0, None), (0, -1)),
    # The original, left-right and up-down: segscale's flip_tta of before, op for op.
    "flip": ((0, None), (0, -1), (0, -2)),
    # D4: the 4 rotations, each also mirrored. Aerial images have no "up".
    "d4": tuple((turns, flip) for turns in range(4) for flip in (None, -1)),
}
"""``inference.tta`` → the views it averages."""

MAX_SCALE = 4.0
"""Largest ``inference.tta_scales`` entry: a tile upsampled 4× already holds 16× its pixels."""


def check_tta(tta: object, scales: object) -> tuple[float, ...]:
    """Raise ``ConfigError`` naming the key unless both are valid; return the scales as floats.

    ``tta``: a name of ``TRANSFORMS``. ``scales``: a non-empty list of numbers in
    ``(0, MAX_SCALE]``.
    """
    if not isinstance(tta, str) or tta not in TRANSFORMS:
        raise ConfigError(
            f"inference.tta={tta!r} is not allowed: expected one of {tuple(TRANSFORMS)}"
        )
    expected = f"a non-empty list of numbers in (0, {MAX_SCALE:g}], such as [0.75, 1, 1.25]"
    if isinstance(scales, (str, bytes)) or not isinstance(scales, Sequence) or not scales:
        raise ConfigError(f"inference.tta_scales={scales!r} is not allowed: expected {expected}")
    for scale in scales:
        if not _is_scale(scale):
            raise ConfigError(
                f"inference.tta_scales={list(scales)!r} is not allowed: {scale!r} is not a "
                f"number in (0, {MAX_SCALE:g}]; expected {expected}"
            )
    return tuple(float(scale) for scale in scales)


def _is_scale(value: object) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    return math.isfinite(value) and 0 < value <= MAX_SCALE


def augmented_probabilities(
    softmax: Softmax,
    batch: torch.Tensor,
    tta: str,
    scales: Sequence[float],
    multiple: int = 1,
) -> torch.Tensor:
    """Mean class probabilities of every view of ``batch`` (``N×C×s×s``), on its pixels.

    Each scale resizes the batch (bilinear) to ``round(s × scale)`` pixels a side,
    padded by reflection up to a multiple of ``multiple`` (what the network's input
    sides must be a multiple of); the probabilities are cropped and resized back to
    ``s``. Within a scale each transform of ``TRANSFORMS[tta]`` is applied, the network
    run, and its inverse applied to the probabilities.
    """
    side = batch.shape[-1]
    total: torch.Tensor | None = None
    for scale in scales:
        size = max(1, round(side * scale))
        scaled = _padded_to_multiple(_resized(batch, size), multiple)
        for turns, flip in TRANSFORMS[tta]:
            view = softmax(_forward(scaled, turns, flip))
            probabilities = _resized(_inverse(view, turns, flip)[..., :size, :size], side)
            total = probabilities if total is None else total + probabilities
    assert total is not None  # scales and transforms are never empty (check_tta)
    return total / (len(scales) * len(TRANSFORMS[tta]))


def _padded_to_multiple(batch: torch.Tensor, multiple: int) -> torch.Tensor:
    """Pad ``N×C×s×s`` at the right and bottom to a side that is a multiple of ``multiple``."""
    extra = -batch.shape[-1] % multiple
    # Edge replication: the padding is narrower than the network's stride, and unlike
    # reflection it needs no minimum side.
    return F.pad(batch, (0, extra, 0, extra), mode="replicate") if extra else batch


def _forward(batch: torch.Tensor, turns: int, flip: int | None) -> torch.Tensor:
    batch = torch.rot90(batch, turns, dims=(-2, -1)) if turns else batch
    return batch if flip is None else batch.flip(flip)


def _inverse(batch: torch.Tensor, turns: int, flip: int | None) -> torch.Tensor:
    batch = batch if flip is None else batch.flip(flip)
    return torch.rot90(batch, -turns, dims=(-2, -1)) if turns else batch


def _resized(batch: torch.Tensor, size: int) -> torch.Tensor:
    if batch.shape[-1] == size:
        return batch
    return F.interpolate(batch, size=(size, size), mode="bilinear", align_corners=False)
