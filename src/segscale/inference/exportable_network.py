"""A network with its input normalisation, as one module that the exporters trace.

It takes images as the user has them (raw pixel values, N×C×H×W) and returns class
scores (N×K×H×W float32 logits) or the mask (N×H×W int64, their argmax).
"""

from __future__ import annotations

import torch
from torch import nn

RETURNS = ("scores", "mask")
"""What the exported network returns: class logits, or class indices (their argmax)."""


class ExportableNetwork(nn.Module):
    """A network with its input normalisation: raw pixel values in, scores or mask out.

    The same arithmetic as ``SegmentationModule.forward`` (to float32, minus ``mean``,
    over ``std``, both in raw pixel values), as a plain module that exporters trace.
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(
        self, network: nn.Module, mean: torch.Tensor, std: torch.Tensor, returns: str
    ) -> None:
        super().__init__()
        self.network = network
        self.returns_mask = returns == "mask"
        self.register_buffer("mean", mean.detach().to(torch.float32).clone())
        self.register_buffer("std", std.detach().to(torch.float32).clone())

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """Class logits (N×K×H×W float32) or class indices (N×H×W int64) of raw images."""
        scores = self.network((image.to(torch.float32) - self.mean) / self.std)
        return scores.argmax(1) if self.returns_mask else scores
