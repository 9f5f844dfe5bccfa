import sys

import pytest

from segscale import progress
from segscale.training.callbacks.progress_bar import TQDMProgressBar
from tests.helpers.scheduled_fit import scheduled_fit


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
