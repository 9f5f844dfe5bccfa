"""Checks on a composed config that stop a run before anything is built.

Each failure names the config key, the value it got and what is allowed, so a user can
fix the override without reading code.
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

from segscale.config_types import check_types
from segscale.data.datamodule import checked_start_method
from segscale.data.samplers import SHUFFLE_MODES
from segscale.data.split_forms import check_splits
from segscale.devices import devices_count
from segscale.errors import ConfigError, integer_at_least, require
from segscale.models.nonfinite import check_policy
from segscale.models.optim import SOLVERS, check_encoder_lr_factor
from segscale.moved_keys import refuse_moved_config_keys
from segscale.platforms.parallel import KEY as START_METHOD_KEY
from segscale.training.callbacks.ema import check_ema
from segscale.training.callbacks.encoder_freeze import KEY as FREEZE_KEY
from segscale.training.callbacks.encoder_freeze import EncoderFreeze
from segscale.training.ranks.threads import check_threads_setting
from segscale.training.run.builders import strategy_backend


def check_config(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` for the first value in ``cfg`` that cannot work."""
    refuse_moved_config_keys(cfg)
    check_data_source(cfg)
    devices_count(cfg.trainer.get("devices", "auto"))
    strategy_backend(cfg)
    for key in ("datamodule.num_classes", "model.num_classes"):
        require(_get(cfg, key), key, lambda v: isinstance(v, int) and v >= 2, "an integer >= 2")
    for key, minimum in (
        ("datamodule.patch_size", 1),
        ("datamodule.patches_per_image", 1),
        ("datamodule.batch_size", 1),
    ):
        value = _get(cfg, key)
        require(
            value,
            key,
            integer_at_least(minimum),
            f"an integer >= {minimum}",
        )
    check_loader_options(cfg)
    shuffle = _get(cfg, "datamodule.shuffle")
    require(
        shuffle, "datamodule.shuffle", lambda v: v in SHUFFLE_MODES, f"one of {list(SHUFFLE_MODES)}"
    )

    solver = _get(cfg, "optimizer.solver")
    require(solver, "optimizer.solver", lambda v: v in SOLVERS, f"one of {list(SOLVERS)}")
    lr = _get(cfg, "optimizer.lr")
    require(
        lr,
        "optimizer.lr",
        lambda v: isinstance(v, (int, float)) and 0 < v < math.inf,
        "a positive learning rate such as 0.01",
    )
    check_policy(OmegaConf.select(cfg, "training.on_nonfinite", default="stop"))
    check_threads_setting(OmegaConf.select(cfg, "training.threads", default="auto"))
    check_fine_tuning(cfg)
    check_ema(cfg)
    # Last, so that the checks above give their more specific messages first.
    # model.in_channels: null means "from the images"; train() fills it in when it builds.
    check_types(cfg, filled_in=("model.in_channels",))


def check_data_source(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` for a data source value left unset (``???``) or of the wrong form.

    The splits of a folder dataset are checked by ``check_splits``.

    Hydra would raise ``MissingMandatoryValue`` when the source is built (``datamodule=folder``
    without ``datamodule.source.root``), naming neither what to give nor how.
    """
    source = OmegaConf.select(cfg, "datamodule.source")
    if not isinstance(source, DictConfig):
        return
    for key in source:
        name = str(key)
        if OmegaConf.is_missing(source, name):
            hint = " (the dataset folder, holding train/ and val/)" if name == "root" else ""
            raise ConfigError(
                f"datamodule.source.{name} is not set: give it on the command line, e.g. "
                f"datamodule.source.{name}=/path/to/data{hint}"
            )
    if "splits" in source:
        check_splits(source.splits)


def check_loader_options(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` for a DataLoader or speed option that cannot work."""
    workers = _get(cfg, "datamodule.num_workers")
    if workers != "auto":
        require(
            workers,
            "datamodule.num_workers",
            lambda v: isinstance(v, int) and v >= 0,
            "an integer >= 0, or 'auto' (the rank's share of the CPU cores)",
        )
    checked_start_method(OmegaConf.select(cfg, START_METHOD_KEY, default="auto"))
    prefetch = OmegaConf.select(cfg, "datamodule.prefetch_factor", default=2)
    require(
        prefetch,
        "datamodule.prefetch_factor",
        lambda v: isinstance(v, int) and v >= 1,
        "an integer >= 1",
    )
    for key, allowed in (
        ("datamodule.persistent_workers", (True, False)),
        ("datamodule.pin_memory", (True, False, None)),
        ("training.channels_last", (True, False)),
        ("training.compile", (True, False)),
        ("training.keep_freed_memory", (True, False)),
    ):
        value = OmegaConf.select(cfg, key, default=False)
        if not any(value is option for option in allowed):
            expected = " or ".join({True: "true", False: "false", None: "null"}[o] for o in allowed)
            raise ConfigError(f"{key}={value!r} is not allowed: expected {expected}")


def check_fine_tuning(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` for a fine-tuning value that cannot work.

    ``training.freeze_encoder_epochs`` acts through the ``EncoderFreeze`` callback of
    ``callbacks`` (``callbacks=none`` drops it): a run that asks for freezing without it,
    or whose callback was given other epochs, is refused rather than trained otherwise.
    """
    check_encoder_lr_factor(OmegaConf.select(cfg, "training.encoder_lr_factor", default=1.0))
    epochs = OmegaConf.select(cfg, FREEZE_KEY, default=0)
    require(epochs, FREEZE_KEY, integer_at_least(0), "a whole number of epochs >= 0")
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
    node: Any = cfg
    for part in dotted.split("."):
        if part not in node:
            raise ConfigError(f"{dotted} is missing from the config")
        node = node[part]
    return node
