"""The objects a composed config describes, each from the config group of its name.

``train.py``, ``bench.py``, the sweepers and the Python API build through these, so a
config means the same thing everywhere (DESIGN.md §3).
"""

from __future__ import annotations

from typing import Any, cast

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from segscale.data.datamodule import SegmentationDataModule
from segscale.errors import ConfigError
from segscale.models.checkpoint_metadata import inference_metadata
from segscale.models.module import SegmentationModule
from segscale.training.launch import included_devices
from segscale.training.scaling import Effective
from segscale.training.sync_batchnorm import convert_sync_batchnorm


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
    model_cfg = cast(dict[str, Any], OmegaConf.to_container(cfg.model, resolve=True))
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
