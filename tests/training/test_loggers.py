from typing import ClassVar

import pytest
import sqlalchemy.exc
from alembic.util.exc import CommandError
from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger

from segscale.training import loggers
from segscale.training.loggers import MLFlowLogger


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
