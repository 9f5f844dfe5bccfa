"""A tile found unreadable mid-run: the run stops with ``last.ckpt`` at its last finished step.

The dataset check read every tile whole before training, so a tile that cannot be read
later has changed, or the disk failed. The rank whose patch met it raises
``UnreadableTileError`` as it fetches a batch: before that batch is trained, so the
network, optimizer and loops are those of the last finished step. That rank writes
``last.ckpt`` itself (under DDP every rank holds the same state, and the others are
waiting for it in a collective), marks an interrupted validation to run again, and the
run ends with the error (exit 2), naming the file. Replace the file (or set
``datamodule.skip_unreadable=true``) and resume with ``ckpt_path=auto``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from segscale.data.storage.tiles import UnreadableTileError
from segscale.training.callbacks.preemption_stop import rerun_validation

log = logging.getLogger(__name__)


class UnreadableTileStop(L.Callback):
    """On ``UnreadableTileError`` after training started: write ``last.ckpt`` of the last step."""

    def __init__(self, output_dir: str) -> None:
        self.path = Path(output_dir) / "checkpoints" / "last.ckpt"
        self._training = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """From now on there is a step to save."""
        self._training = True

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Save the last finished step if a tile could not be read."""
        if not (self._training and isinstance(exception, UnreadableTileError)):
            return
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        if trainer.validating:  # abandoned: a resume runs it again, whole
            rerun_validation(checkpoint)
        # Written by this rank alone, without the collective of Trainer.save_checkpoint.
        trainer.strategy.checkpoint_io.save_checkpoint(checkpoint, self.path)
        for callback in trainer.checkpoint_callbacks:  # summary.json's last_checkpoint
            if isinstance(callback, ModelCheckpoint) and callback.save_last:
                callback.last_model_path = str(self.path)
        log.error("%s holds step %d, the last finished one", self.path, trainer.global_step)
