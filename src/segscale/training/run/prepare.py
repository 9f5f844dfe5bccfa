"""The one preparation of a composed training config that train, bench and the API share.

``datamodule/classes=auto`` is resolved first (the training masks' classes go into the
config before anything reads it), then the values are checked, then the patch side
against the network: every entry point that builds or starts a training refuses the
same configs with the same one-line error.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from segscale.models.networks import check_input_side
from segscale.training.run.config_checks import check_config
from segscale.training.run.inferred_classes import InferredClasses, resolve_inferred_classes


def prepare(cfg: DictConfig, run_folder: str | Path | None = None) -> InferredClasses | None:
    """Resolve inferred classes into ``cfg`` and check it; ``ConfigError`` if it cannot work.

    ``run_folder`` (rank 0 of a run) receives the found classes as ``classes.yaml``.
    Returns the classes found for ``datamodule/classes=auto``, else ``None``.
    """
    found = resolve_inferred_classes(cfg, run_folder)
    check_config(cfg)
    check_input_side(cfg.datamodule.patch_size, "datamodule.patch_size", cfg.model)
    return found
