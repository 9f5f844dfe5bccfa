"""A callback that clocks a run's training steps with CUDA events, for measure.py.

It lives beside the measurement, not in segscale, so that the same clock times the
source of any version (measure.py runs the code before a change and after it): one
CUDA event at the end of every step, read once when training ends, so the clock itself
never makes the host wait. With ``profile_steps``, the steps from ``profile_from`` on run
under torch.profiler and its table (the ops by their own time on the device, and on the
host) is written to ``profile.txt`` beside ``path``.
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

    def __init__(self, path: str, profile_from: int = 0, profile_steps: int = 0) -> None:
        self.path = Path(path)
        self.events: list[Any] = []
        self.started = time.perf_counter()  # built with the run's objects
        self.first_step_s: float | None = None
        self.profile_from, self.profile_steps = profile_from, profile_steps
        self.profiler: torch.profiler.profile | None = None

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        """Start the profiler before step ``profile_from``."""
        if self.profile_steps and trainer.global_step == self.profile_from:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.__enter__()

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
        if self.profiler and trainer.global_step == self.profile_from + self.profile_steps:
            self.stop_profiler(trainer)

    def stop_profiler(self, trainer: L.Trainer) -> None:
        """Stop the profiler; write its tables (rank 0)."""
        profiler, self.profiler = self.profiler, None
        if profiler is None:
            return
        profiler.__exit__(None, None, None)
        if not trainer.is_global_zero:
            return
        table = profiler.key_averages()
        device = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        text = [f"{self.profile_steps} steps from step {self.profile_from}", ""]
        text += ["by own time on the device:", table.table(sort_by=device, row_limit=40), ""]
        host = table.table(sort_by="self_cpu_time_total", row_limit=40)
        text += ["by own time on the host:", host]
        (self.path.parent / "profile.txt").write_text("\n".join(text))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Read every mark once; write the step durations."""
        self.stop_profiler(trainer)
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
