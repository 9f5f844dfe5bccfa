"""``python data.py [datamodule overrides]`` / ``segscale-data``: the dataset, without training.

The inspection itself is ``segscale.training.run.dataset_inspection.inspect_dataset``; this
module adds the config tree and the exit statuses (those of ``train.py``: 2 for a
config or dataset that cannot be used, with every problem listed).
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from segscale.configs import CONFIG_DIR
from segscale.errors import EXIT_BAD_INPUT, ConfigError
from segscale.training.run.dataset_inspection import inspect_dataset

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="data")
def main(cfg: DictConfig) -> None:
    """Entry point of ``data.py``."""
    try:
        inspect_dataset(cfg)
    except ConfigError as error:
        log.error("%s", error)
        sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()
