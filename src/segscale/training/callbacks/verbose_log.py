"""MATLAB's verbose training table in the log."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

import lightning as L
import torch

from segscale.errors import ConfigError
from segscale.training.callbacks.trainer_values import current_learning_rate, logged_metric
from segscale.training.reporting.run_plan import (
    ESTIMATE_AFTER_STEPS,
    ESTIMATE_MOVE,
    RunPlan,
    estimate_line,
    remaining_s,
    run_plan,
)

log = logging.getLogger(__name__)


class VerboseLog(L.Callback):
    """MATLAB's ``VerboseFrequency``: a table row every ``frequency`` iterations.

    The columns are MATLAB's: epoch, iteration, elapsed time, mini-batch accuracy and
    loss, validation accuracy and loss (on the rows right after a validation), and the
    learning rate. Rows go to the log (console and ``train.log``), on rank 0 only.
    ``frequency`` 0 turns the table off.

    As in MATLAB, a row's learning rate is the one its iteration trained with, read
    as the iteration starts: Lightning steps a per-step schedule before
    ``on_train_batch_end``, where the optimizer already holds the next iteration's
    rate (0 after the last step of a ``poly`` schedule). A validation row shows the
    rate of the iteration it follows.

    Whatever ``frequency``: the run's plan (``run_plan``) at the start and, after
    ``ESTIMATE_AFTER_STEPS`` steps past the first (its warm-up left out), the measured
    step time and the estimated end; again at an epoch's end when the estimated end
    moved by more than ``ESTIMATE_MOVE`` of the time left. When the threads of the
    process change (``training.threads=auto`` following the machine), the step time is
    measured afresh from that step, and the estimate checked again once
    ``ESTIMATE_AFTER_STEPS`` steps of it are measured.
    """

    HEADER = (
        "| Epoch | Iteration | Time Elapsed | Mini-batch Acc | Validation Acc "
        "| Mini-batch Loss | Validation Loss | Learning Rate |"
    )

    def __init__(self, frequency: int = 50) -> None:
        if frequency < 0:
            raise ConfigError(
                f"callbacks.verbose_log.frequency={frequency} is not allowed: expected "
                "iterations >= 0 (0 turns the log off)"
            )
        self.frequency = frequency
        self._start = 0.0
        self._rate: float | None = None  # the learning rate of the current iteration
        self._plan: RunPlan | None = None
        self._first_step_end = 0.0  # when the first step (its warm-up) ended
        self._validation_s = 0.0  # all validations' time since the first step
        self._validations = 0
        self._validation_start = 0.0
        self._estimated_s: float | None = None  # the end last logged (perf_counter)
        # The step time is measured over a window: from the first step's end, or from the
        # step at which the threads last changed.
        self._window_start = 0.0
        self._window_step = 0
        self._window_validation_s = 0.0  # validations' time inside the window
        self._window_checked = False  # an estimate was made from this window already
        self._threads = 0  # the threads the window's steps ran with
        self._since = ""  # what the window started with, for the estimate line

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the clock and print the header."""
        self._start = time.perf_counter()
        if not trainer.is_global_zero:
            return
        batch_size = int(getattr(trainer.datamodule, "batch_size", 1)) * trainer.world_size  # type: ignore[attr-defined]
        self._plan = run_plan(trainer, batch_size)
        log.info("%s", self._plan.line())
        if self.frequency:
            log.info(self.HEADER)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Note the learning rate this iteration trains with (a number on the host: no sync)."""
        self._rate = current_learning_rate(trainer)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Print a row on iteration 1 and every ``frequency`` iterations; the estimate."""
        if not trainer.is_global_zero:
            return
        self._estimate(trainer, at_epoch_end=False)
        if not self.frequency:
            return
        if trainer.global_step == 1 or trainer.global_step % self.frequency == 0:
            log.info(self.row(trainer, validation=False))

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Start the validation clock (the estimate adds the passes left)."""
        self._validation_start = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Log the estimate again if it moved a lot."""
        if trainer.is_global_zero:
            self._estimate(trainer, at_epoch_end=True)

    def _estimate(self, trainer: L.Trainer, at_epoch_end: bool) -> None:
        """Estimate the end from the window's step time; log it if it moved enough.

        At a step's end only the first estimate of each window is made; at an epoch's
        end, always.
        """
        step = trainer.global_step
        if self._plan is None or step < 1:
            return
        now_s = time.perf_counter()
        threads = torch.get_num_threads()  # a number on the host: no sync
        if not self._first_step_end:
            self._first_step_end = now_s
            self._start_window(now_s, step, threads, "")
            return
        if threads != self._threads:
            changed = f"the threads changed: {self._threads} -> {threads}"
            self._start_window(now_s, step, threads, changed)
            return
        measured = step - self._window_step
        if measured < ESTIMATE_AFTER_STEPS or (self._window_checked and not at_epoch_end):
            return
        self._window_checked = True
        elapsed = now_s - self._window_start - self._window_validation_s
        step_s = elapsed / measured
        validation_s = self._validation_s / self._validations if self._validations else 0.0
        left = remaining_s(self._plan, step, step_s, self._validations, validation_s)
        # Compare the estimated ends, against the time the last estimate had left.
        end_s, last = now_s + left, self._estimated_s
        if last is None or abs(end_s - last) > ESTIMATE_MOVE * max(last - now_s, 1.0):
            self._estimated_s = end_s
            now = datetime.now().astimezone()
            total = end_s - self._start
            known = bool(self._validations)
            log.info("%s", estimate_line(step_s, left, total, known, now, self._since))

    def _start_window(self, now_s: float, step: int, threads: int, since: str) -> None:
        """Measure the step time afresh from ``step`` (``since``: why, for the line)."""
        self._window_start, self._window_step, self._window_validation_s = now_s, step, 0.0
        self._window_checked, self._threads, self._since = False, threads, since

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Print a row with the validation columns filled."""
        if not trainer.sanity_checking and self._first_step_end:
            seconds = time.perf_counter() - self._validation_start
            self._validation_s += seconds
            self._window_validation_s += seconds
            self._validations += 1
        if self.frequency and trainer.is_global_zero and not trainer.sanity_checking:
            log.info(self.row(trainer, validation=True))

    def row(self, trainer: L.Trainer, validation: bool) -> str:
        """One table row for the current iteration."""
        elapsed = int(time.perf_counter() - self._start)
        clock = f"{elapsed // 3600:02d}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}"

        def cell(key: str, width: int, percent: bool = False) -> str:
            value = logged_metric(trainer, key) if validation or key.startswith("train/") else None
            if value is None:
                return " " * width
            return f"{100 * value:{width - 1}.2f}%" if percent else f"{value:{width}.4f}"

        return (
            f"| {trainer.current_epoch + 1:5d} | {trainer.global_step:9d} | {clock:>12} "
            f"| {cell('train/acc', 14, True)} | {cell('val/acc', 14, True)} "
            f"| {cell('train/loss', 15)} | {cell('val/loss', 15)} "
            f"| {self.learning_rate(trainer):13.4e} |"
        )

    def learning_rate(self, trainer: L.Trainer) -> float:
        """The rate of the current iteration; the optimizer's before the first one."""
        return current_learning_rate(trainer) if self._rate is None else self._rate
