"""A trained network and what it needs to run on new images, as a checkpoint carries them.

``train.py`` stores ``inference_metadata`` in every checkpoint (the resolved ``model``
config, classes, normalization); ``predict.py`` and ``evaluate.py`` rebuild the network
from it with ``load_trained``, so they need no training config.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from segscale.checks import ConfigError
from segscale.data.datamodule import SegmentationDataModule
from segscale.data.labels import class_colours
from segscale.models.module import SegmentationModule


def inference_metadata(model_cfg: dict[str, Any], datamodule: SegmentationDataModule) -> dict:
    """What a checkpoint must carry for inference: network config, classes, normalization."""
    return {
        "model": {**model_cfg, "encoder_weights": None},  # the checkpoint holds the weights
        "class_names": list(datamodule.class_names),
        "class_colors": [list(c) for c in datamodule.class_colors or []] or None,
        "ignore_index": datamodule.ignore_index,
        "mean": list(datamodule.mean),
        "std": list(datamodule.std),
        "max_value": datamodule.max_value,
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


def load_trained(path: str | Path, key: str = "ckpt") -> TrainedModel:
    """Rebuild the network of a ``train.py`` checkpoint on the CPU, in eval mode.

    ``key`` names the config key that gave ``path``, for error messages.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{key}={str(path)!r} does not exist; expected a .ckpt from train.py")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as error:
        raise ConfigError(
            f"{key}={str(path)!r} is not a readable checkpoint ({error}); expected a .ckpt "
            "written by train.py"
        ) from None
    meta = checkpoint.get("segscale") if isinstance(checkpoint, dict) else None
    if not meta or "state_dict" not in checkpoint:
        raise ConfigError(
            f"{key}={str(path)!r} is not a segscale checkpoint (no 'segscale' entry); "
            "expected a .ckpt written by train.py"
        )
    names = meta["class_names"]
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
    try:
        module.network.load_state_dict(weights)
    except RuntimeError as error:
        raise ConfigError(f"{key}={str(path)!r}: weights do not fit the network: {error}") from None
    return TrainedModel(
        module=module.eval(),
        class_names=tuple(names),
        colours=class_colours(meta["class_colors"], len(names)),
        ignore_index=meta["ignore_index"],
        in_channels=meta["model"]["in_channels"],
        max_value=meta["max_value"],
    )
