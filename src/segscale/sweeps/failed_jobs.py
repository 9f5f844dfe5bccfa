"""A grid sweep's failed jobs: named in a few lines at its end, and its exit status.

A job that its checks refused (``ConfigError``: alone, ``train.py`` exits 2) or that a
non-finite loss stopped (``NonFiniteError``: 3) is a failure the job has explained in
its own log. The sweep goes on with the other jobs, writes its summary, and ends with one
line per such job and the exit status of the first of them, never a traceback. A job
that ran in a process of its own (``hydra/launcher=parallel``) failed with the exit
status it reports (``JobFailedError``; its output's tail is in the sweep's log already).
Any other exception is a crash: the sweeper raises it, with its traceback.

Here, not among the plugins: Hydra runs every module of ``hydra_plugins`` again when it
scans for plugins, which would make a new ``JobFailedError`` class that an error raised
before the scan is no instance of.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from segscale.errors import EXIT_BAD_INPUT, ConfigError, RunStopped
from segscale.models.nonfinite import EXIT_NONFINITE, NonFiniteError

log = logging.getLogger(__name__)


class JobFailedError(RuntimeError):
    """A job that ran in a process of its own and exited with ``exit_code`` (not 0)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_status(error: BaseException) -> int | None:
    """The status ``train.py`` exits with for ``error`` alone; ``None``: a crash."""
    if isinstance(error, ConfigError):
        return EXIT_BAD_INPUT
    if isinstance(error, NonFiniteError):
        return EXIT_NONFINITE
    if isinstance(error, (JobFailedError, RunStopped)):
        return error.exit_code
    return None


@dataclass(frozen=True)
class FailedJob:
    """One job of a sweep that failed: its number, what set it apart, and why it failed."""

    number: int
    overrides: tuple[str, ...]
    """The job's overrides that not every job of the sweep has."""
    folder: str | None
    reason: str
    """The first line of the job's error."""
    exit_code: int


def failed_jobs(results: Sequence[JobReturn], first_number: int = 0) -> list[FailedJob]:
    """The jobs of ``results`` (numbered from ``first_number``) that failed as expected.

    Raises the error of the first job that crashed instead (``exit_status`` None), as
    Hydra's sweeper does, with its "Error executing job" line.
    """
    every_job = [set(result.overrides or ()) for result in results]
    shared = set.intersection(*every_job) if every_job else set()
    failed = []
    for number, result in enumerate(results, start=first_number):
        if result.status != JobStatus.FAILED:
            continue
        error = result._return_value
        code = exit_status(error) if isinstance(error, BaseException) else None
        if code is None:
            _ = result.return_value  # raises the crash after Hydra's line, as BasicSweeper does
            raise error  # (a failed job's return_value always raises)
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        own = tuple(o for o in result.overrides or () if o not in shared)
        failed.append(FailedJob(number, own, _folder(result), reason, code))
    return failed


def end_with_failures(failed: Sequence[FailedJob], jobs: int) -> None:
    """Log one line per failed job and exit with the first one's status (none failed: return)."""
    if not failed:
        return
    lines = [f"{len(failed)} of {jobs} job(s) of the sweep failed:"]
    for job in failed:
        where = ", ".join([*job.overrides, *([job.folder] if job.folder else [])])
        lines.append(f"  #{job.number}" + (f" ({where})" if where else "") + f": {job.reason}")
    log.error("%s", "\n".join(lines))
    sys.exit(failed[0].exit_code)


def _folder(result: JobReturn) -> str | None:
    """The job's run folder, when its Hydra config records it."""
    if result.hydra_cfg is None:
        return None
    folder = OmegaConf.select(
        result.hydra_cfg,
        "hydra.runtime.output_dir",
        default=None,
        throw_on_resolution_failure=False,
    )
    return str(folder) if folder else None
