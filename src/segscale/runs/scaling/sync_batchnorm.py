"""Batch norm whose statistics cover the global batch of all ranks, on every device.

Segmentation batches per device are small (a few large patches), so per-device batch
statistics are noisy; synchronizing them makes N devices × b behave like one device
× N·b. ``GlobalBatchNorm`` does it with one all-reduce per layer in the forward pass
and one in the backward pass, and never makes the host wait for the device. It
replaces PyTorch's ``nn.SyncBatchNorm`` on GPUs too: that one gathers every rank's
statistics and drops those of empty ranks with boolean masks, three host syncs per
layer and step (docs/architecture.md, "No avoidable host syncs"), and it does not run
on CPUs at all, where the test suite proves DDP equivalence with this layer.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist
from timm.layers import BatchNormAct2d, SyncBatchNormAct
from torch import nn

from segscale.errors import ConfigError


class GlobalBatchNorm(nn.modules.batchnorm._BatchNorm):
    """Batch norm with the mean and variance of every rank's batch, for any device.

    Each rank computes its count ``n`` (from the shape), mean ``m`` and sum of squared
    deviations ``M2`` (about the local mean, numerically safe, in at least float32), and
    one all-reduce sums ``[n·m, M2 + n·m², n]`` in float64 over the ranks. The global
    mean and variance follow; the cancellation in ``Σ(M2 + n·m²) - N·mean²`` happens in
    float64 on per-channel numbers, so it costs nothing in accuracy. The backward pass
    has one all-reduce too, and gradients flow through the global statistics exactly as
    in one process with the whole batch. A rank with no samples contributes zeros;
    nothing is masked and nothing is read on the host.

    The layer is ``_GlobalNorm``, on PyTorch's fused batch-norm kernels, for inputs of
    every floating type: half-precision ones (mixed precision) with float32 statistics
    and an output in their own type, as ``nn.SyncBatchNorm`` gives them. Outside
    training, or in a single process, it is plain batch norm.
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
        weight = self.weight if self.affine else None
        bias = self.bias if self.affine else None
        output, mean, unbiased_var = _GlobalNorm.apply(input, weight, bias, self.eps)
        if self.track_running_stats:
            self._update_running_stats(mean, unbiased_var)
        return output

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, unbiased_var: torch.Tensor) -> None:
        if self.running_mean is None or self.running_var is None:
            return
        tracked = self.num_batches_tracked
        # _BatchNorm registers it with running_mean and running_var (track_running_stats).
        assert tracked is not None
        tracked.add_(1)
        # momentum None: the cumulative average, 1/n read on the device rather than the host.
        factor = (
            self.momentum
            if self.momentum is not None
            else 1.0 / tracked.to(self.running_mean.dtype)
        )
        self.running_mean.mul_(1 - factor).add_(factor * mean.to(self.running_mean.dtype))
        self.running_var.mul_(1 - factor).add_(factor * unbiased_var.to(self.running_var.dtype))


def _global_sums(local: list[torch.Tensor]) -> torch.Tensor:
    """``local`` concatenated in float64 and summed over the ranks (in place, one all-reduce)."""
    sums = torch.cat([part.to(torch.float64) for part in local])
    dist.all_reduce(sums)
    return sums


class _GlobalNorm(torch.autograd.Function):
    """Batch norm over every rank's batch, forward and backward by PyTorch's fused kernels.

    Autograd over the same arithmetic (segscale's earlier half-precision path) is 5×
    a plain batch-norm layer on a CPU: every elementwise op of the statistics and of
    their gradient is its own pass over the activations. Here the local statistics come
    from ``batch_norm_update_stats``, the output from ``batch_norm`` with the global
    statistics, the local gradient sums from ``native_batch_norm_backward`` (weight and
    bias gradients only), and the input gradient from two fused multiply-adds: the
    formula of batch norm's backward pass with the sums taken over every rank (one
    all-reduce, as ``nn.SyncBatchNorm`` does).

    Half-precision inputs (mixed precision) get statistics, and the input gradient's
    arithmetic, in float32; the output and the input gradient are in the input's type.
    """

    @staticmethod
    def forward(
        ctx: Any,
        input: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Output, global mean and unbiased variance (the last two for the running stats)."""
        channels = input.size(1)
        count = input.numel() // channels
        stats_dtype = torch.promote_types(input.dtype, torch.float32)
        if count:
            # For half-precision input, running buffers in the statistics' type (left as
            # they are: momentum 0) make the kernel return float32 statistics (on a CPU it
            # returns the input's type without them); float32 and float64 need none.
            scratch = None
            if input.dtype != stats_dtype:
                scratch = input.new_zeros(2, channels, dtype=stats_dtype)
            local_mean, local_var = torch.batch_norm_update_stats(
                input,
                None if scratch is None else scratch[0],
                None if scratch is None else scratch[1],
                0.0,
            )
        else:  # a rank with no samples adds nothing
            local_mean = local_var = input.new_zeros(channels, dtype=stats_dtype)
        mean64 = local_mean.to(torch.float64)
        local = [mean64 * count, local_var.to(torch.float64) * count + mean64 * mean64 * count]
        sums = _global_sums([*local, mean64.new_full((1,), float(count))])
        total = sums[-1:].clamp(min=1)  # every rank empty: zeros, not NaN
        mean = sums[:channels] / total
        m2 = (sums[channels:-1] - mean * mean * total).clamp(min=0)
        mean_t, var_t = mean.to(stats_dtype), (m2 / total).to(stats_dtype)
        # The kernels take parameters in the statistics' type (bf16-true has bf16 weights).
        w, b = (None if t is None else t.to(stats_dtype) for t in (weight, bias))
        output = torch.batch_norm(input, w, b, mean_t, var_t, False, 0.0, eps, False)
        invstd = torch.rsqrt(var_t + eps)
        ctx.save_for_backward(input, weight, mean_t, invstd, total)
        ctx.mark_non_differentiable(mean_t)
        unbiased = (m2 / (total - 1).clamp(min=1)).to(stats_dtype)
        ctx.mark_non_differentiable(unbiased)
        return output, mean_t, unbiased

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor, *_: Any) -> tuple[torch.Tensor | None, ...]:
        """Input gradient from the global sums; weight and bias gradients from the local."""
        input, weight, mean, invstd, total = ctx.saved_tensors
        grad_output = grad_output.contiguous(memory_format=_memory_format(input))
        if input.numel():
            # A weight of ones when there is none: the weight gradient does not depend on
            # it, and CUDA's kernel needs one to size its outputs.
            ones = torch.ones_like(mean) if weight is None else weight.to(mean.dtype)
            _, grad_weight, grad_bias = torch.ops.aten.native_batch_norm_backward(
                grad_output, input, ones, None, None, mean, invstd, True, 0.0, [False, True, True]
            )
        else:
            grad_weight = grad_bias = mean.new_zeros(mean.shape)
        # native_batch_norm_backward: grad_weight = Σ dy (x - mean) · invstd, grad_bias = Σ dy
        sum_dy, sum_dy_xmu = grad_bias, grad_weight / invstd
        sums = _global_sums([sum_dy, sum_dy_xmu])
        channels = input.size(1)
        mean_dy = (sums[:channels] / total).to(mean.dtype)
        mean_dy_xmu = (sums[channels:] / total).to(mean.dtype)
        scale = invstd if weight is None else weight.to(mean.dtype) * invstd
        # dx = scale · (dy - mean_dy - (x - mean) · invstd² · mean_dy_xmu)
        x_coefficient = -scale * invstd * invstd * mean_dy_xmu
        constant = -scale * mean_dy - x_coefficient * mean
        shape = [1, channels] + [1] * (input.dim() - 2)
        # In the statistics' type (float32 for half-precision input, where the two terms
        # in x nearly cancel), then in the input's.
        grad_input = torch.addcmul(constant.view(shape), grad_output, scale.view(shape))
        grad_input.addcmul_(input, x_coefficient.view(shape))
        needs = ctx.needs_input_grad
        return (
            grad_input.to(input.dtype) if needs[0] else None,
            grad_weight.to(weight.dtype) if weight is not None and needs[1] else None,
            grad_bias.to(weight.dtype) if weight is not None and needs[2] else None,
            None,
        )


def _memory_format(tensor: torch.Tensor) -> torch.memory_format:
    """channels_last for a 4D tensor stored so, else contiguous."""
    if tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


class GlobalBatchNormAct(GlobalBatchNorm):
    """``GlobalBatchNorm`` followed by a dropout and an activation: timm's norm-act layer.

    timm's ``BatchNormAct2d`` (the norm of its EfficientNets, MobileNets, LCNets, …, so
    of smp's ``tu-`` encoders) is a ``BatchNorm2d`` whose forward also applies ``drop``
    and ``act``; replacing it by plain batch norm would drop the activation. The two
    children have no parameters or buffers, so the state dict keeps its keys.
    """

    def __init__(self, *args: Any, drop: nn.Module, act: nn.Module, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.drop = drop
        self.act = act

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize with the global statistics, then the layer's dropout and activation."""
        return self.act(self.drop(super().forward(input)))


PLAIN_FORWARDS = (nn.modules.batchnorm._BatchNorm.forward, nn.SyncBatchNorm.forward)
"""The forwards of PyTorch's batch-norm layers: normalization and nothing else."""

NORM_ACT_FORWARDS = (BatchNormAct2d.forward, SyncBatchNormAct.forward)
"""The forwards of timm's batch norms with a dropout and an activation after them."""


def convert_sync_batchnorm(module: nn.Module, path: str = "") -> nn.Module:
    """Replace every batch-norm layer of ``module`` by a ``GlobalBatchNorm``.

    Weights, running statistics (the same tensors, on their device and in their type),
    momentum and mode are kept. Every accelerator gets the same layer. timm's norm-act
    layers keep their dropout and activation (``GlobalBatchNormAct``). A batch-norm
    subclass whose forward does anything else is refused (``ConfigError`` naming the
    layer and ``training.sync_batchnorm``): replaced, it would train a different network
    than it was built as.
    """
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
        module, GlobalBatchNorm
    ):
        return _synced(module, path or "the network")
    for name, child in module.named_children():
        setattr(module, name, convert_sync_batchnorm(child, f"{path}.{name}" if path else name))
    return module


def _synced(module: nn.modules.batchnorm._BatchNorm, path: str) -> GlobalBatchNorm:
    """``module`` as a ``GlobalBatchNorm`` (or ``GlobalBatchNormAct``) on its own tensors."""
    args = (module.num_features, module.eps, module.momentum, module.affine)
    # device="meta": the new layer's tensors are replaced by the layer's own below.
    kwargs: dict[str, Any] = {"track_running_stats": module.track_running_stats, "device": "meta"}
    if type(module).forward in NORM_ACT_FORWARDS:
        # cast: timm sets both in __init__; mypy reads them as Module | Tensor attributes
        drop = cast(nn.Module, module.drop)
        act = cast(nn.Module, module.act)
        synced: GlobalBatchNorm = GlobalBatchNormAct(*args, drop=drop, act=act, **kwargs)
    elif type(module).forward in PLAIN_FORWARDS:
        synced = GlobalBatchNorm(*args, **kwargs)
    else:
        raise ConfigError(
            f"training.sync_batchnorm cannot synchronize {path} "
            f"({type(module).__module__}.{type(module).__qualname__}): a batch-norm layer "
            "whose forward does more than batch norm; set training.sync_batchnorm=false"
        )
    for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
        setattr(synced, name, getattr(module, name))
    if hasattr(module, "qconfig"):
        synced.qconfig = module.qconfig
    synced.train(module.training)
    return synced
