"""``strategy=single``: one process on one device, the strategy Lightning is given."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import SingleDeviceStrategy

from segscale.devices import (
    available_devices,
    devices_count,
    is_device_list,
    resolve_accelerator,
    shown_devices,
)
from segscale.errors import ConfigError


def single_device_strategy(accelerator: str = "auto", devices: Any = 1) -> SingleDeviceStrategy:
    """One process on one device; an error that names ``strategy=ddp`` for more."""
    count = devices_count(devices, available_devices(accelerator))
    if count != 1:
        raise ConfigError(
            f"strategy=single runs one process on one device, but "
            f"trainer.devices={shown_devices(devices)} asks for {count}; use strategy=ddp "
            "(or strategy=ddp_spawn) to train on several devices"
        )
    kind = resolve_accelerator(accelerator)
    if kind == "cpu":
        return SingleDeviceStrategy(device=torch.device("cpu"))
    index = next(iter(devices)) if is_device_list(devices) else 0
    return SingleDeviceStrategy(device=torch.device(kind, index))
