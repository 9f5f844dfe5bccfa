"""``python train.py``: compose the config, build the objects, fit, summarize.

The whole path from the command line to ``Trainer.fit`` is in ``train`` below; each
object comes from the config group of the same name (DESIGN.md §3).
"""

from __future__ import annotations

import logging
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from segscale.checks import EXIT_BAD_INPUT, ConfigError, check_config, devices_count
from segscale.data.datamodule import SegmentationDataModule
from segscale.inference.trained import inference_metadata
from segscale.models.module import SegmentationModule
from segscale.models.networks import check_input_side
from segscale.models.nonfinite import NonFiniteError
from segscale.training.callbacks import RunSummary, ensure_writable
from segscale.training.checkpoint_io import SafeCheckpointIO
from segscale.training.launch import (
    QUIET_RANK_OVERRIDES,
    available_devices,
    check_devices,
    external_rank,
    included_devices,
    job_ranks,
)
from segscale.training.resume import (
    ForgetAbandonedBest,
    check_resumable,
    resolve_checkpoint,
    run_dir_for,
)
from segscale.training.run_folder import (
    LaunchRecord,
    RunFolderLock,
    check_fresh_folder,
    has_launch_record,
    launch_record,
    write_launch_record,
)
from segscale.training.scaling import Effective
from segscale.training.sync_batchnorm import convert_sync_batchnorm

log = logging.getLogger(__name__)

CONFIG_DIR = str(Path(__file__).resolve().parents[3] / "conf")
"""The repository's ``conf/`` folder (the package is installed in editable mode)."""

EXIT_NONFINITE = 3
"""Exit status of a run stopped by a non-finite loss or gradient."""

# hydra.run.dir asks this resolver for the folder of the run that ckpt_path resumes.
OmegaConf.register_new_resolver("segscale.run_dir", run_dir_for, replace=True)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train the configured network; return the run summary (empty on ranks > 0).

    Rank 0 holds the run folder for the whole run (``RunFolderLock``): a second run
    started into it is refused.
    """
    leader = rank_zero_only.rank == 0  # read from the rank variables, before the trainer exists
    with RunFolderLock(cfg.output_dir) if leader else nullcontext():
        return _train_in_folder(cfg, leader)


def _train_in_folder(cfg: DictConfig, leader: bool) -> dict[str, Any]:
    """``train`` once the run folder is this run's; ``leader`` (rank 0) writes its files."""
    # A fresh run records itself first, as Hydra would, also if a check then fails; a
    # relaunch (resume, requeue) only once it starts training (LaunchRecord), so that a
    # refused one leaves the run folder as it was.
    relaunch = bool(cfg.get("ckpt_path"))
    if not relaunch:
        check_fresh_folder(cfg.output_dir)  # every rank: torchrun's would wait for rank 0
    if leader and not relaunch and not has_launch_record(cfg.output_dir):
        write_launch_record(cfg.output_dir, launch_record(cfg))
    check_config(cfg)
    check_input_side(cfg.datamodule.patch_size, "datamodule.patch_size", cfg.model)
    L.seed_everything(cfg.seed, workers=True)
    # sync_batchnorm is ours (it converts the network below), not a strategy argument.
    strategy_cfg = OmegaConf.to_container(cfg.strategy, resolve=True)
    sync_batchnorm = strategy_cfg.pop("sync_batchnorm", False)
    strategy = build(OmegaConf.create(strategy_cfg))
    check_devices(cfg.trainer.devices, cfg.trainer.accelerator)
    num_processes = devices_count(cfg.trainer.devices, available_devices(cfg.trainer.accelerator))
    effective = build(cfg.scaling).resolve(
        cfg.datamodule.batch_size, cfg.optimizer.lr, num_processes * cfg.trainer.num_nodes
    )
    log.info("scaling: %s", effective)
    devices = trainer_devices(cfg, num_processes, effective.included)
    # Devices are left out on one node only, so every node runs the same number.
    num_processes = effective.world_size // cfg.trainer.num_nodes
    datamodule = build_datamodule(cfg, effective)
    report = datamodule.check()
    module = build_module(
        cfg,
        datamodule,
        effective.learning_rate,
        effective.warmup_epochs,
        sync_batchnorm=sync_batchnorm and effective.world_size > 1,
    )
    scaling = {**OmegaConf.to_container(cfg.scaling), **effective.as_dict()}
    scaling |= {"base_learning_rate": cfg.optimizer.lr}
    scaling.pop("_target_")
    summary = RunSummary(cfg.output_dir, cfg.training.output_network, scaling)
    callbacks = [*instantiate_each(cfg.get("callbacks")), summary]
    if relaunch:
        callbacks += [LaunchRecord(cfg.output_dir, launch_record(cfg)), ForgetAbandonedBest()]
    for name, node in (cfg.get("callbacks") or {}).items():
        if node and node.get("dirpath"):
            ensure_writable(node.dirpath, f"callbacks.{name}.dirpath")
    ckpt_path = resolve_checkpoint(cfg.get("ckpt_path"), cfg.output_dir)
    if ckpt_path:
        check_resumable(ckpt_path, module)
    start_method = cfg.strategy.get("start_method")
    # Everything above is checked before any other rank starts; the trainer comes after,
    # since Lightning reads the rank variables that job_ranks sets.
    resolved = {"ckpt_path": ckpt_path} if ckpt_path else None
    if leader:
        log.info("%s", report.table())
        if not relaunch:  # the run's own, written when it started
            report.write(Path(cfg.output_dir))
    with job_ranks(start_method, num_processes, cfg.output_dir, cfg.trainer.num_nodes, resolved):
        trainer = instantiate(
            cfg.trainer,
            devices=devices,
            strategy=strategy,
            callbacks=callbacks,
            logger=list(instantiate_each(cfg.get("logger"))) or False,
            plugins=[SafeCheckpointIO()],
            # The datamodule shards every epoch by rank itself (EpochShardSampler).
            use_distributed_sampler=False,
        )
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    # Rank 0 wrote the summary, also when it ran in a process of its own (ddp_spawn).
    return (RunSummary.read(cfg.output_dir) or {}) if trainer.is_global_zero else {}


def build_datamodule(cfg: DictConfig, effective: Effective) -> SegmentationDataModule:
    """The ``datamodule`` group's object, with the per-device batches of ``effective``."""
    batch_sizes = list(effective.per_device_batch_sizes)
    # batch_size also sets the validation batch: that of the largest training share.
    return build(
        cfg.datamodule, _convert_="all", batch_size=max(batch_sizes), rank_batch_sizes=batch_sizes
    )


def build_module(
    cfg: DictConfig,
    datamodule: SegmentationDataModule,
    learning_rate: float,
    warmup_epochs: float = 0.0,
    sync_batchnorm: bool = False,
) -> SegmentationModule:
    """The network (``model``), loss, optimizer and schedule of ``cfg`` in one module.

    ``learning_rate`` and ``warmup_epochs`` are the values after the scaling rules;
    ``sync_batchnorm`` converts batch norm to the synchronized kind (DDP, several ranks).
    ``training.compile`` compiles the network in place (``nn.Module.compile``), so its
    checkpoint keys stay those of the plain network.
    """
    report = datamodule.check()
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    model_cfg["in_channels"] = model_cfg.get("in_channels") or datamodule.in_channels
    network = build(OmegaConf.create(model_cfg))
    if sync_batchnorm:
        network = convert_sync_batchnorm(network)
    if cfg.training.get("compile"):
        network.compile()
    return SegmentationModule(
        network=network,
        optimizer=build(cfg.optimizer, lr=learning_rate),
        schedule=build(cfg.scheduler, **warmup_for(cfg.scheduler, warmup_epochs)),
        num_classes=datamodule.num_classes,
        class_names=datamodule.class_names,
        ignore_index=datamodule.ignore_index,
        mean=datamodule.mean,
        std=datamodule.std,
        max_value=datamodule.max_value,
        gradient_threshold=cfg.training.gradient_threshold,
        gradient_threshold_method=cfg.training.gradient_threshold_method,
        channels_last=cfg.training.channels_last,
        on_nonfinite=cfg.training.get("on_nonfinite", "stop"),
        loss=build(
            cfg.loss,
            num_classes=datamodule.num_classes,
            ignore_index=datamodule.ignore_index,
            class_frequencies=report.frequencies("train").tolist(),
        ),
        inference_metadata=inference_metadata(model_cfg, datamodule),
    )


def trainer_devices(cfg: DictConfig, per_node: int, included: tuple[int, ...]) -> Any:
    """``trainer.devices`` (``per_node`` of them) without those ``worker_load`` weighs 0."""
    if len(included) == per_node * cfg.trainer.num_nodes:
        return cfg.trainer.devices
    if cfg.trainer.num_nodes > 1:
        raise ConfigError(
            f"scaling.worker_load gives a device weight 0 in a run of trainer.num_nodes="
            f"{cfg.trainer.num_nodes}; leaving devices out works on one node only (start "
            "fewer ranks on that node instead)"
        )
    return included_devices(cfg.trainer.devices, cfg.trainer.accelerator, per_node, included)


def warmup_for(scheduler: DictConfig, scaling_warmup_epochs: float) -> dict[str, float]:
    """The schedule's warmup, lengthened to what the scaling rules ask for.

    A warmup given in steps is the user's explicit choice and is kept as it is.
    """
    if scheduler.get("warmup_steps"):
        return {}
    return {"warmup_epochs": max(scheduler.get("warmup_epochs") or 0, scaling_warmup_epochs)}


def build(node: DictConfig, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate``, but a ``ConfigError`` comes out as itself.

    Hydra wraps whatever a target raises in an ``InstantiationException``; unwrapping
    ours keeps the message that names the config key in front of the user.
    """
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as error:
        if isinstance(error.__cause__, ConfigError):
            raise error.__cause__ from None
        raise


def instantiate_each(group: DictConfig | None) -> list[Any]:
    """Instantiate every entry of a name → config mapping (callbacks, loggers).

    Entries that are null, have no ``_target_``, or build ``None`` (switched off) are
    left out.
    """
    if not group:
        return []
    built = [build(node) for node in group.values() if node is not None and "_target_" in node]
    return [item for item in built if item is not None]


def main() -> None:
    """Entry point of ``train.py``: Hydra parses the command line and runs ``run``."""
    if external_rank():
        # A rank > 0 started by torchrun or SLURM: rank 0 alone writes config and log.
        sys.argv += QUIET_RANK_OVERRIDES
    run()


def optimized_metric(cfg: DictConfig) -> str:
    """The metric a sweeper optimizes: ``optimized_metric``, by default ``val/mIoU``."""
    return str(cfg.get("optimized_metric") or "val/mIoU")


def objective(cfg: DictConfig, summary: dict[str, Any]) -> float | None:
    """The value a sweeper optimizes: the final ``optimized_metric`` of the run."""
    return summary.get("metrics", {}).get(optimized_metric(cfg))


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def run(cfg: DictConfig) -> float | None:
    """Train one job of the composed config; return its ``optimized_metric`` (for sweepers)."""
    try:
        summary = train(cfg)
    except (ConfigError, NonFiniteError) as error:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # this job fails; the sweeper reports it and the other jobs go on
        log.error("%s", error)
        sys.exit(EXIT_BAD_INPUT if isinstance(error, ConfigError) else EXIT_NONFINITE)
    log.info("summary: %s", OmegaConf.to_yaml(OmegaConf.create(summary)) if summary else "{}")
    return objective(cfg, summary)
