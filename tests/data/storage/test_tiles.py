"""Tiles opened where they lie cut the same patches, bit for bit, as tiles decoded in memory."""

import numpy as np
import pytest
import tifffile
from PIL import Image

from segscale.data.augment import Augmentation
from segscale.data.classes.labels import LabelMap
from segscale.data.datasets.synthetic import draw_tile
from segscale.data.sampling.class_locations import LocationSampler, TileClassLocations
from segscale.data.sampling.patches import GridPatchDataset, PatchSampling, RandomPatchDataset
from segscale.data.storage.decode_cache import CachedFile, DecodeCache
from segscale.data.storage.rasters import UnreadableWindowError, WindowedRaster
from segscale.data.storage.sources import ImageMaskPair
from segscale.data.storage.tiles import LabelledMask, Tile, open_tiles

GREYS = [0, 40, 80, 120, 160, 200]
"""Mask grey levels of the six classes (label IDs): masks that need decoding."""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Three tiles stored three ways, and each decoded in memory as the reference."""
    folder = tmp_path_factory.mktemp("stored")
    pairs, in_memory = [], []
    for i, form in enumerate(["tiled", "striped", "png"]):
        image, mask = draw_tile(200 + 24 * i, seed=3, index=i)
        greys = np.array(GREYS, np.uint8)[mask]
        if form == "png":
            paths = folder / f"{i}.png", folder / f"{i}_mask.png"
            Image.fromarray(image).save(paths[0])
            Image.fromarray(greys).save(paths[1])
        else:
            layout = {"tile": (64, 64)} if form == "tiled" else {"rowsperstrip": 16}
            paths = folder / f"{i}.tif", folder / f"{i}_mask.tif"
            tifffile.imwrite(paths[0], image, compression="zlib", **layout)
            tifffile.imwrite(paths[1], greys, compression="zlib", **layout)
        pairs.append(ImageMaskPair(*paths))
        in_memory.append(Tile(image, mask))
    return folder, pairs, in_memory


LABELS = LabelMap(6, 255, label_ids=GREYS)


def opened(dataset, tmp_path):
    _, pairs, _ = dataset
    return open_tiles(pairs, LABELS, cache=DecodeCache(str(tmp_path / "cache")))


def test_tiffs_are_read_by_window_and_pngs_mapped_from_the_cache_when_first_read(dataset, tmp_path):
    tiles = opened(dataset, tmp_path)
    assert isinstance(tiles[0].image, WindowedRaster)
    assert isinstance(tiles[1].mask, LabelledMask)  # grey levels, decoded window by window
    png = tiles[2]
    store = tmp_path / "cache" / "segscale-decoded"
    assert isinstance(png.image, CachedFile) and isinstance(png.mask, CachedFile)
    assert list(store.glob("*.npy")) == []  # nothing decoded yet: the shapes are the headers'
    assert png.shape == dataset[2][2].shape and png.image.shape == dataset[2][2].image.shape
    assert png.image[10:20, 5:9].shape == (10, 4, 3)  # the first window read opens it
    assert len(list(store.glob("*.npy"))) == 1 and isinstance(png.image.opened(), np.memmap)
    assert isinstance(png.mask.opened(), np.memmap)
    for tile, reference in zip(tiles, dataset[2], strict=True):
        assert tile.shape == reference.shape
        np.testing.assert_array_equal(np.asarray(tile.image), reference.image)
        np.testing.assert_array_equal(np.asarray(tile.mask), reference.mask)


@pytest.mark.parametrize("sampling", ["uniform", "class_balanced"])
def test_the_same_seed_gives_the_same_patches_from_either(dataset, tmp_path, sampling):
    _, _, in_memory = dataset
    tiles = opened(dataset, tmp_path)
    augmentation = Augmentation(rotation=(-45, 45), translate_x=(-30, 30), translate_y=(-30, 30))
    centres = None
    if sampling == "class_balanced":
        locations = []
        for tile in in_memory:
            sampler = LocationSampler(6, 32, tile.shape[1])
            sampler.add(tile.mask, 0)
            counts = np.bincount(tile.mask.ravel(), minlength=256)[:6].tolist()
            facts = {"class_locations": sampler.facts(), "class_counts": counts}
            locations.append(TileClassLocations.from_facts(facts))
        centres = PatchSampling(mode="class_balanced").centres(locations, [str(c) for c in GREYS])
    made = [
        RandomPatchDataset(t, 64, 16, augmentation, seed=7, centres=centres)
        for t in (in_memory, tiles)
    ]
    for key in [(e, i) for e in range(2) for i in range(len(made[0]))]:
        reference, patch = made[0][key], made[1][key]
        assert torch_equal(reference["image"], patch["image"]), key
        assert torch_equal(reference["mask"], patch["mask"]), key


def test_the_validation_grid_is_the_same_from_either(dataset, tmp_path):
    grids = [GridPatchDataset(t, 48) for t in (dataset[2], opened(dataset, tmp_path))]
    assert len(grids[0]) == len(grids[1])
    for index in range(len(grids[0])):
        assert torch_equal(grids[0][index]["image"], grids[1][index]["image"])
        assert torch_equal(grids[0][index]["mask"], grids[1][index]["mask"])


def test_without_a_cache_pngs_are_decoded_in_memory(dataset):
    _, pairs, in_memory = dataset
    (tile,) = open_tiles(pairs[2:], LABELS)
    assert not isinstance(tile.image, np.memmap) and not isinstance(tile.mask, np.memmap)
    np.testing.assert_array_equal(tile.mask, in_memory[2].mask)


def test_colour_masks_are_decoded_and_class_index_tiffs_stay_mapped(tmp_path):
    colours = np.array([[255, 255, 255], [0, 0, 255]], np.uint8)
    indices = np.random.default_rng(1).integers(0, 2, (16, 12)).astype(np.uint8)
    Image.fromarray(colours[indices]).save(tmp_path / "rgb.png")
    tifffile.imwrite(tmp_path / "index.tif", indices)
    Image.fromarray(np.zeros((16, 12, 3), np.uint8)).save(tmp_path / "image.png")
    (colour,) = open_tiles(
        [ImageMaskPair(tmp_path / "image.png", tmp_path / "rgb.png")],
        LabelMap(2, 255, label_ids=colours.tolist()),
    )
    np.testing.assert_array_equal(colour.mask, indices)
    (plain,) = open_tiles(
        [ImageMaskPair(tmp_path / "image.png", tmp_path / "index.tif")], LabelMap(2)
    )
    assert isinstance(plain.mask, np.memmap)
    np.testing.assert_array_equal(plain.mask, indices)


@pytest.mark.parametrize("cached", [False, True])
def test_the_size_limit_applies_to_what_is_decoded_whole(tmp_path, cached):
    Image.fromarray(np.zeros((16, 12, 3), np.uint8)).save(tmp_path / "image.png")
    Image.fromarray(np.zeros((16, 12), np.uint8)).save(tmp_path / "mask.png")
    pair = ImageMaskPair(tmp_path / "image.png", tmp_path / "mask.png")
    cache = DecodeCache(str(tmp_path / "cache")) if cached else None
    with pytest.raises(ValueError, match=r"image.png: its header declares 12 x 16 = 192"):
        open_tiles([pair], LabelMap(2), max_image_pixels=100, cache=cache)
    assert open_tiles([pair], LabelMap(2), max_image_pixels=192, cache=cache)[0].shape == (16, 12)


def torch_equal(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())


def test_a_rank_sets_up_without_decoding_a_tile_once_the_cache_holds_them(tmp_path, monkeypatch):
    """Start-up does not grow with the data: setting up reads headers, decodes no pixels."""
    from segscale.data.datamodule import segmentation_datamodule
    from segscale.data.datasets.folder import FolderTiles
    from segscale.data.storage import decode_cache, rasters

    for split in ("train", "val"):
        for i, suffix in enumerate([".tif", ".png"]):
            image, mask = draw_tile(160, seed=0, index=i)
            for folder, pixels in (("images", image), ("masks", mask)):
                path = tmp_path / "data" / split / folder / f"{split}{i}{suffix}"
                path.parent.mkdir(parents=True, exist_ok=True)
                if suffix == ".tif":
                    tifffile.imwrite(path, pixels, tile=(64, 64), compression="zlib")
                else:
                    Image.fromarray(pixels).save(path)

    def datamodule():
        return segmentation_datamodule(
            FolderTiles(str(tmp_path / "data")),
            6,
            [str(c) for c in range(6)],
            patch_size=64,
            num_workers=0,
            decode_cache=DecodeCache(str(tmp_path / "cache")),
        )

    first = datamodule()
    first.check()
    first.setup("fit")  # builds the decode cache's entries of the PNGs
    again = datamodule()
    again.check()  # cached by size and time: reads no pixels either

    def decoded(*args, **kwargs):
        raise AssertionError("a tile was decoded while setting up")

    monkeypatch.setattr(rasters.WindowedRaster, "_read_window", decoded)
    monkeypatch.setattr(decode_cache, "_write_entry", decoded)
    monkeypatch.setattr(Image.Image, "load", decoded)
    again.setup("fit")
    assert len(again.train_set.tiles) == 2 and len(again.val_set.tiles) == 2


def test_a_cached_file_pickles_unopened_and_opens_in_the_process_that_reads_it(dataset, tmp_path):
    import pickle

    png = opened(dataset, tmp_path)[2]
    copy = pickle.loads(pickle.dumps(png.image))  # a spawned worker's
    assert copy._array is None
    np.testing.assert_array_equal(np.asarray(copy), dataset[2][2].image)
    again = pickle.loads(pickle.dumps(copy))  # opened: its mapping goes by reference
    assert isinstance(again._array, np.memmap)
    np.testing.assert_array_equal(again[:, :], dataset[2][2].image)


def test_a_file_that_changed_since_the_check_is_unreadable_when_first_read(tmp_path):
    image, mask = draw_tile(64, seed=1, index=0)
    paths = tmp_path / "a.png", tmp_path / "a_mask.png"
    Image.fromarray(image).save(paths[0])
    Image.fromarray(np.array(GREYS, np.uint8)[mask]).save(paths[1])
    tile = open_tiles([ImageMaskPair(*paths)], LABELS, cache=DecodeCache(str(tmp_path / "c")))[0]
    Image.fromarray(image[:32]).save(paths[0])  # another size now
    paths[1].write_bytes(b"no longer a PNG")
    with pytest.raises(UnreadableWindowError, match=r"a\.png: decodes to \[32, 64, 3\]"):
        tile.image[:8, :8]
    with pytest.raises(UnreadableWindowError, match=r"a_mask\.png: cannot be decoded any more"):
        tile.mask[:8, :8]
