import logging
import os
import threading
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from segscale.training.reporting.loggers import CSVLogger, MLFlowLogger, WandbLogger, wandb_run_id
from segscale.training.reporting.plots import (
    IGNORED_COLOUR,
    IGNORED_HATCH,
    IGNORED_LABEL,
    BackgroundFigures,
    SamplePrediction,
    TrainingPosition,
    colour_labels,
    image_loggers,
    log_image,
    sample_predictions_figure,
    training_progress_figure,
)
from segscale.training.run.training_run import train


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_the_progress_title_and_axis_reach_the_last_iteration_not_the_last_logged():
    train = [(50 * k, 1.0 / k, 0.5, 0.1) for k in range(1, 4)]  # logged up to 150
    position = TrainingPosition(184, 184, 2, 2)
    figure = training_progress_figure(train, [(92, 0.9, 0.6, 0.3)], position)
    assert figure.texts[0].get_text() == "Training progress — iteration 184 of 184, epoch 2 of 2"
    assert figure.axes[0].get_xlim()[1] >= 184
    assert TrainingPosition(7).describe() == "iteration 7"  # totals unknown: left out


def test_ignored_pixels_are_grey_hatched_and_named_in_the_legend():
    truth = np.array([[0, 1], [255, 1]], np.uint8)
    colours = np.array([[0, 0, 0], [255, 0, 0]], np.uint8)  # class 0 black, as ignored was
    rgb = colour_labels(truth, colours, 255)
    assert tuple(rgb[1, 0]) == IGNORED_COLOUR and tuple(rgb[0, 0]) == (0, 0, 0)
    sample = SamplePrediction(np.zeros((2, 2, 3), np.uint8), truth, truth.clip(0, 1), "tile")
    figure = sample_predictions_figure([sample], ["road", "car"], colours, 255, "title")
    legend = figure.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["road", "car", IGNORED_LABEL]
    assert legend.get_patches()[-1].get_hatch() == IGNORED_HATCH
    truth_axis, prediction_axis = figure.axes[1:3]
    for axis in (truth_axis, prediction_axis):  # hatched in both: not scored
        assert [c.hatches for c in axis.collections] == [[IGNORED_HATCH]]


def test_a_figure_is_drawn_on_another_thread_and_wait_returns_once_it_is_written(tmp_path):
    figures, release, threads = BackgroundFigures(), threading.Event(), []
    path = tmp_path / "figure.png"

    def write():
        threads.append(threading.current_thread())
        release.wait(10)
        path.write_bytes(b"png")

    figures.draw(path, write)  # returns while the figure is still being drawn
    assert not path.exists()
    release.set()
    figures.close()
    assert path.read_bytes() == b"png" and threads[0] is not threading.main_thread()


def test_a_figure_that_fails_is_logged_and_the_others_are_still_drawn(tmp_path, caplog):
    figures, order = BackgroundFigures(), []

    def fail():
        raise ValueError("no such colour")

    with caplog.at_level(logging.ERROR, logger="segscale"):
        figures.draw(tmp_path / "a.png", lambda: order.append("a"))
        figures.draw(tmp_path / "b.png", fail)
        figures.draw(tmp_path / "c.png", lambda: order.append("c"))
        figures.close()
    assert order == ["a", "c"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [f"could not draw {tmp_path / 'b.png'}: ValueError: no such colour"]


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
