"""A trained network and what it needs to run on new images, as a checkpoint carries them.

``predict.py`` and ``evaluate.py`` rebuild the network with ``load_trained`` from the
metadata ``train.py`` stores in every checkpoint
(``segscale.models.checkpoint_metadata``), so they need no training config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from segscale.data.labels import class_colours
from segscale.data.value_range import ValueRange
from segscale.models.module import SegmentationModule


@dataclass(frozen=True)
class MaskLabels:
    """What the training masks held: ``datamodule.label_ids`` and ``ignore_ids`` as used.

    ``label_ids`` is ``None`` for class indices, else one entry per class (a grey level,
    an RGB triplet as a list, or a list of several); plain values, as a config has them.
    """

    label_ids: list[Any] | None
    ignore_ids: list[Any]


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
    class_colors: list[list[int]] | None = None
    """The colours as the training config gave them (``None``: it gave none)."""
    mask_labels: MaskLabels | None = None
    """The training masks' label IDs; ``None`` for a checkpoint written before segscale
    stored them (its masks' encoding is unknown)."""
    data_source: dict[str, Any] | None = None
    """The training run's ``datamodule.source`` (resolved, ``root`` absolute); ``None``
    for a checkpoint written before segscale stored it."""
    validation_inference: dict[str, Any] | None = None
    """How training's validation predicted whole images (``grid_inference``): the
    sliding-window settings ``evaluate.py`` uses by default; ``None`` for a checkpoint
    written before segscale stored them."""
    value_range: ValueRange | None = None
    """The training images' values per channel (raw), which inputs must not be far
    outside; ``None`` for a checkpoint written before segscale recorded it."""

    @property
    def num_classes(self) -> int:
        """Number of classes the network predicts."""
        return len(self.class_names)


def load_trained(path: str | Path, key: str = "ckpt") -> TrainedModel:
    """Rebuild the network of a ``train.py`` checkpoint on the CPU, in eval mode.

    ``key`` names the config key that gave ``path``, for error messages.
    """
    module = SegmentationModule.load_from_checkpoint(path, key=key)
    meta = module.inference_metadata or {}
    names = module.class_names
    # Checkpoints from before label IDs were stored lack both keys (check_metadata
    # accepts that): their masks' encoding is left unknown, not guessed.
    mask_labels = (
        MaskLabels(meta["label_ids"], meta["ignore_ids"])
        if "label_ids" in meta and "ignore_ids" in meta
        else None
    )
    return TrainedModel(
        module=module.eval(),
        class_names=names,
        colours=class_colours(meta["class_colors"], len(names)),
        ignore_index=module.ignore_index,
        in_channels=int(meta["model"].get("in_channels", 3)),
        max_value=module.max_value,
        class_colors=meta["class_colors"],
        mask_labels=mask_labels,
        data_source=meta.get("data_source"),
        validation_inference=meta.get("validation_inference"),
        value_range=(
            ValueRange.from_record(meta["value_range"]) if "value_range" in meta else None
        ),
    )
