"""Step timing: a callback that clocks training steps, and their statistics."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch

from segscale.atomic_files import write_text_atomically


@dataclass(frozen=True)
class Timing:
    """Seconds per step after warm-up, in ``windows`` consecutive windows of equal length."""

    mean_s: float  # mean over every timed step
    window_means_s: tuple[float, ...]  # mean of each window
    spread_s: float  # standard deviation of the window means (0 with one window)
    jitter: float  # per-step coefficient of variation (std / mean): what stragglers cost
    steps: int  # steps timed

    def as_dict(self) -> dict[str, Any]:
        """The timing as plain numbers (for ``bench.json``)."""
        return asdict(self)


def summarize_steps(durations: list[float], warmup: int, windows: int) -> Timing:
    """``Timing`` of the step ``durations`` left after the first ``warmup`` steps."""
    timed = durations[warmup:]
    if len(timed) < max(1, windows):
        raise ValueError(
            f"{len(durations)} steps leave {len(timed)} after {warmup} warm-up steps: "
            f"expected at least one per window ({windows})"
        )
    size = len(timed) // windows
    means = tuple(statistics.fmean(timed[i * size : (i + 1) * size]) for i in range(windows))
    mean = statistics.fmean(timed)
    jitter = statistics.pstdev(timed) / mean if mean > 0 else 0.0
    spread = statistics.stdev(means) if windows > 1 else 0.0
    return Timing(mean, means, spread, jitter, len(timed))


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a clock reading means it is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer(L.Callback):
    """Clocks every training step on rank 0, from the end of one to the end of the next.

    The time between two ``on_train_batch_end`` calls is everything a step costs in a
    real run: waiting for the batch, moving it to the device, forward, backward, the
    all-reduce, the optimizer and the framework's bookkeeping. With ``path`` the
    durations are written there as JSON when training ends (``bench.py`` reads them from
    the ``train.py`` runs it starts).
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = Path(path) if path else None
        self.durations: list[float] = []
        self._last: float | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the clock."""
        synchronize(pl_module.device)
        self._last, self.durations = time.perf_counter(), []

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        """Record this step's duration."""
        synchronize(pl_module.device)
        now = time.perf_counter()
        if self._last is None:  # what subtracting None would raise
            raise TypeError("a training step ended before on_train_start started the clock")
        self.durations.append(now - self._last)
        self._last = now

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write the durations (rank 0), with the world size and the global batch."""
        if self.path is None or not trainer.is_global_zero:
            return
        # Lightning's DataConnector sets trainer.datamodule; Trainer does not declare it.
        datamodule = trainer.datamodule  # type: ignore[attr-defined]
        batches = (
            getattr(datamodule, "rank_batch_sizes", None)
            or [datamodule.batch_size] * trainer.world_size
        )
        record = {"durations_s": self.durations, "world_size": trainer.world_size}
        record["global_batch"] = int(sum(batches))
        write_text_atomically(self.path, json.dumps(record))
