import albumentations as A
import numpy as np
import pytest
import torch
from scipy.ndimage import maximum_filter, minimum_filter
from torch.utils.data import DataLoader

from segscale.data.augment import Augmentation
from segscale.data.patches import GridPatchDataset, RandomPatchDataset
from segscale.data.samplers import EpochShardSampler
from segscale.data.sources import Tile
from segscale.data.synthetic import draw_tile


@pytest.fixture(scope="module")
def tiles() -> list[Tile]:
    return [Tile(*draw_tile(160, seed=0, index=i)) for i in range(3)]


def dataset(tiles, **kwargs) -> RandomPatchDataset:
    settings = {"patch_size": 48, "patches_per_image": 4, "augmentation": Augmentation(), "seed": 5}
    return RandomPatchDataset(tiles, **(settings | kwargs))


def test_shapes_and_epoch_length(tiles):
    data = dataset(tiles)
    sample = data[(0, 3)]
    assert len(data) == 12
    assert sample["image"].shape == (3, 48, 48) and sample["image"].dtype == torch.uint8
    assert sample["mask"].shape == (48, 48) and sample["mask"].dtype == torch.uint8
    assert sample["key"].tolist() == [0, 3]


def test_same_seed_same_patches_and_epochs_differ(tiles):
    a, b = dataset(tiles), dataset(tiles)
    for key in [(0, 0), (1, 7), (3, 11)]:
        assert torch.equal(a[key]["image"], b[key]["image"])
        assert torch.equal(a[key]["mask"], b[key]["mask"])
    assert a.pose(0, 2) != a.pose(1, 2)
    assert not torch.equal(a[(0, 2)]["image"], a[(1, 2)]["image"])
    assert dataset(tiles, seed=6).pose(0, 2) != a.pose(0, 2)


def test_ranks_and_workers_draw_disjoint_patches(tiles):
    data = dataset(tiles, patches_per_image=16)
    drawn = []
    for rank in range(2):
        sampler = EpochShardSampler(len(data), [4, 4], rank=rank, seed=5)
        sampler.set_epoch(2)
        loader = DataLoader(data, batch_sampler=sampler, num_workers=2)
        for batch in loader:
            for key, image in zip(batch["key"], batch["image"], strict=True):
                drawn.append((tuple(key.tolist()), image.numpy().tobytes()))
    keys = [k for k, _ in drawn]
    assert len(keys) == len(set(keys)) == len(data)
    assert {k[0] for k in keys} == {2}
    assert len({image for _, image in drawn}) == len(data)  # no two patches alike


def test_masks_stay_aligned_under_augmentation():
    # An image whose grey level encodes the class of each pixel.
    ys, xs = np.mgrid[0:200, 0:200]
    mask = ((ys // 20 + xs // 20) % 6).astype(np.uint8)
    image = np.repeat((mask * 40)[:, :, None], 3, axis=2).astype(np.uint8)
    augmentation = Augmentation(
        transforms=[A.HorizontalFlip(p=0.5), A.VerticalFlip(p=0.5), A.RandomRotate90(p=0.5)]
    )
    data = RandomPatchDataset([Tile(image, mask)], 64, 32, augmentation, seed=0)
    for index in range(32):
        sample = data[(0, index)]
        labels, grey = sample["mask"].numpy(), sample["image"][0].numpy()
        # Compare away from class borders (and the patch's own edge, whose neighbours lie
        # outside it), where bilinear and nearest sampling must agree.
        edge = {"mode": "constant", "cval": 254}
        uniform = maximum_filter(labels, 3, **edge) == minimum_filter(labels, 3, **edge)
        interior = uniform & (labels != 255)
        assert interior.mean() > 0.5
        np.testing.assert_array_equal(grey[interior], labels[interior].astype(np.uint8) * 40)


def test_grid_counts_every_pixel_once(tiles):
    grid = GridPatchDataset(tiles[:1], patch_size=48)  # 160 = 48 * 3 + 16
    assert len(grid) == 16
    labelled = sum(int((grid[i]["mask"] != 255).sum()) for i in range(len(grid)))
    assert labelled == 160 * 160
    assert torch.equal(grid[5]["image"], grid[5]["image"])


def test_grid_refuses_a_patch_larger_than_the_image(tiles):
    with pytest.raises(ValueError, match="larger than an image side"):
        GridPatchDataset(tiles[:1], patch_size=161)
