"""``python data.py [datamodule overrides]`` / ``segscale-data``: the dataset, without training.

The inspection itself is ``segscale.training.run.dataset_inspection.inspect_dataset``; this
module adds the config tree and the exit statuses (those of ``train.py``: 2 for a
config or dataset that cannot be used, with every problem listed).

``data.py`` takes only the keys of ``conf/data.yaml`` (the datamodule group, ``seed``,
``task_name``, ``output_dir``, ``hydra``). An override of anything else (``model=unet``)
is refused before Hydra composes, naming what ``data.py`` takes: Hydra would answer
"use +model=unet", which composes and checks the data exactly as without it.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from segscale.configs import CONFIG_DIR
from segscale.errors import EXIT_BAD_INPUT, ConfigError
from segscale.training.run.dataset_inspection import inspect_dataset

log = logging.getLogger(__name__)


def main() -> None:
    """Entry point of ``data.py``: refuse what it does not take, then compose and inspect."""
    try:
        refuse_other_keys(sys.argv[1:])
    except ConfigError as error:  # before Hydra sets up logging: said on stderr
        print(f"Error: {error}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    run()


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="data")
def run(cfg: DictConfig) -> None:
    """Inspect the composed dataset; exit 2 if it cannot be used. Say where it wrote."""
    try:
        inspect_dataset(cfg)
    except ConfigError as error:
        log.error("%s", error)
        log.info("%s", _written(Path(cfg.output_dir)))
        sys.exit(EXIT_BAD_INPUT)
    log.info("%s", _written(Path(cfg.output_dir)))


def _written(folder: Path) -> str:
    """The folder data.py wrote into and its files (the log, the class frequencies, ...)."""
    files = sorted(path.name for path in folder.iterdir() if not path.name.startswith("."))
    return f"written to {folder.resolve()}: {', '.join(files)}"


def refuse_other_keys(arguments: list[str]) -> None:
    """Raise ``ConfigError`` naming every override of ``arguments`` that data.py does not take.

    A command line Hydra cannot read (a bad flag, an override it cannot parse) is left
    to Hydra, which says what is wrong with it.
    """
    overrides = _overrides(arguments)
    if overrides is None:
        return
    taken = _roots("data")
    refused = [text for text, root in overrides if root not in taken]
    if not refused:
        return
    groups = sorted(_groups("data"))
    forms = [form for group in groups for form in _group_forms(group)]
    forms += sorted(f"{key}.<key>=..." if key == "hydra" else key for key in taken - set(groups))
    # train.py's own keys and groups, set there as they stand (no "+": they exist there).
    trains = [
        text.lstrip("+")
        for text, root in overrides
        if text in refused and root in _roots("train") and not text.startswith("~")
    ]
    one = len(refused) == 1
    message = (
        f"{', '.join(refused)}: not {'a setting' if one else 'settings'} of data.py, which "
        f"checks the dataset alone and takes {', '.join(forms)}"
    )
    if trains:
        message += (
            f"; {', '.join(trains)} {'is' if len(trains) == 1 else 'are'} train.py's: "
            f"python train.py {' '.join(trains)} trains with {'it' if len(trains) == 1 else 'them'}"
            ", and checks the same dataset first"
        )
    raise ConfigError(message)


def _overrides(arguments: list[str]) -> list[tuple[str, str]] | None:
    """Each override of ``arguments`` with its root key or group; ``None``: Hydra's to say."""
    parser = get_args_parser()
    parser.exit_on_error = False
    try:
        parsed, _ = parser.parse_known_args(arguments)
        overrides = OverridesParser.create().parse_overrides(parsed.overrides)
    except (argparse.ArgumentError, HydraException):
        return None
    return [
        (override.input_line or override.key_or_group, re.split(r"[./]", override.key_or_group)[0])
        for override in overrides
    ]


def _config(name: str) -> DictConfig:
    config = OmegaConf.load(Path(CONFIG_DIR) / f"{name}.yaml")
    assert isinstance(config, DictConfig)  # a command's config is a mapping
    return config


_SHARED = frozenset({"hydra", "optional local@_global_"})
"""Defaults every command names: the Hydra settings and the machine's own file (conf/local/)."""


def _groups(name: str) -> set[str]:
    """The config groups of ``conf/<name>.yaml``'s defaults list.

    An ``override hydra/...`` entry chooses one of Hydra's own groups (under ``hydra``,
    which every command has), and ``_SHARED`` are every command's: neither is a group of
    the command's own.
    """
    defaults = _config(name).get("defaults", [])
    keys = (str(key) for entry in defaults if isinstance(entry, DictConfig) for key in entry)
    return {key for key in keys if not key.startswith("override ") and key not in _SHARED}


def _roots(name: str) -> set[str]:
    """The top-level keys and groups of ``conf/<name>.yaml`` (``hydra`` among them)."""
    return {str(key) for key in _config(name) if key != "defaults"} | _groups(name) | {"hydra"}


def _group_forms(group: str) -> list[str]:
    """How a command line sets ``group``: its option, its keys, its subgroups' options."""
    folder = Path(CONFIG_DIR) / group
    subgroups = sorted(path.name for path in folder.iterdir() if path.is_dir())
    return [
        f"{group}=<option>",
        f"{group}.<key>=...",
        *(f"{group}/{subgroup}=<option>" for subgroup in subgroups),
    ]
