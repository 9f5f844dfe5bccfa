"""The best and the last checkpoint: Lightning's ``ModelCheckpoint``, ``last.ckpt`` always last.

Since Lightning 2.6.0, ``save_last=True`` writes ``last.ckpt`` only at the steps where
the monitored top-k checkpoint is written too: a validation that does not beat the best
leaves ``last.ckpt`` at the best's step (openclimatefix/pvnet#544 describes the change).
``last.ckpt`` is then not the last state: MATLAB's ``OutputNetwork=last-iteration``
(``summary.json``'s ``output_checkpoint``) would name an older network. This subclass
writes ``last.ckpt`` at every point where Lightning's would have before 2.6.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint


class ModelCheckpoint(LightningModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, whose ``last.ckpt`` follows every save point."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_written_step = -1

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Any]) -> None:
        super()._save_last_checkpoint(trainer, monitor_candidates)
        self._last_written_step = trainer.global_step

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Save as Lightning does, then ``last.ckpt`` if Lightning left it behind."""
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._write_last(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Save as Lightning does, then ``last.ckpt`` if Lightning left it behind."""
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._write_last(trainer)

    def _write_last(self, trainer: L.Trainer) -> None:
        if self.save_last is not True or self._last_written_step == trainer.global_step:
            return
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
