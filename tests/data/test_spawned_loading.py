"""Loading with spawned workers: the batches of every kind of tile, as without workers.

Spawned workers (Windows', macOS', or ``datamodule.worker_start_method=spawn``) receive
the dataset pickled: mapped TIFFs and decode-cache entries by path
(``segscale.data.storage.mapped_arrays``), windowed TIFFs by path (``WindowedRaster``).
"""

from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch

from segscale.data.datamodule import segmentation_datamodule
from segscale.data.datasets.folder import FolderTiles
from segscale.data.storage.decode_cache import DecodeCache
from tests.conftest import write_pair

pytestmark = [pytest.mark.slow, pytest.mark.spawn]


def mixed_tiles(root: Path) -> Path:
    """A PNG (decode cache), an uncompressed TIFF (mapped) and a tiled deflate TIFF (windowed)."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name, suffix in (("png", ".png"), ("mapped", ".tif"), ("tiled", ".tif")):
            image = rng.integers(0, 255, (96, 96, 3), dtype=np.uint8)
            mask = rng.integers(0, 3, (96, 96), dtype=np.uint8)
            if name != "tiled":
                write_pair(root, split, name, image, mask, suffix, suffix)
                continue
            for folder, array in (("images", image), ("masks", mask)):
                (root / split / folder).mkdir(parents=True, exist_ok=True)
                path = root / split / folder / "tiled.tif"
                tifffile.imwrite(path, array, tile=(32, 32), compression="zlib")
    return root


def batches(root: Path, cache: Path, workers: int) -> tuple[list, list]:
    datamodule = segmentation_datamodule(
        FolderTiles(str(root)), 3, ["a", "b", "c"], patch_size=32, patches_per_image=4,
        batch_size=2, num_workers=workers, mean=None, std=None, in_channels=None,
        decode_cache=DecodeCache(str(cache)), worker_start_method="spawn",
        persistent_workers=False,
    )  # fmt: skip
    datamodule.setup("fit")
    train, val = datamodule.train_dataloader(), datamodule.val_dataloader()
    if workers:
        assert train.multiprocessing_context.get_start_method() == "spawn"
    train.batch_sampler.set_epoch(0)
    return list(train), list(val)


def test_spawned_workers_load_the_batches_loaded_without_workers(tmp_path):
    root = mixed_tiles(tmp_path / "data")
    alone = batches(root, tmp_path / "cache", 0)
    spawned = batches(root, tmp_path / "cache", 2)
    for ours, theirs in zip(alone, spawned, strict=True):
        assert len(ours) == len(theirs) > 0
        for one, other in zip(ours, theirs, strict=True):
            assert one.keys() == other.keys()
            for key in one:
                if isinstance(one[key], torch.Tensor):
                    assert torch.equal(one[key], other[key]), key
                else:
                    assert one[key] == other[key], key
