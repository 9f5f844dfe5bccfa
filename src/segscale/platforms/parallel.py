"""What differs in parallel work: how DataLoader workers start, which backends ranks use.

Workers' start methods (``datamodule.worker_start_method``):

- ``fork``: the worker is a copy of its rank's process, made at once; POSIX only, and
  Python's default on Linux up to 3.13.
- ``spawn``: a fresh interpreter that imports segscale and receives the dataset
  pickled (its tiles by path: ``segscale.data.storage.mapped_arrays``); the only method Windows
  has, and the default on Windows and macOS (fork is unsafe there: system libraries
  may hold locks across it).
- ``forkserver``: workers forked from a clean server process; POSIX only, Python's
  default on Linux from 3.14.

``auto`` is the platform's default, as Python and torch would choose it.

Ranks' process-group backends: NCCL moves CUDA tensors between GPUs, on Linux only:
PyTorch's Windows and macOS builds have none (``torch.distributed.is_nccl_available()``
is false there), and NCCL moves no CPU tensors. gloo runs on every platform and device,
GPUs included (through host memory: slower than NCCL between the same GPUs). So ranks on
CUDA GPUs on Linux have NCCL and gloo, NCCL by default; every other rank has gloo alone.
WSL2 is Linux (``sys.platform`` is ``linux`` there): the way to NCCL on a Windows
machine. Only the two names as written here are accepted, lower case and nothing around
them: torch would also take ``NCCL`` and per-device forms (``cpu:gloo,cuda:nccl``),
which a run here has no use for (every collective of the default group moves tensors of
the rank's one device).
"""

from __future__ import annotations

import multiprocessing
import sys

from segscale.platforms import MACOS, WINDOWS, platform_name

KEY = "datamodule.worker_start_method"
AUTO = "auto"
POSIX_METHODS = ("fork", "spawn", "forkserver")
WINDOWS_METHODS = ("spawn",)


class StartMethodError(ValueError):
    """A start method the platform does not have, or no start method at all.

    Its message names the key and the platform; the config check reports it as a
    ``ConfigError`` (this bottom layer knows no config errors).
    """


def start_methods(platform: str | None = None) -> tuple[str, ...]:
    """The start methods ``platform`` (default: this one; a ``sys.platform`` value) has."""
    platform = sys.platform if platform is None else platform
    return WINDOWS_METHODS if platform == WINDOWS else POSIX_METHODS


def default_start_method(platform: str | None = None) -> str:
    """What ``auto`` means on ``platform`` (default: this one): the method Python would use.

    On this platform, a method the program set already (``multiprocessing.set_start_method``)
    is kept; else spawn on Windows and macOS, fork on Linux up to Python 3.13 and
    forkserver from 3.14 (Python's own defaults).
    """
    if platform is None:
        chosen = multiprocessing.get_start_method(allow_none=True)
        if chosen is not None:
            return chosen
        platform = sys.platform
    if platform in (WINDOWS, MACOS):
        return "spawn"
    return "forkserver" if sys.version_info >= (3, 14) else "fork"


def worker_start_method(value: object, platform: str | None = None, key: str = KEY) -> str:
    """The start method ``value`` (a config value) names on ``platform`` (default: this one).

    ``auto`` is ``default_start_method``'s. A value that is not one of ``fork``,
    ``spawn``, ``forkserver``, ``auto``, or a method the platform lacks (fork and
    forkserver on Windows), raises ``StartMethodError`` naming ``key``, the platform and the
    values it has.
    """
    has = start_methods(platform)
    if value == AUTO:
        return default_start_method(platform)
    if isinstance(value, str) and value in has:
        return value
    allowed = ", ".join((*has, AUTO))
    lacks = (
        f"{platform_name(platform)} has no {value!r} start method"
        if isinstance(value, str) and value in POSIX_METHODS
        else f"not a start method {platform_name(platform)} has"
    )
    raise StartMethodError(f"{key}={value!r} is not allowed: {lacks}; expected one of {allowed}")


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
