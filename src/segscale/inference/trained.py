"""A trained network and what it needs to run on new images, as a checkpoint carries them.

``train.py`` stores ``inference_metadata`` in every checkpoint (the resolved ``model``
config, classes, normalization), as plain values that weights-only loading accepts;
``predict.py`` and ``evaluate.py`` rebuild the network from it with ``load_trained``,
so they need no training config. The checkpoint is read weights-only and verified
against its digest (``segscale.training.checkpoint_io``), and its weights must fit the
rebuilt network exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hydra.utils import instantiate
from omegaconf import OmegaConf

from segscale.checks import ConfigError
from segscale.data.datamodule import SegmentationDataModule
from segscale.data.labels import class_colours
from segscale.models.module import SegmentationModule
from segscale.models.weights import load_network_weights
from segscale.training.checkpoint_io import load_checkpoint_file


def inference_metadata(model_cfg: dict[str, Any], datamodule: SegmentationDataModule) -> dict:
    """What a checkpoint must carry for inference: network config, classes, normalization."""
    # Plain Python values only (no numpy scalars): weights-only loading refuses others.
    return {
        "model": {**model_cfg, "encoder_weights": None},  # the checkpoint holds the weights
        "class_names": [str(name) for name in datamodule.class_names],
        "class_colors": [[int(v) for v in c] for c in datamodule.class_colors or []] or None,
        "ignore_index": int(datamodule.ignore_index),
        "mean": [float(v) for v in datamodule.mean],
        "std": [float(v) for v in datamodule.std],
        "max_value": float(datamodule.max_value),
    }


@dataclass(frozen=True)
class TrainedModel:
    """A network ready for inference (eval mode) with its classes and input conventions."""

    module: SegmentationModule
    class_names: tuple[str, ...]
    colours: np.ndarray
    """RGB per class (K×3 uint8)."""
    ignore_index: int
    in_channels: int
    max_value: float

    @property
    def num_classes(self) -> int:
        """Number of classes the network predicts."""
        return len(self.class_names)


NETWORK_TARGETS = ("segscale.models.", "torch.nn.")
"""Where a checkpoint's network ``_target_`` may point: network builders, nothing else."""


def check_network_target(model_cfg: Any, path: Path, key: str) -> None:
    """Refuse a checkpoint whose network config would call anything but a network builder.

    The config is instantiated with Hydra, which calls any ``_target_`` it names, at any
    depth: a shared checkpoint could otherwise run code through its metadata even when
    its pickle cannot.
    """
    if not isinstance(model_cfg, dict):
        raise ConfigError(f"{key}={str(path)!r}: its network config is not a mapping")
    target = model_cfg.get("_target_")
    # Hydra's own keys (_target_, _args_, _partial_, ...) anywhere below the top level.
    arguments = {k: v for k, v in model_cfg.items() if k != "_target_"}
    nested = [k for k in _keys(arguments) if k.startswith("_")]
    if not isinstance(target, str) or not target.startswith(NETWORK_TARGETS) or nested:
        raise ConfigError(
            f"{key}={str(path)!r}: its network config calls {target!r}"
            f"{f' and sets {nested}' if nested else ''}; expected a network built by "
            f"{' or '.join(t + '*' for t in NETWORK_TARGETS)} with plain arguments"
        )


def _keys(value: Any) -> list[str]:
    """Every mapping key at any depth of ``value``."""
    if isinstance(value, dict):
        return [str(k) for k in value] + [k for v in value.values() for k in _keys(v)]
    if isinstance(value, (list, tuple)):
        return [k for v in value for k in _keys(v)]
    return []


def load_trained(path: str | Path, key: str = "ckpt") -> TrainedModel:
    """Rebuild the network of a ``train.py`` checkpoint on the CPU, in eval mode.

    ``key`` names the config key that gave ``path``, for error messages.
    """
    path = Path(path)
    checkpoint = load_checkpoint_file(path, key)
    meta = checkpoint.get("segscale")
    if not isinstance(meta, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise ConfigError(
            f"{key}={str(path)!r} is not a segscale checkpoint (no 'segscale' entry); "
            "expected a .ckpt written by train.py"
        )
    names = meta["class_names"]
    check_network_target(meta["model"], path, key)
    module = SegmentationModule(
        network=instantiate(OmegaConf.create(meta["model"])),
        optimizer=None,
        num_classes=len(names),
        class_names=names,
        ignore_index=meta["ignore_index"],
        mean=meta["mean"],
        std=meta["std"],
        max_value=meta["max_value"],
    )
    prefix = "network."
    weights = {
        k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)
    }
    load_network_weights(module.network, weights, path, key)
    return TrainedModel(
        module=module.eval(),
        class_names=tuple(names),
        colours=class_colours(meta["class_colors"], len(names)),
        ignore_index=meta["ignore_index"],
        in_channels=meta["model"]["in_channels"],
        max_value=meta["max_value"],
    )
