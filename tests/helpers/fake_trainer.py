"""What the datamodule reads of a Lightning trainer, for a loader tested without one."""

from __future__ import annotations

from types import SimpleNamespace

from lightning.pytorch.accelerators import CPUAccelerator


def fake_trainer() -> SimpleNamespace:
    """A trainer of one CPU process at the start of epoch 0 (``restore`` moves it)."""
    progress = SimpleNamespace(current=SimpleNamespace(ready=0))
    return SimpleNamespace(
        current_epoch=0,
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
        global_rank=0,
        world_size=1,
        num_devices=1,
        accelerator=CPUAccelerator(),
    )


def restore(trainer: SimpleNamespace, epoch: int, batches_done: int) -> None:
    """Where Lightning's restore of a checkpoint leaves ``trainer``: its epoch, its batch count."""
    trainer.current_epoch = epoch
    trainer.fit_loop.epoch_loop.batch_progress.current.ready = batches_done
