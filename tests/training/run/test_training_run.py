import pytest

from segscale.training.run.training_run import train
from tests.training.record_dtype import recorded_dtypes

# The tiny config trains 2 epochs of 4 iterations each (see tests/conftest.py).


def read_metrics(path):
    rows = path.read_text().splitlines()
    header = rows[0].split(",")
    return [dict(zip(header, row.split(","), strict=True)) for row in rows[1:]]


@pytest.mark.slow
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


def test_mixed_precision_and_channels_last_train(make_config, tmp_path):
    dtypes = tmp_path / "dtypes.json"
    summary = train(
        make_config(
            "trainer.precision=bf16-mixed",
            "training.channels_last=true",
            "trainer.max_epochs=1",
            "+callbacks.dtype._target_=tests.training.record_dtype.RecordOutputDtype",
            f"+callbacks.dtype.path={dtypes}",
        )
    )
    assert summary["steps"] == 4 and summary["metrics"]["train/loss"] > 0
    # The network computed in bfloat16 inside the training step (autocast was on).
    assert recorded_dtypes(dtypes) == ["torch.bfloat16"]
