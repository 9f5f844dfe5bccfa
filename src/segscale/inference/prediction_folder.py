"""One prediction per output folder: held while it runs, and only a fresh one is taken.

Two ``predict.py`` runs into one folder would overwrite or interleave each other's masks
and records. A prediction therefore holds its folder as a training run holds its run
folder (``RunFolderLock``: a second one started into it while it runs is refused,
naming the holder), and takes only a folder that holds nothing but what a prediction
that wrote no mask leaves: the lock, Hydra's log files, the records in ``.hydra/``.
Anything else there (another prediction's masks, files of the user's) refuses the
run, naming the folder and what it holds, before anything is written: nothing is
overwritten. Each launch records its config where Hydra would (``.hydra/`` of
``hydra.run.dir``, the output folder unless ``output_dir`` names another; the next
``.hydra/launch-<n>/`` when one is there already, as after a launch refused for its
input), once it holds the folder: ``conf/predict.yaml`` turns Hydra's own record off,
which a second run would write over the first's before any code of ours ran.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from segscale.errors import ConfigError
from segscale.runs.folder import (
    LOCK_FILE,
    RECORD_DIR,
    RunFolderLock,
    launch_record,
    stop_logging_into,
    write_launch_record,
)

KEY = "hydra.run.dir, or output_dir"
"""The settings that pick a prediction's folder (output_dir is hydra.run.dir unless set)."""
SHOWN = 5
"""Entries a refusal names, of those found in the folder."""


@contextmanager
def prediction_folder(cfg: DictConfig) -> Iterator[Path]:
    """Hold ``cfg.output_dir`` for the prediction inside, once it is known to be fresh.

    Raises ``ConfigError`` (``RunFolderBusyError``) naming the folder when another
    prediction holds it, or when it holds anything a prediction that wrote no mask
    would not have left (``unexpected_entries``).
    """
    folder = Path(cfg.output_dir)
    with RunFolderLock(folder, what="prediction", key=KEY):
        found = unexpected_entries(folder)
        if found:
            stop_logging_into(folder)  # the log there is the earlier run's
            shown = ", ".join(found[:SHOWN]) + (", ..." if len(found) > SHOWN else "")
            raise ConfigError(
                f"{folder} already holds {len(found)} file(s) or folder(s) that this "
                f"prediction would not write ({shown}): the masks of another prediction, "
                f"or files of yours; nothing was predicted, so none was overwritten. "
                f"Predict into a new folder ({KEY})"
            )
        record_folder = _hydra_run_folder()
        if record_folder is not None:  # what and where Hydra itself would have recorded
            write_launch_record(record_folder, launch_record(cfg))
        yield folder


def _hydra_run_folder() -> str | None:
    """The run folder of the Hydra run this is (``hydra.runtime.output_dir``), if it is one.

    A config composed without a run (a test, the API) leaves it unset.
    """
    if not HydraConfig.initialized():
        return None
    # Hydra annotates it HydraConf, but it holds the config masked to its "hydra" key.
    hydra_cfg = cast(DictConfig, HydraConfig.instance().cfg)
    folder = OmegaConf.select(
        hydra_cfg, "hydra.runtime.output_dir", default=None, throw_on_missing=False
    )
    return None if folder is None else str(folder)


def unexpected_entries(folder: Path) -> list[str]:
    """The entries of ``folder`` that a prediction which wrote no mask leaves none of."""
    with os.scandir(folder) as entries:
        return sorted(
            entry.name + ("/" if entry.is_dir() else "")
            for entry in entries
            if not _left_before_masks(entry)
        )


def _left_before_masks(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is of the forms a prediction writes before its first mask.

    The lock file and the launch records' folder as themselves (not links to something
    else), and Hydra's ``*.log`` files.
    """
    if entry.name == LOCK_FILE:
        return entry.is_file(follow_symlinks=False)
    if entry.name == RECORD_DIR:
        return entry.is_dir(follow_symlinks=False)
    return entry.name.endswith(".log") and entry.is_file(follow_symlinks=False)
