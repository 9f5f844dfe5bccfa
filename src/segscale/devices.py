"""Devices: what ``trainer.devices`` asks for, what this machine has, ranks' cores and backend."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import ListConfig

from segscale.errors import ConfigError, require
from segscale.platforms.parallel import BackendError
from segscale.platforms.parallel import process_group_backend as platform_backend


def slurm_task_rank() -> bool:
    """Whether SLURM's ``srun`` started this process as one of several tasks (ranks).

    Not when torchrun, or segscale's own launcher (``LOCAL_RANK``), started it inside a task.
    """
    tasks = int(os.environ.get("SLURM_NTASKS", "1") or 1)
    return "SLURM_LOCALID" in os.environ and "LOCAL_RANK" not in os.environ and tasks > 1


@dataclass(frozen=True)
class CoreShare:
    """How the ranks of one node share this process's CPU cores."""

    ranks: int
    """The ranks that share them: 1 for a SLURM task, whose cores are its own."""
    granted: int | None = None
    """The cores SLURM granted this rank's task (``SLURM_CPUS_PER_TASK``), where it says."""
    slurm_task: bool = False

    def of(self, cores: int) -> int:
        """The share of ``cores`` that each rank takes (at least 1)."""
        return max(1, min(cores, self.granted or cores) // self.ranks)

    def describe(self) -> str:
        """Who shares the cores out, for log lines."""
        if not self.slurm_task:
            return f"shared by {self.ranks} rank(s) on this node"
        granted = f", SLURM_CPUS_PER_TASK={self.granted}" if self.granted else ""
        return f"not divided (SLURM started this rank as a task with cores of its own{granted})"


def core_share(ranks_per_node: int) -> CoreShare:
    """How the ``ranks_per_node`` ranks of this node share this process's cores.

    Only the cores one launcher gives all its ranks alike are divided: segscale's own
    (``strategy=ddp``'s rank 0), Lightning's ``ddp_spawn`` and torchrun start their ranks
    with their own affinity mask, so those ranks share it. SLURM starts each rank as a
    task with the CPUs it granted that task (``--cpus-per-task``, which its task binding
    makes the task's own mask): nothing to divide, and no more than that grant.
    """
    if not slurm_task_rank():
        return CoreShare(max(1, ranks_per_node))
    granted = os.environ.get("SLURM_CPUS_PER_TASK", "")
    count = int(granted) if re.fullmatch("[0-9]+", granted) else 0
    return CoreShare(1, count or None, slurm_task=True)


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


def process_group_backend(
    value: Any, accelerator: str, key: str, platform: str | None = None
) -> str:
    """The process-group backend of ranks on ``accelerator``: ``value`` (``key``'s), or null's.

    Null is this platform's choice for the device (``segscale.platforms.parallel``:
    NCCL between CUDA GPUs on Linux, gloo elsewhere). A backend the platform or the device
    lacks, or anything but the names ``nccl`` and ``gloo``, raises ``ConfigError`` naming
    ``key``, the platform and what it has, before any rank starts. ``platform``:
    ``sys.platform``'s value, this one's by default.
    """
    try:
        return platform_backend(value, resolve_accelerator(accelerator), platform)
    except BackendError as error:
        raise ConfigError(f"{key}={value!r} is not allowed: {error}") from None


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
