import csv
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import lightning as L
import pytest
import sqlalchemy.exc
import torch
from alembic.util.exc import CommandError
from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger
from lightning.pytorch.trainer.states import TrainerFn
from omegaconf import OmegaConf

from segscale.cli.train import main
from segscale.configs import CONFIG_DIR
from segscale.errors import ConfigError
from segscale.training.reporting import loggers
from segscale.training.reporting.loggers import (
    CSVLogger,
    MLFlowLogger,
    check_logger_folders,
    logger_folders,
)
from tests.conftest import compose_config, tiny_overrides
from tests.in_process import run_in_process

# metrics.csv as Lightning left it when a launch was killed at global step 12 (8 batches
# an epoch, log_every_n_steps=1): a learning-rate and a training row per step, numbered by
# the optimizer steps before it, and epoch 0's validation numbered as its last batch (7).
KILLED_LAUNCH = [
    ["epoch", "lr-SGD", "step", "train/loss", "val/loss"],
    *(
        row
        for step in range(12)
        for row in (
            ["", f"0.0{step}", str(step), "", ""],
            [str(step // 8), "", str(step), f"1.{step}", ""],
            *([["0", "", "7", "", "0.9"]] if step == 7 else []),
        )
    ),
]


def killed_run(tmp_path) -> CSVLogger:
    """A CSV logger on a run folder holding the killed launch's metrics.csv."""
    with (tmp_path / "metrics.csv").open("w", newline="") as file:
        csv.writer(file).writerows(KILLED_LAUNCH)
    return CSVLogger(save_dir=str(tmp_path), name="", version="")


def steps(tmp_path) -> list[tuple[str, int]]:
    """(kind of row, step) of each row of metrics.csv, in order."""
    with (tmp_path / "metrics.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    kinds = [("lr" if r["lr-SGD"] else "val" if r["val/loss"] else "train") for r in rows]
    return [(kind, int(r["step"])) for kind, r in zip(kinds, rows, strict=True)]


def test_a_resume_replaces_the_rows_logged_after_its_checkpoint(tmp_path):
    # Resumed from the checkpoint of global step 10, saved after the batch numbered 9:
    # the resumed run logs steps 10 and 11 again.
    logger = killed_run(tmp_path)
    logger.log_metrics({"lr-SGD": 0.5}, step=10)  # the resumed run's first row
    logger.drop_rows_from(10)
    logger.save()
    expected = [(kind, s) for s in range(10) for kind in ("lr", "train")]
    expected.insert(expected.index(("train", 7)) + 1, ("val", 7))  # its epoch is included
    assert steps(tmp_path) == [*expected, ("lr", 10)]
    assert (tmp_path / "metrics.csv").read_text().splitlines()[:16] == [
        ",".join(row) for row in KILLED_LAUNCH[:16]
    ]  # the rows kept, as they were
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]  # no temporary left


def test_the_restored_step_is_read_from_the_checkpoint_a_fit_resumes(tmp_path):
    checkpoint = tmp_path / "checkpoints" / "epoch000-step0000005.ckpt"
    checkpoint.parent.mkdir()
    torch.save({"global_step": 5, "state_dict": {"w": torch.zeros(3)}}, checkpoint)
    logger = killed_run(tmp_path)
    module = L.LightningModule()
    for stage, ckpt_path in ((TrainerFn.VALIDATING, checkpoint), (TrainerFn.FITTING, None)):
        module.trainer = SimpleNamespace(state=SimpleNamespace(fn=stage), ckpt_path=ckpt_path)
        logger.log_graph(module)
        assert len(steps(tmp_path)) == len(KILLED_LAUNCH) - 1  # not a resumed fit: kept
    module.trainer = SimpleNamespace(
        state=SimpleNamespace(fn=TrainerFn.FITTING), ckpt_path=str(checkpoint)
    )
    logger.log_graph(module)
    assert max(step for _, step in steps(tmp_path)) == 4


class FakeClient:
    """Stands in for ``MlflowClient``: fails as a store being created by another job would."""

    failures: ClassVar[list[Exception]] = []
    opened = 0

    def __init__(self, tracking_uri: str) -> None:
        FakeClient.opened += 1
        if FakeClient.failures:
            raise FakeClient.failures.pop(0)


@pytest.fixture
def fake_store(monkeypatch):
    import mlflow.tracking

    monkeypatch.setattr(mlflow.tracking, "MlflowClient", FakeClient)
    monkeypatch.setattr(loggers.time, "sleep", lambda seconds: None)
    FakeClient.failures, FakeClient.opened = [], 0
    return FakeClient


def new_logger(tmp_path) -> MLFlowLogger:
    return MLFlowLogger(
        run_folder=str(tmp_path / "run"),
        task_name="train",
        tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
        artifact_location=str(tmp_path / "artifacts"),
    )


def test_a_store_that_another_job_is_creating_is_opened_again(fake_store, tmp_path):
    # What concurrent jobs meet while the first creates the store's tables.
    fake_store.failures = [
        sqlalchemy.exc.OperationalError("CREATE TABLE experiments", {}, Exception("exists")),
        CommandError("Online migration expected to match one row"),
    ]
    new_logger(tmp_path)
    assert fake_store.opened == 3


def test_only_a_busy_store_is_retried(fake_store, monkeypatch, tmp_path):
    from mlflow.exceptions import MlflowException

    logger = new_logger(tmp_path)
    errors = [MlflowException("experiment already exists"), TypeError("a bug")]
    calls = []

    def experiment(self):
        calls.append(errors[len(calls)])
        raise calls[-1]

    monkeypatch.setattr(LightningMLFlowLogger, "experiment", property(experiment))
    with pytest.raises(TypeError, match="a bug"):
        _ = logger.experiment
    assert len(calls) == 2  # the busy store once more, the bug not again


def test_per_class_columns_are_in_natural_order(tmp_path):
    logger = CSVLogger(save_dir=str(tmp_path), name="", version="")
    names = [f"val/IoU_class_{k}" for k in range(12)]
    logger.log_metrics({name: 0.5 for name in reversed(names)}, step=0)
    logger.save()
    logger.log_metrics({"val/mIoU": 0.5}, step=1)  # a new column rewrites the header
    logger.save()
    with (tmp_path / "metrics.csv").open(newline="") as file:
        header = next(csv.reader(file))
    assert [h for h in header if h.startswith("val/IoU_")] == names  # class_2 before class_10


LOGGERS = sorted(path.stem for path in (Path(CONFIG_DIR) / "logger").glob("*.yaml"))


def folders(run: Path, option: str) -> dict[str, Path]:
    """Key → folder of every logger of ``logger=<option>``, for the run folder ``run``."""
    cfg = compose_config("train", f"output_dir={run}", f"logger={option}")
    return {place.key: place.folder for place in logger_folders(cfg.logger)}


@pytest.mark.parametrize("option", LOGGERS)
def test_every_shipped_logger_says_where_it_writes(tmp_path, option, monkeypatch):
    monkeypatch.chdir(tmp_path)  # mlflow's default store is relative to the current folder
    run = tmp_path / "run"
    found = folders(run, option)
    expected = {
        "csv": {},
        "tensorboard": {"logger.tensorboard.save_dir": run / "tensorboard"},
        "wandb": {"logger.wandb.run_folder": run / "wandb"},
        "mlflow": {
            "logger.mlflow.tracking_uri": tmp_path / "outputs",
            "logger.mlflow.artifact_location": Path("outputs/mlartifacts"),
        },
        "none": {},
    }[option]
    assert found == (expected | {"logger.csv.save_dir": run} if option != "none" else {})
    check_logger_folders(compose_config("train", f"output_dir={run}", f"logger={option}").logger)


def logger_group(**nodes: dict) -> OmegaConf:
    return OmegaConf.create(nodes)


LIGHTNING = "lightning.pytorch.loggers."
OURS = "segscale.training.reporting.loggers."


@pytest.mark.parametrize(
    ("node", "key", "blocked"),
    [
        ({"_target_": OURS + "CSVLogger", "save_dir": "{f}/run", "name": "", "version": ""},
         "logger.x.save_dir", "{f}"),
        # The folder itself a file, under a folder that can be written.
        ({"_target_": LIGHTNING + "TensorBoardLogger", "save_dir": "{d}", "name": "tensorboard",
          "version": ""}, "logger.x.save_dir", "{d}/tensorboard"),
        ({"_target_": OURS + "WandbLogger", "run_folder": "{d}"}, "logger.x.run_folder",
         "{d}/wandb"),
        ({"_target_": LIGHTNING + "WandbLogger", "save_dir": "{f}/w"}, "logger.x.save_dir", "{f}"),
        ({"_target_": LIGHTNING + "WandbLogger", "dir": "{f}/w"}, "logger.x.dir", "{f}"),
        ({"_target_": OURS + "MLFlowLogger", "run_folder": "{d}", "task_name": "t",
          "tracking_uri": "sqlite:///{f}/x/mlflow.db"}, "logger.x.tracking_uri", "{f}"),
        ({"_target_": OURS + "MLFlowLogger", "run_folder": "{d}", "task_name": "t",
          "tracking_uri": "file://{f}/store"}, "logger.x.tracking_uri", "{f}"),
        ({"_target_": OURS + "MLFlowLogger", "run_folder": "{d}", "task_name": "t",
          "tracking_uri": "http://tracking:5000", "artifact_location": "{f}/a"},
         "logger.x.artifact_location", "{f}"),
        ({"_target_": LIGHTNING + "MLFlowLogger", "tracking_uri": None, "save_dir": "{f}/runs"},
         "logger.x.save_dir", "{f}"),
    ],
    ids=["csv", "tensorboard", "wandb", "lightning-wandb-save_dir", "lightning-wandb-dir",
         "mlflow-sqlite", "mlflow-file-store", "mlflow-artifacts", "lightning-mlflow-save_dir"],
)  # fmt: skip
def test_a_logger_folder_that_cannot_be_made_is_refused_naming_its_key(
    tmp_path, node, key, blocked
):
    folder, file = tmp_path / "d", tmp_path / "f"
    folder.mkdir()
    file.touch()
    (folder / "wandb").touch()  # where the W&B run would go
    (folder / "tensorboard").touch()
    filled = {k: v.format(d=folder, f=file) if isinstance(v, str) else v for k, v in node.items()}
    with pytest.raises(ConfigError) as refused:
        check_logger_folders(logger_group(x=filled))
    message = str(refused.value)
    assert message.startswith(f"{key}=")
    assert f"{blocked.format(d=folder, f=file)} is a file" in message
    assert f"set {key}=..., or leave that logger out: ~logger.x" in message


def test_remote_stores_and_other_loggers_are_left_to_themselves(tmp_path):
    group = logger_group(
        remote={
            "_target_": OURS + "MLFlowLogger",
            "run_folder": str(tmp_path),
            "task_name": "t",
            "tracking_uri": "databricks",
            "artifact_location": "s3://bucket/artifacts",
        },
        other={"_target_": "lightning.pytorch.loggers.CometLogger", "save_dir": "/dev/null/x"},
        off=None,
    )
    assert logger_folders(group) == []
    check_logger_folders(group)


def test_train_py_stops_before_training_when_the_wandb_folder_cannot_be_written(
    tiny_data_root, tmp_path
):
    run = tmp_path / "run"
    run.mkdir()
    (run / "wandb").write_text("not a folder")  # where W&B would write its offline run
    done = run_in_process(
        main,
        *tiny_overrides(tiny_data_root, None),
        f"hydra.run.dir={run}",
        "logger=wandb",
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-3000:]
    assert f"logger.wandb.run_folder='{run}' is not allowed: the wandb logger writes into" in (
        output
    )
    assert f"{run / 'wandb'} is a file" in output and "Traceback" not in output
    # Refused before training, as any bad value: the config and the log, nothing else.
    assert not (run / "summary.json").exists() and not (run / "checkpoints").exists()
    assert "logger.wandb.run_folder" in (run / "train.log").read_text()
    assert sorted(p.name for p in run.iterdir()) == [".hydra", "train.log", "wandb"]
