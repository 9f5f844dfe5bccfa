"""Metric loggers: CSV that keeps a resumed run's history, MLflow and W&B that know their job.

The folders a run's metric loggers write into are checked before anything is built
(``check_logger_folders``).
"""

from __future__ import annotations

import csv
import hashlib
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import unquote, urlparse

import lightning as L
import natsort
import torch
from hydra.utils import get_class
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from segscale.atomic_files import write_csv_atomically
from segscale.errors import ConfigError
from segscale.models.checkpoint.files import written_step
from segscale.output_folder_check import unwritable_reason

T = TypeVar("T")

log = logging.getLogger(__name__)


class _Utf8Files:
    """An fsspec file system whose text files are UTF-8, whatever the locale's encoding.

    Lightning's CSV writer opens ``metrics.csv`` without an encoding, so in the locale's:
    cp1252 on most Windows machines, which cannot write a class named ``水``
    (``val/IoU_水``), and which segscale's readers of the file would not expect.
    """

    def __init__(self, files: Any) -> None:
        self.files = files

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        """``files.open``, a text mode given ``encoding="utf-8"``."""
        if "b" not in mode:
            kwargs.setdefault("encoding", "utf-8")
        return self.files.open(path, mode, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.files, name)


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, except that an existing ``metrics.csv`` is continued.

    Lightning deletes the file when its folder is reused; a resumed run writes into its
    own run folder, so the rows before the interruption would be lost. Its columns are
    in natural order (``val/IoU_class_2`` before ``val/IoU_class_10``), where Lightning
    sorts them as text. The file is UTF-8 (``_Utf8Files``).
    """

    @property  # Lightning's plain attribute, wrapped as it is set
    def _fs(self) -> Any:
        return self._utf8_files

    @_fs.setter
    def _fs(self, files: Any) -> None:
        self._utf8_files = _Utf8Files(files)

    def _record_new_keys(self) -> set[str]:
        new_keys = super()._record_new_keys()
        self.metrics_keys.sort(key=natsort.natsort_key)
        return new_keys

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="", encoding="utf-8") as file:
                self.metrics_keys = list(csv.DictReader(file).fieldnames or [])


class CSVLogger(LightningCSVLogger):
    """Metrics as ``metrics.csv``; a resumed run continues the file it left, each step once.

    The interrupted launch may have logged steps after the checkpoint the run resumes
    from; the resumed run logs them again. So when a fit resumes from a checkpoint, the
    rows at or after its global step are dropped before the first new row is written
    (``drop_rows_from``). Lightning numbers a row by the optimizer steps taken before
    it: the training and learning-rate rows of the batch that takes global step
    ``s + 1`` say ``s``, and so does a validation at the end of that batch's epoch. A
    checkpoint saved at global step ``s + 1`` (after that batch, or after that
    validation) thus includes every row numbered ``s`` or less, and the resumed run's
    first row is numbered ``s + 1``.
    """

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        """The writer, created on first use."""
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        # Lightning declares _experiment as Fabric's writer; only this property sets it.
        return cast(ExperimentWriter, self._experiment)

    @rank_zero_only
    def log_graph(self, model: torch.nn.Module, input_array: torch.Tensor | None = None) -> None:
        """Forget what an interrupted launch logged after the checkpoint this fit resumes from.

        Lightning calls this once as a fit starts (with the hyperparameters, before any
        metric), when the checkpoint is loaded but the loops are not yet restored: the
        checkpoint's global step is read from its file (memory-mapped; the tensors
        stay on disk).
        """
        if not isinstance(model, L.LightningModule):
            return
        trainer = model.trainer
        if trainer.state.fn != TrainerFn.FITTING or not trainer.ckpt_path:
            return
        step = written_step(trainer.ckpt_path)
        if step is not None:  # fit has loaded (and verified) it: it reads
            self.drop_rows_from(step)

    @rank_zero_only
    def drop_rows_from(self, step: int) -> None:
        """Remove the rows numbered ``step`` or later from ``metrics.csv``, atomically.

        Rows not yet written (in the writer's memory) are kept: they are this launch's.
        """
        path = Path(self.log_dir) / ExperimentWriter.NAME_METRICS_FILE
        if not path.is_file():
            return
        with path.open(newline="", encoding="utf-8") as file:
            header, *rows = list(csv.reader(file)) or [[]]
        if "step" not in header:
            return
        column = header.index("step")
        kept = [row for row in rows if not _numbered_from(row, column, step)]
        if len(kept) < len(rows):
            write_csv_atomically(path, header, kept)
            log.info(
                "metrics.csv: %d rows from step %d on, logged before the run was "
                "interrupted, are replaced by the resumed run's",
                len(rows) - len(kept),
                step,
            )


class MLFlowLogger(LightningMLFlowLogger):
    """Lightning's MLflow logger, with a run that tells which job it was.

    The experiment is the sweep (``<task>-multirun/<sweep folder>``) when the run folder
    is a job of one (its parent holds ``multirun.yaml``), else the task name; the run is
    named after the run folder. The job's overrides are logged as parameters when it
    starts; its plots, config and summary are logged as artifacts when it ends, also
    when it failed. Several jobs may open the same store at once (parallel sweeps):
    creating it, or the experiment, is retried.
    """

    def __init__(
        self,
        run_folder: str,
        task_name: str,
        overrides: list[str] | None = None,
        tracking_uri: str = "sqlite:///outputs/mlflow.db",
        artifact_location: str = "outputs/mlartifacts",
        **kwargs: Any,
    ) -> None:
        self.run_folder = Path(run_folder)
        sweep = self.run_folder.parent
        experiment = f"{task_name}-multirun/{sweep.name}" if _is_sweep(sweep) else task_name
        options = {
            "experiment_name": kwargs.pop("experiment_name", None) or experiment,
            "run_name": kwargs.pop("run_name", None) or self.run_folder.name,
            "tracking_uri": _absolute_sqlite(tracking_uri),
            "artifact_location": Path(artifact_location).resolve().as_uri(),
            **kwargs,
        }
        # Lightning opens the store here (its MlflowClient), creating the tables of a new one.
        _retried(lambda: super(MLFlowLogger, self).__init__(**options))
        self.overrides = list(overrides or [])

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The MLflow client, with the store, experiment and run created on first use."""
        if self._initialized:
            return self._mlflow_client
        client = _retried(lambda: super(MLFlowLogger, self).experiment)
        params = dict(o.split("=", 1) for o in self.overrides if "=" in o)
        if params:
            self.log_hyperparams({k.lstrip("+~"): v for k, v in params.items()})
        return client

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        """Log the run folder's plots, config and summary as artifacts, then end the run."""
        if self._initialized:
            artifacts = [
                *self.run_folder.glob("*.png"),
                *self.run_folder.glob("summary.json"),
                *(self.run_folder / "evaluation").glob("*"),
            ]
            for path in artifacts:
                if path.is_file():
                    self.experiment.log_artifact(self.run_id, str(path))
            config = self.run_folder / ".hydra"
            if config.is_dir():
                self.experiment.log_artifacts(self.run_id, str(config), artifact_path="config")
        super().finalize(status)


class WandbLogger(LightningWandbLogger):
    """Lightning's Weights & Biases logger, its run named after the run folder.

    The run's files go into ``<run folder>/wandb``; ``offline`` (the config's default)
    writes them there without a login, for ``wandb sync`` later. Every launch of one run
    folder (a resume, a requeue) logs to one W&B run: its id is the run folder's
    (``wandb_run_id``) and W&B resumes it if it exists; ``id`` given by hand wins.
    """

    def __init__(self, run_folder: str, **kwargs: Any) -> None:
        folder = Path(run_folder)
        kwargs.setdefault("id", wandb_run_id(folder))
        kwargs.setdefault("resume", "allow")
        super().__init__(
            save_dir=str(folder), name=kwargs.pop("name", None) or folder.name, **kwargs
        )


def wandb_run_id(folder: Path) -> str:
    """The W&B run id of a run folder: the same for each of its launches, on every rank.

    A digest of the folder's resolved path and the time its first launch record was
    written (``.hydra/config.yaml``, never rewritten by a later launch), so that a new
    run in a reused path (the old folder deleted) is another W&B run, not a continuation.
    """
    record = folder / ".hydra" / "config.yaml"
    written = record.stat().st_mtime_ns if record.is_file() else 0
    identity = f"{folder.resolve()}\n{written}".encode()
    return hashlib.sha256(identity).hexdigest()[:16]


def _numbered_from(row: list[str], column: int, step: int) -> bool:
    """Whether a ``metrics.csv`` row has a step number of ``step`` or more."""
    try:
        return int(row[column]) >= step
    except (IndexError, ValueError):  # a row that is not Lightning's: kept as it is
        return False


def _retried(action: Callable[[], T]) -> T:
    """``action()``, tried again (10 times in all) while other jobs create the same store."""
    busy = _store_errors()
    for _ in range(9):
        try:
            return action()
        except busy:
            time.sleep(0.5 + random.random())
    return action()


def _store_errors() -> tuple[type[Exception], ...]:
    """What MLflow raises while another job creates the same store or experiment.

    Its SQL store wraps what fails in a session (a locked database, an experiment created
    meanwhile) in ``MlflowException``. Creating the tables of a new store runs Alembic's
    migrations, which raise SQLAlchemy's errors (a table another job just created) and
    Alembic's ``CommandError`` (a migration step another job just did). Anything else (a
    bad argument, a bug) is not retried.
    """
    # Imported here: mlflow (with alembic and sqlalchemy) is an optional dependency.
    from alembic.util.exc import CommandError
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    return (MlflowException, SQLAlchemyError, CommandError)


def _is_sweep(folder: Path) -> bool:
    return (folder / "multirun.yaml").is_file()


def _absolute_sqlite(uri: str) -> str:
    """An ``sqlite:///relative/path`` URI made absolute (jobs may run in other folders)."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        path = Path(uri[len(prefix) :]).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return prefix + str(path)
    return uri


@dataclass(frozen=True)
class LoggerFolder:
    """A folder a logger writes into, and the config key that sets it."""

    key: str  # e.g. logger.wandb.run_folder
    value: str  # the key's value, as given
    folder: Path  # where the logger writes, from that value


def check_logger_folders(loggers: DictConfig | None) -> None:
    """Raise ``ConfigError`` naming each logger folder that cannot be created or written."""
    problems = []
    for place in logger_folders(loggers):
        reason = unwritable_reason(place.folder)
        if reason is not None:
            logger = place.key.split(".")[1]
            problems.append(
                f"{place.key}={place.value!r} is not allowed: the {logger} logger writes into "
                f"{place.folder}, and {reason}; expected a folder that can be created and "
                f"written (set {place.key}=..., or leave that logger out: ~logger.{logger})"
            )
    if problems:
        raise ConfigError("; ".join(problems))


def logger_folders(loggers: DictConfig | None) -> list[LoggerFolder]:
    """Every folder the ``logger`` group's loggers write into (see the module docstring)."""
    places: list[LoggerFolder] = []
    for name, node in (loggers or {}).items():
        if node is not None and "_target_" in node:
            places += _folders(f"logger.{name!s}", get_class(node._target_), node)
    return places


def _folders(key: str, kind: type, node: DictConfig) -> list[LoggerFolder]:
    """Where a logger of class ``kind``, configured by ``node`` at ``key``, writes."""
    if issubclass(kind, (LightningCSVLogger, TensorBoardLogger)):
        save_dir = node.get("save_dir", ".")
        parts = [part for part in (node.get("name"), node.get("version")) if isinstance(part, str)]
        return [LoggerFolder(f"{key}.save_dir", save_dir, Path(save_dir, *parts))]
    if issubclass(kind, LightningWandbLogger):
        option = next((o for o in ("run_folder", "save_dir", "dir") if node.get(o)), None)
        value = node.get(option) if option else "."
        return [LoggerFolder(f"{key}.{option or 'save_dir'}", value, Path(value, "wandb"))]
    if issubclass(kind, LightningMLFlowLogger):
        return _mlflow_folders(key, node)
    return []


def _mlflow_folders(key: str, node: DictConfig) -> list[LoggerFolder]:
    """The folders of an MLflow logger's store and artifacts, where they are local."""
    places = []
    uri = node.get("tracking_uri")
    if uri is None:  # Lightning's: a file store in save_dir
        save_dir = node.get("save_dir", "./mlruns")
        places.append(LoggerFolder(f"{key}.save_dir", save_dir, Path(save_dir)))
    elif (store := _local_path(uri, sqlite=True)) is not None:
        places.append(LoggerFolder(f"{key}.tracking_uri", uri, store))
    artifacts = node.get("artifact_location")
    if artifacts is not None and (folder := _local_path(artifacts)) is not None:
        places.append(LoggerFolder(f"{key}.artifact_location", artifacts, folder))
    return places


def _local_path(uri: Any, sqlite: bool = False) -> Path | None:
    """The local folder ``uri`` names (a plain path, ``file:``, ``sqlite:///``'s folder).

    ``None`` for a store elsewhere (``http(s)://``, ``databricks``, ``s3://``, ...).
    """
    text = str(uri)
    if text == "databricks":  # MLflow's name of the workspace of its login, no path
        return None
    if sqlite and text.startswith("sqlite:///"):
        return Path(os.path.abspath(text[len("sqlite:///") :])).parent
    parsed = urlparse(text)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" or Path(text).drive:  # a plain path (C:\ parses as a scheme)
        return Path(text)
    return None
