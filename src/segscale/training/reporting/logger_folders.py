"""The folders a run's metric loggers write into, checked before anything is built.

A logger opens its folder when training starts, or at its first metric: one that cannot
be written then ended the run with exit status 1 and the logger's traceback (W&B's
``OSError: Read-only file system`` from deep in ``wandb.init``), or, where W&B finds its
own root unwritable, its files went to the system's temporary folder instead of the run
folder. Each logger of the ``logger`` group is asked here where it will write, and a
folder that cannot be created or written stops the run before the dataset check, with
the key that sets it (``ConfigError``, exit status 2).

Where each logger writes, for the loggers segscale ships and Lightning's of the same
kind (a logger of another class is left to itself):

- CSV, TensorBoard: ``save_dir/name/version`` (``name``, ``version``: when strings);
- W&B: ``<run_folder>/wandb`` (segscale's), ``<save_dir or dir>/wandb`` (Lightning's);
- MLflow: the folder of a ``sqlite:///`` store, a ``file:`` or plain-path store
  (``save_dir`` when ``tracking_uri`` is null), and a local ``artifact_location``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from hydra.utils import get_class
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger
from omegaconf import DictConfig

from segscale.errors import ConfigError
from segscale.output_folder_check import unwritable_reason


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
    if issubclass(kind, (CSVLogger, TensorBoardLogger)):
        save_dir = node.get("save_dir", ".")
        parts = [part for part in (node.get("name"), node.get("version")) if isinstance(part, str)]
        return [LoggerFolder(f"{key}.save_dir", save_dir, Path(save_dir, *parts))]
    if issubclass(kind, WandbLogger):
        option = next((o for o in ("run_folder", "save_dir", "dir") if node.get(o)), None)
        value = node.get(option) if option else "."
        return [LoggerFolder(f"{key}.{option or 'save_dir'}", value, Path(value, "wandb"))]
    if issubclass(kind, MLFlowLogger):
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
