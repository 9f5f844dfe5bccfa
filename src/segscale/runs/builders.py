"""The objects a composed config describes, each from the config group of its name.

``train.py``, ``bench.py``, the sweepers and the Python API build through these, so a
config means the same thing everywhere (docs/architecture.md, "One config group, one object").
"""

from __future__ import annotations

import logging
from typing import Any, cast

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from segscale.data.datamodule import SegmentationDataModule
from segscale.data.datasets.split_forms import check_splits
from segscale.devices import included_devices, process_group_backend
from segscale.errors import ConfigError
from segscale.models.checkpoint.init_from import (
    check_init_source_kept,
    check_one_initialisation,
    init_normalization,
    load_whole_network,
)
from segscale.models.checkpoint.reading import Checkpoint
from segscale.models.checkpoint.record import run_record
from segscale.models.module import SegmentationModule
from segscale.models.optim import encoder_of
from segscale.models.pretrained import named_weights, names_a_file, normalization
from segscale.runs.scaling.rules import Effective
from segscale.runs.scaling.sync_batchnorm import convert_sync_batchnorm

log = logging.getLogger(__name__)


def build_datamodule(
    cfg: DictConfig, effective: Effective, resumed: Checkpoint | None = None
) -> SegmentationDataModule:
    """The ``datamodule`` group's object, with the per-device batches of ``effective``.

    ``resumed``: the checkpoint a resume continues, whose normalization it keeps.
    """
    batch_sizes = list(effective.per_device_batch_sizes)
    # batch_size also sets the validation batch: that of the largest training share.
    return build(
        cfg.datamodule,
        _convert_="all",
        batch_size=max(batch_sizes),
        rank_batch_sizes=batch_sizes,
        **weights_normalization(cfg, resumed),
    )


def weights_normalization(
    cfg: DictConfig, resumed: Checkpoint | None = None
) -> dict[str, list[float]]:
    """``datamodule.mean``/``std`` left null, as the pretrained ``model.encoder_weights`` expect.

    Named weights were trained on inputs normalized their way (ImageNet's mean and std
    for most), so a null mean or std means theirs, not the training images' as it does
    otherwise. A value the user set is kept; a local weights file, random weights or
    images of other than 3 channels leave both as configured. With ``model.init_from``,
    a null mean or std is the checkpoint's (``segscale.models.checkpoint.init_from``).

    A resume (``resumed``) keeps the normalization its run trained with, which its
    checkpoint records: neither the ``init_from`` file nor the weights are read again
    (the resumed checkpoint holds the whole network), nor the images measured anew.
    """
    weights = cfg.model.get("encoder_weights")
    unset = [key for key in ("mean", "std") if cfg.datamodule.get(key) is None]
    check_one_initialisation(cfg.model)
    if resumed is not None and resumed.record is not None and unset:
        taken = {key: [float(v) for v in getattr(resumed.record, key)] for key in unset}
        log.info("datamodule %s null: the resumed checkpoint's %s", "/".join(unset), taken)
        return taken
    if cfg.model.get("init_from") is not None and unset:
        if resumed is not None:  # a checkpoint without segscale's record: init_from's, read
            check_init_source_kept(cfg.model.init_from, resumed)
        taken = init_normalization(
            cfg.model.init_from, cfg.datamodule.get("mean"), cfg.datamodule.get("std")
        )
        log.info("datamodule %s null: model.init_from's %s", "/".join(unset), taken)
        return taken
    in_channels = cfg.datamodule.get("in_channels")
    if not isinstance(weights, str) or names_a_file(weights) or not unset:
        return {}
    if in_channels not in (None, 3):
        return {}
    mean, std = normalization(named_weights(cfg.model.encoder, weights))
    log.info("datamodule mean/std null: those %s=%s expects", "model.encoder_weights", weights)
    return {key: value for key, value in (("mean", mean), ("std", std)) if key in unset}


def build_module(
    cfg: DictConfig,
    datamodule: SegmentationDataModule,
    learning_rate: float,
    warmup_epochs: float = 0.0,
    sync_batchnorm: bool = False,
    init_weights: bool = True,
) -> SegmentationModule:
    """The network (``model``), loss, optimizer and schedule of ``cfg`` in one module.

    ``learning_rate`` and ``warmup_epochs`` are the values after the scaling rules;
    ``sync_batchnorm`` converts batch norm to the synchronized kind (DDP, several ranks).
    ``training.compile`` compiles the network in place (``nn.Module.compile``), so its
    checkpoint keys stay those of the plain network. ``training.encoder_lr_factor`` goes
    to the optimizer; both fine-tuning settings are refused here, before training, for a
    network without an encoder. ``model.init_from`` loads a checkpoint's network into the
    new one, and ``model.encoder_weights`` the encoder's, when ``init_weights``: a resume,
    whose weights come from its own checkpoint, passes ``False``, and neither is then
    read (nor fetched).
    """
    report = datamodule.check()
    model_cfg = cast(dict[str, Any], OmegaConf.to_container(cfg.model, resolve=True))
    model_cfg["in_channels"] = model_cfg.get("in_channels") or datamodule.in_channels
    check_one_initialisation(model_cfg)
    # Not the network builder's: the checkpoint is read with the run's classes and
    # normalization at hand, and checkpoints store the network config without it.
    init_from = model_cfg.pop("init_from", None)
    weights = {} if init_weights else {"encoder_weights": None}
    network = build(OmegaConf.create({**model_cfg, **weights}))
    if init_from is not None and init_weights:
        load_whole_network(
            network,
            {**model_cfg, "init_from": init_from},
            datamodule.class_names,
            {"mean": datamodule.mean, "std": datamodule.std},
        )
    lr_factor = encoder_lr_factor_for(cfg, network)
    if sync_batchnorm:
        network = convert_sync_batchnorm(network)
    if cfg.training.get("compile"):
        network.compile()
    return SegmentationModule(
        network=network,
        optimizer=build(cfg.optimizer, lr=learning_rate, **lr_factor),
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
        inference_metadata=run_record(model_cfg, datamodule, cfg.datamodule.source),
    )


def fine_tuning(cfg: DictConfig) -> dict[str, Any]:
    """``training.encoder_lr_factor`` and ``training.freeze_encoder_epochs`` of ``cfg``."""
    return {
        "encoder_lr_factor": cfg.training.encoder_lr_factor,
        "freeze_encoder_epochs": cfg.training.freeze_encoder_epochs,
    }


def encoder_lr_factor_for(cfg: DictConfig, network: nn.Module) -> dict[str, float]:
    """The optimizer's ``encoder_lr_factor`` argument, if set; checks ``network`` for both keys.

    Passed only when other than 1, so that an optimizer target of the user's own needs
    no such parameter. A network without an encoder is refused for either fine-tuning
    key here, before training, rather than when the optimizer or callback meets it.
    """
    tuning = fine_tuning(cfg)
    for key, default in (("encoder_lr_factor", 1), ("freeze_encoder_epochs", 0)):
        if tuning[key] != default:
            encoder_of(network, f"training.{key}", tuning[key])
    factor = tuning["encoder_lr_factor"]
    return {"encoder_lr_factor": factor} if factor != 1 else {}


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


BACKEND_KEY = "strategy.process_group_backend"
"""Lightning's DDP strategies' key for the ranks' backend (``strategy=ddp``, ``ddp_spawn``)."""


def build_strategy(cfg: DictConfig) -> Any:
    """The ``strategy`` group's Lightning strategy, with the backend ``strategy_backend`` gives."""
    return build(cfg.strategy, **strategy_backend(cfg))


def strategy_backend(cfg: DictConfig) -> dict[str, str]:
    """``{"process_group_backend": ...}``: the strategy's own, or this platform's for null.

    Lightning's null is NCCL for GPUs whatever the platform, which Windows and macOS do
    not have; ours is the platform's (``segscale.devices.process_group_backend``). Empty
    for a strategy without the key (``strategy=single``). ``ConfigError`` for a backend
    the platform or the device (``trainer.accelerator``) lacks: ``check_config`` asks
    first, before anything is built.
    """
    if "process_group_backend" not in cfg.strategy:
        return {}
    value = cfg.strategy.process_group_backend
    backend = process_group_backend(value, cfg.trainer.accelerator, BACKEND_KEY)
    return {"process_group_backend": backend}


def check_data_source(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` for a data source value left unset (``???``) or of the wrong form.

    The splits of a folder dataset are checked by ``check_splits``.

    Hydra would raise ``MissingMandatoryValue`` when the source is built (``datamodule=folder``
    without ``datamodule.source.root``), naming neither what to give nor how.
    """
    source = OmegaConf.select(cfg, "datamodule.source")
    if not isinstance(source, DictConfig):
        return
    for key in source:
        name = str(key)
        if OmegaConf.is_missing(source, name):
            hint = " (the dataset folder, holding train/ and val/)" if name == "root" else ""
            raise ConfigError(
                f"datamodule.source.{name} is not set: give it on the command line, e.g. "
                f"datamodule.source.{name}=/path/to/data{hint}"
            )
    if "splits" in source:
        check_splits(source.splits)


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
