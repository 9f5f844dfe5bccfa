import statistics
from pathlib import Path

import numpy as np
import pytest
import tifffile

from segscale.bench.measure.storage import (
    ROUNDS,
    decoded_copy,
    measure_storage,
    storage_kind,
    tile_bytes,
    training_set,
)
from segscale.data.datasets.synthetic import draw_tile
from segscale.data.storage.rasters import WindowedRaster
from segscale.runs.builders import build_datamodule
from segscale.runs.scaling.rules import ScalingRules
from tests.conftest import compose_config

SIDE = 96
TILE_BYTES = SIDE * SIDE * 3 + SIDE * SIDE  # an RGB image and its mask, uint8


@pytest.fixture(scope="module")
def compressed_tiffs(tmp_path_factory) -> Path:
    """Two training tiles and one validation tile: deflate-compressed, tiled TIFFs."""
    root = tmp_path_factory.mktemp("tiffs")
    for split, count in (("train", 2), ("val", 1)):
        for i in range(count):
            image, mask = draw_tile(SIDE, seed=5, index=i + 10 * (split == "val"))
            for folder, array in (("images", image), ("masks", mask)):
                path = root / split / folder / f"tile{i}.tif"
                path.parent.mkdir(parents=True, exist_ok=True)
                tifffile.imwrite(path, array, tile=(32, 32), compression="zlib")
    return root


@pytest.fixture
def datamodule(compressed_tiffs, tmp_path):
    cfg = compose_config(
        "train",
        "datamodule=folder",
        f"datamodule.source.root={compressed_tiffs}",
        f"datamodule.decode_cache.folder={tmp_path / 'decoded'}",
        "datamodule.patch_size=32",
        "datamodule.patches_per_image=8",
        "datamodule.batch_size=4",
        "datamodule.num_workers=0",
        f"output_dir={tmp_path / 'run'}",
    )
    built = build_datamodule(cfg, ScalingRules().resolve(4, 0.01, 1))
    built.setup("fit")
    return built


def test_tiles_as_stored_are_measured_against_the_same_tiles_decoded(datamodule):
    rates = measure_storage(datamodule, workers=0, seconds=0.05, budget_bytes=10**9)
    assert rates.stored_as == {"TIFF read by window": 2}
    assert (rates.tiles, rates.in_memory_tiles) == (2, 2)
    assert rates.decoded_mb == 2 * TILE_BYTES / 1e6
    assert len(rates.stored) == len(rates.in_memory) == ROUNDS
    assert all(r > 0 for r in rates.stored + rates.in_memory)
    medians = statistics.median(rates.stored), statistics.median(rates.in_memory)
    assert rates.ratio == medians[0] / medians[1]
    result = rates.as_dict()
    assert result["ratio"] == rates.ratio and result["skipped"] is None
    assert 6 * 0.05 < rates.took_s == pytest.approx(result["took_s"], abs=0.05)
    # The measurement left the training set as it was: read where it lies.
    assert all(isinstance(t.image, WindowedRaster) for t in datamodule.train_set.tiles)


def test_the_budget_bounds_what_is_decoded(datamodule):
    one = measure_storage(datamodule, workers=0, seconds=0.02, budget_bytes=TILE_BYTES + 1)
    assert one.in_memory_tiles == 1 and one.decoded_mb == TILE_BYTES / 1e6
    none = measure_storage(datamodule, workers=0, seconds=0.02, budget_bytes=TILE_BYTES - 1)
    assert none.in_memory_tiles == 0 and none.stored == none.in_memory == []
    assert none.ratio is None
    assert "smallest training tile decodes to" in none.skipped
    assert "bench.in_memory_gb" in none.skipped


def test_the_decoded_copy_draws_the_same_patches_from_arrays(datamodule):
    stored = datamodule.train_set
    decoded = decoded_copy(stored, budget_bytes=10**9)
    assert decoded is not None and decoded is not stored
    assert all(type(t.image) is np.ndarray and type(t.mask) is np.ndarray for t in decoded.tiles)
    assert len(decoded) == len(stored)
    for key in [(0, 0), (0, 5), (1, 3), (0, 40)]:  # 40: past the epoch, as bench draws
        a, b = stored[key], decoded[key]
        assert all(bool((a[name] == b[name]).all()) for name in ("image", "mask", "key"))
    assert all(isinstance(t.image, WindowedRaster) for t in stored.tiles)  # not replaced


def test_a_partial_copy_keeps_the_epoch_long_and_draws_from_its_tiles(datamodule):
    stored = datamodule.train_set
    decoded = decoded_copy(stored, budget_bytes=TILE_BYTES)
    assert decoded is not None and len(decoded.tiles) == 1
    assert len(decoded) >= len(stored)
    assert decoded_copy(stored, budget_bytes=TILE_BYTES - 1) is None


def test_the_training_set_comes_back_after_an_error(datamodule):
    stored = datamodule.train_set
    decoded = decoded_copy(stored, budget_bytes=10**9)
    with pytest.raises(RuntimeError), training_set(datamodule, decoded):
        assert datamodule.train_set is decoded
        raise RuntimeError
    assert datamodule.train_set is stored


def test_storage_kinds(tmp_path, make_config):
    uncompressed = tmp_path / "plain.tif"
    tifffile.imwrite(uncompressed, np.zeros((8, 8, 3), np.uint8))
    compressed = tmp_path / "deflate.tif"
    tifffile.imwrite(compressed, np.zeros((8, 8, 3), np.uint8), compression="zlib")
    assert storage_kind(tifffile.memmap(uncompressed, mode="r")) == "TIFF, memory-mapped"
    assert storage_kind(WindowedRaster(compressed)) == "TIFF read by window"
    assert storage_kind(np.zeros((8, 8, 3), np.uint8)) == "in memory"
    # The synthetic dataset's PNGs are read through the decode cache
    cfg = make_config()
    synthetic = build_datamodule(cfg, ScalingRules().resolve(4, 0.01, 1))
    synthetic.setup("fit")
    kinds = {storage_kind(t.image) for t in synthetic.train_set.tiles}
    assert kinds == {"decode cache, memory-mapped"}


def test_tile_bytes_counts_image_and_mask_in_their_types():
    from segscale.data.storage.tiles import Tile

    tile = Tile(np.zeros((4, 5, 3), np.uint16), np.zeros((4, 5), np.uint8))
    assert tile_bytes(tile) == 4 * 5 * 3 * 2 + 4 * 5


def test_a_partial_copy_keeps_the_valid_windows_of_the_tiles_it_holds(tmp_path):
    # Tile 0 (160²) does not fit the budget, tile 1 (96², its left half ignored) does:
    # the copy's one tile must draw within tile 1's valid windows, not tile 0's.
    for split in ("train", "val"):
        for i, side in enumerate((160, 96)):
            image, mask = draw_tile(side, seed=5, index=i)
            mask[:, : side // 2] = 255 if i == 1 else mask[:, : side // 2]
            for folder, array in (("images", image), ("masks", mask)):
                path = tmp_path / split / folder / f"tile{i}.tif"
                path.parent.mkdir(parents=True, exist_ok=True)
                tifffile.imwrite(path, array, tile=(32, 32), compression="zlib")
    cfg = compose_config(
        "train",
        "datamodule=folder",
        f"datamodule.source.root={tmp_path}",
        "datamodule.sampling.min_valid=0.9",
        "datamodule.patch_size=32",
        "datamodule.num_workers=0",
        f"output_dir={tmp_path / 'run'}",
    )
    built = build_datamodule(cfg, ScalingRules().resolve(4, 0.01, 1))
    built.setup("fit")
    stored = built.train_set
    assert stored.windows is not None and len(stored.windows) == 2
    decoded = decoded_copy(stored, budget_bytes=TILE_BYTES)
    assert decoded is not None and decoded.tiles[0].shape == (96, 96)
    assert decoded.windows == [stored.windows[1]]
    for index in range(20):
        assert decoded.pose(0, index).centre_x >= 48  # in the valid right half
