"""Figures drawn on a thread of their own, so that drawing holds neither training nor its end.

A figure takes a second or more to draw (a large sample-prediction figure several on a
busy CPU); drawn in the hook that asks for it, it would stop training at every
validation and add its time to the run's end. Each ``BackgroundFigures`` draws on one
thread, one figure after the other in the order asked; the figures themselves use
matplotlib's object-oriented API (``segscale.training.reporting.plots``), never pyplot's
global state, which is not thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

log = logging.getLogger(__name__)


class BackgroundFigures:
    """Draws figures one at a time on a thread of its own; ``wait`` until all are written.

    A figure that fails to draw is logged as an error naming its file, and nothing
    else happens: a figure never costs the run its result. The thread is a daemon:
    a process that ends without ``wait`` (a crash, a kill) does not hang on it, and
    the file, written atomically, is then the previous one or none.
    """

    def __init__(self, name: str = "figures") -> None:
        self.name = name
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def draw(self, path: Path, write: Callable[[], None]) -> None:
        """Run ``write`` (which writes the figure at ``path``) on the drawing thread."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"segscale-{self.name}")
        future = self._executor.submit(write)
        future.add_done_callback(partial(_log_failure, path))
        self._pending = [f for f in self._pending if not f.done()] + [future]

    def wait(self) -> None:
        """Return once every figure asked for is written (or its failure logged)."""
        for future in self._pending:
            future.exception()  # waits; the failure is logged by _log_failure
        self._pending = []

    def close(self) -> None:
        """``wait``, then end the drawing thread."""
        self.wait()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def _log_failure(path: Path, future: Future[None]) -> None:
    if (error := future.exception()) is not None:
        log.error("could not draw %s: %s: %s", path, type(error).__name__, error)
