"""One record per launch in a run folder: the composed config, Hydra's, the overrides.

The first launch records into ``.hydra/`` (as Hydra does), every later one (a resume,
a requeue) into the next ``.hydra/launch-<n>/``; ``relaunch`` reads them back, as data.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from segscale.atomic_files import write_text_atomically
from segscale.errors import ConfigError

RECORD_DIR = ".hydra"
"""Where a run folder keeps its launch records (Hydra's own output subfolder)."""
MAX_CONFIG_BYTES = 4 << 20
"""A recorded config larger than this is not one train.py wrote."""
_REFERENCE = re.compile(r"\$\{[A-Za-z_][\w.\-]*\}")
"""An interpolation that only refers to another key (``${seed}``), no resolver."""


def has_launch_record(folder: str | Path) -> bool:
    """Whether a launch has already recorded itself in ``folder``."""
    return (Path(folder) / RECORD_DIR / "config.yaml").is_file()


def launch_record(cfg: DictConfig) -> dict[str, str]:
    """The current launch's record as file name → YAML: config, Hydra's config, overrides.

    Outside a Hydra app (a test, the Python API) only the composed config.
    """
    return {"config.yaml": OmegaConf.to_yaml(cfg), **_hydra_files()}


def write_launch_record(folder: str | Path, record: dict[str, str]) -> Path:
    """Write ``record`` (``launch_record``) into ``folder``; return the record folder.

    The first launch records into ``.hydra/``, every later one into the next free
    ``.hydra/launch-<n>/`` (n = 2, 3, ...).
    """
    root = Path(folder) / RECORD_DIR
    target = root
    number = 1
    while (target / "config.yaml").exists():
        number += 1
        target = root / f"launch-{number}"
    for name, text in record.items():
        write_text_atomically(target / name, text)
    return target


def _hydra_files() -> dict[str, str]:
    """Hydra's own config and the command-line overrides, as Hydra writes them."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    # Hydra annotates it HydraConf, but it holds the config masked to its "hydra" key.
    hydra_cfg = cast(DictConfig | None, HydraConfig.instance().cfg)
    assert hydra_cfg is not None
    return {
        "hydra.yaml": OmegaConf.to_yaml(hydra_cfg),
        "overrides.yaml": OmegaConf.to_yaml(hydra_cfg.hydra.overrides.task),
    }


def read_record_config(path: Path) -> DictConfig:
    """A launch record's ``config.yaml`` read as data (``ConfigError`` if it is not one).

    The file is in a run folder that others may have written, and OmegaConf calls a
    resolver wherever a value interpolates one (``${oc.env:...}``, ``${oc.create:...}``):
    such values are kept as the text they are, and only references to other keys
    (``${seed}``) still resolve, to the values the file itself holds.
    """
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{path}: {size} bytes is not a config train.py records (at most "
                f"{MAX_CONFIG_BYTES}); expected the composed config of a launch"
            )
        loaded = OmegaConf.load(path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, OmegaConfBaseException) as error:
        raise ConfigError(
            f"{path}: cannot be read as a launch record's config ({error}); expected the "
            "composed config train.py writes there"
        ) from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(
            f"{path}: not a mapping; expected the composed config train.py writes there"
        )
    return OmegaConf.create(_as_data(OmegaConf.to_container(loaded, resolve=False)))


def _as_data(value: Any) -> Any:
    """``value`` (containers of a loaded config) with every resolver call made literal text."""
    if isinstance(value, dict):
        return {key: _as_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_data(item) for item in value]
    if isinstance(value, str) and not _references_only(value):
        # OmegaConf reads a backslash before "${" as an escape (a literal "${"): each
        # "${" gets one, and the backslashes already before it are doubled to stay text.
        return re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", value)
    return value


def _references_only(text: str) -> bool:
    """Whether every interpolation in ``text`` only refers to a key (or there is none)."""
    rest = _REFERENCE.sub("", text)
    return "${" not in rest and ("\\" not in text or "${" not in text)
