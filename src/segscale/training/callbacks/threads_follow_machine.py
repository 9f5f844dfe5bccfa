"""``training.threads=auto`` while training: the thread count follows the machine's load.

The start-up's number (``segscale.training.ranks.threads``) is its share of the cores
that nothing else kept busy at that moment; a process that was busy then may be gone a
minute later, and one may start beside the run. So each rank looks again: at every
epoch's start, every ``every_s`` seconds, and sooner when its step time drifts by more
than ``DRIFT`` (a neighbour that starts or stops shows there first). A look reads the
cores' counters and the run's own CPU time (``core_times``: two file reads, no pause,
no host or device synchronisation) and measures the busy cores since the previous look;
the new number is taken once two looks in a row agree on it, so a passing burst does
not flip it back and forth. Each change is one log line with the busy cores seen.

Every rank decides for its own share, as at the start (``MachineShare``): a rank's
thread count needs no other rank's agreement (the ranks wait for each other at every
step in any case). The step-time estimate of the log (``VerboseLog``) starts measuring
again after a change and is logged again when it moved.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from segscale.platforms import cores as platform_cores
from segscale.training.ranks.threads import CoreTimes, MachineShare, busy_between, core_times

log = logging.getLogger(__name__)

LOOK_EVERY_S = 30.0
"""Seconds between two looks at the machine while an epoch trains."""

MIN_INTERVAL_S = 1.0
"""A look this soon after the previous one measures too little (100 clock ticks a core):
it waits, and the next measures the longer interval."""

DRIFT = 0.10
"""A step time this much off the previous interval's makes the next look come sooner."""

DRIFT_STEPS = 5
"""Steps an interval needs before its step time is compared."""


class ThreadsFollowMachine(L.Callback):
    """Set this rank's threads (``torch.set_num_threads``) to its share of the free cores.

    ``machine``: what the start-up's number was made from; ``count``: that number.
    ``every_s``: seconds between looks; ``clock``: seconds, for the looks' cadence.
    """

    def __init__(
        self,
        machine: MachineShare,
        count: int,
        every_s: float = LOOK_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.machine, self.count, self.every_s, self.clock = machine, count, every_s, clock
        self._cores: set[int] = set()
        self._reading: CoreTimes | None = None
        self._read_at = 0.0  # when _reading was taken (clock)
        self._pending: int | None = None  # a new number seen once, waiting for a second look
        self._steps = 0  # steps since the last reading
        self._step_s: float | None = None  # the step time of the interval before

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The first reading: the threads the start-up chose are in place."""
        self._cores = platform_cores.affinity()
        self._reading, self._read_at = self._read(), self.clock()
        self.count = torch.get_num_threads()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Look at every epoch's start (the first has nothing to compare with yet)."""
        self.look(trainer)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Look every ``every_s`` seconds, or sooner when the step time drifts."""
        self._steps += 1
        elapsed = self.clock() - self._read_at
        if elapsed >= self.every_s or self._drifted(elapsed):
            self.look(trainer)

    def _drifted(self, elapsed: float) -> bool:
        """Whether this interval's step time is off the previous interval's by > ``DRIFT``."""
        if self._step_s is None or self._steps < DRIFT_STEPS or elapsed < MIN_INTERVAL_S:
            return False
        return abs(elapsed / self._steps - self._step_s) > DRIFT * self._step_s

    def look(self, trainer: L.Trainer) -> None:
        """Measure the busy cores since the last look; change the threads on a second sight."""
        now = self.clock()
        if now - self._read_at < MIN_INTERVAL_S:
            return
        reading = self._read()
        before, steps = self._reading, self._steps
        # The interval's step time, for the next drift check (None across an epoch's end).
        self._step_s = (now - self._read_at) / steps if steps >= DRIFT_STEPS else None
        self._reading, self._read_at, self._steps = reading, now, 0
        if reading is None or before is None:
            return
        busy = busy_between(before, reading, len(self._cores), self.machine.share.ranks)
        choice = self.machine.count(busy)
        if choice == self.count:
            self._pending = None
            return
        if choice != self._pending:
            self._pending = choice  # seen once: the next look decides
            return
        self._pending = None
        rank = f"rank {trainer.global_rank}: " if trainer.world_size > 1 else ""
        log.info(
            "%sthreads: %d -> %d per training process (busy cores seen: %.1f of %d with "
            "other processes, on two looks in a row; training.threads=auto)",
            rank,
            self.count,
            choice,
            busy,
            len(self._cores),
        )
        torch.set_num_threads(choice)
        self.count = choice

    def _read(self) -> CoreTimes | None:
        """The cores' counters and this rank's own time (its live workers' included)."""
        workers = [p.pid for p in multiprocessing.active_children() if p.pid is not None]
        return core_times(self._cores, workers)
