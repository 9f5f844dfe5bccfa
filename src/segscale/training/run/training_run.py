"""One training run in its folder: check the config, build the objects, fit, summarize.

The whole path from a composed config to ``Trainer.fit`` is in ``train`` below; each
object comes from the config group of the same name (``builders``).
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from pathlib import Path
from typing import Any, cast

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from segscale.config_schema import check_schema
from segscale.devices import available_devices, check_devices, devices_count
from segscale.models.checkpoint.files import SafeCheckpointIO
from segscale.platforms.processes import keep_freed_memory
from segscale.runs.builders import (
    build,
    build_datamodule,
    build_module,
    build_strategy,
    fine_tuning,
    instantiate_each,
    trainer_devices,
)
from segscale.runs.folder import (
    RunFolderLock,
    check_fresh_folder,
    has_launch_record,
    launch_record,
    read_summary,
    write_launch_record,
)
from segscale.training.callbacks.checkpoints import ForgetAbandonedBest, ensure_writable
from segscale.training.callbacks.ema import ema_callback
from segscale.training.callbacks.learning_rate import ApplyLearningRate
from segscale.training.callbacks.preemption_stop import PreemptionStop
from segscale.training.callbacks.run_summary import LaunchRecord, RunSummary
from segscale.training.callbacks.threads_follow_machine import ThreadsFollowMachine
from segscale.training.callbacks.trial_pruning import trial_pruning
from segscale.training.callbacks.unreadable_tiles import LeftOutTiles, UnreadableTileStop
from segscale.training.ranks.launch import WorkersEndWithRun, job_ranks
from segscale.training.ranks.preemption import (
    PreemptionSignals,
    without_lightning_signal_handlers,
)
from segscale.training.ranks.threads import process_threads, resolve_threads
from segscale.training.reporting.loggers import check_logger_folders
from segscale.training.reporting.run_times import RunClock
from segscale.training.reporting.third_party_noise import (
    ThirdPartyNoiseFilter,
    third_party_noise_filtered,
)
from segscale.training.run.config_checks import prepare
from segscale.training.run_folder.relaunch import check_relaunch
from segscale.training.run_folder.resume import (
    check_resumable,
    checkpoint_of_rank_zero,
    read_resumed,
    resolve_checkpoint,
)

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train the configured network; return the run summary (empty on ranks > 0).

    Rank 0 holds the run folder for the whole run (``RunFolderLock``): a second run
    started into it is refused.
    """
    # Read from the rank variables, before the trainer exists. Lightning sets ``rank`` on
    # the function when it is imported; the function's type does not declare it.
    leader = rank_zero_only.rank == 0  # type: ignore[attr-defined]
    clock = RunClock()
    # Preemption signals are handled for the whole run: before training starts one ends
    # it at once (exit 75, nothing to save), while training at the next safe point.
    check_schema(cfg)  # before the signals' settings are read
    signals = PreemptionSignals(cfg.training.preemption_signals, cfg.training.preemption_deadline_s)
    with signals, RunFolderLock(cfg.output_dir) if leader else nullcontext():
        return _train_in_folder(cfg, leader, clock, signals)


def _train_in_folder(
    cfg: DictConfig, leader: bool, clock: RunClock, signals: PreemptionSignals
) -> dict[str, Any]:
    """``train`` once the run folder is this run's; ``leader`` (rank 0) writes its files."""
    # A fresh run records itself first, as Hydra would, also if a check then fails; a
    # relaunch (resume, requeue) only once it starts training (LaunchRecord), so that a
    # refused one leaves the run folder as it was.
    relaunch = bool(cfg.get("ckpt_path"))
    if not relaunch:
        check_fresh_folder(cfg.output_dir)  # every rank: torchrun's would wait for rank 0
    # datamodule/classes=auto: the training masks' classes go into cfg before anything reads
    # it, so the launch record and check_relaunch compare found classes on every launch.
    try:
        prepare(cfg, cfg.output_dir if leader else None)
    finally:
        if leader and not relaunch and not has_launch_record(cfg.output_dir):
            write_launch_record(cfg.output_dir, launch_record(cfg))
    check_relaunch(cfg)  # a change the run cannot take mid-run is refused
    check_logger_folders(cfg.get("logger"))  # opened only as training starts
    clock.mark("config checks")
    L.seed_everything(cfg.seed, workers=True)
    strategy = build_strategy(cfg)
    check_devices(cfg.trainer.devices, cfg.trainer.accelerator)
    num_processes = devices_count(cfg.trainer.devices, available_devices(cfg.trainer.accelerator))
    effective = build(cfg.scaling).resolve(
        cfg.datamodule.batch_size, cfg.optimizer.lr, num_processes * cfg.trainer.num_nodes
    )
    log.info("scaling: %s", effective)
    devices = trainer_devices(cfg, num_processes, effective.included)
    # Devices are left out on one node only, so every node runs the same number.
    num_processes = effective.world_size // cfg.trainer.num_nodes
    ckpt_path = resolve_checkpoint(cfg.get("ckpt_path"), cfg.output_dir)
    resumed = read_resumed(ckpt_path) if ckpt_path else None  # its normalization, kept
    datamodule = build_datamodule(cfg, effective, resumed)
    report = datamodule.check()
    clock.mark("dataset check")
    # Each rank's threads: its share of the cores that nothing else keeps busy now,
    # measured before any rank or DataLoader worker of this run starts.
    workers = datamodule.workers_per_rank(num_processes)
    threads = resolve_threads(cfg.training.threads, num_processes, workers)
    module = build_module(
        cfg,
        datamodule,
        effective.learning_rate,
        effective.warmup_epochs,
        sync_batchnorm=bool(cfg.training.sync_batchnorm) and effective.world_size > 1,
        init_weights=not ckpt_path,  # a resume takes its weights from ckpt_path
    )
    clock.mark("model")
    scaling = {**cast(dict[str, Any], OmegaConf.to_container(cfg.scaling)), **effective.as_dict()}
    scaling |= {"base_learning_rate": cfg.optimizer.lr}
    scaling.pop("_target_")
    summary = RunSummary(
        cfg.output_dir,
        cfg.training.output_network,
        scaling,
        fine_tuning(cfg),
        clock,
        nodata=report.nodata.summary() if report.nodata is not None else None,
    )
    stop = PreemptionStop(signals, cfg.output_dir)
    callbacks = [summary, *instantiate_each(cfg.get("callbacks")), stop, ThirdPartyNoiseFilter()]
    callbacks.insert(0, UnreadableTileStop(cfg.output_dir))  # before the summary names it
    callbacks.append(LeftOutTiles())  # skip_unreadable's, listed by the summary
    if ema := ema_callback(cfg, relaunch):  # first: the report after training sees the average
        callbacks.insert(0, ema)
    if pruning := trial_pruning(cfg.get("search_trial"), str(cfg.optimized_metric)):
        callbacks.append(pruning)
    if threads.machine is not None:  # auto's measured share, looked at again while training
        callbacks.append(ThreadsFollowMachine(threads.machine, threads.count))
    if relaunch:
        callbacks += [LaunchRecord(cfg.output_dir, launch_record(cfg)), ForgetAbandonedBest()]
        # optimizer.lr given on a resume applies; first, so that every other callback's
        # on_train_start (the summary's effective values) sees the rate it sets.
        callbacks.insert(0, ApplyLearningRate())
    for name, node in (cfg.get("callbacks") or {}).items():
        if node and node.get("dirpath"):
            ensure_writable(node.dirpath, f"callbacks.{name}.dirpath")
    checkpoint_io = SafeCheckpointIO()
    if resumed is not None:
        verified = check_resumable(resumed, module)
    start_method = cfg.strategy.get("start_method")
    # Everything above is checked before any other rank starts; the trainer comes after,
    # since Lightning reads the rank variables that job_ranks sets.
    # ckpt_path=auto is agreed on below, by every rank, however the ranks were started.
    auto = cfg.get("ckpt_path") == "auto"
    resolved = {"ckpt_path": ckpt_path} if ckpt_path and not auto else None
    if leader:
        log.info("%s", threads.describe())
        log.info("%s", report.table())
        if report.nodata is not None:
            log.info("%s", "\n".join(report.nodata.lines()))
        if not relaunch:  # the run's own, written when it started
            report.write(Path(cfg.output_dir))
    ranks = job_ranks(start_method, num_processes, cfg.output_dir, cfg.trainer.num_nodes, resolved)
    own_workers = WorkersEndWithRun()  # left first: before the other ranks are waited for
    follows = threads.machine is not None
    # Before the ranks start: they inherit the settings through the environment.
    if cfg.training.keep_freed_memory and (kept := keep_freed_memory()) and leader:
        log.info("%s", kept)
    with process_threads(threads.count, follows), ranks, third_party_noise_filtered(), own_workers:
        trainer = instantiate(
            cfg.trainer,
            devices=devices,
            strategy=strategy,
            callbacks=callbacks,
            logger=list(instantiate_each(cfg.get("logger"))) or False,
            plugins=[checkpoint_io],
            # The datamodule shards every epoch by rank itself (EpochShardSampler).
            use_distributed_sampler=False,
        )
        without_lightning_signal_handlers(trainer)
        own_workers.follow(trainer)
        if auto:  # rank 0's choice, on every rank
            agreed = checkpoint_of_rank_zero(trainer, ckpt_path)
            if agreed and agreed != ckpt_path:
                verified = check_resumable(read_resumed(agreed), module)
            ckpt_path = agreed
        if ckpt_path and trainer.strategy.launcher is None:
            # The checkpoint read and verified above, not read again by fit; only where
            # fit runs in this process (a spawned rank would get it pickled, and reads it).
            checkpoint_io.hand_over(verified.path, verified.content)
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    # Rank 0 wrote the summary, also when it ran in a process of its own (ddp_spawn).
    return (read_summary(cfg.output_dir) or {}) if trainer.is_global_zero else {}
