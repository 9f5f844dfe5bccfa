"""Optimizers (MATLAB's solvers) and learning-rate schedules with warmup."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from segscale.errors import ConfigError

SOLVERS: dict[str, type[torch.optim.Optimizer]] = {
    "sgdm": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "rmsprop": torch.optim.RMSprop,
}
_NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)


PART_GROUPS = (("decoder", True), ("decoder", False), ("encoder", True), ("encoder", False))
"""The parameter groups under an encoder learning-rate factor, in order: (part, decayed)."""


def build_optimizer(
    network: nn.Module,
    solver: str = "sgdm",
    lr: float = 0.01,
    weight_decay: float = 0.0,
    decay_norm_and_bias: bool = True,
    encoder_lr_factor: float = 1.0,
    **solver_kwargs: Any,
) -> torch.optim.Optimizer:
    """The optimizer named by ``solver`` over ``network``'s parameters.

    ``weight_decay`` is MATLAB's ``L2Regularization``. With ``decay_norm_and_bias``
    false, biases and the weights of normalization layers are not decayed (a common
    choice for segmentation networks); MATLAB decays every learnable parameter.

    ``encoder_lr_factor`` is MATLAB's ``LearnRateFactor`` of the encoder
    (``training.encoder_lr_factor``): the encoder's parameters learn at
    ``lr × encoder_lr_factor``, the rest of the network (decoder and head) at ``lr``.
    Other than 1, the parameter groups are split by part (``PART_GROUPS``), each with its
    own ``lr``, its ``lr_factor`` and a ``name`` (the learning-rate monitor's key);
    the first group is always the decoder's, at ``lr``. A schedule multiplies every
    group's rate alike. At 1 the groups are those of a network without parts, as they
    always were (a checkpoint's optimizer state keeps fitting).
    """
    if solver not in SOLVERS:
        raise ConfigError(
            f"optimizer.solver={solver!r} is unknown: expected one of {list(SOLVERS)}"
        )
    encoder: set[int] = set()
    if encoder_lr_factor != 1:
        parts = encoder_of(network, "training.encoder_lr_factor", encoder_lr_factor)
        encoder = {id(parameter) for parameter in parts.parameters()}
    # (part, decayed) -> parameters, in network order; the decoder's decayed group first.
    split: dict[tuple[str, bool], list[nn.Parameter]] = {key: [] for key in PART_GROUPS}
    for module in network.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if not parameter.requires_grad:
                continue
            is_norm = isinstance(module, _NORM_LAYERS)
            decayed = decay_norm_and_bias or not (is_norm or name == "bias")
            part = "encoder" if id(parameter) in encoder else "decoder"
            split[part, decayed].append(parameter)
    groups: list[dict[str, Any]] = []
    for (part, decayed), parameters in split.items():
        if not parameters and groups:  # the first group stays, empty or not
            continue
        group: dict[str, Any] = {
            "params": parameters,
            "weight_decay": weight_decay if decayed else 0.0,
        }
        if encoder:
            factor = encoder_lr_factor if part == "encoder" else 1.0
            group |= {
                "lr": lr * factor,
                "lr_factor": factor,
                "name": part if decayed else f"{part}_no_decay",
            }
        groups.append(group)
    # Each solver's constructor takes lr (Optimizer's own, typed here, takes defaults).
    optimizer: Callable[..., torch.optim.Optimizer] = SOLVERS[solver]
    if solver_kwargs.get("fused") and "fused" not in inspect.signature(optimizer).parameters:
        raise ConfigError(
            f"optimizer.fused=true: optimizer.solver={solver!r} has no fused implementation "
            f"in torch ({optimizer.__name__}); sgdm, adam and adamw have one"
        )
    return optimizer(groups, lr=lr, **solver_kwargs)


def encoder_of(network: nn.Module, key: str, value: Any) -> nn.Module:
    """``network.encoder``, which the setting ``key`` (set to ``value``) acts on.

    segmentation_models_pytorch networks have one; a network without one cannot have
    its encoder trained differently, so ``ConfigError`` names the key.
    """
    encoder = getattr(network, "encoder", None)
    if not isinstance(encoder, nn.Module):
        raise ConfigError(
            f"{key}={value!r} needs a network with an encoder (network.encoder, as "
            f"segmentation_models_pytorch networks have), but {type(network).__name__} "
            "has none: leave the key at its default"
        )
    return encoder


class Schedule:
    """A learning-rate multiplier per optimizer step: warmup × the named schedule.

    ``none`` keeps the rate; ``piecewise`` multiplies it by ``drop_factor`` every
    ``drop_period`` epochs (MATLAB's ``LearnRateSchedule='piecewise'``); ``poly`` decays
    it as ``(1 - t)^power`` and ``cosine`` as ``(1 + cos(πt)) / 2`` over training
    progress ``t``, both down to ``min_factor``. Warmup ramps the rate linearly from
    ``warmup_start_factor`` over ``warmup_epochs`` epochs or ``warmup_steps`` steps
    (whichever is set) and composes with any schedule.
    """

    def __init__(
        self,
        name: str = "none",
        drop_period: int = 10,
        drop_factor: float = 0.1,
        power: float = 0.9,
        min_factor: float = 0.0,
        warmup_epochs: float = 0,
        warmup_steps: int = 0,
        warmup_start_factor: float = 0.0,
    ) -> None:
        # Each value's kind and range is the schema's (segscale.config_schema).
        if warmup_epochs and warmup_steps:
            raise ConfigError("set scheduler.warmup_epochs or scheduler.warmup_steps, not both")
        self.name = name
        self.drop_period = drop_period
        self.drop_factor = drop_factor
        self.power = power
        self.min_factor = min_factor
        self.warmup_epochs = warmup_epochs
        self.warmup_steps = warmup_steps
        self.warmup_start_factor = warmup_start_factor

    def factor(self, step: int, steps_per_epoch: int, total_steps: int) -> float:
        """Multiplier of the initial learning rate at optimizer step ``step`` (from 0)."""
        return self._warmup(step, steps_per_epoch) * self._decay(step, steps_per_epoch, total_steps)

    def _warmup(self, step: int, steps_per_epoch: int) -> float:
        length = self.warmup_steps or self.warmup_epochs * steps_per_epoch
        if step >= length:
            return 1.0
        return self.warmup_start_factor + (1 - self.warmup_start_factor) * step / length

    def _decay(self, step: int, steps_per_epoch: int, total_steps: int) -> float:
        if self.name == "piecewise":
            return self.drop_factor ** (step // (steps_per_epoch * self.drop_period))
        progress = min(step / max(total_steps, 1), 1.0)
        if self.name == "poly":
            shape = (1 - progress) ** self.power
        elif self.name == "cosine":
            shape = (1 + math.cos(math.pi * progress)) / 2
        else:
            return 1.0
        return self.min_factor + (1 - self.min_factor) * shape


def lr_scheduler(
    optimizer: torch.optim.Optimizer, schedule: Schedule, steps_per_epoch: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step ``LambdaLR`` that follows ``schedule``."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: schedule.factor(step, steps_per_epoch, total_steps)
    )


def clip_gradients(parameters: list[nn.Parameter], threshold: float, method: str) -> None:
    """Clip gradients in place as MATLAB's ``GradientThreshold``/``GradientThresholdMethod``.

    ``l2norm`` rescales each parameter's gradient whose L2 norm exceeds ``threshold``;
    ``global-l2norm`` rescales all gradients together when their joint L2 norm does;
    ``absolute-value`` clamps every gradient element to ``[-threshold, threshold]``.
    The norms never leave the device: each gradient is multiplied by
    ``min(1, threshold / norm)`` rather than compared on the host (docs/architecture.md,
    "No avoidable host syncs"), with PyTorch's multi-tensor (foreach) kernels where the
    device has them.
    """
    if math.isinf(threshold):
        return
    with_grad = [p for p in parameters if p.grad is not None]
    if not with_grad:
        return
    if method == "global-l2norm":
        torch.nn.utils.clip_grad_norm_(with_grad, threshold)
    elif method == "l2norm":
        _clip_each_norm([p.grad for p in with_grad if p.grad is not None], threshold)
    else:
        torch.nn.utils.clip_grad_value_(with_grad, threshold)


@torch.no_grad()
def _clip_each_norm(gradients: list[torch.Tensor], threshold: float) -> None:
    """Scale every gradient whose L2 norm exceeds ``threshold`` down to that norm."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for gradient in gradients:
        groups.setdefault((gradient.device, gradient.dtype), []).append(gradient)
    for group in groups.values():
        norms = torch.stack(torch._foreach_norm(group))
        # A zero norm gives threshold/0 = inf, clamped to 1: the gradient stays as it is.
        factors = (threshold / norms).clamp_(max=1.0)
        torch._foreach_mul_(group, list(factors.unbind()))
