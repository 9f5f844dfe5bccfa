import json
from pathlib import Path

import pytest
from lightning.pytorch.callbacks import Timer

from segscale.training.callbacks.learning_rate import LearningRateMonitor
from segscale.training.callbacks.run_summary import RunSummary
from segscale.training.run.training_run import train
from tests.conftest import compose_config, tiny_overrides
from tests.training.callbacks.scheduled_fit import RATES, scheduled_fit

# The tiny config trains 2 epochs of 4 iterations each (see tests/conftest.py).


@pytest.fixture(scope="module")
def default_run(tiny_data_root: Path, tmp_path_factory: pytest.TempPathFactory):
    """One tiny run of the default config (no training.output_network given): its summary
    and its folder, read by the tests of the default output network."""
    run = tmp_path_factory.mktemp("default") / "run"
    return train(compose_config("train", *tiny_overrides(tiny_data_root, run))), run


@pytest.mark.parametrize("choice", ["best-validation", "last-iteration"])
def test_output_network_picks_the_reported_checkpoint(make_config, tmp_path, choice, default_run):
    if choice == "best-validation":  # the default: the shared run's
        summary, run = default_run
    else:  # one epoch: its last checkpoint is what the choice picks whatever the size
        summary = train(make_config(f"training.output_network={choice}", "trainer.max_epochs=1"))
        run = tmp_path / "run"
    on_disk = json.loads((run / "summary.json").read_text())
    expected = "best.ckpt" if choice == "best-validation" else "last.ckpt"
    assert on_disk["output_network"] == choice
    assert summary["output_checkpoint"].endswith(expected)


def test_the_output_checkpoint_is_best_ckpt_as_in_the_readme_examples(default_run):
    summary, _ = default_run
    assert summary["output_network"] == "best-validation"
    assert summary["output_checkpoint"] == summary["best_checkpoint"]
    assert summary["output_checkpoint"].endswith("checkpoints/best.ckpt")
    assert summary["last_checkpoint"].endswith("checkpoints/last.ckpt")


def test_the_fine_tuning_settings_are_in_the_summary(make_config):
    summary = train(
        make_config(
            "training.freeze_encoder_epochs=1",
            "training.encoder_lr_factor=0.1",
            "trainer.max_epochs=1",  # the summary reports the settings, whatever the length
        )
    )
    assert summary["fine_tuning"] == {"encoder_lr_factor": 0.1, "freeze_encoder_epochs": 1}


def test_the_summary_reports_the_rate_of_the_last_step_and_keeps_rates_out_of_metrics(tmp_path):
    monitor = LearningRateMonitor(logging_interval="step")
    trainer = scheduled_fit(tmp_path, RunSummary(str(tmp_path)), monitor)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.0  # the schedule's next step's
    assert summary["learning_rate"] == RATES[0]
    assert summary["final_learning_rate"] == pytest.approx(RATES[-1])  # the last step's
    # The monitor logged every step (metrics.csv), but its values are not run metrics.
    logged = (tmp_path / "metrics.csv").read_text()
    assert "lr-SGD" in logged and "lr-SGD" in trainer.callback_metrics
    assert set(summary["metrics"]) == {"train/loss", "val/loss"}


def test_the_training_time_is_lightnings_timer_less_the_validations(tmp_path):
    run_summary = RunSummary(str(tmp_path))
    scheduled_fit(tmp_path, run_summary)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert isinstance(run_summary, Timer)  # the training stage is Lightning's to time
    stage = run_summary.end_time("train") - run_summary.start_time("train")
    validation = summary["time_split_s"]["validation"]
    assert validation > 0
    assert summary["train_time_s"] == pytest.approx(stage - validation, abs=2e-3)
    assert run_summary.state_dict() == {}  # checkpoints carry no times


@pytest.mark.slow
def test_the_summary_splits_the_wall_time_and_logs_the_time_to_the_first_step(make_config, caplog):
    with caplog.at_level("INFO", logger="segscale"):
        summary = train(make_config("trainer.max_epochs=4"))
    phases, split = summary["startup_phases_s"], summary["time_split_s"]
    assert {"dataset check", "model", "workers and first batch", "first step"} <= set(phases)
    # The phases are the time to the first step; the four parts are the wall time.
    assert sum(phases.values()) == pytest.approx(summary["time_to_first_step_s"], abs=0.01)
    assert sum(split.values()) == pytest.approx(summary["wall_time_s"], abs=0.05)
    assert split["validation"] > 0 and split["end"] > 0
    # 4 epochs of 4 steps: the steady rate starts after the second step.
    assert summary["steady_after_steps"] == 2 and summary["steady_patches_per_s"] > 0
    lines = [r.getMessage() for r in caplog.records if "time to first step" in r.getMessage()]
    assert len(lines) == 1 and "dataset check" in lines[0]


def test_the_summary_compares_the_best_and_the_last_validation_score(default_run):
    summary, _ = default_run
    comparison = summary["best_versus_last"]
    assert comparison["best"] == summary["best_score"]
    assert comparison["last"] == summary["metrics"][comparison["metric"]]
    gap = abs(comparison["best"] - comparison["last"])
    assert comparison["within_noise"] == (0 < gap < 0.01)


@pytest.mark.parametrize(
    ("last", "within"), [(0.770, True), (0.7605, False), (0.7601, False), (0.772, False)]
)
def test_a_best_last_gap_within_the_seed_spread_is_called_noise(last, within):
    from types import SimpleNamespace

    import torch

    from segscale.training.callbacks.run_summary import best_versus_last, noise_line

    checkpoint = SimpleNamespace(monitor="val/mIoU", best_model_score=torch.tensor(0.772))
    trainer = SimpleNamespace(
        checkpoint_callback=checkpoint, callback_metrics={"val/mIoU": torch.tensor(last)}
    )
    comparison = best_versus_last(trainer)
    assert comparison["within_noise"] is within
    assert comparison["noise"] == 0.01
    if within:
        line = noise_line(comparison)
        assert "0.0020" in line and "last.ckpt" in line and "test set" in line
    no_score = SimpleNamespace(checkpoint_callback=checkpoint, callback_metrics={})
    assert best_versus_last(no_score) is None
