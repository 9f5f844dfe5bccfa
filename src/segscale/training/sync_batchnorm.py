"""Batch norm whose statistics cover the global batch of all ranks.

Segmentation batches per device are small (a few large patches), so per-device batch
statistics are noisy; synchronizing them makes N devices × b behave like one device
× N·b. The cost is one small all-reduce per batch-norm layer in each forward pass.
PyTorch's ``SyncBatchNorm`` runs on GPUs only; ``CPUSyncBatchNorm`` does the same on
CPUs (gloo), which is how the test suite proves DDP equivalence. It costs two small
all-reduces per layer (mean, then variance) where PyTorch's GPU version needs one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn


class CPUSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """``SyncBatchNorm`` for any device: mean and variance over every rank's batch.

    Sums and squared sums are all-reduced with an autograd-aware ``all_reduce``, so
    gradients flow through the global statistics exactly as in one process with the
    whole batch. Outside training, or in a single process, it is plain batch norm.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input, got {input.dim()}D")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize with statistics gathered from all ranks (while training)."""
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if not (self.training and distributed):
            return super().forward(input)
        self._check_input_dim(input)
        channels = input.size(1)
        dims = [0, *range(2, input.dim())]
        count = torch.full((1,), input.numel() / channels, dtype=input.dtype, device=input.device)
        sums = dist_fn.all_reduce(torch.cat([input.sum(dims), count]))
        total = sums[-1]
        mean = sums[:channels] / total
        # Two passes (mean, then squared deviations) instead of E[x²] - mean², which
        # loses float32 precision when the mean is large against the spread.
        shape = [1, channels] + [1] * (input.dim() - 2)
        centred = input - mean.view(shape)
        var = dist_fn.all_reduce((centred * centred).sum(dims)) / total
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), total.detach())
        output = centred * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            output = output * self.weight.view(shape) + self.bias.view(shape)
        return output

    @torch.no_grad()
    def _update_running_stats(
        self, mean: torch.Tensor, var: torch.Tensor, total: torch.Tensor
    ) -> None:
        self.num_batches_tracked += 1
        factor = (
            self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        )
        unbiased = var * total / (total - 1).clamp(min=1)
        self.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
        self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)


def convert_sync_batchnorm(module: nn.Module, accelerator: str) -> nn.Module:
    """Replace every batch-norm layer by its synchronized form for ``accelerator``."""
    if accelerator != "cpu":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
        module, CPUSyncBatchNorm
    ):
        synced = CPUSyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
        )
        synced.load_state_dict(module.state_dict())
        synced.train(module.training)
        return synced
    for name, child in module.named_children():
        setattr(module, name, convert_sync_batchnorm(child, accelerator))
    return module
