"""Tiles skip_unreadable leaves out reach summary.json: which file, why, when; from workers too.

The run end to end (left out mid-run, after a resume): tests/cli/test_unreadable_tiles.py.
"""

from types import SimpleNamespace

import numpy as np
import pytest
from torch.utils.data import DataLoader

from segscale.data.augment import Augmentation
from segscale.data.datasets.synthetic import draw_tile
from segscale.data.sampling.patches import GridPatchDataset, RandomPatchDataset
from segscale.data.storage.tiles import Tile, UnreadableTiles
from segscale.training.callbacks.run_summary import left_out_tiles
from segscale.training.callbacks.unreadable_tiles import LeftOutTiles
from tests.helpers.distributed import on_two_ranks
from tests.helpers.failing import BrokenRaster

REASON = "broken.tif: rows 0-1 cannot be read (injected)"


def trainer_at(epoch: int, step: int, callback: LeftOutTiles | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        current_epoch=epoch, global_step=step, world_size=1, callbacks=[callback]
    )


def broken_second_tile() -> list[Tile]:
    tiles = [Tile(*draw_tile(64, seed=0, index=i)) for i in range(3)]
    tiles[1] = Tile(BrokenRaster(tiles[1].image.shape, tiles[1].image.dtype), tiles[1].mask)
    return tiles


@pytest.mark.parametrize("workers", [0, 1])
def test_a_tile_left_out_in_a_loader_worker_is_noted_once_with_its_first_time(workers):
    data = RandomPatchDataset(
        broken_second_tile(), 32, 2, Augmentation(), unreadable=UnreadableTiles(True)
    )
    # Epoch 0's batches in order (tile 1's patches are indices 1 and 4), two at a time,
    # in a worker process: its own note of the skipped tile stays there.
    loader = DataLoader(data, batch_size=2, num_workers=workers)
    callback = LeftOutTiles()
    for step, batch in enumerate(loader):
        callback.on_train_batch_start(trainer_at(0, step), None, batch, step)
    assert callback.tiles == [
        {"file": "broken.tif", "reason": REASON, "split": "train", "epoch": 0, "step": 0}
    ]
    assert left_out_tiles(trainer_at(0, 3, callback)) == callback.tiles  # summary.json's


def test_a_validation_tile_left_out_is_noted_as_val_and_the_list_survives_a_resume():
    image, mask = draw_tile(64, seed=0, index=0)
    tiles = [Tile(image, mask), Tile(BrokenRaster(image.shape, image.dtype), mask)]
    grid = GridPatchDataset(tiles, 32, unreadable=UnreadableTiles(True))
    callback = LeftOutTiles()
    for batch in DataLoader(grid, batch_size=3):
        callback.on_validation_batch_start(trainer_at(1, 8), None, batch, 0)
    assert callback.tiles == [
        {"file": "broken.tif", "reason": REASON, "split": "val", "epoch": 1, "step": 8}
    ]
    resumed = LeftOutTiles()
    resumed.load_state_dict(callback.state_dict())  # what a checkpoint carries
    assert resumed.tiles == callback.tiles
    assert left_out_tiles(trainer_at(0, 0)) == []  # a trainer without the callback


def test_samples_that_left_nothing_out_say_so():
    tiles = [Tile(*draw_tile(64, seed=0, index=i)) for i in range(2)]
    sample = RandomPatchDataset(tiles, 32, 2, Augmentation())[(0, 1)]
    assert sample["left_out"] == "" and sample["left_out_reason"] == ""
    callback = LeftOutTiles()
    callback.on_train_batch_start(trainer_at(0, 0), None, next(iter(DataLoader([sample]))), 0)
    callback.on_train_batch_start(trainer_at(0, 0), None, {"image": np.zeros(1)}, 0)
    assert callback.tiles == []


def _join_on_rank(rank: int) -> list[dict]:
    callback = LeftOutTiles()
    # Rank 0 met a.tif at step 5 and b.tif at step 2; rank 1 met b.tif first, at step 1.
    noted = {0: [("a.tif", 5), ("b.tif", 2)], 1: [("b.tif", 1)]}[rank]
    callback.tiles = [
        {"file": f, "reason": f"{f} on rank {rank}", "split": "train", "epoch": 0, "step": s}
        for f, s in noted
    ]
    callback.on_train_end(SimpleNamespace(world_size=2), None)
    return callback.tiles


@pytest.mark.slow
def test_the_ranks_lists_are_joined_each_file_at_its_first_time():
    joined = on_two_ranks(_join_on_rank)
    assert joined[0] == joined[1]
    assert [(t["file"], t["step"], t["reason"]) for t in joined[0]] == [
        ("b.tif", 1, "b.tif on rank 1"),
        ("a.tif", 5, "a.tif on rank 0"),
    ]
