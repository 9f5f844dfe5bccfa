"""A trained network and what it needs to run on new images, as a checkpoint carries them.

``predict.py``, ``evaluate.py``, ``export.py`` and ``segscale.load`` rebuild the network
with ``load_trained`` from the record ``train.py`` stores in every checkpoint
(``record.run_record``), so they need no training config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from segscale.data.checks.value_range import ValueRange
from segscale.data.classes.labels import class_colours
from segscale.models.checkpoint.reading import read_trained_network
from segscale.models.checkpoint.record import MaskLabels
from segscale.models.module import SegmentationModule


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
    network, record = read_trained_network(path, key)
    module = SegmentationModule.for_inference(network, record)
    return TrainedModel(
        module=module.eval(),
        class_names=record.class_names,
        colours=class_colours(record.class_colors, len(record.class_names)),
        ignore_index=record.ignore_index,
        in_channels=record.in_channels,
        max_value=float(record.max_value),
        class_colors=record.class_colors,
        mask_labels=record.mask_labels,
        data_source=record.data_source,
        validation_inference=record.validation_inference,
        value_range=record.value_range,
    )
