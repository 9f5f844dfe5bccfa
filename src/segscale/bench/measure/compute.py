"""The training step on one device: a bare PyTorch loop next to the Lightning run.

Both run the same module (network, normalization, loss), the same optimizer and the same
batch, already in host memory and copied to the device every step as a DataLoader's
would be, so that what differs is the framework alone. The bare loop also clocks the
forward pass (with the loss), the backward pass and the optimizer step separately: the
prediction of multi-device speed needs to know how long the backward pass is, since
DDP hides the gradient all-reduce behind it.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import statistics
import warnings
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from segscale.bench.measure.timing import StepClock, StepTimer, Timing, summarize_steps
from segscale.errors import ConfigError
from segscale.models.module import SegmentationModule
from segscale.platforms.processes import peak_memory_bytes
from segscale.training.reporting.third_party_noise import third_party_noise_filtered

MIXED_PRECISION = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
FULL_PRECISION = ("32-true", "32")


@dataclass(frozen=True)
class StepPlan:
    """How many steps to run: warm-up first, then ``windows`` windows of ``window_steps``."""

    warmup: int = 5
    window_steps: int = 10
    windows: int = 3

    @property
    def total(self) -> int:
        """Steps in all."""
        return self.warmup + self.window_steps * self.windows


@dataclass(frozen=True)
class BareLoopResult:
    """The bare loop's step and its three phases, in seconds."""

    step: Timing
    forward_s: float  # forward pass and loss
    backward_s: float
    optimizer_s: float  # optimizer step and zeroing the gradients
    peak_memory_mb: float
    warmup_s: float  # the warm-up steps together (torch.compile compiles in the first)

    def as_dict(self) -> dict[str, Any]:
        """Plain numbers (for ``bench.json``)."""
        return {
            "step": self.step.as_dict(),
            "forward_s": self.forward_s,
            "backward_s": self.backward_s,
            "optimizer_s": self.optimizer_s,
            "peak_memory_mb": self.peak_memory_mb,
            "warmup_s": self.warmup_s,
        }


def gradient_bytes(module: torch.nn.Module) -> int:
    """Bytes of gradient one step produces: what DDP all-reduces every step."""
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


def parameter_count(module: torch.nn.Module) -> int:
    """Trainable parameters."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast context of ``trainer.precision`` (a no-op for full precision)."""
    if str(precision) in FULL_PRECISION:
        return contextlib.nullcontext()
    if str(precision) not in MIXED_PRECISION:
        raise ConfigError(
            f"trainer.precision={precision!r} cannot be measured by bench.py: expected one "
            f"of {[*FULL_PRECISION[:1], *MIXED_PRECISION]}"
        )
    return torch.autocast(device.type, dtype=MIXED_PRECISION[str(precision)])


def reset_peak_memory(device: torch.device) -> None:
    """Start a fresh peak-memory count (on a GPU; a process's peak RSS cannot be reset)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory: allocated on the GPU since the last reset, or the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_memory_bytes() / 2**20


Phases = tuple[float, float, float]
"""Seconds of one bare step's forward (with the loss), backward and optimizer."""


def forward_loss(
    module: SegmentationModule, batch: dict[str, torch.Tensor], precision: str, device: torch.device
) -> torch.Tensor:
    """The batch copied to the device (as a DataLoader's would be), forward and mean loss."""
    image = batch["image"].to(device, non_blocking=True)
    mask = batch["mask"].to(device, non_blocking=True).long()
    with autocast(precision, device):
        return module.loss_fn(module(image), mask).mean()


def optimizer_and_scaler(
    module: SegmentationModule, precision: str, device: torch.device
) -> tuple[torch.optim.Optimizer, torch.amp.GradScaler]:
    """The module's optimizer, and a gradient scaler that scales only under ``16-mixed``."""
    if module.optimizer_factory is None:  # calling None would raise this TypeError too
        raise TypeError("this module was built with optimizer=None: it cannot train")
    optimizer = module.optimizer_factory(module.network)
    return optimizer, torch.amp.GradScaler(device.type, enabled=str(precision) == "16-mixed")


def apply_gradients(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
    """Step the optimizer through the scaler and clear the gradients."""
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def bare_steps(
    module: SegmentationModule,
    batch: dict[str, torch.Tensor],
    precision: str,
    device: torch.device,
    steps: int,
) -> list[Phases]:
    """Train ``module`` on ``batch`` for ``steps`` steps in plain PyTorch; clock each phase.

    The phases are clocked as the steps run, pipelined as in a real training loop
    (``StepClock``: no synchronization between steps or phases on a GPU).
    """
    module = module.to(device).train()
    optimizer, scaler = optimizer_and_scaler(module, precision, device)
    clock = StepClock(device)
    clock.mark()
    for _ in range(steps):
        loss = forward_loss(module, batch, precision, device)
        clock.mark()
        scaler.scale(loss).backward()
        clock.mark()
        apply_gradients(optimizer, scaler)
        clock.mark()
    seconds = clock.seconds()
    return [(seconds[i], seconds[i + 1], seconds[i + 2]) for i in range(0, len(seconds), 3)]


def bare_result(windows: list[list[Phases]], warmup_s: float, peak_mb: float) -> BareLoopResult:
    """``BareLoopResult`` of timed windows of steps (warm-up steps already left out)."""
    timed = [phases for window in windows for phases in window]
    return BareLoopResult(
        step=summarize_steps([sum(p) for p in timed], 0, len(windows)),
        forward_s=sum(p[0] for p in timed) / len(timed),
        backward_s=sum(p[1] for p in timed) / len(timed),
        optimizer_s=sum(p[2] for p in timed) / len(timed),
        peak_memory_mb=peak_mb,
        warmup_s=warmup_s,
    )


def bare_loop(
    module: SegmentationModule,
    batch: dict[str, torch.Tensor],
    precision: str,
    device: torch.device,
    plan: StepPlan,
) -> BareLoopResult:
    """The bare loop for ``plan.total`` steps in one go (its windows follow each other)."""
    reset_peak_memory(device)
    steps = bare_steps(module, batch, precision, device, plan.total)
    timed = steps[plan.warmup :]
    size = len(timed) // plan.windows
    windows = [timed[i * size : (i + 1) * size] for i in range(plan.windows)]
    warmup_s = sum(sum(p) for p in steps[: plan.warmup])
    return bare_result(windows, warmup_s, peak_memory_mb(device))


class RepeatedBatch(Dataset):
    """One batch, ``length`` times: the Lightning run's data, already in memory."""

    def __init__(self, batch: dict[str, torch.Tensor], length: int) -> None:
        self.batch = batch
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.batch


def lightning_steps(
    module: SegmentationModule,
    batch: dict[str, torch.Tensor],
    trainer_options: dict[str, Any],
    steps: int,
) -> list[float]:
    """Train ``module`` on ``batch`` with a one-device ``Trainer``; each step's seconds.

    ``trainer_options`` are the config's (accelerator, precision, benchmark, logging
    interval); checkpoints, validation, loggers and progress bars are off, as they
    happen between steps and are not what a step costs.
    """
    timer = StepTimer()
    loader = DataLoader(RepeatedBatch(batch, steps), batch_size=None)
    quiet = logging.getLogger("lightning.pytorch")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # not the trainer's start-up lines, once per round
    try:
        with third_party_noise_filtered(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            warnings.filterwarnings("ignore", message=".*no `val_dataloader`.*")
            trainer = L.Trainer(
                **trainer_options,
                devices=1,
                max_steps=steps,
                max_epochs=1,
                limit_val_batches=0,
                num_sanity_val_steps=0,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                callbacks=[timer],
            )
            trainer.fit(module, train_dataloaders=loader)
    finally:
        quiet.setLevel(level)
    return timer.durations


@dataclass(frozen=True)
class Comparison:
    """The bare loop and the Lightning run, measured in alternating rounds."""

    bare: BareLoopResult
    lightning: Timing
    ratio: float  # median over rounds of Lightning's mean step / the bare loop's
    peak_memory_mb: float  # the larger of the two


def framework_comparison(
    module: SegmentationModule,
    batch: dict[str, torch.Tensor],
    trainer_options: dict[str, Any],
    device: torch.device,
    plan: StepPlan,
) -> Comparison:
    """The bare loop and the Lightning run in ``plan.windows`` alternating rounds.

    Each round trains a fresh copy of ``module`` with each, ``plan.warmup`` untimed steps
    then ``plan.window_steps`` timed ones. Alternating keeps a slow spell of a shared
    machine from landing on one side only; the ratio is the median of the rounds'.
    """
    bare_rounds: list[list[Phases]] = []
    lightning_rounds: list[list[float]] = []
    steps = plan.warmup + plan.window_steps
    precision = trainer_options["precision"]
    reset_peak_memory(device)
    for _ in range(plan.windows):
        bare_rounds.append(bare_steps(copy.deepcopy(module), batch, precision, device, steps))
        lightning_rounds.append(
            lightning_steps(copy.deepcopy(module), batch, trainer_options, steps)
        )
    ratios = [
        statistics.fmean(light[plan.warmup :])
        / statistics.fmean(sum(p) for p in bare[plan.warmup :])
        for light, bare in zip(lightning_rounds, bare_rounds, strict=True)
    ]
    peak = peak_memory_mb(device)
    timed = [d for durations in lightning_rounds for d in durations[plan.warmup :]]
    return Comparison(
        bare=bare_result(
            [round_steps[plan.warmup :] for round_steps in bare_rounds],
            sum(sum(p) for p in bare_rounds[0][: plan.warmup]),
            peak,
        ),
        lightning=summarize_steps(timed, 0, plan.windows),
        ratio=statistics.median(ratios),
        peak_memory_mb=peak,
    )
