"""Spawned DataLoader workers share a memory-mapped dataset: none holds a copy of it.

Spawned, a worker receives its dataset pickled; a memory map pickled by value (NumPy's
own) would give each of them a private copy of the data. Each of 4 spawned workers
reads every pixel of 268 MB of uncompressed TIFFs here, and its private memory (USS:
the pages no other process maps) is compared with a worker's over a tiny dataset.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psutil
import pytest
import tifffile
from torch.utils.data import DataLoader, Dataset

from segscale.data.classes.labels import LabelMap
from segscale.data.storage.sources import ImageMaskPair
from segscale.data.storage.tiles import Tile, open_tiles

WORKERS = 4


class EveryTileToEveryWorker(Dataset):
    """Item ``i`` reads tile ``i // WORKERS`` whole: each worker reads every tile (batch 1).

    A worker's items are ``k, k + WORKERS, ...``: one of each tile.
    """

    def __init__(self, tiles: list[Tile]) -> None:
        self.tiles = tiles

    def __len__(self) -> int:
        return len(self.tiles) * WORKERS

    def __getitem__(self, index: int) -> int:
        tile = self.tiles[index // WORKERS]
        return int(tile.image.sum(dtype=np.uint64) + tile.mask.sum(dtype=np.uint64))


def mapped_tiles(root: Path, count: int, side: int) -> tuple[list[Tile], int]:
    """``count`` uncompressed RGB TIFF tiles of ``side``² and masks, opened; their bytes."""
    pairs = []
    root.mkdir()
    for i in range(count):
        pair = ImageMaskPair(root / f"image{i}.tif", root / f"mask{i}.tif")
        row = np.arange(side, dtype=np.uint8)
        tifffile.imwrite(pair.image, np.broadcast_to((row + i)[:, None, None], (side, side, 3)))
        tifffile.imwrite(pair.mask, np.broadcast_to((row % 3)[None, :], (side, side)))
        pairs.append(pair)
    tiles = open_tiles(pairs, LabelMap(3))
    return tiles, count * side * side * 4


def workers_private_mb(tiles: list[Tile], workers: int) -> list[float]:
    """Each spawned worker's USS (MB) once it has read every tile; this process read them too.

    This process maps and reads them first: a page of a file that only one process maps
    is private to it, one that several map is shared.
    """
    dataset = EveryTileToEveryWorker(tiles)
    expected = [dataset[index] for index in range(len(dataset))]  # maps and reads each tile
    loader = DataLoader(
        dataset, batch_size=None, num_workers=workers, multiprocessing_context="spawn"
    )
    batches = iter(loader)
    got = [next(batches) for _ in range(len(dataset))]  # the workers stay up: not exhausted
    assert got == expected
    started = [psutil.Process(worker.pid) for worker in batches._workers]  # type: ignore[attr-defined]
    assert len(started) == workers
    private = [child.memory_full_info().uss / 2**20 for child in started]
    del batches
    return private


@pytest.mark.slow
@pytest.mark.spawn
def test_spawned_workers_add_no_private_memory_proportional_to_the_data(tmp_path):
    tiny, _ = mapped_tiles(tmp_path / "tiny", 1, 64)
    baseline = max(workers_private_mb(tiny, 1))  # an interpreter with torch and segscale
    tiles, size = mapped_tiles(tmp_path / "large", 4, 4096)
    data_mb = size / 2**20  # 256 MiB
    private = workers_private_mb(tiles, WORKERS)
    grown = [mb - baseline for mb in private]
    print(f"data {data_mb:.0f} MiB; baseline worker {baseline:.0f} MiB; workers {private}")
    # By value (each worker its own copy), each grew by the data's 256 MiB.
    assert max(grown) < data_mb / 8, (baseline, private)
