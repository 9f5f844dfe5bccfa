"""Which process-group backend this config's GPU ranks would use: NCCL, or gloo.

NCCL exists on Linux only (WSL2 is Linux), so on Windows DDP's GPU ranks all-reduce over
gloo, through host memory (``segscale.bench.host_staged_link``); on Linux they do when
the config asks for gloo (``strategy.process_group_backend=gloo``). bench predicts gloo's
link where the ranks would use it, and NCCL's beside it (what Linux or WSL2 would give).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from segscale.devices import process_group_backend
from segscale.platforms import platform_name

KEY = "strategy.process_group_backend"


@dataclass(frozen=True)
class GpuBackend:
    """The backend of the GPU ranks, and why it is that one (for the verdict)."""

    name: str
    """``nccl`` or ``gloo``."""
    reason: str
    """Why, in a few words: the platform, or the config key that chose it."""


def gpu_backend(value: object, platform: str | None = None) -> GpuBackend:
    """The backend GPU ranks use with ``strategy.process_group_backend=value`` on ``platform``.

    The choice and its checks are training's (``segscale.platforms.parallel``,
    through ``segscale.devices.process_group_backend``), so bench predicts the backend
    its ddp runs and the user's own runs take, for CUDA GPUs whatever this machine has:
    null is NCCL on Linux, gloo elsewhere; a backend the platform lacks, or anything but
    ``nccl`` and ``gloo``, raises ``ConfigError`` naming the key. ``platform`` defaults
    to ``sys.platform``.
    """
    platform = sys.platform if platform is None else platform
    name = process_group_backend(value, "cuda", KEY, platform)
    if value is not None:
        return GpuBackend(name, f"{KEY}={name}")
    if name == "nccl":
        return GpuBackend(name, "NCCL on Linux")
    return GpuBackend(name, f"{platform_name(platform)} has no NCCL")
