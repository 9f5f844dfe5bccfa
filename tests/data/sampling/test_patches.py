import albumentations as A
import numpy as np
import pytest
import torch
from scipy.ndimage import maximum_filter, minimum_filter
from torch.utils.data import DataLoader

from segscale.data.augment import Augmentation, PatchPose, cut_patch, patch_rng
from segscale.data.datasets.synthetic import draw_tile
from segscale.data.sampling.class_locations import (
    LocationSampler,
    TileClassLocations,
    centre_on_pixel,
)
from segscale.data.sampling.loaders import EpochShardSampler
from segscale.data.sampling.patches import GridPatchDataset, PatchSampling, RandomPatchDataset
from segscale.data.sampling.valid_windows import TileWindows
from segscale.data.storage.tiles import Tile
from segscale.errors import ConfigError
from tests.helpers.valid_maps import bordered_tile, cells_of, patch_share, rotation_reach


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
    # Window 5 is row 1, column 1 of the 4 × 4 grid: the tile's pixels at (48, 48), as
    # they are (a grid patch is cut, not augmented), and its mask likewise.
    tile = tiles[0]
    window = torch.from_numpy(np.ascontiguousarray(tile.image[48:96, 48:96]))
    assert torch.equal(grid[5]["image"], window.permute(2, 0, 1))
    assert torch.equal(grid[5]["mask"].long(), torch.from_numpy(tile.mask[48:96, 48:96]).long())
    # The last column's window starts at 112 and repeats 32 columns of the one before:
    # those are ignored, so that each pixel counts once.
    last = grid[3]["mask"]
    assert (last[:, :32] == 255).all() and (last[:, 32:] != 255).any()


def test_grid_refuses_a_patch_larger_than_the_image(tiles):
    with pytest.raises(ValueError, match="larger than an image side"):
        GridPatchDataset(tiles[:1], patch_size=161)


# Class-balanced sampling (datamodule.sampling).

CLASSES = 6


def locations(tiles, per_class: int = 64) -> list[TileClassLocations]:
    """What the validation pass keeps of each tile: per class, ``per_class`` pixels."""
    kept = []
    for tile in tiles:
        sampler = LocationSampler(CLASSES, per_class, tile.shape[1])
        sampler.add(tile.mask, 0)
        counts = np.bincount(tile.mask.ravel(), minlength=256)[:CLASSES]
        facts = {"class_locations": sampler.facts(), "class_counts": counts.tolist()}
        kept.append(TileClassLocations.from_facts(facts))
    return kept


def balanced(tiles, p=0.5, class_weights="present", **kwargs) -> RandomPatchDataset:
    sampling = PatchSampling("class_balanced", p, class_weights)
    centres = sampling.centres(locations(tiles), [f"c{c}" for c in range(CLASSES)])
    return dataset(tiles, centres=centres, **kwargs)


def test_uniform_sampling_draws_todays_patches(tiles):
    # Poses recorded before class-balanced sampling existed (seed 5, 48 px, 160 px tiles).
    recorded = {
        (0, 0): (114.46683868032541, 110.20539605225014, -17.842771904733745),
        (1, 7): (102.20525376602647, 61.636996764923296, 13.25450514712469),
        (3, 11): (130.76294953569817, 114.14815279682665, 13.697391651384486),
        (2, 100): (59.308630054492745, 39.88324962666075, -9.682319426211734),
    }
    augmentation = Augmentation(transforms=[A.HorizontalFlip(p=0.5)])
    data = dataset(tiles, augmentation=augmentation)
    assert data.centres is None  # what PatchSampling() (uniform) gives
    for (epoch, index), pose in recorded.items():
        assert data.pose(epoch, index) == PatchPose(*pose)
        # Today's draw, written out: centre, pose and transforms from the patch's stream.
        rng = patch_rng(5, epoch, index)
        centre = rng.uniform(24, 136), rng.uniform(24, 136)
        tile = tiles[index % 3]
        image, mask = cut_patch(tile.image, tile.mask, augmentation.pose(rng, *centre), 48, 255)
        image, mask = augmentation.transform(image, mask, rng)
        sample = data[(epoch, index)]
        np.testing.assert_array_equal(sample["image"].numpy().transpose(1, 2, 0), image)
        np.testing.assert_array_equal(sample["mask"].numpy(), mask)
    assert PatchSampling().centres(locations(tiles), ["c"] * CLASSES) is None


@pytest.mark.parametrize(
    ("class_weights", "expected"),
    [
        ("present", None),
        ("inverse_frequency", None),
        ([0, 1, 0, 0, 3, 0], [0, 0.25, 0, 0, 0.75, 0]),
    ],
)
def test_patch_centres_follow_the_requested_class_weights(tiles, class_weights, expected):
    data = balanced(tiles, p=0.7, class_weights=class_weights)
    counts = np.sum([t.counts for t in locations(tiles)], axis=0)
    if class_weights == "present":
        expected = (counts > 0) / (counts > 0).sum()
    elif class_weights == "inverse_frequency":
        expected = (1 / counts) / (1 / counts).sum()
    draws = [data.draw(0, i).centre_class for i in range(4000)]
    centred = np.array([c for c in draws if c is not None])
    assert abs(len(centred) / len(draws) - 0.7) < 0.03
    shares = np.bincount(centred, minlength=CLASSES) / len(centred)
    # Four standard errors of a share measured over ~2800 patches.
    tolerance = 4 * np.sqrt(np.asarray(expected) * (1 - np.asarray(expected)) / len(centred))
    assert (np.abs(shares - expected) <= tolerance + 1e-9).all(), (shares, expected)


def test_a_class_centred_patch_has_its_class_at_its_middle_pixel():
    # Larger tiles than the others': fewer class pixels lie in the border band.
    tiles = [Tile(*draw_tile(256, seed=0, index=i)) for i in range(3)]
    still = Augmentation(rotation=(0, 0), translate_x=(0, 0), translate_y=(0, 0))
    data = balanced(tiles, p=1.0, augmentation=still, patch_size=32)
    middle = []
    for index in range(600):
        draw = data.draw(0, index)
        mask = data[(0, index)]["mask"].numpy()
        assert draw.centre_class in mask  # always inside the patch
        inside = all(16 < c < 240 for c in (draw.pose.centre_x, draw.pose.centre_y))
        if inside:  # not moved back from a border: the class pixel is the middle one
            assert mask[16, 16] == draw.centre_class
            middle.append(draw.centre_class)
    assert len(middle) > 300 and len(set(middle)) == CLASSES


def test_class_balanced_patches_are_index_addressed(tiles):
    a, b = balanced(tiles), balanced(tiles)
    for key in [(0, 0), (1, 7), (3, 11), (0, 50)]:
        assert a.draw(*key) == b.draw(*key)
        assert torch.equal(a[key]["image"], b[key]["image"])
        assert torch.equal(a[key]["mask"], b[key]["mask"])
    epochs = [a.draw(e, 5) for e in range(6)]
    assert len({(d.tile, d.pose) for d in epochs}) == 6
    assert balanced(tiles, seed=6).draw(0, 5) != a.draw(0, 5)


def test_patches_not_centred_on_a_class_are_the_uniform_ones(tiles):
    uniform, never, half = dataset(tiles), balanced(tiles, p=0.0), balanced(tiles, p=0.5)
    for index in range(40):
        assert never.draw(0, index) == uniform.draw(0, index)
        assert torch.equal(never[(0, index)]["image"], uniform[(0, index)]["image"])
        drawn, plain = half.draw(0, index), uniform.draw(0, index)
        if drawn.centre_class is None:
            assert drawn == plain
        else:  # same rotation: only the centre (and maybe the tile) moved
            assert drawn.pose.angle == plain.pose.angle


def test_one_and_two_ranks_draw_the_same_class_balanced_patches(tiles):
    data = balanced(tiles, patches_per_image=8)  # 24 patches: 3 steps of 8
    one = shard_steps(data, [8], 0, 0)
    ranks = [shard_steps(data, [4, 4], rank, 2) for rank in range(2)]
    assert [a + b for a, b in zip(*ranks, strict=True)] == one
    assert sum(data.draw(1, i).centre_class is not None for i in range(24)) > 4


# Valid-data-aware patches (datamodule.sampling.min_valid).

VALID_SIZE = 48


@pytest.fixture(scope="module")
def bordered():
    """Two tiles with a no-data border and an unlabelled area, and their valid pixels."""
    made = [bordered_tile(160, index=i) for i in range(2)]
    return [tile for tile, _ in made], [valid for _, valid in made]


def valid_windows(valid, min_valid) -> list[TileWindows]:
    return [TileWindows(cells_of(v), VALID_SIZE, min_valid) for v in valid]


def valid_dataset(bordered, min_valid, **kwargs) -> RandomPatchDataset:
    tiles, valid = bordered
    settings = {"patch_size": VALID_SIZE, "patches_per_image": 64}
    return dataset(tiles, windows=valid_windows(valid, min_valid), **(settings | kwargs))


def plain_dataset(bordered, **kwargs) -> RandomPatchDataset:
    return dataset(bordered[0], **({"patch_size": VALID_SIZE, "patches_per_image": 64} | kwargs))


@pytest.mark.parametrize("rotation", [0, 20])
def test_drawn_patches_hold_min_valid_of_valid_pixels(bordered, rotation):
    _, valid = bordered
    augmentation = Augmentation(rotation=(-rotation, rotation))  # translation ±10 px
    data = valid_dataset(bordered, 0.7, augmentation=augmentation)
    draws = [data.draw(0, i) for i in range(400)]
    shares = [patch_share(valid[d.tile], d.pose, VALID_SIZE) for d in draws]
    # Nearest sampling moves a window by up to half a pixel each way; a rotation by θ
    # reaches past it by at most rotation_reach(θ) of it (12% at 20°).
    assert min(shares) >= 0.7 - 1 / VALID_SIZE - rotation_reach(rotation)
    assert np.mean(shares) > 0.8
    plain = plain_dataset(bordered, augmentation=augmentation)
    before = [patch_share(valid[i % 2], plain.pose(0, i), VALID_SIZE) for i in range(400)]
    assert np.mean(np.array(before) < 0.7) > 0.3  # without min_valid, a third fall short


def test_min_valid_moves_only_the_patches_that_fall_short(bordered):
    data, plain = valid_dataset(bordered, 0.7), plain_dataset(bordered)
    moved = 0
    for index in range(200):
        drawn, before = data.draw(1, index), plain.draw(1, index)
        window = data.windows[before.tile]
        if window.holds(before.pose.centre_x, before.pose.centre_y)[0]:
            assert drawn == before
            assert torch.equal(data[(1, index)]["image"], plain[(1, index)]["image"])
        else:  # moved, with the same rotation (and transforms), in its own tile
            assert drawn.tile == before.tile and drawn.pose.angle == before.pose.angle
            assert drawn.pose != before.pose
            moved += 1
    assert 40 < moved < 160


def shard_steps(data, batch_sizes, rank, workers) -> list[list[tuple]]:
    """Keys and image bytes of each step that ``rank`` trains on in epoch 1."""
    sampler = EpochShardSampler(len(data), batch_sizes, rank=rank, seed=5)
    sampler.set_epoch(1)
    loader = DataLoader(data, batch_sampler=sampler, num_workers=workers)
    return [
        [
            (tuple(k.tolist()), i.numpy().tobytes())
            for k, i in zip(b["key"], b["image"], strict=True)
        ]
        for b in loader
    ]


def test_one_and_two_ranks_draw_the_same_valid_patches(bordered):
    data = valid_dataset(bordered, 0.7, patches_per_image=12)  # 24 patches: 3 steps of 8
    one = shard_steps(data, [8], 0, 0)
    ranks = [shard_steps(data, [4, 4], rank, 2) for rank in range(2)]
    assert [a + b for a, b in zip(*ranks, strict=True)] == one
    plain = plain_dataset(bordered, patches_per_image=12)
    assert sum(data.draw(1, i) != plain.draw(1, i) for i in range(24)) > 4  # some moved


def test_class_balanced_patches_are_centred_where_their_window_qualifies(bordered):
    tiles, valid = bordered
    windows = valid_windows(valid, 0.7)
    sampling = PatchSampling("class_balanced", 1.0, min_valid=0.7)
    centres = sampling.centres(locations(tiles), [f"c{c}" for c in range(CLASSES)], windows)
    still = Augmentation(rotation=(0, 0))  # translation ±10 px
    data = plain_dataset(bordered, augmentation=still, centres=centres, windows=windows)
    on_middle = 0
    for index in range(300):
        draw = data.draw(0, index)
        assert patch_share(valid[draw.tile], draw.pose, VALID_SIZE) >= 0.7 - 1 / VALID_SIZE
        assert draw.centre_class in data[(0, index)]["mask"].numpy()
        pose = data.pose(0, index)
        on_middle += (pose.centre_x, pose.centre_y) in {
            tuple(map(float, centre_on_pixel(r, c, VALID_SIZE, 160, 160)))
            for r, c in centres.locations[draw.tile].points[draw.centre_class]
        }
    assert 5 < on_middle < 150  # moved back from a translation that fell short


def test_a_class_weight_that_min_valid_leaves_without_centres_is_refused(bordered):
    tiles, valid = bordered
    moved = []
    for tile in tiles:
        mask = tile.mask.copy()
        mask[mask == 5] = 0
        mask[:, :8] = 5  # class 5 only in the no-data border
        moved.append(Tile(tile.image, mask))
    windows = valid_windows(valid, 0.7)
    names = [f"c{c}" for c in range(CLASSES)]
    weighted = PatchSampling("class_balanced", 1.0, [1] * CLASSES, min_valid=0.7)
    with pytest.raises(ConfigError, match=r"weights=\[1.0.*no kept pixel of c5 .*min_valid=0.7"):
        weighted.centres(locations(moved), names, windows)
    present = PatchSampling("class_balanced", 1.0, "present", min_valid=0.7)
    centres = present.centres(locations(moved), names, windows)
    assert centres.class_cdf[5] == centres.class_cdf[4]  # class 5 is never drawn
    assert weighted.centres(locations(moved), names) is not None  # without min_valid: drawn


@pytest.fixture(scope="module")
def dominated() -> list[Tile]:
    """Tiles that class 0 fills but for a band of classes 1 and 2 down their middle."""
    tiles = []
    for i in range(2):
        image, mask = draw_tile(160, seed=1, index=i)
        mask = np.zeros_like(mask)
        mask[:, 60:100] = 1
        mask[70:90, 60:100] = 2
        tiles.append(Tile(image, mask))
    return tiles


def largest_share(mask: torch.Tensor) -> float:
    counts = np.bincount(mask.numpy().ravel(), minlength=256)[:255]  # 255: ignored
    return counts.max() / counts.sum()


def test_max_class_ratio_redraws_only_the_patches_one_class_dominates(dominated):
    capped = dataset(dominated, max_class_ratio=0.75, patches_per_image=40)
    plain = dataset(dominated, patches_per_image=40)
    redrawn = 0
    for index in range(len(capped)):
        patch, before = capped[(1, index)], plain[(1, index)]
        assert largest_share(patch["mask"]) < 0.75  # the band is in reach of every tile row
        if largest_share(before["mask"]) < 0.75:
            assert torch.equal(patch["image"], before["image"])  # the first draw is kept
        else:
            redrawn += 1
    assert 20 < redrawn < 60


def test_max_class_ratio_keeps_the_last_draw_after_ten_tries(dominated):
    one_class = [Tile(t.image, np.zeros_like(t.mask)) for t in dominated]
    capped, plain = dataset(one_class, max_class_ratio=0.75), dataset(one_class)
    tenth = (0, 3 + 9 * len(plain))  # retry r of patch i is patch i + r x len(dataset)
    assert torch.equal(capped[(0, 3)]["image"], plain[tenth]["image"])


def test_one_and_two_ranks_draw_the_same_capped_patches(dominated):
    data = dataset(dominated, max_class_ratio=0.75, patches_per_image=8)  # 2 steps of 8
    again = dataset(dominated, max_class_ratio=0.75, patches_per_image=8)
    one = shard_steps(data, [8], rank=0, workers=0)
    two = [shard_steps(again, [4, 4], rank=r, workers=2) for r in range(2)]
    for step, (a, b) in enumerate(zip(*two, strict=True)):
        assert sorted(one[step]) == sorted(a + b)
