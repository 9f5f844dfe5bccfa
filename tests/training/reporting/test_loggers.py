import csv
from types import SimpleNamespace
from typing import ClassVar

import lightning as L
import pytest
import sqlalchemy.exc
import torch
from alembic.util.exc import CommandError
from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger
from lightning.pytorch.trainer.states import TrainerFn

from segscale.training.reporting import loggers
from segscale.training.reporting.loggers import CSVLogger, MLFlowLogger

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
