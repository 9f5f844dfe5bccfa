"""Running inference on one device or several, each rank taking its share of the images."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from lightning.fabric import Fabric

from segscale.checks import devices_count
from segscale.training.launch import available_devices

T = TypeVar("T")


def run_on_devices(
    accelerator: str, devices: Any, work: Callable[..., T], items: Sequence[Any], *args: Any
) -> T:
    """Call ``work(fabric, items[rank::world], *args)`` on every rank; return rank 0's result.

    One device runs in this process; several are started as processes of their own
    (``ddp_spawn``: GPUs, or CPU processes with ``accelerator=cpu``), so that a run
    writes one output folder. ``work`` may all-reduce through ``fabric``.
    """
    count = devices_count(devices, available_devices(accelerator), key="devices")
    strategy = "ddp_spawn" if count > 1 else "auto"
    fabric = Fabric(accelerator=accelerator, devices=devices, strategy=strategy)
    return fabric.launch(_share, work, items, *args)


def _share(fabric: Fabric, work: Callable[..., T], items: Sequence[Any], *args: Any) -> T:
    """Rank ``r`` of ``N`` takes items ``r, r + N, …``."""
    return work(fabric, items[fabric.global_rank :: fabric.world_size], *args)
