"""MATLAB's training-progress figure, as a PNG in the run folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L

from segscale.training.callbacks.trainer_values import current_learning_rate, logged_metric
from segscale.training.plots import plot_training_progress


class TrainingProgressPlot(L.Callback):
    """MATLAB's ``Plots='training-progress'``: a PNG redrawn at every validation.

    Training loss, accuracy and learning rate are recorded every
    ``trainer.log_every_n_steps`` iterations (when the mini-batch accuracy is measured);
    the validation loss, accuracy and mIoU at every validation. Rank 0 draws the figure
    (``segscale.training.plots``) and replaces the file atomically.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.train: list[tuple[int, float, float, float]] = []
        self.val: list[tuple[int, float, float, float]] = []

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
        if trainer.global_step % max(1, every):
            return
        loss, acc = logged_metric(trainer, "train/loss"), logged_metric(trainer, "train/acc")
        if loss is not None and acc is not None:
            self.train.append((trainer.global_step, loss, acc, current_learning_rate(trainer)))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Record the validation metrics and redraw the figure."""
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        loss, acc, miou = [logged_metric(trainer, k) for k in ("val/loss", "val/acc", "val/mIoU")]
        if loss is not None and acc is not None and miou is not None:
            self.val.append((trainer.global_step, loss, acc, miou))
        plot_training_progress(self.train, self.val, self.path)

    def state_dict(self) -> dict[str, Any]:
        """The curves so far, so that a resumed run continues them."""
        return {"train": self.train, "val": self.val}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the curves of the run being resumed."""
        self.train = [tuple(r) for r in state_dict["train"]]
        self.val = [tuple(r) for r in state_dict["val"]]
