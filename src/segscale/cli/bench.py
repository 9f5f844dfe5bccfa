"""``python bench.py`` / ``segscale-bench``: will more devices make this training faster.

Hydra composes ``conf/bench.yaml`` (``conf/train.yaml`` plus a ``bench`` section); the
measurements, the prediction and the verdict are ``segscale.bench.benchmark.bench``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from segscale.bench.benchmark import bench, finish
from segscale.configs import CONFIG_DIR
from segscale.errors import EXIT_BAD_INPUT, ConfigError
from segscale.moved_keys import refuse_moved_overrides
from segscale.training.run_folder.resume import register_run_dir_resolver

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="bench")
def run(cfg: DictConfig) -> None:
    """Benchmark the composed config; print the table, write the files (see module docstring)."""
    overrides = list(HydraConfig.get().overrides.task)
    try:
        results = bench(cfg, overrides)
    except ConfigError as error:
        log.error("%s", error)
        sys.exit(EXIT_BAD_INPUT)
    text = finish(results, Path(cfg.output_dir))
    log.info("bench results in %s", cfg.output_dir)
    print(text)


def main() -> None:
    """Entry point of ``bench.py``."""
    # conf/bench.yaml composes conf/train.yaml, whose hydra.run.dir asks this resolver.
    register_run_dir_resolver()
    try:
        refuse_moved_overrides(sys.argv[1:])
    except ConfigError as error:  # before Hydra sets up logging: said on stderr
        print(f"Error: {error}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    run()


if __name__ == "__main__":
    main()
