import os
from pathlib import Path

import numpy as np
import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from segscale.training.reporting.loggers import CSVLogger, MLFlowLogger, WandbLogger, wandb_run_id
from segscale.training.reporting.tracker_images import image_loggers, log_image
from segscale.training.run.training_run import train


def tensorboard_images(run: Path) -> list[tuple[int, int, int]]:
    """(step, height, width) of each ``val/samples`` image in the run's event file."""
    events = EventAccumulator(str(run / "tensorboard")).Reload()
    if "val/samples" not in events.Tags()["images"]:
        return []
    return [(e.step, e.height, e.width) for e in events.Images("val/samples")]


def test_each_validation_sends_its_sample_predictions_to_tensorboard(make_config, tmp_path):
    train(make_config("logger=tensorboard"))
    images = tensorboard_images(tmp_path / "run")
    # Two epochs, a validation at the end of each (8 patches of 64 px, batch size 4:
    # 4 steps an epoch), not the sanity check: an image each, at its iteration.
    assert [step for step, _, _ in images] == [4, 8]
    assert all(height > 100 and width > 300 for _, height, width in images)
    # The file on disk is still written.
    assert (tmp_path / "run" / "evaluation" / "sample_predictions.png").is_file()


def test_no_tracker_samples_sends_no_image(make_config, tmp_path):
    train(
        make_config(
            "logger=tensorboard",
            "callbacks.validation_report.tracker_samples=0",
            "trainer.max_epochs=1",
        )
    )
    assert tensorboard_images(tmp_path / "run") == []
    assert (tmp_path / "run" / "evaluation" / "sample_predictions.png").is_file()


@pytest.mark.slow  # ~5 s: creating an MLflow store
def test_mlflow_keeps_each_image_as_an_artifact_and_csv_gets_none(tmp_path):
    mlflow = MLFlowLogger(
        run_folder=str(tmp_path / "run"),
        task_name="train",
        tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
        artifact_location=str(tmp_path / "artifacts"),
    )
    csv = CSVLogger(save_dir=str(tmp_path / "run"), name="", version="")
    assert image_loggers([csv, mlflow]) == [mlflow]
    image = np.zeros((20, 30, 3), np.uint8)
    image[:, :10] = 255
    for step in (4, 12):
        log_image([csv, mlflow], "val/samples", image, step)
    client = mlflow.experiment
    stored = [a.path for a in client.list_artifacts(mlflow.run_id, "val/samples")]
    assert stored == ["val/samples/step_0000004.png", "val/samples/step_0000012.png"]
    assert not (tmp_path / "run" / "metrics.csv").exists()  # CSV got nothing


def test_tensorboard_receives_the_image_as_given(tmp_path):
    logger = TensorBoardLogger(save_dir=str(tmp_path), name="tensorboard", version="")
    log_image([logger], "val/samples", np.full((20, 30, 3), 7, np.uint8), 3)
    logger.experiment.flush()
    assert tensorboard_images(tmp_path) == [(3, 20, 30)]


@pytest.fixture
def offline_wandb(monkeypatch, tmp_path):
    """W&B offline and silent, its own folders in ``tmp_path`` (never the user's)."""
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DIR": str(tmp_path / "wandb-dir"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
    }.items():
        monkeypatch.setenv(name, value)


@pytest.mark.slow  # ~6 s: a tiny run and W&B's service process
def test_wandb_writes_an_offline_run_with_the_images_into_the_run_folder(
    make_config, tmp_path, offline_wandb
):
    train(make_config("logger=wandb"))
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    images = list((runs[0] / "files" / "media" / "images").rglob("*.png"))
    assert len(images) == 2  # one per validation
    assert (tmp_path / "run" / "metrics.csv").is_file()  # the CSV logger as well
    # The W&B run is the run folder's: a resume logs to it again (wandb_run_id).
    assert runs[0].name.endswith("-" + wandb_run_id(tmp_path / "run"))


def test_every_launch_of_a_run_folder_logs_to_one_wandb_run(tmp_path, offline_wandb):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    record = run / ".hydra" / "config.yaml"
    record.write_text("seed: 1\n")
    first = WandbLogger(str(run), project="p", offline=True)
    again = WandbLogger(str(tmp_path / "." / "run"), project="p", offline=True)
    assert first._wandb_init["id"] == again._wandb_init["id"] == wandb_run_id(run)
    assert first._wandb_init["resume"] == "allow"
    # A new run in the same path (the old folder deleted) is another W&B run.
    os.utime(record, ns=(1, 1))
    assert wandb_run_id(run) != first._wandb_init["id"]
    assert WandbLogger(str(run), project="p", id="mine")._wandb_init["id"] == "mine"
