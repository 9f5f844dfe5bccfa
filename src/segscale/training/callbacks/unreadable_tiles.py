"""A tile found unreadable mid-run: left out and listed, or the run stops at its last step.

``LeftOutTiles``: tiles ``datamodule.skip_unreadable`` left out mid-run, which file, why,
and when. ``UnreadableTileStop``: without it, the run stops with ``last.ckpt`` at its
last finished step.

A patch dataset that meets a tile it cannot read (the file changed, or the disk
failed, since the dataset check) leaves it out, and the sample says so (its
``left_out`` and ``left_out_reason`` fields): a DataLoader worker's own note of it
never reaches the training process. This callback reads those fields from every batch
and keeps each file's first time: the split, the epoch and the optimizer steps taken
before it. ``summary.json`` lists them (``left_out_tiles``), and checkpoints carry them,
so a resumed run's list continues the interrupted one's. Under DDP each rank meets its
own patches: the ranks' lists are joined at the end of each validation and of training
(a run that fails lists what rank 0 had then, and its own since).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint

from segscale.data.sampling.patches import LEFT_OUT, LEFT_OUT_REASON
from segscale.data.storage.tiles import UnreadableTileError
from segscale.training.callbacks.preemption_stop import rerun_validation


class LeftOutTiles(L.Callback):
    """The tiles left out as unreadable (``skip_unreadable``), each file once, earliest first."""

    def __init__(self) -> None:
        self.tiles: list[dict[str, Any]] = []

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Note the training tiles this batch's patches left out."""
        self._note(trainer, batch, "train")

    def on_validation_batch_start(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Note the validation tiles this batch's windows left out."""
        self._note(trainer, batch, "val")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Join the ranks' lists (every rank ends a validation)."""
        self._join_ranks(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Join the ranks' lists before rank 0 writes the summary."""
        self._join_ranks(trainer)

    def state_dict(self) -> dict[str, Any]:
        """The list so far, for a resume to continue."""
        return {"tiles": [dict(tile) for tile in self.tiles]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the interrupted launch's list."""
        self.tiles = [dict(tile) for tile in state_dict.get("tiles", [])]

    def _note(self, trainer: L.Trainer, batch: Any, split: str) -> None:
        files = batch.get(LEFT_OUT) if isinstance(batch, dict) else None
        if not files or not any(files):
            return
        known = {tile["file"] for tile in self.tiles}
        for file, reason in zip(files, batch[LEFT_OUT_REASON], strict=True):
            if file and file not in known:
                known.add(file)
                self.tiles.append(
                    {
                        "file": file,
                        "reason": reason,
                        "split": split,
                        "epoch": trainer.current_epoch,
                        "step": trainer.global_step,
                    }
                )

    def _join_ranks(self, trainer: L.Trainer) -> None:
        if trainer.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return
        lists: list[Any] = [None] * trainer.world_size
        dist.all_gather_object(lists, self.tiles)
        earliest: dict[str, dict[str, Any]] = {}
        for tile in sorted((t for tiles in lists for t in tiles), key=lambda t: t["step"]):
            earliest.setdefault(tile["file"], tile)
        self.tiles = list(earliest.values())


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
