"""``python bench.py`` / ``segscale-bench``: will more devices make this training faster.

Hydra composes ``conf/bench.yaml`` (``conf/train.yaml`` plus a ``bench`` section); the
measurements, the prediction and the verdict are ``segscale.bench.benchmark.bench``, its
``train.py`` runs given this run's config folders (``config_options``). Exit status: 0,
every measurement ran; 2 (``EXIT_BAD_INPUT``), refused before measuring: a bad value,
named; 3 (``EXIT_FAILED_MEASUREMENT``), a measurement failed: the verdict names it and
its error, the others' results are written.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import cast

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from segscale.bench.benchmark import bench, finish
from segscale.command_line import config_options
from segscale.configs import CONFIG_DIR
from segscale.errors import EXIT_BAD_INPUT, ConfigError
from segscale.training.run_folder.resume import register_run_dir_resolver

log = logging.getLogger(__name__)

EXIT_FAILED_MEASUREMENT = 3
"""A measurement failed (named in the verdict); what the others measured is written."""


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="bench")
def run(cfg: DictConfig) -> None:
    """Benchmark the composed config; print the table, write the files (see module docstring)."""
    # Typed as the HydraConf dataclass; what it returns is the DictConfig made from it.
    hydra_cfg = cast(DictConfig, HydraConfig.get())
    overrides = list(hydra_cfg.overrides.task)
    try:
        results = bench(cfg, overrides, config_options(hydra_cfg))
    except ConfigError as error:
        log.error("%s", error)
        sys.exit(EXIT_BAD_INPUT)
    text = finish(results, Path(cfg.output_dir))
    log.info("bench results in %s", cfg.output_dir)
    print(text)
    if results["failed"]:
        names = ", ".join(failure["measurement"] for failure in results["failed"])
        log.error("bench could not measure: %s (the verdict says why)", names)
        sys.exit(EXIT_FAILED_MEASUREMENT)


def main() -> None:
    """Entry point of ``bench.py``."""
    # conf/bench.yaml composes conf/train.yaml, whose hydra.run.dir asks this resolver.
    register_run_dir_resolver()
    run()


if __name__ == "__main__":
    main()
