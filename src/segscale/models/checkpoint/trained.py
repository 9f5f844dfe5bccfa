"""A trained network and what it needs to run on new images, as a checkpoint carries them.

``predict.py``, ``evaluate.py``, ``export.py`` and ``segscale.load`` rebuild the network
with ``load_trained`` from the record ``train.py`` stores in every checkpoint
(``record.run_record``), so they need no training config. The record is held once: what
the network's users read of it are properties.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from segscale.data.checks.value_range import ValueRange
from segscale.data.classes.labels import class_colours
from segscale.models.checkpoint.reading import read_trained_network
from segscale.models.checkpoint.record import CheckpointRecord
from segscale.models.module import SegmentationModule


@dataclass(frozen=True)
class TrainedModel:
    """A network ready for inference (eval mode) with the record of its checkpoint."""

    module: SegmentationModule
    record: CheckpointRecord
    checks_value_range: bool = True
    """Whether inputs are checked against the record's value range (``check_value_range``)."""

    @property
    def class_names(self) -> tuple[str, ...]:
        """The classes' names, in the order of the network's outputs."""
        return self.record.class_names

    @property
    def num_classes(self) -> int:
        """Number of classes the network predicts."""
        return len(self.record.class_names)

    @cached_property
    def colours(self) -> np.ndarray:
        """RGB per class (K×3 uint8): the record's colours, else the default palette's."""
        return class_colours(self.record.class_colors, self.num_classes)

    @property
    def in_channels(self) -> int:
        """The channels an input image must have."""
        return self.record.in_channels

    @property
    def max_value(self) -> float:
        """The pixels' full intensity in the training images (255 for 8-bit)."""
        return self.record.max_value

    @property
    def value_range(self) -> ValueRange | None:
        """The training images' raw values per channel, which inputs must not be far outside.

        ``None``: not recorded, or not checked (``checks_value_range``).
        """
        return self.record.value_range if self.checks_value_range else None

    @property
    def validation_inference(self) -> dict[str, Any]:
        """How validation predicted whole images: ``evaluate.py``'s default window."""
        return self.record.validation_inference


def load_trained(path: str | Path, key: str = "ckpt") -> TrainedModel:
    """Rebuild the network of a ``train.py`` checkpoint on the CPU, in eval mode.

    ``key`` names the config key that gave ``path``, for error messages.
    """
    network, record = read_trained_network(path, key)
    return TrainedModel(SegmentationModule.for_inference(network, record).eval(), record)
