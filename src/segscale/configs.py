"""The config tree (``conf/``), wherever segscale runs from, and composing a config from it."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from segscale.config_schema import check_schema


def _config_dir() -> str:
    """The ``conf/`` that belongs with this segscale code.

    Run from a checkout (``<checkout>/src/segscale``: an editable install or
    ``PYTHONPATH=src``), the checkout's top-level ``conf/``: the one beside the code
    running, even where another checkout's editable install also maps ``segscale.conf``.
    Installed from a wheel, the package data ``segscale.conf``, found by
    ``importlib.resources``.
    """
    package = Path(__file__).resolve().parent
    checkout = package.parent.parent / "conf"
    if package.parent.name == "src" and (checkout / "train.yaml").is_file():
        return str(checkout)
    try:
        tree = files("segscale.conf")
    except ModuleNotFoundError:
        tree = None
    if not isinstance(tree, Path) or not (tree / "train.yaml").is_file():
        raise RuntimeError(
            f"segscale's config tree is missing: neither {checkout} nor the package data "
            f"segscale/conf holds train.yaml. Reinstall segscale (pip install segscale, or "
            f"pip install -e . in a checkout)."
        )
    return str(tree)


CONFIG_DIR = _config_dir()
"""The config tree's folder: ``conf/`` of a checkout, ``segscale/conf`` of an install."""


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
