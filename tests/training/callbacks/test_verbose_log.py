import logging

from segscale.training.callbacks.verbose_log import VerboseLog
from segscale.training.run.training_run import train
from tests.training.callbacks.scheduled_fit import RATES, scheduled_fit

# The tiny config trains 2 epochs of 4 iterations each (see tests/conftest.py).


def test_verbose_log_prints_every_n_iterations(make_config, caplog, monkeypatch):
    import segscale.training.callbacks.verbose_log as verbose_log

    monkeypatch.setattr(verbose_log, "ESTIMATE_AFTER_STEPS", 2)
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
