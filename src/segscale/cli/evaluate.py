"""``python evaluate.py ckpt=... datamodule=folder datamodule.source.root=...``.

The run itself is ``segscale.inference.evaluation.run``; this module parses the
command line (did it name the data?), calls it and exits 2 (``EXIT_BAD_INPUT``) on a
refused config, 74 (``EXIT_DISK_FULL``) when a write met a full disk.
"""

from __future__ import annotations

import logging
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from segscale.configs import CONFIG_DIR
from segscale.errors import EXIT_BAD_INPUT, ConfigError, full_disk_ends_command
from segscale.inference.evaluation.run import evaluate, names_data

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="evaluate")
def main(cfg: DictConfig) -> None:
    """Entry point of ``evaluate.py``."""
    hint = "free space there, or evaluate into another folder (hydra.run.dir)"
    try:
        with full_disk_ends_command(cfg.output_dir, hint):
            evaluate(cfg, data_given=names_data(HydraConfig.get().overrides.task))
    except ConfigError as error:
        log.error("%s", error)
        sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()
