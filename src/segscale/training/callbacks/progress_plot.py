"""MATLAB's training-progress figure, as a PNG in the run folder."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L

from segscale.training.callbacks.trainer_values import current_learning_rate, logged_metric
from segscale.training.reporting.background_figures import BackgroundFigures
from segscale.training.reporting.plots import TrainingPosition, plot_training_progress


class TrainingProgressPlot(L.Callback):
    """MATLAB's ``Plots='training-progress'``: a PNG redrawn at every validation.

    Training loss, accuracy and learning rate (the one the iteration trained with) are
    recorded every ``trainer.log_every_n_steps`` iterations (when the mini-batch
    accuracy is measured); the validation loss, accuracy and mIoU at every validation.
    Rank 0 draws the figure (``segscale.training.reporting.plots``) and replaces the file
    atomically; at the end of training it is drawn once more if training went on past
    the last validation, so that the final figure reaches, and its title names, the
    last iteration. The figure is drawn in the background (``BackgroundFigures``), so
    that training goes on meanwhile; the end of fitting waits for the last one.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.train: list[tuple[int, float, float, float]] = []
        self.val: list[tuple[int, float, float, float]] = []
        self.drawn_at: int | None = None  # the iteration of the figure on disk
        self.rate = float("nan")  # the learning rate of the iteration now running
        self.figures = BackgroundFigures("progress-figure")

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Note the learning rate this iteration trains with."""
        # By on_train_batch_end the scheduler has already set the next iteration's rate.
        if trainer.is_global_zero:
            self.rate = current_learning_rate(trainer)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Record this iteration's loss, accuracy and learning rate, when they were logged."""
        # training_step ran with the step count before this optimizer step
        if not trainer.is_global_zero:
            return
        # Lightning's LoggerConnector sets it on the trainer; Trainer does not declare it.
        every = trainer.log_every_n_steps  # type: ignore[attr-defined]
        step = trainer.global_step
        # Under gradient accumulation several batches end at the same step: record it once.
        if step % max(1, every) or (self.train and self.train[-1][0] == step):
            return
        loss, acc = logged_metric(trainer, "train/loss"), logged_metric(trainer, "train/acc")
        if loss is not None and acc is not None:
            self.train.append((step, loss, acc, self.rate))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Record the validation metrics and redraw the figure."""
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        loss, acc, miou = [logged_metric(trainer, k) for k in ("val/loss", "val/acc", "val/mIoU")]
        if loss is not None and acc is not None and miou is not None:
            self.val.append((trainer.global_step, loss, acc, miou))
        self._draw(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Draw the final figure, unless the last validation already drew this iteration."""
        if trainer.is_global_zero and self.drawn_at != trainer.global_step:
            self._draw(trainer)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Wait until the last figure is written."""
        self.figures.close()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Finish the figure asked for before the run stopped."""
        self.figures.close()

    def _draw(self, trainer: L.Trainer) -> None:
        # The training metrics are rank 0's: its share of the global mini-batch under DDP.
        batch = "rank 0's share of the mini-batch" if trainer.world_size > 1 else "mini-batch"
        # Copies: training appends to the curves while the figure is drawn.
        train, val, position = list(self.train), list(self.val), training_position(trainer)
        self.figures.draw(
            self.path, partial(plot_training_progress, train, val, self.path, position, batch)
        )
        self.drawn_at = trainer.global_step

    def state_dict(self) -> dict[str, Any]:
        """The curves so far, so that a resumed run continues them."""
        return {"train": self.train, "val": self.val}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the curves of the run being resumed."""
        self.train = [tuple(r) for r in state_dict["train"]]
        self.val = [tuple(r) for r in state_dict["val"]]


def training_position(trainer: L.Trainer) -> TrainingPosition:
    """The trainer's optimizer steps and epoch (1-based), and their planned totals.

    Epochs are counted in optimizer steps (as the learning-rate schedule counts them),
    so the epoch named is the one the latest step belongs to, also after training ends
    (when Lightning's ``current_epoch`` already counts the next one).
    """
    step = trainer.global_step
    planned = trainer.estimated_stepping_batches
    steps = int(planned) if math.isfinite(planned) and planned > 0 else None
    batches = trainer.num_training_batches
    if not math.isfinite(batches) or batches < 1:
        return TrainingPosition(step, steps)
    per_epoch = max(1, math.ceil(batches / trainer.accumulate_grad_batches))
    epochs = math.ceil(steps / per_epoch) if steps else None
    return TrainingPosition(step, steps, max(1, math.ceil(step / per_epoch)), epochs)
