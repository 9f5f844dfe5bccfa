"""Where a run's time goes before its first step: named phases on one clock.

The clock starts when the process started (read from the operating system:
``segscale.platforms.processes.process_age``), so that the interpreter's start, the
imports and Hydra's config composition are counted too; where the operating system
does not say, or where an earlier run of the same process (a sweep's in-process jobs,
repeated ``segscale.train`` calls) already counted them, it starts when ``train`` is
called.
"""

from __future__ import annotations

import time

from segscale.platforms.processes import process_age

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
