"""``training.ema``: an exponential moving average of the weights, validated and saved.

Lightning's ``WeightAveraging`` holds the averaged copy (torch's ``AveragedModel``),
parameters and buffers (batch-norm statistics) alike, saves and restores it, swaps it
in for each validation, so ``val/*``, ``best.ckpt`` and the run's evaluation judge the
averaged network, and copies it into the network when training ends. After every
optimizer step this callback applies torch's EMA update (``get_ema_multi_avg_fn``),
without ``AveragedModel.update_parameters``' read of its count on the host.

A checkpoint's ``state_dict`` (what inference, ``predict.py`` and ``segscale.load``
read) holds the average; ``current_model_state`` the trained weights and
``averaging_state`` the count of updates, so a resume continues both exactly. A resume
with ``training.ema`` off continues from the trained weights (``TrainedWeightsOnResume``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import chain
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from omegaconf import DictConfig, OmegaConf
from torch import Tensor
from torch.optim.swa_utils import get_ema_multi_avg_fn

KEY = "training.ema"

log = logging.getLogger(__name__)


class ExponentialMovingAverage(WeightAveraging):
    """Lightning's ``WeightAveraging`` as an EMA of ``decay``, begun after ``start_step`` steps.

    Until step ``start_step`` the average is the network itself (each update copies
    it); from then on ``average = decay × average + (1 − decay) × weights`` per step.
    """

    def __init__(self, decay: float, start_step: int = 0) -> None:
        super().__init__()
        self.decay = decay
        self.start_step = start_step
        self._swapped = False  # the network holds the average (during a validation)
        self._ema_update: Callable[[list[Tensor], list[Tensor], Tensor], None] | None = None

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """After every optimizer step, never at an epoch's end."""
        return step_idx is not None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Keep the average on the network's device (``setup`` ran before it moved there).

        The EMA update (a closure) is made here, in the rank's process: ``ddp_spawn``
        pickles the callbacks into its ranks, and a closure cannot be pickled.
        """
        self._ema_update = get_ema_multi_avg_fn(self.decay)
        if self._average_model is not None:
            self._average_model.module.to(pl_module.device)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """After an optimizer step, update the average: a copy up to ``start_step``, then the EMA.

        ``AveragedModel.update_parameters`` reads its count of updates on the host at
        every update (whether to copy): on a GPU a wait for the step to finish
        (docs/architecture.md, "No avoidable host syncs in the training step"). The step
        number decides that here; the update is torch's EMA (``get_ema_multi_avg_fn``).
        """
        average = self._average_model
        step = trainer.global_step
        if average is None or self._ema_update is None or step <= self._latest_update_step:
            return  # a batch inside a gradient-accumulation window
        averaged = [
            t.detach() for t in chain(average.module.parameters(), average.module.buffers())
        ]
        current = [t.detach() for t in chain(pl_module.parameters(), pl_module.buffers())]
        if step <= max(self.start_step, 1):
            torch._foreach_copy_(averaged, current)
        else:
            by_dtype: dict[torch.dtype, tuple[list[Tensor], list[Tensor]]] = {}
            for mine, theirs in zip(averaged, current, strict=True):
                pair = by_dtype.setdefault(mine.dtype, ([], []))
                pair[0].append(mine)
                pair[1].append(theirs)
            for mine_list, their_list in by_dtype.values():  # foreach ops take one dtype
                self._ema_update(mine_list, their_list, average.n_averaged)
        average.n_averaged += 1  # on the host: recorded in checkpoints, never read here
        self._latest_update_step = step

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Swap the average in for the validation."""
        super().on_validation_epoch_start(trainer, pl_module)
        self._swapped = self._average_model is not None

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Swap the trained weights back."""
        super().on_validation_epoch_end(trainer, pl_module)
        self._swapped = False

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """``state_dict`` the average, ``current_model_state`` the trained weights.

        A save inside a validation (a preemption's ``last.ckpt``) finds the two
        swapped: the network holds the average and the averaged model the weights.
        """
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._swapped and "current_model_state" in checkpoint:
            checkpoint["state_dict"], checkpoint["current_model_state"] = (
                checkpoint["current_model_state"],
                checkpoint["state_dict"],
            )


class TrainedWeightsOnResume(L.Callback):
    """``training.ema`` off, resuming a checkpoint written with it: the trained weights go on.

    Lightning loads a checkpoint's ``state_dict`` into the network, which for such a
    checkpoint is the average; without this, training would silently continue from it.
    """

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Load ``current_model_state``, the trained weights, if the checkpoint has it."""
        trained = checkpoint.get("current_model_state")
        if trained is not None:
            log.info("%s is off: training continues from the checkpoint's trained weights", KEY)
            pl_module.load_state_dict(trained)


def ema_settings(cfg: DictConfig) -> tuple[float, int] | None:
    """``(decay, start_step)`` of ``training.ema``, or ``None`` when it is off.

    The schema (``segscale.config_schema``) checks the values: null or a mapping, a
    decay between 0 and 1, a start step >= 0.
    """
    node = OmegaConf.select(cfg, KEY)
    if node is None or node.get("decay") is None:
        return None
    return float(node.decay), node.get("start_step", 0)


def ema_callback(cfg: DictConfig, resuming: bool) -> L.Callback | None:
    """The callback ``training.ema`` asks for; when it is off, one for a resume, else ``None``."""
    settings = ema_settings(cfg)
    if settings:
        return ExponentialMovingAverage(*settings)
    return TrainedWeightsOnResume() if resuming else None
