"""How DataLoader workers are started on each platform (``datamodule.worker_start_method``).

- ``fork``: the worker is a copy of its rank's process, made at once; POSIX only, and
  Python's default on Linux up to 3.13.
- ``spawn``: a fresh interpreter that imports segscale and receives the dataset
  pickled (its tiles by path: ``segscale.data.storage.mapped_arrays``); the only method Windows
  has, and the default on Windows and macOS (fork is unsafe there: system libraries
  may hold locks across it).
- ``forkserver``: workers forked from a clean server process; POSIX only, Python's
  default on Linux from 3.14.

``auto`` is the platform's default, as Python and torch would choose it.
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
