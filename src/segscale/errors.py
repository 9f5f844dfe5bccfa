"""The errors an entry point ends with: bad input (and the check that raises it), a full disk.

Each bad input names the config key, the value it got and what is allowed, so a user can
fix the override without reading code.

A full disk (or the user's quota) surfaces as an ``OSError`` somewhere in the exception
that ends a run, possibly wrapped (``CheckpointWriteError``) or followed by the failure
of a later write (the summary of the failed run): ``disk_full_error`` finds it, and the
entry points (``train.py``, ``predict.py``, ``evaluate.py``) end with
``disk_full_message`` and ``EXIT_DISK_FULL`` instead of a traceback
(``full_disk_ends_command``). Any other ``OSError`` is a crash, traceback and all.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


log = logging.getLogger(__name__)

FULL = (errno.ENOSPC, errno.EDQUOT)
"""The errors of a write to a full disk, or past the user's quota."""

EXIT_DISK_FULL = 74
"""Exit status of a run stopped by a full disk (``EX_IOERR`` of ``sysexits.h``, whose
``EX_TEMPFAIL``, 75, is a preempted run's)."""


def disk_full_error(error: BaseException) -> OSError | None:
    """The full-disk ``OSError`` in ``error``'s chain of causes and contexts that says most.

    The earliest in the chain that names its file (or, if none does, the earliest): the
    write that met the full disk, whose later failures (a wrapper, a retry, the report
    of the failure) follow from it.
    """
    full = [
        current
        for current in _chain(error)
        if isinstance(current, OSError) and current.errno in FULL
    ]
    named = [current for current in full if current.filename]
    return (named or full)[-1] if full else None


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and what it was raised from or while handling, to the first (no cycles)."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def disk_full_message(error: OSError, folder: str, hint: str) -> str:
    """What could not be written, where, why, and ``hint``: what to do then."""
    what = f"{error.filename}" if error.filename else "a file"
    reason = (error.strerror or "no space left on device").lower()
    return f"{what} could not be written: {reason}\n  the output folder: {folder}\n  {hint}"


@contextmanager
def full_disk_ends_command(folder: str, hint: str) -> Iterator[None]:
    """A command's block: a full disk met inside ends it in a few lines, ``EXIT_DISK_FULL``.

    ``folder`` is the command's output folder and ``hint`` what to do, both for the
    message; any other ``OSError`` goes on up (a crash).
    """
    try:
        yield
    except OSError as error:
        full = disk_full_error(error)
        if full is None:
            raise
        log.error("%s", disk_full_message(full, folder, hint))
        raise SystemExit(EXIT_DISK_FULL) from None
