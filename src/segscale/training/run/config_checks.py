"""Checks on a composed config that stop a run before anything is built.

Each failure names the config key, the value it got and what is allowed, so a user can
fix the override without reading code.

``prepare`` is the one preparation of a composed training config that train, bench and
the API share: ``datamodule/classes=auto`` is resolved first (the training masks'
classes go into the config before anything reads it), then the values are checked, then
the patch side against the network, so every entry point that builds or starts a
training refuses the same configs with the same one-line error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from segscale.config_schema import check_schema
from segscale.config_types import check_types
from segscale.data.datamodule import checked_start_method
from segscale.devices import devices_count
from segscale.errors import ConfigError, integer_at_least, require
from segscale.models.networks import check_input_side
from segscale.models.optim import SOLVERS
from segscale.platforms.parallel import KEY as START_METHOD_KEY
from segscale.runs.builders import check_data_source, strategy_backend
from segscale.training.callbacks.encoder_freeze import KEY as FREEZE_KEY
from segscale.training.callbacks.encoder_freeze import EncoderFreeze
from segscale.training.run.inferred_classes import InferredClasses, resolve_inferred_classes


def check_config(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` for the first value in ``cfg`` that cannot work."""
    check_schema(cfg)
    check_data_source(cfg)
    devices_count(cfg.trainer.get("devices", "auto"))
    strategy_backend(cfg)
    for key in REQUIRED:  # their kinds and ranges: the schema's
        _get(cfg, key)
    # classes=auto has filled in the count by now (the schema sees auto at composition).
    for key in ("datamodule.num_classes", "model.num_classes"):
        require(_get(cfg, key), key, integer_at_least(2), "an integer >= 2")
    checked_start_method(OmegaConf.select(cfg, START_METHOD_KEY, default="auto"))
    solver = _get(cfg, "optimizer.solver")
    require(solver, "optimizer.solver", lambda v: v in SOLVERS, f"one of {list(SOLVERS)}")
    check_fine_tuning(cfg)
    # Last, so that the checks above give their more specific messages first.
    # model.in_channels: null means "from the images"; train() fills it in when it builds.
    check_types(cfg, filled_in=("model.in_channels",))


def check_fine_tuning(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` for fine-tuning settings that do not agree with the callbacks.

    ``training.freeze_encoder_epochs`` acts through the ``EncoderFreeze`` callback of
    ``callbacks`` (``callbacks=none`` drops it): a run that asks for freezing without it,
    or whose callback was given other epochs, is refused rather than trained otherwise.
    """
    epochs = cfg.training.freeze_encoder_epochs
    target = f"{EncoderFreeze.__module__}.{EncoderFreeze.__qualname__}"
    callbacks = cfg.get("callbacks") or {}
    found = {
        name: node for name, node in callbacks.items() if node and node.get("_target_") == target
    }
    for name, node in found.items():
        if node.get("epochs", 0) != epochs:
            raise ConfigError(
                f"callbacks.{name}.epochs={node.get('epochs', 0)!r} differs from "
                f"{FREEZE_KEY}={epochs}: set {FREEZE_KEY} only"
            )
    if epochs and not found:
        raise ConfigError(
            f"{FREEZE_KEY}={epochs} needs the callback callbacks.encoder_freeze "
            f"({target}), which this config's callbacks leave out (callbacks=none?)"
        )


def _get(cfg: DictConfig, dotted: str) -> Any:
    value = OmegaConf.select(cfg, dotted, default=_ABSENT)
    if value is _ABSENT:
        raise ConfigError(f"{dotted} is missing from the config")
    return value


_ABSENT = object()
REQUIRED = (
    "datamodule.num_classes",
    "model.num_classes",
    "datamodule.patch_size",
    "datamodule.patches_per_image",
    "datamodule.batch_size",
    "datamodule.num_workers",
    "datamodule.shuffle",
    "optimizer.solver",
    "optimizer.lr",
)
"""Keys every training config holds."""


def prepare(cfg: DictConfig, run_folder: str | Path | None = None) -> InferredClasses | None:
    """Resolve inferred classes into ``cfg`` and check it; ``ConfigError`` if it cannot work.

    ``run_folder`` (rank 0 of a run) receives the found classes as ``classes.yaml``.
    Returns the classes found for ``datamodule/classes=auto``, else ``None``.
    """
    found = resolve_inferred_classes(cfg, run_folder)
    check_config(cfg)
    check_input_side(cfg.datamodule.patch_size, "datamodule.patch_size", cfg.model)
    return found
