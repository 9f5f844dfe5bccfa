"""Where a run's time goes before its first step: named phases on one clock.

The clock starts when the process started (read from the operating system, on Linux),
so that the interpreter's start, the imports and Hydra's config composition are
counted too; where the operating system does not say, or where an earlier run of the
same process (a sweep's in-process jobs, repeated ``segscale.train`` calls) already
counted them, it starts when ``train`` is called.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PROCESS_START = "process start"
TRAIN_CALL = "train() call"

_imports_done: float | None = None
"""When the command's module finished importing (``imports_done``), ``time.monotonic``."""


def imports_done() -> None:
    """Mark now as the end of this process's imports; a command's module calls it once.

    The first run's clock then splits its first phase in two: the interpreter's start
    and the imports, then Hydra's config composition and run folder up to ``train``.
    """
    global _imports_done
    if _imports_done is None:
        _imports_done = time.monotonic()


def process_age() -> float | None:
    """Seconds since this process started, from ``/proc`` (Linux); ``None`` elsewhere."""
    try:
        stat = Path("/proc/self/stat").read_text()
        # Field 22, starttime, in clock ticks since boot; fields after the command's ")".
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        ticks_per_s = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return max(0.0, since_boot - ticks / ticks_per_s)


class RunClock:
    """The start-up of one run: its origin and the phases ``mark`` closes, in order.

    ``mark(name)`` attributes the time since the previous mark (or the origin) to the
    phase ``name``. Times are ``time.monotonic`` seconds, the clock of Lightning's
    ``Timer`` (whose training-stage times ``RunTimes`` reads).
    """

    # The first run of a process counts the process's start; later ones their own call.
    _process_start_counted = False

    def __init__(self) -> None:
        now = time.monotonic()
        age = None if RunClock._process_start_counted else process_age()
        RunClock._process_start_counted = True
        self.since = TRAIN_CALL if age is None else PROCESS_START
        self.origin = now - (age or 0.0)
        self.phases: dict[str, float] = {}
        self._last = self.origin
        if age is not None and _imports_done is not None and self.origin <= _imports_done:
            self.phases["python, imports"] = _imports_done - self.origin
            self._last = _imports_done
            self.mark("config, run folder")
        elif age is not None:
            self.mark("python, imports, config")

    def mark(self, phase: str) -> None:
        """Close ``phase`` now: the time since the previous mark is its (added to any)."""
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now

    def elapsed(self) -> float:
        """Seconds since the origin."""
        return time.monotonic() - self.origin
