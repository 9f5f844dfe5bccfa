"""Progress of a long pass (images evaluated, files checked, batches, bench's measurements).

On a terminal it is tqdm's bar. Written to a file or a pipe (a cluster's job log,
``> run.log 2>&1``) a bar's redraws would land between the log lines, so there it is a
log line now and then instead: every ``1 / LOG_STEPS`` of the total or
``LOG_EVERY_S`` seconds, whichever comes first, with the count, the time so far and
an estimate of the time left; never one per item. A pass shorter than ``QUIET_S``
shows nothing (a small data set's checks would only add lines).

An item may be done in parts (``update(0.25)``: a quarter of a large image), and the
caller may say where the pass is inside the current item (``detail``: its row of tiles,
the rate), in the bar's postfix and in the lines; or name each item as it is done
(``progress("compute")``: bench's measurements).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

LOG_STEPS = 10
"""A progress line in a log at every tenth of the way."""

LOG_EVERY_S = 30.0
"""... or after this many seconds without one."""

QUIET_S = 5.0
"""Nothing is shown in a pass's first seconds: a short one shows no progress at all."""


class Progress:
    """Progress through ``total`` items of ``what`` (``"images evaluated"``).

    ``stream``: where a terminal shows the bar (stderr); ``log``: where the lines go
    when that stream is not a terminal; None: neither (another rank's share, say).
    ``clock``: seconds, for the lines' times. ``every_s``: the longest time between two
    lines (``LOG_EVERY_S``). ``detail``: where the pass is inside the current item, set by
    the caller before an ``update``.
    """

    def __init__(
        self,
        total: int,
        what: str,
        log: logging.Logger | None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = LOG_EVERY_S,
    ) -> None:
        stream = sys.stderr if stream is None else stream
        self.total, self.what, self.log = total, what, log
        self.done: float = 0
        self.detail = ""
        self.every_s = every_s
        self.clock = clock
        self.start = self.last_line = clock()
        self.next_step = 1  # the next step of the way (in LOG_STEPS) that logs a line
        on_terminal = log is not None and stream.isatty()
        self.quiet_s = QUIET_S
        self.bar = (
            tqdm(total=total, desc=what, file=stream, leave=False, delay=self.quiet_s)
            if on_terminal
            else None
        )

    def update(self, count: float = 1) -> None:
        """``count`` more items are done (a fraction: part of one)."""
        self.done += count
        if self.bar is not None:
            if self.detail:
                self.bar.set_postfix_str(self.detail, refresh=False)
            self.bar.update(count)
            return
        if self.log is None:
            return
        now = self.clock()
        if now - self.start < self.quiet_s:
            return
        # Whole numbers: a tenth of the way is reached exactly, not missed by rounding.
        step_reached = self.done * LOG_STEPS >= self.next_step * self.total
        if step_reached or now - self.last_line >= self.every_s:
            self.log.info("%s", self.line(now))
            self.last_line = now
            self.next_step = int(self.done * LOG_STEPS // max(self.total, 1)) + 1

    def __call__(self, done: str) -> None:
        """One more item is done, named ``done`` (the ``detail`` until the next)."""
        self.detail = done
        self.update(1)

    def line(self, now: float) -> str:
        """``"images evaluated: 3/10 (30%), 0:12 so far, about 0:28 left"``.

        Items done in part count whole once done; the ``detail`` follows the counts.
        """
        elapsed = now - self.start
        text = f"{self.what}: {int(self.done + 1e-9)}/{self.total}"
        if self.total:
            text += f" ({int(100 * self.done / self.total + 1e-9)}%)"
        if self.detail:
            text += f", {self.detail}"
        text += f", {tqdm.format_interval(elapsed)} so far"
        if 0 < self.done < self.total:
            left = elapsed / self.done * (self.total - self.done)
            text += f", about {tqdm.format_interval(left)} left"
        return text

    def close(self) -> None:
        """Remove the bar (a log has had its lines)."""
        if self.bar is not None:
            self.bar.close()
