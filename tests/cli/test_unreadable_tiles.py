"""A tile found unreadable mid-run: the run stops naming it, with last.ckpt at its last step."""

import json

import albumentations as A
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from segscale.cli.train import main
from segscale.data.augment import Augmentation
from segscale.data.datasets.synthetic import draw_tile
from segscale.data.sampling.patches import RandomPatchDataset
from segscale.data.storage.tiles import Tile, UnreadableTileError, UnreadableTiles
from tests.conftest import tiny_overrides
from tests.helpers.failing import BrokenRaster
from tests.helpers.in_process import run_in_process
from tests.helpers.record_batches import recorded

RECORD = "+callbacks.record._target_=tests.helpers.record_batches.RecordBatches"


@pytest.mark.slow
def test_the_run_stops_naming_the_file_and_resumes_from_its_last_step(tiny_data_root, tmp_path):
    run = tmp_path / "run"
    common = [
        *tiny_overrides(tiny_data_root, None),
        f"hydra.run.dir={run}",
        "ckpt_path=auto",
        RECORD,
        f"+callbacks.record.folder={tmp_path / 'record'}",
    ]
    broken = [
        "+callbacks.broken._target_=tests.helpers.failing.BreakTileAt",
        "+callbacks.broken.step=2",
    ]
    stopped = run_in_process(main, *common, *broken, cwd=tmp_path)
    output = stopped.stdout + stopped.stderr
    assert stopped.returncode == 2, output[-3000:]
    assert "tile1.tif: rows 0-1 cannot be read (injected): the file changed" in output
    assert "datamodule.skip_unreadable=true" in output and "Traceback" not in output
    saved = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["global_step"] == 2  # the batch that met the tile was not trained
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["last_checkpoint"].endswith("last.ckpt")

    assert summary["left_out_tiles"] == []  # stopped at the tile, not left out

    # Resumed as the message says, with skip_unreadable=true; the file, whole again, breaks
    # again after step 4 (epoch 0's last): the resumed launch leaves it out from epoch 1 on.
    skipped = [
        "datamodule.skip_unreadable=true",
        "+callbacks.broken._target_=tests.helpers.failing.BreakTileAt",
        "+callbacks.broken.step=4",
    ]
    resumed = run_in_process(main, *common, *skipped, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    batches, _ = recorded(tmp_path / "record")
    # 2 epochs of 4 steps: steps 1-2 trained, then 3-8 after the resume, each batch once.
    assert [b["step"] for b in batches] == list(range(1, 9))
    keys = [tuple(k) for b in batches for k in b["keys"]]
    assert len(keys) == len(set(keys)) == 8 * 4
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert summary["left_out_tiles"] == [
        {
            "file": "tile1.tif",
            "reason": "tile1.tif: rows 0-1 cannot be read (injected)",
            "split": "train",
            "epoch": 1,
            "step": 4,  # the optimizer steps before the batch that left it out
        }
    ]


def test_skip_unreadable_leaves_the_tile_out_with_one_warning(caplog):
    tiles = [Tile(*draw_tile(96, seed=0, index=i)) for i in range(3)]
    image = tiles[1].image
    tiles[1] = Tile(BrokenRaster(image.shape, image.dtype), tiles[1].mask)
    data = RandomPatchDataset(tiles, 32, 4, Augmentation(), unreadable=UnreadableTiles(True))
    with caplog.at_level("WARNING"):
        patches = [data[(0, i)] for i in range(len(data))]
    assert [int(p["key"][1]) for p in patches] == list(range(12))  # every key, none dropped
    assert caplog.text.count("broken.tif") == 1 and "left out" in caplog.text
    substitute = data[(0, 1)]  # tile 1's patch comes from tile 2, a fresh patch of it
    assert data.draw(0, 1 + 1 + len(data)).tile == 2
    assert torch.equal(substitute["image"], data[(0, 2 + len(data))]["image"])
    with pytest.raises(UnreadableTileError, match=r"broken\.tif: rows 0-1 cannot be read"):
        RandomPatchDataset(tiles, 32, 4, Augmentation())[(0, 1)]


def with_a_broken_tile(augmentation: Augmentation) -> RandomPatchDataset:
    """Patches of 3 tiles (4 each), tile 1 unreadable and skipped, seed 3."""
    tiles = [Tile(*draw_tile(96, seed=0, index=i)) for i in range(3)]
    image = tiles[1].image
    tiles[1] = Tile(BrokenRaster(image.shape, image.dtype), tiles[1].mask)
    return RandomPatchDataset(tiles, 32, 4, augmentation, seed=3, unreadable=UnreadableTiles(True))


def test_a_replacement_patch_is_drawn_from_seed_epoch_and_index_albumentations_too():
    # "Randomness addressed by index": the patch standing in for an unreadable tile's is
    # the same whichever process draws it, and whatever it drew before.
    transforms = [A.HorizontalFlip(), A.RandomBrightnessContrast(p=1.0), A.GaussNoise(p=1.0)]
    first, second = (with_a_broken_tile(Augmentation(transforms=transforms)) for _ in range(2))
    key = (1, 4)  # tile 1's, in epoch 1
    drawn = first[key]["image"]
    for index in range(len(first)):  # other patches move albumentations' own generator
        first[(1, index)]
    assert torch.equal(first[key]["image"], drawn)
    assert torch.equal(second[key]["image"], drawn)
    # The transforms act (they are not what keeps the patch the same) ...
    plain = with_a_broken_tile(Augmentation())[key]["image"]
    assert not torch.equal(plain, drawn)
    # ... and the replacement is the next tile's fresh patch, transforms and all.
    assert first.draw(1, 4 + 1 + len(first)).tile == 2
    assert torch.equal(second[(1, 4 + 1 + len(second))]["image"], drawn)


def test_a_workers_error_comes_back_as_its_own_line():
    tiles = [Tile(BrokenRaster((64, 64, 3), np.uint8), np.zeros((64, 64), np.uint8))]
    loader = DataLoader(RandomPatchDataset(tiles, 32, 2, Augmentation()), num_workers=1)
    with pytest.raises(UnreadableTileError) as stopped:
        next(iter(loader))
    message = str(stopped.value)
    assert message.startswith("broken.tif: rows 0-1 cannot be read") and "Traceback" not in message


def test_a_skipped_validation_tile_counts_for_nothing():
    from segscale.data.sampling.patches import GridPatchDataset

    image, mask = draw_tile(64, seed=0, index=0)
    tiles = [Tile(BrokenRaster(image.shape, image.dtype), mask), Tile(image, mask)]
    grid = GridPatchDataset(tiles, 32, unreadable=UnreadableTiles(True))
    skipped, kept = grid[0], grid[len(grid) - 1]
    assert bool((skipped["mask"] == 255).all()) and not bool((kept["mask"] == 255).all())
    with pytest.raises(UnreadableTileError):
        GridPatchDataset(tiles, 32)[0]
