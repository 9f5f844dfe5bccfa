"""A run's checkpoints: the best and the last, the periodic ones, and a resume's best.

``ModelCheckpoint`` keeps the best and the last checkpoint, ``last.ckpt`` always last.
Since Lightning 2.6.0, ``save_last=True`` writes ``last.ckpt`` only at the steps where
the monitored top-k checkpoint is written too: a validation that does not beat the best
leaves ``last.ckpt`` at the best's step (openclimatefix/pvnet#544 describes the change).
``last.ckpt`` is then not the last state: MATLAB's ``OutputNetwork=last-iteration``
(``summary.json``'s ``output_checkpoint``) would name an older network. This subclass
writes ``last.ckpt`` at every point where Lightning's would have before 2.6.

``periodic_checkpoint`` is MATLAB's checkpoint path and frequency: a checkpoint kept
every N epochs or iterations. ``ForgetAbandonedBest``: a resume from a checkpoint older
than the run's best forgets that best.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.callbacks import ModelCheckpoint as LightningModelCheckpoint

from segscale.errors import ConfigError
from segscale.models.checkpoint.files import written_step


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


def periodic_checkpoint(dirpath: str, frequency: int = 0, unit: str = "epoch") -> Callback | None:
    """MATLAB's ``CheckpointPath``/``CheckpointFrequency``/``CheckpointFrequencyUnit``.

    Keeps a checkpoint every ``frequency`` epochs or iterations in ``dirpath``, named
    ``epoch<E>-step<S>.ckpt``; ``frequency`` 0 keeps none (``None``: no callback).
    ``segscale.training.run.training_run`` checks that ``dirpath`` is writable before training.
    """
    if unit not in ("epoch", "iteration"):
        raise ConfigError(
            f"callbacks.periodic_checkpoint.unit={unit!r} is unknown: expected epoch or iteration"
        )
    if frequency < 0:
        raise ConfigError(
            f"callbacks.periodic_checkpoint.frequency={frequency} is not allowed: expected >= 0"
        )
    if frequency == 0:
        return None
    return LightningModelCheckpoint(
        dirpath=dirpath,
        filename="epoch{epoch:03d}-step{step:07d}",
        auto_insert_metric_name=False,
        save_top_k=-1,
        save_on_train_epoch_end=True,
        enable_version_counter=False,  # a resumed run rewrites its own files, not -v1 copies
        # None, ModelCheckpoint's default, for the unit not chosen
        every_n_epochs=frequency if unit == "epoch" else None,
        every_n_train_steps=frequency if unit == "iteration" else None,
    )


def ensure_writable(folder: str, key: str) -> None:
    """Raise ``ConfigError`` naming ``key`` unless files can be created in ``folder``."""
    path = Path(folder)
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise ConfigError(
            f"{key}={folder!r}: cannot write checkpoints there ({error.strerror}); "
            "expected a writable folder"
        ) from None
    if created:
        path.rmdir()  # made again when the first checkpoint is saved


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
        callbacks = [
            c for c in trainer.checkpoint_callbacks if isinstance(c, LightningModelCheckpoint)
        ]
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


def _written_after(callback: LightningModelCheckpoint, step: int) -> bool:
    """Whether ``callback``'s best file (a fixed name) was saved at a later step."""
    best = callback.best_model_path
    if not callback.monitor or not best or not Path(best).is_file():
        return False
    written = written_step(best)
    return written is None or written > step  # unreadable: nothing of it is worth keeping
