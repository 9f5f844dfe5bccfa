"""A run's wall time split into start-up, training, validation and the end; its steady rate.

Where a run's time goes before its first step: named phases on one clock
(``RunClock``), started when the process started.

Lightning's ``Timer`` measures the training stage (from the start of the train loop to
its end); what it does not measure is ours: the start-up's phases (``RunClock``), the
time to the first optimizer step, the validations summed (``Timer`` keeps only the
last one's), and the rate of each step. One clock for all: ``time.monotonic``, the
``Timer``'s.

Host clocks: on a GPU a step's end is the host's view of it, which for a rate over many
steps is the device's too (the host runs at most about a step ahead: the non-finite
check reads the previous step's verdict every step).
"""

from __future__ import annotations

import math
import time
from array import array
from typing import Any

from lightning.pytorch.callbacks import Timer

from segscale.platforms.processes import process_age

WARMUP_FRACTION = 0.1
"""The first tenth of a launch's optimizer steps (at least one) is its warm-up."""
MIN_STEADY_STEPS = 3
"""The steady rate needs at least this many optimizer steps after the warm-up."""


def warmup_steps(steps: int) -> int:
    """How many of ``steps`` optimizer steps the steady rate leaves out: a tenth, at least 1."""
    return max(1, math.ceil(WARMUP_FRACTION * steps))


class RunTimes:
    """The clocks of one launch, driven by the trainer's hooks in the order they run.

    Start-up runs from ``clock``'s origin until the first training batch is in hand;
    training from then until the training stage ends (``timer``'s end), less the
    validations; a validation from its start until training resumes (so the
    checkpoints written after it count with it); the end from the end of training until
    ``split`` is asked (the evaluation report, figures and ``summary.json``). ``timer``
    is the Lightning ``Timer`` the trainer calls (``RunSummary`` is one).
    """

    def __init__(self, timer: Timer, clock: RunClock | None = None) -> None:
        self.timer = timer
        self.clock = clock or RunClock()
        self.first_batch_at: float | None = None
        self.first_step_s: float | None = None  # time to the first step, from the origin
        self.validation_s = 0.0
        self._paused_at: float | None = None  # a validation's start
        # Per optimizer step: training seconds (validations excluded) and patches so far.
        self._step_s = array("d")
        self._step_patches = array("d")

    def batch_start(self) -> None:
        """A training batch starts: close the start-up, or the validation before it."""
        now = time.monotonic()
        if self.first_batch_at is None:
            self.clock.mark("workers and first batch")
            self.first_batch_at = now
        self._resume(now)

    def step_end(self, steps: int, patches: int) -> None:
        """A training batch ended with ``steps`` optimizer steps and ``patches`` trained."""
        if steps <= len(self._step_s) or self.first_batch_at is None:
            return  # accumulating gradients: no optimizer step yet
        now = time.monotonic()
        if self.first_step_s is None:
            self.clock.mark("first step")
            self.first_step_s = now - self.clock.origin
        self._step_s.append(now - self.first_batch_at - self.validation_s)
        self._step_patches.append(patches)

    def validation_start(self) -> None:
        """A validation (not the sanity check) starts: pause the training clock."""
        if self.first_batch_at is not None and self._paused_at is None:
            self._paused_at = time.monotonic()

    def train_end_at(self) -> float | None:
        """When the training stage ended (its last validation and checkpoint included).

        ``None`` while it runs (or a launch that failed in it).
        """
        return self.timer.end_time("train")

    def training_s(self) -> float:
        """The training stage of this launch (``Timer``'s), less the validations; 0 before it.

        From the start of the train loop (its workers' start included) to its end, or
        until now if it has not ended.
        """
        start = self.timer.start_time("train")
        if start is None:
            return 0.0
        end = self.train_end_at()
        return (end if end is not None else time.monotonic()) - start - self._validations(end)

    def _validations(self, end: float | None) -> float:
        """The validations so far, one still open counted until ``end`` (or now)."""
        if self._paused_at is None:
            return self.validation_s
        return self.validation_s + (end if end is not None else time.monotonic()) - self._paused_at

    def _resume(self, now: float) -> None:
        if self._paused_at is not None:
            self.validation_s += now - self._paused_at
            self._paused_at = None

    def steady_rate(self) -> float | None:
        """Patches/s over the steps after the warm-up; ``None`` with too few steps."""
        steps = len(self._step_s)
        first = warmup_steps(steps)
        if steps - first < MIN_STEADY_STEPS:
            return None
        seconds = self._step_s[-1] - self._step_s[first - 1]
        patches = self._step_patches[-1] - self._step_patches[first - 1]
        return patches / seconds if seconds > 0 else None

    def startup_line(self) -> str:
        """One line: the time to the first step and where it went."""
        phases = ", ".join(f"{name} {s:.1f} s" for name, s in self.clock.phases.items())
        first = self.first_step_s or 0.0
        return f"time to first step: {first:.1f} s from {self.clock.since} ({phases})"

    def split(self) -> dict[str, Any]:
        """The summary's timing keys, with the end measured until now."""
        now = time.monotonic()
        origin, first_batch = self.clock.origin, self.first_batch_at
        end = self.train_end_at()
        ended = end if end is not None else now
        validation = self._validations(end)
        startup = (first_batch if first_batch is not None else ended) - origin
        training = ended - first_batch - validation if first_batch is not None else 0.0
        rate = self.steady_rate()
        return {
            "time_to_first_step_s": _seconds(self.first_step_s),
            "time_measured_from": self.clock.since,
            "startup_phases_s": {k: round(v, 3) for k, v in self.clock.phases.items()},
            "time_split_s": {
                "startup": round(startup, 3),
                "training": round(training, 3),
                "validation": round(validation, 3),
                "end": round(now - ended, 3),
            },
            "steady_patches_per_s": None if rate is None else round(rate, 3),
            "steady_after_steps": warmup_steps(len(self._step_s)),
        }


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


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
