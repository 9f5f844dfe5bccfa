"""One record per launch in a run folder: the composed config, Hydra's, the overrides.

The first launch records into ``.hydra/`` (as Hydra does), every later one (a resume,
a requeue) into the next ``.hydra/launch-<n>/``; ``relaunch`` reads them back.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from omegaconf import DictConfig, OmegaConf

from segscale.atomic_files import write_text_atomically

RECORD_DIR = ".hydra"
"""Where a run folder keeps its launch records (Hydra's own output subfolder)."""


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
