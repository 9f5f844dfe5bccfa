"""A run's DataLoader worker processes end with the run, however it ends.

Lightning shuts the workers down when a stage ends, and on an exception only those of
the loop it takes for the active one: a failure during the validation inside ``fit``
(a non-finite validation loss, say) leaves the training loader's persistent workers
running. At exit torch no longer shuts them down (its own exit hook has run by then),
and multiprocessing terminates and joins them with a ``SIGTERM`` that workers ignore
(``segscale.data.sampling.loaders.init_worker``): the process would wait for them forever.
So on leaving the run, the fit loop is torn down whatever happened, which shuts its
loaders' workers down, and any worker process the run started that is still alive
after that is killed: a worker holds no state of its own.
"""

from __future__ import annotations

import logging
import multiprocessing
from types import TracebackType
from typing import Any

import lightning as L

from segscale.platforms.signals import child_exits_unwatched

log = logging.getLogger(__name__)

KILL_WAIT_S = 5.0
"""Seconds to wait for a killed worker to be gone (the kernel's part; instant in practice)."""


class WorkersEndWithRun:
    """Context: every worker process started inside it is gone when it is left.

    ``follow`` names the trainer whose loops' workers to shut down first, the way
    Lightning does at the end of a stage.
    """

    def __init__(self) -> None:
        self.trainer: L.Trainer | None = None
        self._before: set[int | None] = set()

    def __enter__(self) -> WorkersEndWithRun:
        self._before = {process.pid for process in multiprocessing.active_children()}
        return self

    def follow(self, trainer: L.Trainer) -> None:
        """Shut down the workers of ``trainer``'s loops on leaving."""
        self.trainer = trainer

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.trainer is not None:
            # Tears down the training loader and the validation loop's: harmless where
            # Lightning did it already (each loop forgets its fetcher once torn down).
            self.trainer.fit_loop.teardown()
        left = [p for p in multiprocessing.active_children() if p.pid not in self._before]
        if left:
            log.warning("stopping %d DataLoader worker(s) that outlived the run", len(left))
            _kill(left)


def _kill(processes: list[Any]) -> None:
    """Kill ``processes`` (multiprocessing children) and reap them.

    A worker still registered with torch's ``SIGCHLD`` handler would make it raise in
    this thread ("worker exited unexpectedly"): the handler is set aside meanwhile.
    """
    with child_exits_unwatched():
        for process in processes:
            process.kill()
        for process in processes:
            process.join(timeout=KILL_WAIT_S)
