"""What a run shows of its progress while it trains: the bar, the verbose table, the figure.

The progress bar, with the training loss, and progress lines of a validation pass in a
log (``TQDMProgressBar``); MATLAB's verbose training table in the log (``VerboseLog``);
MATLAB's training-progress figure, as a PNG in the run folder
(``TrainingProgressPlot``); and the values they read from the running trainer
(``logged_metric``, ``current_learning_rate``).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar as LightningTQDMProgressBar

from segscale.errors import ConfigError
from segscale.models.module import logs_this_step
from segscale.progress import Progress
from segscale.training.reporting.plots import (
    BackgroundFigures,
    TrainingPosition,
    plot_training_progress,
)
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


class TQDMProgressBar(LightningTQDMProgressBar):
    """Lightning's TQDM progress bar, showing ``train/loss`` beside ``val/mIoU``.

    The module logs the training loss only on logging steps and not to the progress bar:
    Lightning would read a progress-bar value on the host after every step, a host sync
    each. This bar reads the loss of each logging step once, when that step ends (a
    logger reads it then anyway), and shows the last one read.

    The bar is drawn only on a terminal: written to a file or a pipe (a cluster's job
    log, ``> train.log 2>&1``), each redraw would land between the log lines, and the
    log has periodic rows of its own (``VerboseLog``, ``callbacks.verbose_log.frequency``).
    A validation pass has none: there it logs a progress line now and then instead
    (``segscale.progress``: a count and the time left; none for a pass of seconds).
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False):
        super().__init__(refresh_rate, process_position, leave)
        if not sys.stdout.isatty():  # where Lightning draws its bars
            self.disable()
        self.loss: float | None = None  # the training loss of the last logging step
        self._logs = False  # whether the step now running logs its loss
        self._validation: Progress | None = None  # lines of a pass when no bar is drawn

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Note whether this step logs its loss (as the module decides it), on rank 0."""
        self._logs = self.is_enabled and logs_this_step(trainer)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Read the loss of a logging step, then update the bar."""
        value = trainer.callback_metrics.get("train/loss") if self._logs else None
        if value is not None:
            self.loss = float(value)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """Lightning's progress-bar values, the training loss first."""
        metrics = super().get_metrics(trainer, pl_module)
        return metrics if self.loss is None else {"train/loss": self.loss, **metrics}

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Without a bar, count the pass's batches for the log (rank 0, not sanity checks)."""
        super().on_validation_start(trainer, pl_module)
        if self.is_enabled or trainer.sanity_checking or not trainer.is_global_zero:
            return
        total = sum(trainer.num_val_batches)
        if math.isfinite(total) and total > 0:
            self._validation = Progress(int(total), "validation batches", log, sys.stdout)

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Update the bar, or count the batch for the log."""
        super().on_validation_batch_end(
            trainer, pl_module, outputs, batch, batch_idx, dataloader_idx
        )
        if self._validation is not None:
            self._validation.update()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The pass is over: its count ends."""
        super().on_validation_end(trainer, pl_module)
        if self._validation is not None:
            self._validation.close()
            self._validation = None


class TrainingProgressPlot(L.Callback):
    """MATLAB's ``Plots='training-progress'``: a PNG redrawn at every validation.

    Training loss, accuracy and learning rate (the one the iteration trained with) are
    recorded every ``trainer.log_every_n_steps`` iterations (when the mini-batch
    accuracy is measured); the validation loss, accuracy and mIoU at every validation.
    Rank 0 draws the figure (``segscale.training.reporting.plots``) and replaces the file
    atomically; at the end of training it is drawn once more if training went on past
    the last validation, so that the final figure reaches, and its title names, the
    last iteration. The figure is drawn in the background (``BackgroundFigures``), so
    that training goes on meanwhile; the end of fitting waits for the last one.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.train: list[tuple[int, float, float, float]] = []
        self.val: list[tuple[int, float, float, float]] = []
        self.drawn_at: int | None = None  # the iteration of the figure on disk
        self.rate = float("nan")  # the learning rate of the iteration now running
        self.figures = BackgroundFigures("progress-figure")

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Note the learning rate this iteration trains with."""
        # By on_train_batch_end the scheduler has already set the next iteration's rate.
        if trainer.is_global_zero:
            self.rate = current_learning_rate(trainer)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Record this iteration's loss, accuracy and learning rate, when they were logged."""
        # training_step ran with the step count before this optimizer step
        if not trainer.is_global_zero:
            return
        # Lightning's LoggerConnector sets it on the trainer; Trainer does not declare it.
        every = trainer.log_every_n_steps  # type: ignore[attr-defined]
        step = trainer.global_step
        # Under gradient accumulation several batches end at the same step: record it once.
        if step % max(1, every) or (self.train and self.train[-1][0] == step):
            return
        loss, acc = logged_metric(trainer, "train/loss"), logged_metric(trainer, "train/acc")
        if loss is not None and acc is not None:
            self.train.append((step, loss, acc, self.rate))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Record the validation metrics and redraw the figure."""
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        loss, acc, miou = [logged_metric(trainer, k) for k in ("val/loss", "val/acc", "val/mIoU")]
        if loss is not None and acc is not None and miou is not None:
            self.val.append((trainer.global_step, loss, acc, miou))
        self._draw(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Draw the final figure, unless the last validation already drew this iteration."""
        if trainer.is_global_zero and self.drawn_at != trainer.global_step:
            self._draw(trainer)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Wait until the last figure is written."""
        self.figures.close()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Finish the figure asked for before the run stopped."""
        self.figures.close()

    def _draw(self, trainer: L.Trainer) -> None:
        # The training metrics are rank 0's: its share of the global mini-batch under DDP.
        batch = "rank 0's share of the mini-batch" if trainer.world_size > 1 else "mini-batch"
        # Copies: training appends to the curves while the figure is drawn.
        train, val, position = list(self.train), list(self.val), training_position(trainer)
        self.figures.draw(
            self.path, partial(plot_training_progress, train, val, self.path, position, batch)
        )
        self.drawn_at = trainer.global_step

    def state_dict(self) -> dict[str, Any]:
        """The curves so far, so that a resumed run continues them."""
        return {"train": self.train, "val": self.val}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the curves of the run being resumed."""
        self.train = [tuple(r) for r in state_dict["train"]]
        self.val = [tuple(r) for r in state_dict["val"]]


def training_position(trainer: L.Trainer) -> TrainingPosition:
    """The trainer's optimizer steps and epoch (1-based), and their planned totals.

    Epochs are counted in optimizer steps (as the learning-rate schedule counts them),
    so the epoch named is the one the latest step belongs to, also after training ends
    (when Lightning's ``current_epoch`` already counts the next one).
    """
    step = trainer.global_step
    planned = trainer.estimated_stepping_batches
    steps = int(planned) if math.isfinite(planned) and planned > 0 else None
    batches = trainer.num_training_batches
    if not math.isfinite(batches) or batches < 1:
        return TrainingPosition(step, steps)
    per_epoch = max(1, math.ceil(batches / trainer.accumulate_grad_batches))
    epochs = math.ceil(steps / per_epoch) if steps else None
    return TrainingPosition(step, steps, max(1, math.ceil(step / per_epoch)), epochs)


def logged_metric(trainer: L.Trainer, key: str) -> float | None:
    """The value of ``key`` the module last logged (``None`` before it is logged)."""
    value = trainer.callback_metrics.get(key)
    return None if value is None else float(value)


def current_learning_rate(trainer: L.Trainer) -> float:
    """The learning rate of the first parameter group now."""
    return float(trainer.optimizers[0].param_groups[0]["lr"])
