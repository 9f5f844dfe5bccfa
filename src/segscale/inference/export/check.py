"""The check of an exported file against the network it came from, in PyTorch.

Before a file is moved into place it is run (onnxruntime, or ``torch.jit.load``) on
random images of two sizes and compared with PyTorch, so a file that does not compute
what the checkpoint computes, or that fixed a size it should not have, is never left
behind.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from segscale.inference.export.formats import DTYPES, ExportSettings, load_exported

TOLERANCE = 1e-4
"""Largest difference from PyTorch allowed, relative to the largest score (at least 1)."""


class ExportMismatchError(RuntimeError):
    """The exported file does not compute what the checkpoint's network computes."""


def random_image(
    dtype: str, max_value: float, shape: tuple[int, ...], seed: int = 0
) -> torch.Tensor:
    """Random raw pixel values (0 to ``max_value``) of the pixel type ``dtype``."""
    generator = torch.Generator().manual_seed(seed)
    if dtype == "float32":
        return torch.rand(shape, generator=generator) * max_value
    top = int(min(DTYPES[dtype][1], max_value))
    # randint has no uint16 kernel: draw in int32, then convert.
    values = torch.randint(0, top + 1, shape, generator=generator, dtype=torch.int32)
    return values.to(DTYPES[dtype][0])


def check_exported(
    path: Path, settings: ExportSettings, reference: nn.Module, images: list[torch.Tensor]
) -> float:
    """Largest difference between the file at ``path`` and PyTorch on ``images``.

    ``reference`` returns scores (``exportable(trained, "scores")``). Scores must agree
    within ``TOLERANCE`` (relative to the largest, at least 1); a mask may differ only
    where the two best scores are that close (a tie either side may break). Raises
    ``ExportMismatchError`` otherwise.
    """
    run = load_exported(path, settings.format)
    worst = 0.0
    for image in images:
        with torch.no_grad():
            scores = reference(image).numpy()
        got = run(image.numpy())
        worst = max(worst, _difference(scores, got, settings.returns, tuple(image.shape)))
    return worst


def _difference(scores: np.ndarray, got: np.ndarray, returns: str, shape: tuple[int, ...]) -> float:
    """|exported − PyTorch| at worst; ``ExportMismatchError`` past the tolerance."""
    tolerance = TOLERANCE * max(1.0, float(np.abs(scores).max()))
    size = "×".join(map(str, shape))
    if returns == "scores":
        if got.shape != scores.shape:
            raise ExportMismatchError(
                f"on a {size} input the file returned {got.shape}, expected {scores.shape}"
            )
        difference = float(np.abs(got - scores).max())
    else:
        if got.shape != scores.shape[:1] + scores.shape[2:]:
            raise ExportMismatchError(f"on a {size} input the file returned {got.shape}")
        best = scores.max(axis=1)
        chosen = np.take_along_axis(scores, got[:, None].astype(np.int64), axis=1)[:, 0]
        difference = float((best - chosen).max())
    if difference > tolerance:
        raise ExportMismatchError(
            f"the exported file differs from PyTorch by {difference:.3g} on a {size} input "
            f"(allowed {tolerance:.3g})"
        )
    return difference
