"""What a run will do and how long it will take: the plan and the estimated end, logged.

A new user on a small machine should learn at once that the run they started takes a
day: the plan line says how many epochs, steps and patches it has, and after the first
steps the estimate line says when it will end (training and validation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

import lightning as L

ESTIMATE_AFTER_STEPS = 10
"""Steps measured (after the first, whose warm-up is left out) before the first estimate."""

ESTIMATE_MOVE = 0.10
"""A later estimate is logged again when the end moved by more than this fraction of the
time the last one logged had left."""


@dataclass(frozen=True)
class RunPlan:
    """The numbers of a run, read from the trainer once training starts."""

    epochs: int
    steps_per_epoch: int
    total_steps: int
    patches_per_epoch: int
    validation_passes: int
    validation_batches: int

    def line(self) -> str:
        """The plan, as one log line."""
        return (
            f"plan: {self.epochs} epochs of {self.steps_per_epoch} steps = "
            f"{self.total_steps} steps, {self.patches_per_epoch} patches per epoch; "
            f"{self.validation_passes} validation passes of {self.validation_batches} batches"
        )


def run_plan(trainer: L.Trainer, batch_size: int) -> RunPlan:
    """The plan of ``trainer``'s fit; ``batch_size``: patches per step (all ranks)."""
    batches = (
        int(trainer.num_training_batches) if math.isfinite(trainer.num_training_batches) else 0
    )
    steps_per_epoch = max(1, batches // max(1, trainer.accumulate_grad_batches))
    total = int(trainer.estimated_stepping_batches)
    epochs = math.ceil(total / steps_per_epoch)
    every = trainer.check_val_every_n_epoch or 1
    passes = epochs // every if trainer.num_val_batches else 0
    return RunPlan(
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
        patches_per_epoch=batches * batch_size,
        validation_passes=passes,
        validation_batches=int(sum(trainer.num_val_batches)),
    )


def remaining_s(
    plan: RunPlan, steps_done: int, step_s: float, validations_done: int, validation_s: float
) -> float:
    """Seconds left: the steps left at ``step_s`` each, the passes left at ``validation_s``."""
    steps_left = max(0, plan.total_steps - steps_done)
    passes_left = max(0, plan.validation_passes - validations_done)
    return steps_left * step_s + passes_left * validation_s


def estimate_line(
    step_s: float,
    left_s: float,
    total_s: float,
    validation_known: bool,
    now: datetime,
    since: str = "",
) -> str:
    """The estimate, as one log line: step time, time left, whole duration, end time.

    The duration counts training and validation from the start of training. ``since``:
    what the step time was measured since, where not the first step (``"the threads
    changed: 1 -> 2"``).
    """
    end = (now + timedelta(seconds=left_s)).isoformat(sep=" ", timespec="minutes")
    note = "" if validation_known else " (validation not measured yet, left out)"
    if since:
        note += f" (step time measured since {since})"
    return (
        f"estimate: {step_s:.3f} s per step; {_clock(left_s)} left of about "
        f"{_clock(total_s)} in all, ending around {end}{note}"
    )


def _clock(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600}h{whole // 60 % 60:02d}m{whole % 60:02d}s"
