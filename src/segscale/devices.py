"""Devices: what ``trainer.devices`` asks for, what this machine has, and its CPU cores."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from omegaconf import ListConfig

from segscale.errors import ConfigError, require


def cpus_available() -> int:
    """CPU cores this process may run on (its affinity mask, as SLURM and taskset set it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def is_device_list(devices: Any) -> bool:
    """Whether ``trainer.devices`` lists device indices (``[0, 2]``) rather than a count."""
    return isinstance(devices, (list, tuple, ListConfig))


def devices_count(devices: Any, available: int | None = None, key: str = "trainer.devices") -> int:
    """Number of devices that ``trainer.devices`` (or ``key``) asks for on this node.

    Accepts a positive count, ``-1`` or ``"auto"`` (all ``available``), or a list of
    distinct device indices such as ``[0, 2]``, as Lightning does.
    """
    expected = "a positive count, -1 or 'auto' (all devices), or a list of indices such as [0,2]"
    if is_device_list(devices):
        indices = list(devices)
        ok = bool(indices) and all(isinstance(i, int) and i >= 0 for i in indices)
        require(devices, key, lambda _: ok and len(set(indices)) == len(indices), expected)
        return len(indices)
    if devices in ("auto", -1, "-1"):
        return max(1, available or 1)
    if isinstance(devices, str) and devices.isdigit():
        devices = int(devices)
    require(devices, key, lambda v: isinstance(v, int) and v >= 1, expected)
    return devices


def resolve_accelerator(accelerator: str) -> str:
    """The concrete accelerator (``cuda``, ``mps`` or ``cpu``) that ``accelerator`` means."""
    if accelerator in ("gpu", "cuda"):
        return "cuda"
    if accelerator == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    return accelerator


def available_devices(accelerator: str) -> int:
    """How many devices of ``accelerator`` this machine has (1 for the CPU)."""
    kind = resolve_accelerator(accelerator)
    if kind == "cuda":
        return torch.cuda.device_count()
    return 1


def check_devices(devices: Any, accelerator: str, prefix: str = "trainer.") -> None:
    """Raise ``ConfigError`` unless ``devices`` names devices this machine has.

    ``prefix`` is where the two keys sit, for messages: ``trainer.`` for ``train.py``,
    nothing for ``predict.py`` and ``evaluate.py``.
    """
    kind = resolve_accelerator(accelerator)
    listed = is_device_list(devices)
    devices_key, accelerator_key = f"{prefix}devices", f"{prefix}accelerator"
    if kind != "cuda":
        if listed:
            raise ConfigError(
                f"{devices_key}={shown_devices(devices)} lists device indices, "
                "which only GPUs have; "
                f"with {accelerator_key}={accelerator} ({kind}) give a count of processes, "
                f"e.g. {devices_key}=2"
            )
        return
    available = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    if available == 0:
        # Not the count's fault: no GPU at all (no driver, none in CUDA_VISIBLE_DEVICES).
        raise ConfigError(
            f"{accelerator_key}={accelerator}: no GPU is visible to this process "
            f"(torch.cuda.is_available() is {torch.cuda.is_available()}, "
            f"CUDA_VISIBLE_DEVICES={visible}); to run on the CPU give "
            f"{accelerator_key}=cpu (or auto, which takes a GPU when there is one)"
        )
    wanted = list(devices) if listed else []
    missing = [i for i in wanted if i >= available]
    count = devices_count(devices, available, devices_key)
    if missing or count > available:
        raise ConfigError(
            f"{devices_key}={shown_devices(devices)} asks for GPU(s) this machine "
            "does not have: it "
            f"has {available} (indices 0..{available - 1}; CUDA_VISIBLE_DEVICES={visible} "
            "numbers them from 0)"
        )


def shown_devices(value: Any) -> Any:
    """``trainer.devices`` as written (a list, not a ListConfig), for messages."""
    return list(value) if is_device_list(value) else value


def included_devices(devices: Any, accelerator: str, count: int, included: Sequence[int]) -> Any:
    """``trainer.devices`` (``count`` devices) narrowed to the positions in ``included``.

    GPUs keep their indices; on CPUs the result is a count of processes.
    """
    if resolve_accelerator(accelerator) != "cuda":
        return len(included)
    indices = list(devices) if is_device_list(devices) else list(range(count))
    return [indices[position] for position in included]
