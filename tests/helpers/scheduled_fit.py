"""A tiny fit whose learning rate falls at every step, for the callbacks that report it."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader

RATES = (0.03, 0.02, 0.01)
"""The learning rate of steps 1, 2 and 3. A per-step schedule sets the optimizer's rate
after each step: after the last one it holds 0.0, the rate of a step that never comes."""


class ScheduledModule(L.LightningModule):
    """A linear layer trained on batches like the datamodule's, at ``RATES``."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch["image"]).pow(2).mean()
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val/loss", self.layer(batch["image"]).pow(2).mean())

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.SGD(self.parameters(), lr=RATES[0])
        # Falls by RATES[0] / 3 at every step: 0.03, 0.02, 0.01, then 0.0.
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / len(RATES))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def train_dataloader(self) -> DataLoader:
        return batches(len(RATES))

    def val_dataloader(self) -> DataLoader:
        return batches(1)


def batches(count: int) -> DataLoader:
    """``count`` batches of 4 two-feature ``image`` rows."""
    generator = torch.Generator().manual_seed(0)
    data = [{"image": torch.randn(4, 2, generator=generator)} for _ in range(count)]
    return DataLoader(data, batch_size=None)


def scheduled_fit(folder: Path, *callbacks: L.Callback, logger: bool = True) -> L.Trainer:
    """Train ``ScheduledModule`` for one epoch of ``len(RATES)`` steps, logging every step."""
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        log_every_n_steps=1,
        logger=CSVLogger(folder, name="", version="") if logger else False,
        callbacks=list(callbacks),
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=any(isinstance(c, L.pytorch.callbacks.ProgressBar) for c in callbacks),
        num_sanity_val_steps=0,
        default_root_dir=folder,
    )
    trainer.fit(ScheduledModule())
    return trainer
