"""Callbacks the framework adds to every run."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only

log = logging.getLogger(__name__)


class RunSummary(L.Callback):
    """Measures training throughput and writes ``summary.json`` into the run folder.

    Throughput counts the training patches of all ranks over the training time alone:
    validation and the sanity check are excluded. The summary records the final
    metrics, the checkpoints, and the effective values read back from the running
    objects: world size, per-device and global batch, learning rate.
    """

    def __init__(self, output_dir: str) -> None:
        self.output_dir = Path(output_dir)
        self.patches = 0
        self.train_s = 0.0
        self._fit_start = self._train_start = self._val_start = 0.0
        self._val_s = 0.0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the wall clock."""
        self._fit_start = time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the training clock (after the sanity check) and log the effective values."""
        self._train_start, self._val_s = time.perf_counter(), 0.0
        if trainer.is_global_zero:
            values = self.effective_values(trainer)
            log.info("effective: %s", ", ".join(f"{k}={v}" for k, v in values.items()))

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: dict[str, torch.Tensor],
        batch_idx: int,
    ) -> None:
        """Count this batch's patches on every rank."""
        self.patches += batch["image"].shape[0] * trainer.world_size

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Pause the training clock."""
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Resume the training clock."""
        if self._train_start:
            self._val_s += time.perf_counter() - self._val_start

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Stop the training clock."""
        self.train_s = time.perf_counter() - self._train_start - self._val_s

    @rank_zero_only
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write ``summary.json`` (rank 0 only)."""
        summary = self.summary(trainer)
        path = self.output_dir / "summary.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(summary, indent=2))
        os.replace(temporary, path)

    @staticmethod
    def effective_values(trainer: L.Trainer) -> dict[str, Any]:
        """World size, devices, batch sizes and learning rate, read from the running objects."""
        loader = trainer.train_dataloader
        per_device = loader.batch_size if loader is not None else None
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        strategy = trainer.strategy
        devices = getattr(strategy, "parallel_devices", None) or [strategy.root_device]
        return {
            "world_size": trainer.world_size,
            "num_nodes": trainer.num_nodes,
            "accelerator": type(trainer.accelerator).__name__,
            "devices": [str(d) for d in devices],
            "per_device_batch_size": per_device,
            "global_batch_size": per_device * trainer.world_size if per_device else None,
            # The base rate the schedule multiplies; LambdaLR keeps it as "initial_lr".
            "learning_rate": optimizer.param_groups[0].get("initial_lr") if optimizer else None,
            "final_learning_rate": optimizer.param_groups[0]["lr"] if optimizer else None,
        }

    def summary(self, trainer: L.Trainer) -> dict[str, Any]:
        """The run's summary as a JSON-ready dict."""
        checkpoint = trainer.checkpoint_callback
        return {
            "metrics": {k: _number(v) for k, v in sorted(trainer.callback_metrics.items())},
            "best_checkpoint": getattr(checkpoint, "best_model_path", None) or None,
            "best_score": _number(getattr(checkpoint, "best_model_score", None)),
            "last_checkpoint": getattr(checkpoint, "last_model_path", None) or None,
            **self.effective_values(trainer),
            "epochs": trainer.current_epoch,
            "steps": trainer.global_step,
            "train_patches": self.patches,
            "train_time_s": round(self.train_s, 3),
            "wall_time_s": round(time.perf_counter() - self._fit_start, 3),
            "throughput_patches_per_s": round(self.patches / self.train_s, 3)
            if self.train_s > 0
            else None,
        }


def _number(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value.item() if isinstance(value, torch.Tensor) else value)
    return None if math.isnan(number) else number
