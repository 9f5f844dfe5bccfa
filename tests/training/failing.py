"""Callbacks that inject failures: a raising rank (a DDP run never hangs), NaN images."""

import lightning as L
import torch


class FailOnRank(L.Callback):
    """Raise at the given training step on the given global rank."""

    def __init__(self, rank: int = 1, step: int = 2) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            raise RuntimeError(f"injected failure on rank {self.rank}")


class NaNImagesAt(L.Callback):
    """Replace the batch's images by NaN at the given training step: a non-finite loss.

    On every rank, or on ``rank`` alone.
    """

    def __init__(self, step: int = 5, rank: int | None = None) -> None:
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            batch["image"] = torch.full(batch["image"].shape, float("nan"))
