"""Which process-group backend this config's GPU ranks would use: NCCL, or gloo.

NCCL exists on Linux only (WSL2 is Linux), so on Windows DDP's GPU ranks all-reduce over
gloo, through host memory (``segscale.bench.host_staged_link``); on Linux they do when
the config asks for gloo (``strategy.process_group_backend=gloo``). bench predicts gloo's
link where the ranks would use it, and NCCL's beside it (what Linux or WSL2 would give).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from segscale.errors import ConfigError

KEY = "strategy.process_group_backend"
BACKENDS = ("nccl", "gloo")
"""The values bench accepts for ``KEY`` besides null (the platform's choice)."""

PLATFORM_NAMES = {"win32": "Windows", "darwin": "macOS", "linux": "Linux"}
"""``sys.platform``'s names as messages give them."""


@dataclass(frozen=True)
class GpuBackend:
    """The backend of the GPU ranks, and why it is that one (for the verdict)."""

    name: str
    """``nccl`` or ``gloo``."""
    reason: str
    """Why, in a few words: the platform, or the config key that chose it."""


def gpu_backend(process_group_backend: str | None, platform: str | None = None) -> GpuBackend:
    """The backend GPU ranks use with ``strategy.process_group_backend`` on ``platform``.

    ``None`` (the config's null) is the platform's choice: NCCL on Linux, gloo elsewhere
    (Windows: ``win32``), where there is no NCCL. ``nccl`` off Linux and any value but
    these two are refused (``ConfigError``, naming the key); names are taken in any case,
    as ``torch.distributed.Backend`` takes them. ``platform`` defaults to
    ``sys.platform``. The platform module (issue 47, item 1) will own this choice; until
    it lands, bench makes it here from the config and ``sys.platform``.
    """
    platform = sys.platform if platform is None else platform
    system = PLATFORM_NAMES.get(platform, platform)
    if isinstance(process_group_backend, str):
        process_group_backend = process_group_backend.lower()
    if process_group_backend is None:
        if platform == "linux":
            return GpuBackend("nccl", "NCCL on Linux")
        return GpuBackend("gloo", f"{system} has no NCCL")
    if process_group_backend not in BACKENDS:
        raise ConfigError(
            f"{KEY}={process_group_backend!r} is not a backend bench can predict: expected "
            f"null (the platform's), {' or '.join(BACKENDS)}"
        )
    if process_group_backend == "nccl" and platform != "linux":
        raise ConfigError(
            f"{KEY}=nccl: {system} has no NCCL (Linux only); set it to gloo or null "
            f"(gloo here), or train in WSL2 or on Linux for NCCL"
        )
    return GpuBackend(process_group_backend, f"{KEY}={process_group_backend}")
