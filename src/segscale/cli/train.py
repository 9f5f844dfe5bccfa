"""``python train.py`` / ``segscale-train``: Hydra parses the command line, the library trains.

The run itself (checks, builders, ``Trainer.fit``) is ``segscale.training.run.training_run.train``;
this module adds what belongs to a command: the config tree, exit statuses, and the
quiet overrides of ranks that torchrun or SLURM started.
"""

from __future__ import annotations

import atexit
import gc
import logging
import sys

import hydra
from omegaconf import DictConfig

from segscale.configs import CONFIG_DIR

log = logging.getLogger(__name__)

DISK_FULL_HINT = (
    "free space there (or give the run another folder: hydra.run.dir), then continue "
    "the run from its last checkpoint: ckpt_path=auto, or ckpt_path=<its checkpoint>"
)
"""What to do when a training run met a full disk."""


def main() -> None:
    """Entry point of ``train.py``: Hydra parses the command line and runs ``run``.

    Nothing is done, and little imported, when the module is imported: a spawned process
    (a DataLoader worker, a ``ddp_spawn`` rank) imports it again, and must find no work
    there. The run's modules are imported here, before the clock's first phase ends.
    """
    # The run's modules too (run imports them again), so that the clock counts them as imports.
    import segscale.training.run.training_run  # noqa: F401
    from segscale.errors import EXIT_BAD_INPUT, ConfigError
    from segscale.training.ranks.launch import QUIET_RANK_OVERRIDES, external_rank
    from segscale.training.reporting.run_times import imports_done
    from segscale.training.run_folder.relaunch import restore_overrides
    from segscale.training.run_folder.resume import register_run_dir_resolver

    imports_done()  # everything a training run needs is imported: the clock's first phase ends
    register_run_dir_resolver()  # conf/train.yaml's hydra.run.dir asks it
    # At exit the interpreter's last garbage collection walks every object torch,
    # Lightning and the run made: seconds (5 s on a busy machine), and a DDP run's rank
    # 0 exits only after the other ranks did. Frozen, they are left to the OS; exit
    # handlers (log files, loggers) run as before.
    atexit.unregister(gc.freeze)  # once, however often main runs in one process
    atexit.register(gc.freeze)
    # ckpt_path=last or a path: the resumed run's own overrides, the command line's on top.
    try:
        sys.argv = restore_overrides(sys.argv)
    except ConfigError as error:  # before Hydra sets up logging: said on stderr
        print(f"Error: {error}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    if external_rank():
        # A rank > 0 started by torchrun or SLURM: rank 0 alone writes config and log.
        sys.argv += QUIET_RANK_OVERRIDES
    run()


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def run(cfg: DictConfig) -> float | None:
    """Train one job of the composed config; return its ``optimized_metric`` (for sweepers)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from segscale.errors import EXIT_BAD_INPUT, ConfigError, RunStopped, full_disk_ends_command
    from segscale.models.nonfinite import EXIT_NONFINITE, NonFiniteError
    from segscale.sweeps.sweep_summary import objective
    from segscale.training.ranks.preemption import Preempted
    from segscale.training.run.training_run import train

    try:
        # A full disk stops the whole process (a sweep's too): its other jobs would fail alike.
        with full_disk_ends_command(cfg.output_dir, DISK_FULL_HINT):
            summary = train(cfg)
    except (ConfigError, NonFiniteError) as error:
        log.error("%s", error)  # in this job's log; a sweep names the job again at its end
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # this job fails; the sweeper reports it and the other jobs go on
        sys.exit(EXIT_BAD_INPUT if isinstance(error, ConfigError) else EXIT_NONFINITE)
    except Preempted as stop:
        # The whole process (a sweep's included) stops: its machine is going away.
        log.error("%s", stop)
        stop.hand_over()  # submitit's handler requeues the job
        sys.exit(stop.exit_code)
    except RunStopped as stop:  # a pruned trial: the sweeper records it
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise
        log.info("%s", stop)
        if stop.exit_code:
            sys.exit(stop.exit_code)
        return None
    log.info("summary: %s", OmegaConf.to_yaml(OmegaConf.create(summary)) if summary else "{}")
    return objective(cfg, summary)


if __name__ == "__main__":
    main()
