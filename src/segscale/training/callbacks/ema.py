"""``training.ema``: an exponential moving average of the weights, validated and saved.

Lightning's ``WeightAveraging`` (``torch.optim.swa_utils.AveragedModel`` underneath)
keeps the average, after every optimizer step, with torch's foreach EMA update
(``get_ema_multi_avg_fn``); parameters and buffers (batch-norm statistics) alike. It
swaps the average in for each validation, so ``val/*``, ``best.ckpt`` and the run's
evaluation judge the averaged network, and copies it into the network when training
ends. A checkpoint's ``state_dict`` (what inference, ``predict.py`` and
``segscale.load`` read) holds the average; ``current_model_state`` the trained weights
and ``averaging_state`` the count of updates, so a resume continues both exactly.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import WeightAveraging
from omegaconf import DictConfig, OmegaConf
from torch.optim.swa_utils import get_ema_multi_avg_fn

from segscale.errors import ConfigError

KEY = "training.ema"


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

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """After every optimizer step, never at an epoch's end."""
        return step_idx is not None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Build the averaged model with the EMA update of ``decay``.

        The update (a closure) is made here, in the rank's process: ``ddp_spawn``
        pickles the callbacks into its ranks, and a closure cannot be pickled.
        """
        self._kwargs["multi_avg_fn"] = get_ema_multi_avg_fn(self.decay)
        try:
            super().setup(trainer, pl_module, stage)
        finally:
            del self._kwargs["multi_avg_fn"]

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Keep the average on the network's device (``setup`` ran before it moved there).

        The count of updates stays on the host: ``AveragedModel`` compares it with 0 at
        every update, which on a GPU would wait for the device twice a step.
        """
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
        """Update the average; up to ``start_step`` it restarts, a copy of the weights."""
        if self._average_model is not None and trainer.global_step <= self.start_step:
            self._average_model.n_averaged.zero_()  # AveragedModel copies at count 0
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

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


def check_ema(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` for a ``training.ema`` that cannot work (null or no decay: off)."""
    ema_settings(cfg)


def ema_settings(cfg: DictConfig) -> tuple[float, int] | None:
    """``(decay, start_step)`` of ``training.ema``, or ``None`` when it is off."""
    node = OmegaConf.select(cfg, KEY)
    if node is None:
        return None
    if not isinstance(node, DictConfig) or set(node) - {"decay", "start_step"}:
        shown = OmegaConf.to_container(node) if isinstance(node, DictConfig) else node
        raise ConfigError(
            f"{KEY}={shown!r}: expected null or the keys decay (0 < decay < 1) and "
            f"start_step, e.g. {KEY}.decay=0.999"
        )
    decay, start_step = node.get("decay"), node.get("start_step", 0)
    if decay is None:
        return None
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay < 1:
        raise ConfigError(
            f"{KEY}.decay={decay!r}: expected a number between 0 and 1 (exclusive), such as "
            "0.999 (the average's weight at each step), or null (no averaging)"
        )
    if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
        raise ConfigError(
            f"{KEY}.start_step={start_step!r}: expected an integer >= 0, the optimizer step "
            "the average starts from"
        )
    return float(decay), start_step


def ema_callback(cfg: DictConfig) -> ExponentialMovingAverage | None:
    """The callback ``training.ema`` asks for, or ``None`` when it is off."""
    settings = ema_settings(cfg)
    return ExponentialMovingAverage(*settings) if settings else None
