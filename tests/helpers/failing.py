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


class InfGradientAt(L.Callback):
    """Make one gradient element infinite after the backward pass of the given step.

    The loss stays finite: only the check of the gradients can find it. Gradient
    clipping would turn it into NaN weights (l2norm: threshold / inf · inf) or clamp it
    into a finite value (absolute-value), so the check must come before clipping.
    """

    def __init__(self, step: int = 5) -> None:
        self.step = step

    def on_after_backward(self, trainer, pl_module) -> None:
        if trainer.global_step == self.step:
            first = next(p for p in pl_module.parameters() if p.grad is not None)
            first.grad.view(-1)[0] = float("inf")


class BrokenRaster:
    """Stands for a tile's image whose file broke after the dataset check: every read fails."""

    def __init__(self, shape, dtype, path="broken.tif") -> None:
        self.shape, self.dtype, self.ndim, self.path = shape, dtype, len(shape), path

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index):
        from segscale.data.storage.rasters import UnreadableWindowError

        raise UnreadableWindowError(f"{self.path}: rows 0-1 cannot be read (injected)", self.path)


class BreakTileAt(L.Callback):
    """After training step ``step``, tile ``tile`` of the training set can no longer be read.

    For runs without DataLoader workers (the tiles are the main process's).
    """

    def __init__(self, step: int = 2, tile: int = 1) -> None:
        self.step, self.tile = step, tile

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            from segscale.data.storage.tiles import Tile

            tiles = trainer.datamodule.train_set.tiles
            image = tiles[self.tile].image
            broken = BrokenRaster(image.shape, image.dtype, f"tile{self.tile}.tif")
            tiles[self.tile] = Tile(broken, tiles[self.tile].mask)
