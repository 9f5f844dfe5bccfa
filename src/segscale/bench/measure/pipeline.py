"""The data pipeline's speed: patches/s of the training DataLoader against its floor.

Three in-process rates on one core (``OpenCV`` single-threaded, as in a worker) say what
one worker can do at best: the crop alone (slicing the window out of the tile, no
augmentation: the cost floor), the crop with one affine warp (what rotation and
translation need at least), and the configured augmentation (what a worker does). Then
the real training DataLoader, for several worker counts: patches/s delivered to the
training loop, worker start-up excluded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np
import torch

from segscale.data.augment import PatchPose, cut_patch
from segscale.data.datamodule import SegmentationDataModule
from segscale.data.sampling.patches import RandomPatchDataset
from segscale.data.storage.tiles import open_now


@dataclass(frozen=True)
class PipelineRates:
    """Patches/s of one core (crop, crop + warp, augmented) and of the DataLoader per workers."""

    patch_size: int
    crop_only: float
    crop_and_warp: float
    augmented: float
    loader: dict[int, float] = field(default_factory=dict)  # workers → patches/s

    @property
    def augmentation_cost(self) -> float:
        """How many times the cost of crop + one warp a fully augmented patch takes."""
        return self.crop_and_warp / self.augmented

    def as_dict(self) -> dict[str, Any]:
        """The rates as plain numbers (for ``bench.json``)."""
        return {
            "patch_size": self.patch_size,
            "crop_only": self.crop_only,
            "crop_and_warp": self.crop_and_warp,
            "augmented_one_core": self.augmented,
            "augmentation_cost": self.augmentation_cost,
            "loader": {str(k): v for k, v in sorted(self.loader.items())},
        }


def calls_per_second(function: Callable[[int], Any], seconds: float, warmup: int = 3) -> float:
    """Calls of ``function(i)`` per second, over at least ``seconds`` after ``warmup`` calls."""
    for i in range(warmup):
        function(i)
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or count < 5:
        function(warmup + count)
        count += 1
    return count / elapsed


def one_core_rates(dataset: RandomPatchDataset, seconds: float) -> tuple[float, float, float]:
    """Patches/s of one core: crop alone, crop + one affine warp, fully augmented."""
    size = dataset.patch_size
    cv2.setNumThreads(1)  # as in a DataLoader worker (SegmentationDataModule.setup)

    def crop(i: int) -> None:
        tile = dataset.tiles[i % len(dataset.tiles)]
        pose = dataset.pose(0, i)
        height, width = tile.shape
        y = int(np.clip(pose.centre_y - size / 2, 0, height - size))
        x = int(np.clip(pose.centre_x - size / 2, 0, width - size))
        torch.from_numpy(np.ascontiguousarray(tile.image[y : y + size, x : x + size]))
        torch.from_numpy(np.ascontiguousarray(tile.mask[y : y + size, x : x + size]))

    def warp(i: int) -> None:
        tile = dataset.tiles[i % len(dataset.tiles)]
        pose = dataset.pose(0, i)
        image, mask = cut_patch(
            tile.image, tile.mask, PatchPose(pose.centre_x, pose.centre_y, 0.0), size, 255
        )
        torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))
        torch.from_numpy(mask)

    return (
        calls_per_second(crop, seconds),
        calls_per_second(warp, seconds),
        calls_per_second(lambda i: dataset[(0, i)], seconds),
    )


def loader_rate(datamodule: SegmentationDataModule, workers: int, seconds: float) -> float:
    """Patches/s the training DataLoader delivers with ``workers`` workers (start-up excluded)."""
    loader = datamodule.train_dataloader(num_workers=workers)
    batches = iter(loader)
    next(batches)  # the workers' start and their first batch
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or count == 0:
        batch = next(batches, None)
        if batch is None:  # the epoch ended: go on with the next one
            batches = iter(loader)
            continue
        count += len(batch["image"])
    del batches  # stop the workers before the next count starts its own
    return count / elapsed


def measure_pipeline(
    datamodule: SegmentationDataModule,
    worker_counts: Iterable[int],
    seconds: float,
    progress: Callable[[str], None] = lambda _: None,
) -> PipelineRates:
    """One core's rates and the DataLoader's rate for each of ``worker_counts``.

    ``progress`` is told what was measured after each measurement.
    """
    datamodule.setup("fit")
    dataset = datamodule.train_set
    assert dataset is not None  # setup("fit") made it
    open_now(dataset.tiles)  # the decode cache filled: its steady state is measured
    crop, warp, augmented = one_core_rates(dataset, seconds)
    progress("pipeline: one core")
    rates = PipelineRates(dataset.patch_size, crop, warp, augmented)
    for workers in worker_counts:
        rates.loader[workers] = loader_rate(datamodule, workers, seconds)
        progress(f"pipeline: {workers} workers")
    return rates


def doubling_counts(limit: int, *also: int) -> list[int]:
    """1, 2, 4, … below ``limit``, ``limit`` itself, and ``also``: the counts worth measuring."""
    counts, count = {limit, *also}, 1
    while count < limit:
        counts.add(count)
        count *= 2
    return sorted(counts)


def worker_counts(cpus: int, configured: int) -> list[int]:
    """Worker counts to measure: 1, 2, 4, … up to ``cpus``, ``cpus`` itself, and ``configured``."""
    return doubling_counts(cpus, max(1, configured))


def rank_data_rate(loader_rate: float, ranks: int, workers: int, cpus: int) -> float:
    """Patches/s one rank's workers deliver when ``ranks`` ranks share ``cpus`` cores.

    ``loader_rate`` is one process's measured rate with ``workers`` workers; when the
    ranks' processes and workers together outnumber the cores, each gets its share.
    """
    return loader_rate * min(1.0, cpus / (ranks * (workers + 1)))
