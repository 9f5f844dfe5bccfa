"""The progress bar, with the training loss; progress lines of a validation pass in a log."""

from __future__ import annotations

import logging
import math
import sys
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar as LightningTQDMProgressBar

from segscale.models.module import logs_this_step
from segscale.progress import Progress

log = logging.getLogger(__name__)


class TQDMProgressBar(LightningTQDMProgressBar):
    """Lightning's TQDM progress bar, showing ``train/loss`` beside ``val/mIoU``.

    The module logs the training loss only on logging steps and not to the progress bar:
    Lightning would read a progress-bar value on the host after every step, a host sync
    each. This bar reads the loss of each logging step once, when that step ends (a
    logger reads it then anyway), and shows the last one read.

    The bar is drawn only on a terminal: written to a file or a pipe (a cluster's job
    log, ``> train.log 2>&1``), each redraw would land between the log lines, and the
    log has periodic rows of its own (``VerboseLog``, ``callbacks.verbose_log.frequency``).
    A validation pass has none: there it logs a progress line now and then instead
    (``segscale.progress``: a count and the time left; none for a pass of seconds).
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False):
        super().__init__(refresh_rate, process_position, leave)
        if not sys.stdout.isatty():  # where Lightning draws its bars
            self.disable()
        self.loss: float | None = None  # the training loss of the last logging step
        self._logs = False  # whether the step now running logs its loss
        self._validation: Progress | None = None  # lines of a pass when no bar is drawn

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Note whether this step logs its loss (as the module decides it), on rank 0."""
        self._logs = self.is_enabled and logs_this_step(trainer)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Read the loss of a logging step, then update the bar."""
        value = trainer.callback_metrics.get("train/loss") if self._logs else None
        if value is not None:
            self.loss = float(value)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """Lightning's progress-bar values, the training loss first."""
        metrics = super().get_metrics(trainer, pl_module)
        return metrics if self.loss is None else {"train/loss": self.loss, **metrics}

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Without a bar, count the pass's batches for the log (rank 0, not sanity checks)."""
        super().on_validation_start(trainer, pl_module)
        if self.is_enabled or trainer.sanity_checking or not trainer.is_global_zero:
            return
        total = sum(trainer.num_val_batches)
        if math.isfinite(total) and total > 0:
            self._validation = Progress(int(total), "validation batches", log, sys.stdout)

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Update the bar, or count the batch for the log."""
        super().on_validation_batch_end(
            trainer, pl_module, outputs, batch, batch_idx, dataloader_idx
        )
        if self._validation is not None:
            self._validation.update()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The pass is over: its count ends."""
        super().on_validation_end(trainer, pl_module)
        if self._validation is not None:
            self._validation.close()
            self._validation = None
