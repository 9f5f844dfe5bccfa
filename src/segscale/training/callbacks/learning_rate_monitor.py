"""Lightning's learning-rate monitor, idle in a run without a metric logger."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor as LightningLearningRateMonitor


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
