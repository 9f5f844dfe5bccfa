"""A callback that clocks a run's training steps with CUDA events, for measure.py.

It lives beside the measurement, not in segscale, so that the same clock times the
source of any version (measure.py runs the code before a change and after it): one
CUDA event at the end of every step, read once when training ends, so the clock itself
never makes the host wait.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch


class SteadyClock(L.Callback):
    """Writes ``{"durations_s": [...], "first_step_s": ...}`` to ``path`` at the end."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.events: list[Any] = []
        self.started = time.perf_counter()  # built with the run's objects
        self.first_step_s: float | None = None

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        """Mark the step's end on the device (the wall clock on a CPU, for a dry run)."""
        if torch.cuda.is_available():
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)
        else:
            self.events.append(time.perf_counter())
        if self.first_step_s is None:
            self.first_step_s = time.perf_counter() - self.started

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Read every mark once; write the step durations."""
        pairs = zip(self.events, self.events[1:], strict=False)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            durations = [start.elapsed_time(end) / 1000 for start, end in pairs]
        else:
            durations = [end - start for start, end in pairs]
        if trainer.is_global_zero:
            self.path.write_text(
                json.dumps({"durations_s": durations, "first_step_s": self.first_step_s})
            )
