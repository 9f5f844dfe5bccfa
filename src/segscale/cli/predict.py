"""``python predict.py ckpt=... input=...``: label maps of images of any size.

The run itself is ``segscale.inference.prediction.run``; this module parses the command
line, calls it and maps the outcome to an exit status: 0, every image predicted; 2
(``EXIT_BAD_INPUT``), refused: a config value or an unreadable input (all listed); 3
(``EXIT_SKIPPED``), the readable images were predicted and the unreadable ones, listed
in the log, skipped; 74 (``EXIT_DISK_FULL``), a write met a full disk (named, no
traceback).
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from segscale.configs import CONFIG_DIR
from segscale.errors import EXIT_BAD_INPUT, ConfigError, full_disk_ends_command
from segscale.inference.prediction.run import run_prediction

log = logging.getLogger(__name__)

EXIT_SKIPPED = 3
"""Exit status of a run that predicted the readable images and skipped the others."""


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="predict")
def main(cfg: DictConfig) -> None:
    """Entry point of ``predict.py``: exit 0, 2, 3 or 74 (see the module's docstring)."""
    hint = "free space there, or predict into another folder (hydra.run.dir)"
    try:
        with full_disk_ends_command(cfg.output_dir, hint):
            run = run_prediction(cfg)
    except ConfigError as error:
        log.error("%s", error)
        sys.exit(EXIT_BAD_INPUT)
    if run.skipped:
        log.warning(
            "%d image(s) predicted, %d skipped as unreadable (listed above)",
            len(run.written),
            len(run.skipped),
        )
        sys.exit(EXIT_SKIPPED)


if __name__ == "__main__":
    main()
