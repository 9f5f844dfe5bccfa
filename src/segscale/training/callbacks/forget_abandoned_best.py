"""A resume from a checkpoint older than the run's best forgets that best."""

from __future__ import annotations

import math
from pathlib import Path
from typing import cast

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from segscale.models.checkpoint.files import written_step


class ForgetAbandonedBest(L.Callback):
    """After a resume from a checkpoint older than the run's best one, forget that best.

    A run resumed from an earlier checkpoint than its newest takes a new branch from
    there; a best checkpoint written later (``best.ckpt``) belongs to the branch it
    left. Its score, kept in the restored state, no longer describes any weights of the
    new branch, and a new branch that never beat it would end with ``best.ckpt`` still
    holding the old branch's weights. So the restored best is dropped, and the new
    branch's first validation writes ``best.ckpt`` again.

    Rank 0 alone reads the files and decides, for every rank: a rank that decided
    alone (a read error on one node) would keep another best than the others, and
    their checkpoint callbacks would then disagree on when to save (a collective).
    """

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Drop the best of each monitoring checkpoint callback whose file is newer."""
        callbacks = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
        decided = (
            [_written_after(c, trainer.global_step) for c in callbacks]
            if trainer.is_global_zero
            else None
        )
        forget = cast(list[bool], trainer.strategy.broadcast(decided, src=0))
        for callback, abandoned in zip(callbacks, forget, strict=True):
            if abandoned:
                callback.best_k_models = {}
                callback.best_model_path = callback.kth_best_model_path = ""
                callback.best_model_score = None
                worst = math.inf if callback.mode == "min" else -math.inf
                callback.kth_value = torch.tensor(worst)


def _written_after(callback: ModelCheckpoint, step: int) -> bool:
    """Whether ``callback``'s best file (a fixed name) was saved at a later step."""
    best = callback.best_model_path
    if not callback.monitor or not best or not Path(best).is_file():
        return False
    written = written_step(best)
    return written is None or written > step  # unreadable: nothing of it is worth keeping
