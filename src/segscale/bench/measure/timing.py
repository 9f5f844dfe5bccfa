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


class StepClock:
    """Marks points in a stream of queued work and gives the seconds between them.

    On a GPU each mark is a CUDA event recorded into the current stream: it is reached
    when the device gets there, and the host goes on queuing meanwhile, so timing does
    not stop the host running ahead of the device as a synchronization would (every
    step of a real run is pipelined so, and a clock that synchronized each step measured
    7-20% more than a run's steady step). The time between two marks is the device's,
    idle gaps waiting for the host included: in the steady state, exactly what a step
    costs. ``seconds`` synchronizes once, to read every mark. On a CPU the work is done
    when the host returns, and a mark is the wall clock.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.marks: list[Any] = []

    def mark(self) -> None:
        """A mark at the end of the work queued so far."""
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """The seconds between consecutive marks (one fewer than the marks)."""
        if self.device.type == "cuda":
            synchronize(self.device)
            return [
                start.elapsed_time(end) / 1000
                for start, end in zip(self.marks, self.marks[1:], strict=False)
            ]
        return [end - start for start, end in zip(self.marks, self.marks[1:], strict=False)]


class StepTimer(L.Callback):
    """Clocks every training step on rank 0, from the end of one to the end of the next.

    The time between two ``on_train_batch_end`` calls is everything a step costs in a
    real run: waiting for the batch, moving it to the device, forward, backward, the
    all-reduce, the optimizer and the framework's bookkeeping. The steps are clocked as
    they run, pipelined (``StepClock``: CUDA events on a GPU, no synchronization per
    step). With ``path`` the durations are written there as JSON when training ends
    (``bench.py`` reads them from the ``train.py`` runs it starts).
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = Path(path) if path else None
        self.durations: list[float] = []
        self._clock: StepClock | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the clock."""
        self._clock = StepClock(pl_module.device)
        self.durations = []
        self._clock.mark()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        """Mark this step's end."""
        if self._clock is None:
            raise TypeError("a training step ended before on_train_start started the clock")
        self._clock.mark()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Read the steps' durations; write them (rank 0), with the world size and global batch."""
        if self._clock is not None:
            self.durations = self._clock.seconds()
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
