"""The config tree shipped inside the package, and composing a config from it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from segscale.config_schema import check_schema

CONFIG_DIR = str(Path(__file__).resolve().parent / "conf")
"""The package's ``conf/`` folder: found wherever segscale is installed."""


def compose_config(
    config_name: str = "train",
    overrides: Sequence[str] = (),
    return_hydra_config: bool = False,
) -> DictConfig:
    """``conf/<config_name>.yaml`` with ``overrides``, composed as the command line does.

    ``hydra.searchpath=[...]`` among the overrides adds a user's own config folders.
    Works inside a running Hydra app or ``initialize`` context too: that Hydra is set
    aside while this config is composed, and given back after. A value the schema
    refuses (``segscale.config_schema``) raises ``ConfigError`` naming its key.
    """
    caller = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose(
                config_name, overrides=list(overrides), return_hydra_config=return_hydra_config
            )
    finally:
        # initialize_config_dir replaces the GlobalHydra instance on leaving: ask again.
        GlobalHydra.instance().hydra = caller
    check_schema(cfg)
    return cfg
