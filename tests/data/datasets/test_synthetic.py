import numpy as np

from segscale.data.datasets.synthetic import CLASS_NAMES, SyntheticTiles, draw_tile
from segscale.data.storage.sources import read_image, read_mask


def test_tiles_are_deterministic_and_hold_every_class():
    image_a, mask_a = draw_tile(256, seed=3, index=1)
    image_b, mask_b = draw_tile(256, seed=3, index=1)
    assert image_a.shape == (256, 256, 3) and image_a.dtype == np.uint8
    assert mask_a.shape == (256, 256) and mask_a.dtype == np.uint8
    np.testing.assert_array_equal(image_a, image_b)
    np.testing.assert_array_equal(mask_a, mask_b)
    assert not np.array_equal(mask_a, draw_tile(256, seed=3, index=2)[1])
    big = draw_tile(1024, seed=0, index=0)[1]
    assert set(np.unique(big)) == set(range(len(CLASS_NAMES)))


def test_classes_are_not_a_colour_lookup():
    # Roofs and roads share grey tones: the same colour appears in several classes.
    image, mask = draw_tile(512, seed=0, index=0)
    colours = image.reshape(-1, 3).astype(np.int64) // 16
    keys = colours[:, 0] * 256 + colours[:, 1] * 16 + colours[:, 2]
    shared = 0
    for key in np.unique(keys):
        if len(np.unique(mask.reshape(-1)[keys == key])) > 1:
            shared += 1
    assert shared / len(np.unique(keys)) > 0.3


def test_prepare_writes_once_and_reuses(tmp_path):
    tiles = SyntheticTiles(root=str(tmp_path), num_train=2, num_val=1, image_size=96)
    tiles.prepare()
    pairs = tiles.pairs("train") + tiles.pairs("val")
    assert len(pairs) == 3 and all(p.image.is_file() and p.mask.is_file() for p in pairs)
    stamp = pairs[0].image.stat().st_mtime_ns
    tiles.prepare()
    assert pairs[0].image.stat().st_mtime_ns == stamp
    assert read_image(pairs[0].image).shape == (96, 96, 3)
    assert read_mask(pairs[0].mask).values.max() < len(CLASS_NAMES)
    # Train and validation tiles differ.
    assert not np.array_equal(read_mask(pairs[0].mask).values, read_mask(pairs[2].mask).values)
    assert not list(tmp_path.glob(".staging-*"))
