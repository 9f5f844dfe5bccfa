"""The framework's fixed cost per training step, in milliseconds.

Measured on a network that computes next to nothing (a 1×1 convolution on two 16×16
patches), so that a cost of a millisecond stands out, where in a real CPU step of half a
second it would drown in the noise. The same module (the config's loss, metrics logging,
optimizer and schedule, around the tiny network) trains on the same batch two ways, in
alternating rounds in one process:

- the bare PyTorch loop: copy the batch to the device, forward and loss, backward,
  optimizer step, zero the gradients;
- Lightning as ``train.py`` runs it: the trainer of the ``trainer`` group with every
  callback of the ``callbacks`` group (progress bar included), the run summary and the
  ``logger`` group's loggers, writing into a temporary folder; validation off.

The overhead is the median over rounds of the difference of their mean steps: the hooks,
the logging (``self.log``, loggers, progress bar), the learning-rate schedule, the
module's checks (non-finite loss and gradients) and the DataLoader, everything
``train.py`` does around the same arithmetic. A GPU step of ``t`` ms loses overhead / t
to it: 1.5 ms of a 30 ms step is 5%. On a CPU it is host time in any case; more torch
threads than one only wait on tensors this small.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.profilers import SimpleProfiler
from lightning.pytorch.strategies import SingleDeviceStrategy
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader

from segscale.bench.measure.compute import (
    RepeatedBatch,
    apply_gradients,
    forward_loss,
    optimizer_and_scaler,
)
from segscale.bench.measure.timing import synchronize
from segscale.models.checkpoint.files import SafeCheckpointIO
from segscale.models.module import SegmentationModule
from segscale.runs.builders import build, instantiate_each
from segscale.training.callbacks.run_summary import RunSummary

BATCH = 2
SIDE = 16
"""The tiny batch: ``BATCH`` patches of ``SIDE`` × ``SIDE`` pixels."""

TARGET_MS = 1.5
"""The overhead we aim at: 5% of a 30 ms GPU step."""


@dataclass(frozen=True)
class Overhead:
    """Milliseconds per step of the bare loop and of Lightning, and their difference."""

    lightning_ms: float  # median over rounds of Lightning's mean step
    bare_ms: float  # median over rounds of the bare loop's mean step
    overhead_ms: float  # median over rounds of (Lightning − bare)
    spread_ms: float  # median absolute deviation of the rounds' differences from overhead_ms
    rounds_ms: tuple[float, ...]  # each round's difference
    steps: int  # timed steps per round and side
    callbacks: tuple[str, ...]  # the Lightning side's callbacks, by class name
    loggers: tuple[str, ...]  # and its loggers
    # Where a Lightning step's time goes, ms per step by term (``step_terms``), from one
    # more round under Lightning's SimpleProfiler (which adds its own microseconds).
    terms_ms: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain numbers and names (for ``bench.json``)."""
        return asdict(self)


WARMUP_STEPS = 20
"""Untimed steps of each round before its timed ones."""


def measure_overhead(
    cfg: DictConfig,
    device: torch.device,
    steps: int = 300,
    rounds: int = 5,
    warmup: int = WARMUP_STEPS,
) -> Overhead:
    """The framework's overhead per step for ``cfg`` on ``device`` (see the module docstring).

    Each of ``rounds`` rounds runs the bare loop, then Lightning, each on a fresh copy of
    the tiny module for ``warmup`` untimed then ``steps`` timed steps.
    """
    if steps < 1 or rounds < 1 or warmup < 0:
        raise ValueError(
            f"steps={steps}, rounds={rounds}, warmup={warmup}: expected steps and rounds >= 1 "
            "and warmup >= 0"
        )
    module = tiny_module(cfg)
    batch = tiny_batch(cfg)
    precision = str(cfg.trainer.precision)
    bare: list[float] = []
    light: list[float] = []
    with tempfile.TemporaryDirectory(prefix="segscale-overhead-") as folder:
        for index in range(rounds):
            bare.append(bare_round(copy.deepcopy(module), batch, precision, device, warmup, steps))
            step_s, trainer = lightning_round(
                cfg, copy.deepcopy(module), batch, device, warmup, steps, Path(folder) / str(index)
            )
            light.append(step_s)
        terms = profiled_terms(
            cfg, copy.deepcopy(module), batch, device, warmup, steps, Path(folder) / "profiled"
        )
    # Lightning's CallbackConnector sets trainer.callbacks; Trainer does not declare it.
    listed = trainer.callbacks  # type: ignore[attr-defined]
    callbacks = tuple(type(c).__name__ for c in listed if not isinstance(c, RoundClock))
    differences = [1e3 * (lt - b) for lt, b in zip(light, bare, strict=True)]
    middle = statistics.median(differences)
    return Overhead(
        lightning_ms=1e3 * statistics.median(light),
        bare_ms=1e3 * statistics.median(bare),
        overhead_ms=middle,
        # Robust, as the median is: a round that met a busy spell of a shared machine
        # moves neither.
        spread_ms=statistics.median(abs(d - middle) for d in differences),
        rounds_ms=tuple(differences),
        steps=steps,
        callbacks=callbacks,
        loggers=tuple(type(logger).__name__ for logger in trainer.loggers),
        terms_ms=terms,
    )


def profiled_terms(
    cfg: DictConfig,
    module: SegmentationModule,
    batch: dict[str, torch.Tensor],
    device: torch.device,
    warmup: int,
    steps: int,
    folder: Path,
) -> dict[str, float]:
    """``step_terms`` of one more Lightning round, under Lightning's SimpleProfiler."""
    profiler = SimpleProfiler()
    lightning_round(cfg, module, batch, device, warmup, steps, folder, profiler)
    totals = {action: sum(times) for action, times in profiler.recorded_durations.items()}
    return step_terms(totals, warmup + steps)


STEP_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
)
"""The hooks Lightning calls in every training step (a callback's are its per-step cost)."""
_INSIDE_OPTIMIZER_STEP = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")
"""Of those, the ones Lightning calls inside ``optimizer_step`` (in its closure)."""


def step_terms(
    totals: Mapping[str, float], steps: int, step_s: float | None = None
) -> dict[str, float]:
    """Milliseconds per step of each term a Lightning training step's time goes to.

    ``totals``: seconds per action of Lightning's SimpleProfiler over ``steps`` steps
    (its ``recorded_durations`` summed, or its report's "Total time" column). The
    terms: ``loader`` (waiting for the next batch), ``to device``, ``training_step``
    (forward, loss and the module's logging), ``backward``, ``non-finite check,
    clipping`` (the module's ``on_before_optimizer_step``), ``optimizer`` (the rest of
    ``optimizer_step``: the update itself), ``zero_grad``, ``schedule``, one
    ``callback <Name>`` per callback (its per-step hooks) and ``Lightning's loop,
    logging``: the rest of the whole step (``step_s``, default the profiler's
    ``run_training_batch`` plus the loader's wait).
    """

    def per_step(total: float) -> float:
        return 1000 * total / max(1, steps)

    def named(prefix: str, hook: str) -> float:
        return sum(t for a, t in totals.items() if a.startswith(prefix) and a.endswith(f".{hook}"))

    terms = {
        "loader": per_step(totals.get("[_TrainingEpochLoop].train_dataloader_next", 0.0)),
        "to device": per_step(named("[Strategy]", "batch_to_device")),
        "training_step": per_step(named("[Strategy]", "training_step")),
        "backward": per_step(named("[Strategy]", "backward")),
        "non-finite check, clipping": per_step(
            named("[LightningModule]", "on_before_optimizer_step")
        ),
    }
    callbacks: dict[str, float] = {}
    inside = 0.0
    for action, total in totals.items():
        if not action.startswith("[Callback]"):
            continue
        name, _, hook = action[len("[Callback]") :].rpartition(".")
        if hook in STEP_HOOKS:
            label = f"callback {name.split('{')[0]}"
            callbacks[label] = callbacks.get(label, 0.0) + per_step(total)
            inside += total if hook in _INSIDE_OPTIMIZER_STEP else 0.0
    module_inside = sum(
        named("[LightningModule]", h) for h in ("on_before_backward", "on_after_backward")
    )
    optimizer_step = per_step(named("[LightningModule]", "optimizer_step"))
    within = (
        terms["training_step"]
        + terms["backward"]
        + terms["non-finite check, clipping"]
        + per_step(inside + module_inside)
    )
    terms["optimizer"] = max(0.0, optimizer_step - within)
    terms["zero_grad"] = per_step(named("[LightningModule]", "optimizer_zero_grad"))
    terms["schedule"] = per_step(named("[LightningModule]", "lr_scheduler_step"))
    terms.update(sorted(callbacks.items(), key=lambda item: -item[1]))
    whole = (
        1000 * step_s
        if step_s is not None
        else per_step(totals.get("run_training_batch", 0.0)) + terms["loader"]
    )
    terms["Lightning's loop, logging"] = max(0.0, whole - sum(terms.values()))
    return {name: round(ms, 4) for name, ms in terms.items()}


def tiny_module(cfg: DictConfig) -> SegmentationModule:
    """The config's module (loss, optimizer, schedule, training options), on a 1×1 conv.

    The classes come from the ``datamodule`` group; normalization and class frequencies,
    which would need the data, are neutral ones: they change no cost.
    """
    data = cfg.datamodule
    channels, classes = int(data.get("in_channels") or 3), int(data.num_classes)
    training = cfg.training
    return SegmentationModule(
        network=nn.Conv2d(channels, classes, kernel_size=1),
        optimizer=build(cfg.optimizer),
        schedule=build(cfg.scheduler),
        num_classes=classes,
        class_names=list(data.class_names),
        ignore_index=int(data.ignore_index),
        mean=[0.0] * channels,
        std=[1.0] * channels,
        gradient_threshold=training.gradient_threshold,
        gradient_threshold_method=training.gradient_threshold_method,
        channels_last=training.channels_last,
        on_nonfinite=training.get("on_nonfinite", "stop"),
        loss=build(
            cfg.loss,
            num_classes=classes,
            ignore_index=int(data.ignore_index),
            class_frequencies=[1 / classes] * classes,
        ),
    )


def tiny_batch(cfg: DictConfig) -> dict[str, torch.Tensor]:
    """A batch as the DataLoader delivers one (uint8 image and mask, the patch keys)."""
    channels, classes = int(cfg.datamodule.get("in_channels") or 3), int(cfg.datamodule.num_classes)
    generator = torch.Generator().manual_seed(0)
    shape = (BATCH, SIDE, SIDE)
    return {
        "image": torch.randint(0, 256, (BATCH, channels, SIDE, SIDE), generator=generator).byte(),
        "mask": torch.randint(0, classes, shape, generator=generator).byte(),
        "key": torch.zeros(BATCH, 2, dtype=torch.long),
    }


def bare_round(
    module: SegmentationModule,
    batch: dict[str, torch.Tensor],
    precision: str,
    device: torch.device,
    warmup: int,
    steps: int,
) -> float:
    """Seconds per step of the bare loop, over ``steps`` steps after ``warmup``."""
    module = module.to(device).train()
    optimizer, scaler = optimizer_and_scaler(module, precision, device)
    start = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            synchronize(device)
            start = time.perf_counter()
        scaler.scale(forward_loss(module, batch, precision, device)).backward()
        apply_gradients(optimizer, scaler)
    synchronize(device)
    return (time.perf_counter() - start) / steps


class RoundClock(L.Callback):
    """Clocks the steps after the first ``warmup``, from the end of that one to the last.

    The device is waited for at those two steps only, as in the bare loop.
    """

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.start = self.end = 0.0
        self.steps = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the clock now if there is no warm-up."""
        if self.warmup == 0:
            synchronize(pl_module.device)
            self.start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        """Start the clock at the end of the warm-up, stop it at the last step."""
        done = trainer.global_step
        if done == self.warmup:
            synchronize(pl_module.device)
            self.start = time.perf_counter()
        if done == trainer.max_steps and done > self.warmup:
            synchronize(pl_module.device)
            self.end = time.perf_counter()
            self.steps = done - self.warmup

    @property
    def step_s(self) -> float:
        """Seconds per timed step."""
        if self.steps < 1:
            raise ValueError("no step was timed: expected more steps than the warm-up")
        return (self.end - self.start) / self.steps


def lightning_round(
    cfg: DictConfig,
    module: SegmentationModule,
    batch: dict[str, torch.Tensor],
    device: torch.device,
    warmup: int,
    steps: int,
    folder: Path,
    profiler: SimpleProfiler | None = None,
) -> tuple[float, L.Trainer]:
    """Seconds per step of ``train.py``'s trainer, over ``steps`` steps after ``warmup``.

    The trainer is the ``trainer`` group's with ``train.py``'s callbacks and loggers,
    writing into ``folder``; it trains on ``device`` alone, without validation. The
    progress bar draws into nothing and the start-up lines are not logged: what they
    cost still counts, without a bar or table in the middle of ``bench.py``'s output.
    """
    clock = RoundClock(warmup)
    loader = DataLoader(RepeatedBatch(batch, warmup + steps), batch_size=None)
    with quiet():
        trainer = train_trainer(in_folder(cfg, folder), device, warmup + steps, clock, profiler)
        trainer.fit(module, train_dataloaders=loader)
    return clock.step_s, trainer


def train_trainer(
    cfg: DictConfig,
    device: torch.device,
    max_steps: int,
    clock: RoundClock,
    profiler: SimpleProfiler | None = None,
) -> L.Trainer:
    """The ``Trainer`` of ``train.py`` (``training_run``) on one device, for ``max_steps``.

    Its callbacks are the ``callbacks`` group's and the run summary, its loggers the
    ``logger`` group's, built as ``train.py`` builds them, and ``clock``; ``profiler``
    (``None``: the ``trainer`` group's) records where its steps' time goes.
    """
    callbacks = [*instantiate_each(cfg.get("callbacks")), RunSummary(cfg.output_dir)]
    return instantiate(
        cfg.trainer,
        accelerator=device.type,
        devices=1,
        strategy=SingleDeviceStrategy(device=device),
        callbacks=[*callbacks, clock],
        logger=list(instantiate_each(cfg.get("logger"))) or False,
        plugins=[SafeCheckpointIO()],
        use_distributed_sampler=False,
        max_steps=max_steps,
        max_epochs=1,
        limit_train_batches=None,
        limit_val_batches=0,
        val_check_interval=None,
        check_val_every_n_epoch=1,
        num_sanity_val_steps=0,
        **({"profiler": profiler} if profiler is not None else {}),
    )


TRACKING_KEYS = ("tracking_uri", "artifact_location")
"""Logger arguments that name a store outside the run folder (MLflow's)."""


def in_folder(cfg: DictConfig, folder: Path) -> DictConfig:
    """``cfg`` with its run folder, and any logger's store, in ``folder``."""
    moved = copy.deepcopy(cfg)
    OmegaConf.update(moved, "output_dir", str(folder))
    for node in (moved.get("logger") or {}).values():
        if node is not None and "tracking_uri" in node:
            node.tracking_uri = f"sqlite:///{folder / 'mlflow.db'}"
        if node is not None and "artifact_location" in node:
            node.artifact_location = str(folder / "mlartifacts")
    return moved


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No progress bar drawn, no start-up lines or warnings: once per round, not the user's."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "segscale")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING + 1)  # ValidationReport: "no validation ran"
    try:
        with (
            open(os.devnull, "w", encoding="utf-8") as nothing,
            contextlib.redirect_stdout(nothing),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
