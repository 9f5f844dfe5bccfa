"""The training tiles as stored against the same tiles decoded into memory: patches/s.

Training reads each tile where it lies (``segscale.data.storage.tiles``): a compressed TIFF a
window at a time, a PNG or JPEG through the machine's decode cache, an uncompressed
TIFF memory-mapped. The in-memory path it replaced held every tile decoded in every
rank. Both are measured here through the same training DataLoader, with the same
patches (same seed, augmentation and tile order) and the configured workers: the tiles
as stored, and a copy of the training set whose tiles are decoded arrays. The copy holds
at most ``budget_bytes`` (``bench.in_memory_gb``), the first tiles in order that fit, so
that bench never decodes a dataset larger than memory. The two are measured in
alternating rounds (the machine's load drifts), and their ratio is of the medians.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from segscale.bench.measure.pipeline import loader_rate
from segscale.data.datamodule import SegmentationDataModule
from segscale.data.sampling.patches import RandomPatchDataset
from segscale.data.storage.decode_cache import CachedFile
from segscale.data.storage.rasters import WindowedRaster
from segscale.data.storage.tiles import Tile

ROUNDS = 3
"""Rounds of each measurement, taken in turn: stored, in memory, stored, ..."""


@dataclass(frozen=True)
class StorageRates:
    """Patches/s of the DataLoader with the tiles as stored and decoded into memory.

    ``stored_as`` says how the training tiles are read (kind → tiles); ``in_memory_tiles``
    of ``tiles`` were decoded (``decoded_mb`` in all); ``skipped`` says why nothing was
    measured (no tile fits the budget), else it is empty. ``took_s``: what measuring it
    took (decoding the copy, starting the workers, the rounds).
    """

    workers: int
    tiles: int
    stored_as: dict[str, int]
    in_memory_tiles: int
    decoded_mb: float
    stored: list[float]
    in_memory: list[float]
    skipped: str = ""
    took_s: float = 0.0

    @property
    def ratio(self) -> float | None:
        """Patches/s as stored / in memory (medians of the rounds); ``None`` if skipped."""
        if not self.stored or not self.in_memory:
            return None
        return statistics.median(self.stored) / statistics.median(self.in_memory)

    def as_dict(self) -> dict[str, Any]:
        """The rates and what they were measured on, as plain values (``bench.json``)."""
        return {
            "workers": self.workers,
            "tiles": self.tiles,
            "stored_as": dict(self.stored_as),
            "in_memory_tiles": self.in_memory_tiles,
            "decoded_mb": self.decoded_mb,
            "stored": list(self.stored),
            "in_memory": list(self.in_memory),
            "stored_median": statistics.median(self.stored) if self.stored else None,
            "in_memory_median": statistics.median(self.in_memory) if self.in_memory else None,
            "ratio": self.ratio,
            "skipped": self.skipped or None,
            "took_s": round(self.took_s, 1),
        }


def storage_kind(pixels: Any) -> str:
    """How a tile's image is read: by window, memory-mapped (and from where), or in memory."""
    if isinstance(pixels, CachedFile):
        pixels = pixels.opened()
    if isinstance(pixels, WindowedRaster):
        return "TIFF read by window"
    if isinstance(pixels, np.memmap):
        name = str(pixels.filename or "")
        return "decode cache, memory-mapped" if name.endswith(".npy") else "TIFF, memory-mapped"
    return "in memory"


def tile_bytes(tile: Tile) -> int:
    """What ``tile`` takes decoded: its image and its mask."""
    return sum(
        math.prod(pixels.shape) * np.dtype(pixels.dtype).itemsize
        for pixels in (tile.image, tile.mask)
    )


def decoded_copy(dataset: RandomPatchDataset, budget_bytes: int) -> RandomPatchDataset | None:
    """``dataset`` over its first tiles that fit in ``budget_bytes``, decoded into memory.

    The patches are drawn as ``dataset`` draws them from those tiles (same seed,
    augmentation, patch size; class-balanced centres only when every tile fits), and an
    epoch is as long as ``dataset``'s. ``None`` when no tile fits.
    """
    chosen, used = [], 0
    for index, tile in enumerate(dataset.tiles):
        size = tile_bytes(tile)
        if used + size <= budget_bytes:
            chosen.append(index)
            used += size
    if not chosen:
        return None
    decoded = copy.copy(dataset)
    tiles = [dataset.tiles[i] for i in chosen]
    decoded.tiles = [Tile(np.asarray(t.image), np.asarray(t.mask)) for t in tiles]
    decoded.patches_per_image = math.ceil(len(dataset) / len(chosen))
    if dataset.windows is not None:  # the valid windows of the tiles kept
        decoded.windows = [dataset.windows[i] for i in chosen]
    if len(chosen) < len(dataset.tiles):
        decoded.centres = None  # the class locations are those of every tile
    return decoded


@contextmanager
def training_set(datamodule: SegmentationDataModule, dataset: RandomPatchDataset) -> Iterator[None]:
    """The datamodule's training loaders draw from ``dataset`` for the duration."""
    kept = datamodule.train_set
    datamodule.train_set = dataset
    try:
        yield
    finally:
        datamodule.train_set = kept


def measure_storage(
    datamodule: SegmentationDataModule, workers: int, seconds: float, budget_bytes: int
) -> StorageRates:
    """Patches/s as stored and in memory, ``ROUNDS`` alternating rounds of ``seconds`` each.

    ``datamodule`` has been set up for ``fit``; ``workers`` is the configured count.
    """
    started = time.perf_counter()
    dataset = datamodule.train_set
    assert dataset is not None  # measure_pipeline set it up
    kinds: dict[str, int] = {}
    for tile in dataset.tiles:
        kind = storage_kind(tile.image)
        kinds[kind] = kinds.get(kind, 0) + 1
    decoded = decoded_copy(dataset, budget_bytes)
    if decoded is None:
        smallest = min(tile_bytes(t) for t in dataset.tiles)
        why = (
            f"the smallest training tile decodes to {smallest / 1e9:.2f} GB, more than "
            f"bench.in_memory_gb={budget_bytes / 1e9:g}"
        )
        took = time.perf_counter() - started
        return StorageRates(workers, len(dataset.tiles), kinds, 0, 0.0, [], [], why, took)
    stored, in_memory = [], []
    for _ in range(ROUNDS):
        stored.append(loader_rate(datamodule, workers, seconds))
        with training_set(datamodule, decoded):
            in_memory.append(loader_rate(datamodule, workers, seconds))
    decoded_mb = sum(tile_bytes(t) for t in decoded.tiles) / 1e6
    took = time.perf_counter() - started
    return StorageRates(
        workers,
        len(dataset.tiles),
        kinds,
        len(decoded.tiles),
        decoded_mb,
        stored,
        in_memory,
        "",
        took,
    )
