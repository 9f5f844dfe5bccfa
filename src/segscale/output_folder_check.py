"""A Hydra callback that refuses an output folder that cannot be created or written.

Hydra creates the run folder (``hydra.run.dir``) in ``run_job``, and a sweep's folder
(``hydra.sweep.dir``) in its launcher, before any code of ours runs: a folder under a
read-only one, or under a regular file, would end the run in Hydra's traceback. The
callback runs first (``on_run_start``, ``on_multirun_start``), creates nothing, and
stops such a run with one line that names the folder and the key, and exit status 2.
It is registered under ``hydra.callbacks`` in ``conf/{train,predict,evaluate}.yaml``.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from segscale.errors import EXIT_BAD_INPUT

log = logging.getLogger(__name__)


class OutputFolderCheck(Callback):
    """Stops a run, before Hydra creates its folder, if that folder cannot be written."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check ``hydra.run.dir``, which Hydra creates next (``run_job``)."""
        check_output_folder(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check ``hydra.sweep.dir``, which the launcher creates before the first job."""
        check_output_folder(config, "hydra.sweep.dir")


def check_output_folder(config: DictConfig, key: str) -> None:
    """Log why the folder at ``key`` cannot be created or written and exit with status 2.

    ``SystemExit``, unlike an exception, passes through Hydra's error report, which
    would print a traceback. A folder whose name does not resolve yet is left to Hydra.
    """
    folder = _resolved_folder(config, key)
    reason = None if folder is None else unwritable_reason(folder)
    if reason is None:
        return
    log.error(
        "%s=%r is not allowed: %s; expected a folder that can be created and written "
        "(set %s=<folder>, or run from a folder you can write to)",
        key,
        folder,
        reason,
        key,
    )
    sys.exit(EXIT_BAD_INPUT)


def unwritable_reason(folder: str | os.PathLike[str]) -> str | None:
    """Why ``folder`` cannot be created or written into; ``None`` when it can.

    Creates nothing. The nearest part of the path that exists must be a folder that
    this process may write into. ``os.access`` also answers for root, who may write
    anywhere but on a read-only file system; a regular file in the path stops anyone.
    """
    path = Path(os.path.abspath(folder))
    existing = path
    # lexists: a broken link is there, and mkdir would fail on it.
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not os.path.isdir(existing):
        kind = "a file" if os.path.isfile(existing) else "not a folder (a broken link?)"
        return f"{existing} is {kind}"
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "the folder" if existing == path else f"{existing}, where it would be created,"
        return f"{where} is not writable"
    return None


def _resolved_folder(config: DictConfig, key: str) -> str | None:
    """The folder at ``key``, resolved as Hydra will resolve it; ``None`` if it cannot be.

    Hydra sets its ``HydraConfig`` (``${hydra:...}`` interpolations) only in
    ``run_job``; a copy is set for the moment here, and the config itself is resolved,
    so that ``${now:...}`` (cached in the config) names the folder Hydra will create.
    """
    hydra_config = HydraConfig.instance()
    previous = hydra_config.cfg
    hydra_config.set_config(copy.deepcopy(config))
    try:
        folder = OmegaConf.select(config, key)
    except InterpolationResolutionError:
        return None
    finally:
        hydra_config.cfg = previous
    return None if folder is None else str(folder)
