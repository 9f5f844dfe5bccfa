"""The error a failed run's console output names: the first one, in the words it gave.

A ``train.py`` run that fails says why in one of a few forms, in the order it met them
(stdout and stderr as one stream): a log record at ERROR (segscale's refusals, exit 2
and 3), an ``Error: ...`` line (an override refused before Hydra starts), a Python
traceback (the line that names the exception ends it), or Hydra's own message when the
config does not compose (``Could not find 'datamodule/classes/mine'``), printed before
its last line, ``Set the environment variable HYDRA_FULL_ERROR=1 ...``, which names no
error at all.
"""

from __future__ import annotations

import re

HYDRA_HINT = "Set the environment variable HYDRA_FULL_ERROR=1"
"""The start of the line Hydra ends every error with (its advice, not the error)."""

LOG_RECORD = re.compile(r"^\[[^\]]*\]\[[^\]]*\]\[(?P<level>[A-Z]+)\] - (?P<message>.*)$")
"""A record in Hydra's console format: ``[time][logger][LEVEL] - message``."""

WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")
"""Python's warning line (``path:line: Category: message``); its source line follows indented."""

TRACEBACK = "Traceback (most recent call last):"
HYDRA_JOB_ERROR = "Error executing job with overrides:"  # Hydra's line before a traceback
REFUSED = "Error: "  # segscale's refusal before Hydra starts (a moved key)


def first_error(console: str) -> str | None:
    """The first error ``console`` names (module docstring); ``None`` if it names none."""
    lines = console.splitlines()
    last_record = -1
    for index, line in enumerate(lines):
        record = LOG_RECORD.match(line)
        if record:
            if record["level"] in ("ERROR", "CRITICAL"):
                return record["message"].strip()
            last_record = index
        elif line.startswith(TRACEBACK):
            return _exception_line(lines[index + 1 :]) or line
        elif line.startswith(REFUSED):
            return line[len(REFUSED) :].strip()
    if any(line.startswith(HYDRA_HINT) for line in lines):
        return _hydra_message(lines[last_record + 1 :])
    return None


def _exception_line(lines: list[str]) -> str | None:
    """The line that ends a traceback: the first one not indented (its frames are)."""
    return next((line.strip() for line in lines if line.strip() and not line[0].isspace()), None)


def _hydra_message(lines: list[str]) -> str | None:
    """The first line of Hydra's message: not a warning, its source line, or the hint."""
    for line in lines:
        if not line.strip() or line[0].isspace() or WARNING.match(line):
            continue
        if line.startswith(HYDRA_HINT) or line.startswith(HYDRA_JOB_ERROR):
            continue
        return line.strip()
    return None
