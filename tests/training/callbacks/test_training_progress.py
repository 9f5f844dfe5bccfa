import csv
import logging
import sys

import pytest

from segscale import progress
from segscale.training.callbacks.training_progress import TQDMProgressBar, VerboseLog
from segscale.training.reporting.plots import plot_training_progress
from segscale.training.run.training_run import train
from tests.training.callbacks.scheduled_fit import RATES, scheduled_fit

# The tiny config trains 2 epochs of 4 iterations each (see tests/conftest.py).


def test_verbose_log_prints_every_n_iterations(make_config, caplog, monkeypatch):
    import segscale.training.callbacks.training_progress as training_progress

    monkeypatch.setattr(training_progress, "ESTIMATE_AFTER_STEPS", 2)
    caplog.set_level(logging.INFO, logger="segscale.training.callbacks")
    train(make_config("callbacks.verbose_log.frequency=3"))
    messages = [r.getMessage() for r in caplog.records]
    # The plan, once, before the table; the estimated end after steps 2-3 were measured.
    plans = [m for m in messages if m.startswith("plan:")]
    assert plans == [plans[0]] and plans[0].startswith("plan: 2 epochs of 4 steps = 8 steps, ")
    assert "; 2 validation passes of " in plans[0]
    estimates = [m for m in messages if m.startswith("estimate:")]
    assert estimates and " s per step; " in estimates[0] and "ending around" in estimates[0]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("|")]
    assert lines[0] == VerboseLog.HEADER
    iterations = [int(line.split("|")[2]) for line in lines[1:]]
    # Iteration 1, every 3rd iteration, and a row with the validation columns after each
    # epoch's validation (iterations 4 and 8).
    assert iterations == [1, 3, 4, 6, 8]
    validation_rows = [line for line in lines[1:] if line.split("|")[5].strip()]
    assert [int(r.split("|")[2]) for r in validation_rows] == [4, 8]
    assert all(len(line.split("|")) == 10 for line in lines)


def test_each_row_shows_the_rate_its_iteration_trained_with(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="segscale.training.callbacks")
    scheduled_fit(tmp_path, VerboseLog(frequency=1))
    rows = [r.getMessage().split("|") for r in caplog.records if r.getMessage().startswith("| ")]
    rates = [(int(row[2]), float(row[8])) for row in rows[1:]]
    # Iterations 1-3 at 0.03, 0.02, 0.01 (MATLAB's semantics), and the validation row after
    # iteration 3 at its rate: not the 0.0 the schedule leaves for a step after the last.
    assert rates == [(1, RATES[0]), (2, RATES[1]), (3, RATES[2]), (3, RATES[2])]


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _estimating(monkeypatch, caplog):
    """A VerboseLog of a 1000-step run without validation, on a clock the test moves."""
    import types

    import torch

    import segscale.training.callbacks.training_progress as training_progress
    from segscale.training.reporting.run_plan import RunPlan

    clock, threads = _Clock(), {"count": 1}
    monkeypatch.setattr(training_progress.time, "perf_counter", clock)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads["count"])
    caplog.set_level(logging.INFO, logger="segscale.training.callbacks")
    callback = VerboseLog(frequency=0)
    callback._plan = RunPlan(1, 1000, 1000, 1000, 0, 0)
    trainer = types.SimpleNamespace(global_step=0, is_global_zero=True)

    def steps(count, seconds):
        for _ in range(count):
            clock.now += seconds
            trainer.global_step += 1
            callback.on_train_batch_end(trainer, None, None, None, 0)

    def epoch_end():
        callback.on_train_epoch_end(trainer, None)

    def estimates():
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("estimate")]

    return steps, epoch_end, estimates, threads


def test_the_estimate_is_logged_again_when_it_moves_by_more_than_a_tenth(monkeypatch, caplog):
    steps, epoch_end, estimates, threads = _estimating(monkeypatch, caplog)
    steps(11, 1.0)  # the first step's end starts the clock; 10 steps of 1 s measured
    (first,) = estimates()
    assert first.startswith("estimate: 1.000 s per step; 0h16m29s left")  # 989 steps
    steps(89, 1.05)
    epoch_end()  # ~5% slower: the end 45 s later, 5% of the 896 s left then: kept
    assert len(estimates()) == 1
    threads["count"] = 2  # the machine freed: threads 1 -> 2, steps twice as fast
    steps(10, 0.5)
    assert len(estimates()) == 1  # the new step time is being measured
    steps(1, 0.5)
    assert len(estimates()) == 2
    assert estimates()[1].startswith("estimate: 0.500 s per step; 0h07m24s left")  # 889 steps
    assert estimates()[1].endswith("(step time measured since the threads changed: 1 -> 2)")
    steps(10, 0.5)
    epoch_end()  # unchanged: not logged again
    assert len(estimates()) == 2


def test_a_slower_machine_moves_the_estimate_at_an_epochs_end(monkeypatch, caplog):
    steps, epoch_end, estimates, _ = _estimating(monkeypatch, caplog)
    steps(11, 1.0)
    steps(100, 1.2)  # the average step since the first: 1.18 s, the end 3 min later (21%)
    assert len(estimates()) == 1  # within an epoch only each window's first estimate
    epoch_end()
    assert len(estimates()) == 2 and estimates()[1].startswith("estimate: 1.182 s per step")


def test_the_bar_shows_the_training_loss_of_the_last_logging_step(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # drawn on a terminal only
    bar = TQDMProgressBar(refresh_rate=1)
    trainer = scheduled_fit(tmp_path, bar)
    shown = bar.get_metrics(trainer, trainer.lightning_module)
    assert shown["train/loss"] == float(trainer.callback_metrics["train/loss"])
    assert next(iter(shown)) == "train/loss"


@pytest.mark.parametrize("terminal", [True, False])
def test_the_bar_is_drawn_on_a_terminal_only(monkeypatch, terminal: bool):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    assert TQDMProgressBar(refresh_rate=1).is_enabled is terminal


def test_without_a_terminal_the_validation_pass_logs_progress_lines(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    monkeypatch.setattr(progress, "QUIET_S", 0.0)  # a tiny pass is over in a moment
    caplog.set_level("INFO")
    scheduled_fit(tmp_path, TQDMProgressBar(refresh_rate=1))
    lines = [r.getMessage() for r in caplog.records if "validation batches" in r.message]
    assert lines == ["validation batches: 1/1 (100%), 00:00 so far"]


# The tiny config trains 2 epochs of 4 iterations each (see tests/conftest.py).


def test_training_progress_png_is_drawn_and_updated(make_config, tmp_path):
    train(make_config())
    png = tmp_path / "run" / "training_progress.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = png.read_bytes()
    plot_training_progress([(1, 1.0, 0.5, 0.1), (2, 0.8, 0.6, 0.1)], [(2, 0.9, 0.55, 0.3)], png)
    assert png.read_bytes() != first
    assert [p.name for p in png.parent.glob(".*.png")] == []  # no temporary left


def test_the_progress_plot_is_redrawn_at_every_validation_and_ends_at_the_last_iteration(
    make_config, monkeypatch, tmp_path
):
    from segscale.training.callbacks import training_progress

    drawn, rates = [], []
    original = training_progress.plot_training_progress

    def counting(train_rows, val_rows, path, position, batch):
        drawn.append((len(train_rows), len(val_rows), position.describe()))
        rates[:] = [(step, rate) for step, _, _, rate in train_rows]
        original(train_rows, val_rows, path, position, batch)

    monkeypatch.setattr(training_progress, "plot_training_progress", counting)
    train(
        make_config(
            "trainer.val_check_interval=3",
            "trainer.check_val_every_n_epoch=null",
            "trainer.log_every_n_steps=3",
        )
    )
    # 8 iterations, logged and validated every 3: a redraw at each validation with the
    # curves so far, and a last one at iteration 8, past the last logged and validated.
    assert drawn == [
        (1, 1, "iteration 3 of 8, epoch 1 of 2"),
        (2, 2, "iteration 6 of 8, epoch 2 of 2"),
        (2, 2, "iteration 8 of 8, epoch 2 of 2"),
    ]
    # Each iteration's learning rate is the one it trained with, as the csv logs it
    # (at the 0-based step before it), not the next one the scheduler has set.
    with open(tmp_path / "run" / "metrics.csv") as stream:
        logged = {
            int(r["step"]) + 1: float(r["lr-SGD"]) for r in csv.DictReader(stream) if r["lr-SGD"]
        }
    assert rates == [(3, logged[3]), (6, logged[6])]
