"""Running inference on one device or several, each rank taking its share of the images."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch
from lightning.fabric import Fabric
from lightning.fabric.strategies import DDPStrategy
from omegaconf import DictConfig

from segscale.devices import (
    available_devices,
    check_devices,
    devices_count,
    process_group_backend,
)

T = TypeVar("T")


BACKEND_KEY = "process_group_backend"
"""``predict.py``'s and ``evaluate.py``'s key for the backend of several devices' ranks."""


def inference_backend(cfg: DictConfig) -> str:
    """The ranks' backend ``cfg`` asks for (``process_group_backend``; null: this platform's).

    ``ConfigError`` naming the key for one the platform or the device lacks: asked before
    the checkpoint is read, so a bad value stops the run before any work.
    """
    return process_group_backend(cfg.process_group_backend, cfg.accelerator, BACKEND_KEY)


def run_on_devices(
    accelerator: str,
    devices: Any,
    backend: str,
    work: Callable[..., T],
    items: Sequence[Any],
    *args: Any,
) -> T:
    """Call ``work(fabric, items[rank::world], *args)`` on every rank; return rank 0's result.

    One device runs in this process; several are started as processes of their own
    (``ddp_spawn``: GPUs, or CPU processes with ``accelerator=cpu``), that talk through
    ``backend`` (``inference_backend``'s), so that a run writes one output folder.
    ``work`` may all-reduce through ``fabric``; what it returns must pickle by value
    (numpy, lists, paths; not tensors, which a spawned rank would hand back as shared
    memory that dies with it).

    Devices this machine lacks are refused first (``ConfigError`` naming ``accelerator``
    or ``devices``), before Lightning would fail on them with a message of its own.
    """
    check_devices(devices, accelerator, prefix="")
    count = devices_count(devices, available_devices(accelerator), key="devices")
    strategy: DDPStrategy | str = "auto"
    if count > 1:  # Fabric's ddp_spawn, with the backend given (its null is NCCL for GPUs)
        strategy = DDPStrategy(start_method="spawn", process_group_backend=backend)
    fabric = Fabric(accelerator=accelerator, devices=devices, strategy=strategy)
    return fabric.launch(_Share(work, items, args))


class _Share(Generic[T]):
    """``work`` on rank ``r`` of ``N`` with items ``r, r + N, …``.

    A plain object on purpose: Lightning's process launcher walks the arguments it is
    given and cannot rebuild frozen dataclasses (our pairs, the trained model), while it
    passes an object like this one through as it is.
    """

    def __init__(self, work: Callable[..., T], items: Sequence[Any], args: tuple) -> None:
        self.work = work
        self.items = items
        self.args = args

    def __call__(self, fabric: Fabric) -> T:
        """Run this rank's share, then leave the process group."""
        share = self.items[fabric.global_rank :: fabric.world_size]
        try:
            return self.work(fabric, share, *self.args)
        finally:
            # Fabric leaves a spawned rank's process group up; gloo's threads still
            # running when the process exits abort it now and then ("terminate called
            # without an active exception", SIGABRT), which failed the whole run.
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
