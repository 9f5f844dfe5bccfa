"""The LightningDataModule and its settings: tiles read where they lie, patches, a validation grid.

The settings ``SegmentationDataModule`` takes: the few groups its config keys form.

The ``datamodule`` config group keeps its flat keys (``datamodule.batch_size=4``);
``segscale.data.datamodule.segmentation_datamodule``, its ``_target_``, gathers them
into these (the classes, the patches of an epoch, the loaders, the normalization).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import cv2
import lightning as L
from lightning.pytorch.accelerators import CUDAAccelerator
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

from segscale.data.augment import Augmentation
from segscale.data.checks.dataset_report import DatasetReport
from segscale.data.checks.validation import validate_dataset
from segscale.data.checks.value_range import ValueRange
from segscale.data.classes.labels import LabelMap
from segscale.data.classes.palette import warn_indistinct
from segscale.data.sampling.loaders import (
    DeferredStartLoader,
    EpochShardSampler,
    auto_num_workers,
    init_worker,
)
from segscale.data.sampling.patches import GridPatchDataset, PatchSampling, RandomPatchDataset
from segscale.data.storage.decode_cache import DecodeCache
from segscale.data.storage.grids import check_mask_alignment
from segscale.data.storage.sources import (
    DEFAULT_MAX_IMAGE_PIXELS,
    TileSource,
    check_max_image_pixels,
)
from segscale.data.storage.tiles import SKIP_KEY, UnreadableTiles, open_tiles
from segscale.errors import ConfigError
from segscale.platforms.parallel import StartMethodError, worker_start_method


class SegmentationDataModule(L.LightningDataModule):
    """Random augmented patches for training and a fixed patch grid for validation.

    Under DDP each rank reads its rank and the world size from the trainer and draws
    only its own shard (``EpochShardSampler``); the trainer must therefore be built with
    ``use_distributed_sampler=False``, which ``segscale.training.run.training_run`` does.
    It takes the settings its config keys form (the settings classes here:
    the classes, the patches of an epoch, the loaders, the normalization); the
    ``datamodule`` group builds it from its flat keys through ``segmentation_datamodule``.

    ``max_image_pixels`` refuses, before decoding, an image or mask whose header
    declares more pixels (``None``: no limit; memory-mapped TIFFs decode nothing and are
    exempt): the validation pass lists such files with the other unusable ones.

    ``sampling`` says where training patches are centred (``PatchSampling``: uniform,
    or class-balanced on the class locations the validation pass keeps), and how valid.

    ``decode_cache`` holds the PNG and JPEG files decoded once per machine
    (``DecodeCache``; ``None``: each rank decodes them into its memory); TIFFs are read
    where they lie (``segscale.data.storage.tiles``). A tile found unreadable mid-run stops it
    (``UnreadableTileError``), or with ``skip_unreadable`` is left out with a warning.

    ``mask_alignment``: what the validation pass does with a GeoTIFF mask on another grid
    than its image's (``segscale.data.storage.grids``): ``refuse`` it, or ``warp`` it onto the
    image's grid, which the tiles are then read on.
    """

    def __init__(
        self,
        source: TileSource,
        classes: ClassSettings,
        patches: PatchSettings | None = None,
        loader: LoaderSettings | None = None,
        normalization: Normalization | None = None,
        augmentation: Augmentation | None = None,
        max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
        sampling: PatchSampling | Mapping[str, Any] | None = None,
        decode_cache: DecodeCache | None = None,
        skip_unreadable: bool = False,
        mask_alignment: str = "refuse",
    ) -> None:
        super().__init__()
        check_mask_alignment(mask_alignment)
        self.mask_alignment = mask_alignment
        self.decode_cache = decode_cache
        if not isinstance(skip_unreadable, bool):
            raise ConfigError(
                f"{SKIP_KEY}={skip_unreadable!r} is not allowed: expected true or false"
            )
        self.unreadable = UnreadableTiles(skip_unreadable)
        patches = patches or PatchSettings()
        loader = loader or LoaderSettings()
        normalization = normalization or Normalization()
        check_max_image_pixels(max_image_pixels, "datamodule.max_image_pixels")
        if not isinstance(sampling, PatchSampling):  # a node without _target_, or none
            sampling = PatchSampling(**(sampling or {}))
        sampling.check_classes(classes.num_classes)
        self.sampling = sampling
        self.source = source
        self.num_classes = classes.num_classes
        self.class_names = tuple(classes.class_names)
        self.class_colors = (
            [tuple(c) for c in classes.class_colors] if classes.class_colors else None
        )
        if self.class_colors:
            warn_indistinct(self.class_colors, self.class_names)
        self.ignore_index = classes.ignore_index
        self.labels = LabelMap(
            classes.num_classes, classes.ignore_index, classes.label_ids, classes.ignore_ids
        )
        self.patch_size = patches.patch_size
        self.patches_per_image = patches.patches_per_image
        self.seed = patches.seed
        self.shuffle = patches.shuffle
        self.batch_size = loader.batch_size
        self.val_batch_size = loader.val_batch_size or loader.batch_size
        self.rank_batch_sizes = list(loader.rank_batch_sizes) if loader.rank_batch_sizes else None
        self.num_workers = loader.num_workers
        self.pin_memory = loader.pin_memory
        self.persistent_workers = loader.persistent_workers
        self.prefetch_factor = loader.prefetch_factor
        self.start_method = checked_start_method(loader.worker_start_method)
        self._mean = normalization.mean
        self._std = normalization.std
        self._in_channels = normalization.in_channels
        self.augmentation = augmentation or Augmentation()
        self.max_image_pixels = max_image_pixels
        self.report: DatasetReport | None = None
        self.train_set: RandomPatchDataset | None = None
        self.val_set: GridPatchDataset | None = None

    def check(self) -> DatasetReport:
        """Make the data available and validate every file against the settings.

        Raises ``InvalidDatasetError`` listing every unusable file; returns what the
        pass found (class frequencies, channels, pixel statistics). The pass is cached
        beside the data, so only new or changed files are read again.
        """
        if self.report is None:
            self.source.prepare()
            self.report = validate_dataset(
                self.source,
                self.labels,
                self.class_names,
                self.patch_size,
                self._in_channels,
                max_image_pixels=self.max_image_pixels,
                locations_per_class=(
                    self.sampling.locations_per_class if self.sampling.class_balanced else 0
                ),
                min_valid=self.sampling.min_valid,
                nodata=self.sampling.nodata,
                mask_alignment=self.mask_alignment,
            )
        return self.report

    @property
    def in_channels(self) -> int:
        """Image channels: ``in_channels`` when set, else those of the data."""
        return self._in_channels or self.check().channels

    @property
    def max_value(self) -> float:
        """Full intensity of the images' pixel type: 255 (uint8), 65535 (uint16), 1."""
        return self.check().max_value

    @property
    def value_range(self) -> ValueRange | None:
        """The training images' values per channel (``DatasetReport.value_range``)."""
        return self.check().value_range

    @property
    def mean(self) -> tuple[float, ...]:
        """Per-channel mean (fraction of full intensity): ``mean``, or the training set's."""
        return tuple(self._mean) if self._mean is not None else self.check().channel_mean

    @property
    def std(self) -> tuple[float, ...]:
        """Per-channel standard deviation: ``std``, or the training set's."""
        return tuple(self._std) if self._std is not None else self.check().channel_std

    def prepare_data(self) -> None:
        """Generate or unpack the data once per machine."""
        self.source.prepare()

    def setup(self, stage: str) -> None:
        """Open the tiles of the splits that ``stage`` needs, where they lie (no TIFF decoded)."""
        # Patches are small: OpenCV's thread pool only oversubscribes the CPU that
        # DataLoader workers share. Set here, before workers fork: calling it inside a
        # forked worker deadlocks when the parent's pool is already running.
        cv2.setNumThreads(1)
        if stage == "fit" and self.train_set is None:
            report = self.check()
            locations = report.class_locations.get("train", [])
            windows = report.valid_windows.get("train")
            self.train_set = RandomPatchDataset(
                open_tiles(
                    report.pairs["train"],
                    self.labels,
                    self.max_image_pixels,
                    self.decode_cache,
                    report.warped_masks,
                ),
                self.patch_size,
                self.patches_per_image,
                self.augmentation,
                self.seed,
                self.ignore_index,
                centres=self.sampling.centres(locations, self.class_names, windows),
                windows=windows,
                unreadable=self.unreadable,
                max_class_ratio=self.sampling.max_class_ratio,
            )
        if stage in ("fit", "validate") and self.val_set is None:
            report = self.check()
            self.val_set = GridPatchDataset(
                open_tiles(
                    report.pairs["val"],
                    self.labels,
                    self.max_image_pixels,
                    self.decode_cache,
                    report.warped_masks,
                ),
                self.patch_size,
                self.ignore_index,
                self.unreadable,
            )

    def _rank_and_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer else (0, 1)

    def train_dataloader(self, num_workers: int | None = None) -> DataLoader:
        """Random patches of each epoch: the shard of this rank.

        ``num_workers`` overrides the configured workers (``bench.py`` measures several).
        """
        rank, world = self._rank_and_world()
        batch_sizes = self.rank_batch_sizes or [self.batch_size] * world
        if len(batch_sizes) != world:
            raise ValueError(f"rank_batch_sizes has {len(batch_sizes)} entries for {world} ranks")
        train_set = self.train_set
        if train_set is None:  # len(None) would raise this TypeError too
            raise TypeError("no training set: call setup('fit') first")
        sampler = EpochShardSampler(
            len(train_set), batch_sizes, rank, self.shuffle, self.seed, self._epoch_position
        )
        if len(sampler) == 0:  # Lightning would skip training without a word
            raise ConfigError(
                f"an epoch of {len(train_set)} training patches (datamodule.patches_per_image="
                f"{self.patches_per_image} × {len(train_set.tiles)} images) holds no full "
                f"global batch of {sum(batch_sizes)} (datamodule.batch_size × devices): "
                "draw more patches per image or lower the batch"
            )
        # Deferred: the sampler reads the epoch and the batches done at the first batch,
        # after Lightning has restored a checkpoint's step, with workers as without.
        return self._loader(
            train_set, batch_sampler=sampler, num_workers=num_workers, kind=DeferredStartLoader
        )

    def _epoch_position(self) -> tuple[int, int] | None:
        """The trainer's epoch and the batches of it trained already (after a resume: > 0).

        The count is Lightning's own (its epoch loop's batches, restored from a
        checkpoint), the one its gradient-accumulation windows and its end of the epoch
        follow: a checkpoint written inside a window (a validation there) resumes with
        the batch after the last one Lightning counted, in the window Lightning steps.
        """
        trainer = self.trainer
        if trainer is None:  # a loader used on its own: the sampler's set_epoch says
            return None
        done = trainer.fit_loop.epoch_loop.batch_progress.current.ready
        return trainer.current_epoch, done

    def val_dataloader(self) -> DataLoader:
        """Validation grid patches: the share of this rank (metrics are synced across ranks)."""
        rank, world = self._rank_and_world()
        val_set = self.val_set
        if val_set is None:  # len(None) would raise this TypeError too
            raise TypeError("no validation set: call setup('fit') or setup('validate') first")
        shard = Subset(val_set, range(rank, len(val_set), world))
        return self._loader(shard, batch_size=self.val_batch_size)

    def workers_per_rank(self, ranks: int | None = None) -> int:
        """DataLoader workers of each rank: ``num_workers``, or its ``auto`` value.

        ``auto`` depends on the ranks per node: ``ranks``, else the trainer's devices
        (``bench.py`` asks what a run on ``ranks`` devices would give each rank).
        """
        if self.num_workers != "auto":
            return int(self.num_workers)
        if ranks is None:
            ranks = self.trainer.num_devices if self.trainer else 1
        return auto_num_workers(ranks)

    def _loader(
        self,
        dataset: Dataset,
        batch_size: int | None = None,
        batch_sampler: Sampler | None = None,
        num_workers: int | None = None,
        kind: type[DataLoader] = DataLoader,
    ) -> DataLoader:
        workers = self.workers_per_rank() if num_workers is None else num_workers
        pin_memory = self.pin_memory
        if pin_memory is None:  # page-locked host memory only helps copies to a GPU
            pin_memory = self.trainer is not None and isinstance(
                self.trainer.accelerator, CUDAAccelerator
            )
        return kind(
            dataset,
            batch_size=batch_size or 1,
            batch_sampler=batch_sampler,
            num_workers=workers,
            pin_memory=pin_memory,
            persistent_workers=self.persistent_workers and workers > 0,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
            multiprocessing_context=self.start_method if workers > 0 else None,
            worker_init_fn=partial(init_worker, rank=self._rank_and_world()[0]),
        )


def segmentation_datamodule(
    source: TileSource,
    num_classes: int,
    class_names: Sequence[str],
    patch_size: int = 128,
    patches_per_image: int = 64,
    batch_size: int = 8,
    num_workers: int | str = "auto",
    augmentation: Augmentation | None = None,
    ignore_index: int = 255,
    seed: int = 0,
    shuffle: str = "every-epoch",
    val_batch_size: int | None = None,
    pin_memory: bool | None = None,
    mean: Sequence[float] | None = (0.485, 0.456, 0.406),
    std: Sequence[float] | None = (0.229, 0.224, 0.225),
    in_channels: int | None = 3,
    class_colors: Sequence[Sequence[int]] | None = None,
    rank_batch_sizes: Sequence[int] | None = None,
    label_ids: Sequence[Any] | None = None,
    ignore_ids: Sequence[Any] = (),
    persistent_workers: bool = True,
    prefetch_factor: int = 2,
    worker_start_method: str = "auto",
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    sampling: PatchSampling | Mapping[str, Any] | None = None,
    decode_cache: DecodeCache | None = None,
    skip_unreadable: bool = False,
    mask_alignment: str = "refuse",
) -> SegmentationDataModule:
    """The ``datamodule`` group's object, from its flat keys (each documented in the group).

    The keys are gathered into ``ClassSettings``, ``PatchSettings``, ``LoaderSettings``
    and ``Normalization``; the others go to ``SegmentationDataModule`` as they are.
    """
    return SegmentationDataModule(
        source,
        ClassSettings(num_classes, class_names, class_colors, label_ids, ignore_ids, ignore_index),
        PatchSettings(patch_size, patches_per_image, seed, shuffle),
        LoaderSettings(
            batch_size,
            val_batch_size,
            rank_batch_sizes,
            num_workers,
            pin_memory,
            persistent_workers,
            prefetch_factor,
            worker_start_method,
        ),
        Normalization(mean, std, in_channels),
        augmentation=augmentation,
        max_image_pixels=max_image_pixels,
        sampling=sampling,
        decode_cache=decode_cache,
        skip_unreadable=skip_unreadable,
        mask_alignment=mask_alignment,
    )


def checked_start_method(value: object) -> str:
    """The DataLoader start method ``value`` names here (``auto``: the platform's).

    A method this platform lacks, or no method, raises ``ConfigError`` (exit 2) naming
    ``datamodule.worker_start_method``, the platform and the methods it has.
    """
    try:
        return worker_start_method(value)
    except StartMethodError as error:
        raise ConfigError(str(error)) from None


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
