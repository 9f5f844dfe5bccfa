"""The error every entry point reports as bad input, and the check that raises it.

Each failure names the config key, the value it got and what is allowed, so a user can
fix the override without reading code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import ListConfig


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and what is allowed."""


EXIT_BAD_INPUT = 2
"""Exit status of every entry point that refuses a bad value, file or folder."""


def require(value: Any, key: str, ok: Callable[[Any], bool], expected: str) -> None:
    """Raise ``ConfigError`` naming ``key`` unless ``ok(value)`` (a bool is never allowed)."""
    if isinstance(value, bool) or not ok(value):
        shown = list(value) if isinstance(value, ListConfig) else value
        raise ConfigError(f"{key}={shown!r} is not allowed: expected {expected}")


def integer_at_least(minimum: int) -> Callable[[Any], bool]:
    """A check for ``require``: an integer ``>= minimum`` (a bool is refused by ``require``)."""
    return lambda v: isinstance(v, int) and v >= minimum


class RunStopped(Exception):  # noqa: N818 (a stop on purpose, not an error)
    """A run stopped on purpose before it finished, on every rank at the same step.

    Not a failure: ``summary.json`` records ``status`` (``preempted``, ``pruned``) and
    ``details``, and the entry point exits with ``exit_code``. Every rank raises it
    alike, so rank 0's own is the one reported.
    """

    status = "stopped"
    exit_code = 1

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details
