"""The backends ranks' process groups can use, per platform and device, and the default.

NCCL moves CUDA tensors between GPUs, on Linux only: PyTorch's Windows and macOS builds
have none (``torch.distributed.is_nccl_available()`` is false there), and NCCL moves no
CPU tensors. gloo runs on every platform and device, GPUs included (through host
memory: slower than NCCL between the same GPUs). So ranks on CUDA GPUs on Linux have
NCCL and gloo, NCCL by default; every other rank has gloo alone. WSL2 is Linux
(``sys.platform`` is ``linux`` there): the way to NCCL on a Windows machine.

Only the two names as written here are accepted, lower case and nothing around them:
torch would also take ``NCCL`` and per-device forms (``cpu:gloo,cuda:nccl``), which a
run here has no use for (every collective of the default group moves tensors of the
rank's one device).
"""

from __future__ import annotations

import sys

from segscale.platforms import WINDOWS, platform_name

NCCL = "nccl"
GLOO = "gloo"


class BackendError(ValueError):
    """A process-group backend the platform or the device does not have, or no backend."""


def process_group_backends(device: str, platform: str | None = None) -> tuple[str, ...]:
    """The backends ranks on ``device`` (``cuda``, ``mps``, ``cpu``) have on ``platform``.

    The default (``default_process_group_backend``) first. ``platform``: ``sys.platform``'s
    value, this one's by default.
    """
    platform = sys.platform if platform is None else platform
    if device == "cuda" and platform.startswith("linux"):
        return (NCCL, GLOO)
    return (GLOO,)


def default_process_group_backend(device: str, platform: str | None = None) -> str:
    """The backend ranks on ``device`` use on ``platform`` unless told otherwise."""
    return process_group_backends(device, platform)[0]


def process_group_backend(value: object, device: str, platform: str | None = None) -> str:
    """``value`` if ranks on ``device`` have that backend on ``platform``; ``None``: the default.

    Raises ``BackendError``, saying what the ranks have, for anything else.
    """
    platform = sys.platform if platform is None else platform
    backends = process_group_backends(device, platform)
    if value is None:
        return backends[0]
    if isinstance(value, str) and value in backends:
        return value
    where = platform_name(platform)
    has = f"ranks on {device} devices on {where} have {' or '.join(backends)}"
    default = f"null picks {backends[0]}"
    if value == NCCL and where != "Linux":
        wsl = "; for NCCL between its GPUs, run under WSL2" if platform == WINDOWS else ""
        raise BackendError(
            f"{where} has no NCCL (PyTorch has it on Linux only); {has} ({default}){wsl}"
        )
    if value == NCCL:
        raise BackendError(f"NCCL moves tensors between CUDA GPUs only; {has} ({default})")
    raise BackendError(f"not a process-group backend; {has} ({default})")
