"""The settings ``SegmentationDataModule`` takes: the few groups its config keys form.

The ``datamodule`` config group keeps its flat keys (``datamodule.batch_size=4``);
``segscale.data.datamodule.segmentation_datamodule``, its ``_target_``, gathers them
into these (the classes, the patches of an epoch, the loaders, the normalization).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ClassSettings:
    """The classes: how many, their names and colours, and the mask values that make them.

    ``label_ids`` maps mask values to classes (``None``: a value is its class index);
    ``ignore_ids`` are mask values left out of loss and metrics, like ``ignore_index``.
    """

    num_classes: int
    class_names: Sequence[str]
    class_colors: Sequence[Sequence[int]] | None = None
    label_ids: Sequence[Any] | None = None
    ignore_ids: Sequence[Any] = ()
    ignore_index: int = 255


@dataclass(frozen=True)
class PatchSettings:
    """What an epoch draws: the patch side, patches per image, their seed and order."""

    patch_size: int = 128
    patches_per_image: int = 64
    seed: int = 0
    shuffle: str = "every-epoch"


@dataclass(frozen=True)
class LoaderSettings:
    """How batches are loaded.

    ``batch_size`` is the training batch of every device, unless ``rank_batch_sizes``
    gives one per rank (uneven devices, ``scaling.worker_load``); ``val_batch_size``
    (``None``: ``batch_size``). ``num_workers`` per rank (``"auto"``:
    ``auto_num_workers``), ``pin_memory`` (``None``: on when training on a GPU),
    ``persistent_workers`` (keep workers across epochs), ``prefetch_factor``
    (batches each worker keeps ready) and ``worker_start_method`` (how workers start:
    ``fork``, ``spawn``, ``forkserver``, or ``auto``, the platform's default:
    ``segscale.platforms.parallel``).
    """

    batch_size: int = 8
    val_batch_size: int | None = None
    rank_batch_sizes: Sequence[int] | None = None
    num_workers: int | str = "auto"
    pin_memory: bool | None = None
    persistent_workers: bool = True
    prefetch_factor: int = 2
    worker_start_method: str = "auto"


@dataclass(frozen=True)
class Normalization:
    """The images' channels and the mean and std they are normalized with.

    Fractions of full intensity; ``None``: the training images' own, from the
    validation pass (and ``in_channels`` ``None``: theirs too).
    """

    mean: Sequence[float] | None = (0.485, 0.456, 0.406)
    std: Sequence[float] | None = (0.229, 0.224, 0.225)
    in_channels: int | None = 3
