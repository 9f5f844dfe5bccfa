import json
import logging

import pytest

from segscale.errors import ConfigError
from segscale.training.callbacks.periodic_checkpoint import (
    ensure_writable,
    periodic_checkpoint,
)
from segscale.training.callbacks.verbose_log import VerboseLog
from segscale.training.plots import plot_training_progress
from segscale.training.run import train

# The tiny config trains 2 epochs of 4 iterations each (see tests/conftest.py).


def read_metrics(path):
    rows = path.read_text().splitlines()
    header = rows[0].split(",")
    return [dict(zip(header, row.split(","), strict=True)) for row in rows[1:]]


def test_verbose_log_prints_every_n_iterations(make_config, caplog):
    caplog.set_level(logging.INFO, logger="segscale.training.callbacks")
    train(make_config("callbacks.verbose_log.frequency=3"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("|")]
    assert lines[0] == VerboseLog.HEADER
    iterations = [int(line.split("|")[2]) for line in lines[1:]]
    # Iteration 1, every 3rd iteration, and a row with the validation columns after each
    # epoch's validation (iterations 4 and 8).
    assert iterations == [1, 3, 4, 6, 8]
    validation_rows = [line for line in lines[1:] if line.split("|")[5].strip()]
    assert [int(r.split("|")[2]) for r in validation_rows] == [4, 8]
    assert all(len(line.split("|")) == 10 for line in lines)


def test_training_progress_png_is_drawn_and_updated(make_config, tmp_path):
    train(make_config())
    png = tmp_path / "run" / "training_progress.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = png.read_bytes()
    plot_training_progress([(1, 1.0, 0.5, 0.1), (2, 0.8, 0.6, 0.1)], [(2, 0.9, 0.55, 0.3)], png)
    assert png.read_bytes() != first
    assert [p.name for p in png.parent.glob(".*.png")] == []  # no temporary left


def test_validation_patience_stops_training(make_config, tmp_path):
    # min_delta=1000: no validation after the first counts as an improvement.
    summary = train(
        make_config(
            "trainer.max_epochs=5",
            "callbacks.early_stopping.patience=1",
            "+callbacks.early_stopping.min_delta=1000",
        )
    )
    assert summary["epochs"] == 2 and summary["steps"] == 8
    patient = train(
        make_config(
            "trainer.max_epochs=3",
            "+callbacks.early_stopping.min_delta=1000",
            f"output_dir={tmp_path / 'patient'}",  # a run folder holds one run
        )
    )
    assert patient["steps"] == 12  # patience .inf: never stops early


def test_validation_frequency_in_iterations(make_config, tmp_path):
    train(make_config("trainer.val_check_interval=3", "trainer.check_val_every_n_epoch=null"))
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    assert [int(r["step"]) for r in rows if r["val/mIoU"]] == [2, 5]  # after iterations 3 and 6


@pytest.mark.parametrize("choice", ["best-validation", "last-iteration"])
def test_output_network_picks_the_reported_checkpoint(make_config, tmp_path, choice):
    summary = train(make_config(f"training.output_network={choice}"))
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    expected = "best.ckpt" if choice == "best-validation" else "last.ckpt"
    assert on_disk["output_network"] == choice
    assert summary["output_checkpoint"].endswith(expected)


def test_periodic_checkpoints_by_iteration_and_epoch(make_config, tmp_path):
    train(
        make_config(
            "callbacks.periodic_checkpoint.frequency=3",
            "callbacks.periodic_checkpoint.unit=iteration",
        )
    )
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("epoch*.ckpt"))
    assert names == ["epoch000-step0000003.ckpt", "epoch001-step0000006.ckpt"]


def test_unwritable_checkpoint_path_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(
        ConfigError, match=r"callbacks\.periodic_checkpoint\.dirpath=.*cannot write"
    ):
        ensure_writable(str(blocker / "checkpoints"), "callbacks.periodic_checkpoint.dirpath")
    with pytest.raises(ConfigError, match=r"unit='hour'"):
        periodic_checkpoint(str(tmp_path), frequency=1, unit="hour")
    assert periodic_checkpoint(str(tmp_path), frequency=0) is None


def test_mixed_precision_and_channels_last_train(make_config):
    summary = train(
        make_config(
            "trainer.precision=bf16-mixed", "training.channels_last=true", "trainer.max_epochs=1"
        )
    )
    assert summary["steps"] == 4 and summary["metrics"]["train/loss"] > 0


def test_the_progress_plot_is_redrawn_at_every_validation(make_config, monkeypatch):
    from segscale.training import callbacks

    drawn = []
    original = callbacks.plot_training_progress

    def counting(train_rows, val_rows, path):
        drawn.append((len(train_rows), len(val_rows)))
        original(train_rows, val_rows, path)

    monkeypatch.setattr(callbacks, "plot_training_progress", counting)
    train(make_config("trainer.val_check_interval=2", "trainer.check_val_every_n_epoch=null"))
    # 8 iterations, a validation every 2: four redraws, each with the curves so far.
    assert drawn == [(2, 1), (4, 2), (6, 3), (8, 4)]
