"""The learning rate: the configured one applied on a resume, and its monitor.

On a resume, the configured learning rate replaces the one the checkpoint restores
(``ApplyLearningRate``); Lightning's learning-rate monitor, idle in a run without a
metric logger (``LearningRateMonitor``).
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor as LightningLearningRateMonitor

log = logging.getLogger(__name__)


class ApplyLearningRate(L.Callback):
    """On a resume, the configured learning rate replaces the one the checkpoint restores.

    Lightning restores the optimizer and scheduler states as they were saved, base rates
    included, so ``optimizer.lr`` given on a resume would be ignored. Each parameter
    group's base rate (``initial_lr``, the one the schedule multiplies; the encoder's
    own under ``training.encoder_lr_factor``) is read as this launch's configuration
    builds it (``on_fit_start``, before the restore) and put back after the restore
    (``on_train_start``), in the optimizer and in its scheduler's ``base_lrs``; the
    current rate keeps its place in the schedule (scaled by new base / old base). So a
    changed learning rate applies from the resumed step on, and the optimizer's other
    state (momentum, moments) continues.
    """

    def __init__(self) -> None:
        self._configured: list[list[float]] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Note each group's base rate as this launch's configuration built it."""
        self._configured = [
            [float(g.get("initial_lr", g["lr"])) for g in o.param_groups]
            for o in trainer.optimizers
        ]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Put the configured base rates back where the restore replaced them."""
        for optimizer, configured in zip(trainer.optimizers, self._configured, strict=True):
            schedulers = [
                c.scheduler
                for c in trainer.lr_scheduler_configs
                if c.scheduler.optimizer is optimizer
            ]
            changed = False
            for index, (group, base) in enumerate(
                zip(optimizer.param_groups, configured, strict=True)
            ):
                restored = float(group.get("initial_lr", group["lr"]))
                if restored == base:
                    continue
                changed = True
                group["lr"] = group["lr"] * base / restored if restored else base
                if "initial_lr" in group:
                    group["initial_lr"] = base
                for scheduler in schedulers:
                    if hasattr(scheduler, "base_lrs"):
                        scheduler.base_lrs[index] = base
                if index == 0 and trainer.is_global_zero:
                    log.info(
                        "resumed with another learning rate: the base rate is %.6g (was "
                        "%.6g); the schedule continues at its step",
                        base,
                        restored,
                    )
            if changed:
                for scheduler in schedulers:  # what get_last_lr() reports until its next step
                    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]


class LearningRateMonitor(LightningLearningRateMonitor):
    """Logs each parameter group's learning rate (``lr-SGD``, ...) to the metric loggers.

    Lightning's monitor refuses to train without a logger; this one then does nothing,
    so that ``logger=none`` works with the default callbacks. The verbose table and
    ``summary.json`` still show the rate.
    """

    def on_train_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        """Name the parameter groups, if there is a logger to log them to."""
        if trainer.loggers:
            super().on_train_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        """Log the rates this step trains with, on logging steps."""
        if trainer.loggers:
            super().on_train_batch_start(trainer, *args, **kwargs)

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        """Log the rates of the epoch's start (``logging_interval`` epoch or null)."""
        if trainer.loggers:
            super().on_train_epoch_start(trainer, *args, **kwargs)
