"""Memory maps pickle by reference: a spawned process maps the file again, copying nothing."""

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import tifffile

from segscale.data.datamodule import segmentation_datamodule
from segscale.data.datasets.folder import FolderTiles
from segscale.data.storage.decode_cache import DecodeCache
from segscale.data.storage.mapped_arrays import ChangedFileError, MappedArray, mapped_array
from segscale.data.storage.sources import read_image, read_mask
from tests.conftest import write_pair


@pytest.fixture
def mapped(tmp_path: Path) -> MappedArray:
    pixels = np.arange(3 * 120 * 70 * 3, dtype=np.uint16).reshape(3, 120, 70, 3)
    np.save(tmp_path / "a.npy", pixels)
    return mapped_array(np.load(tmp_path / "a.npy", mmap_mode="r"))[1]


def views(array: MappedArray) -> list[np.ndarray]:
    return [
        array,
        array[10:20, 5:9],
        array[::3, ::-2, 1],
        np.moveaxis(array, -1, 0),
        array[5:, :, None],
        array.T,
    ]


def test_a_map_and_its_views_pickle_by_reference_and_read_the_same_pixels(mapped):
    for view in views(mapped):
        pickled = pickle.dumps(view)
        assert len(pickled) < 1000, (view.shape, len(pickled))  # 50 KB of pixels mapped
        again = pickle.loads(pickled)
        assert isinstance(again, MappedArray) and again.dtype == view.dtype
        assert np.array_equal(again, view)
        # Unpickled, it pickles by reference again (a ddp_spawn rank's spawned workers).
        assert np.array_equal(pickle.loads(pickle.dumps(again[2:])), view[2:])


def test_results_that_hold_no_mapping_are_plain_arrays_pickled_by_value(mapped):
    for result in (mapped + 1, mapped[[1, 2]]):
        assert type(result) is np.ndarray
        assert np.array_equal(pickle.loads(pickle.dumps(result)), result)
    copied = mapped.astype(np.float32)  # a MappedArray without a mapping, as np.memmap's
    assert len(pickle.dumps(copied)) > copied.nbytes
    assert np.array_equal(pickle.loads(pickle.dumps(copied)), mapped)
    assert not isinstance(mapped.sum(), np.ndarray)  # a scalar, as np.memmap gives


def test_a_file_changed_since_it_was_mapped_is_refused_naming_it(tmp_path, mapped):
    pickled = pickle.dumps(mapped)
    os.utime(tmp_path / "a.npy", ns=(1, 1))
    with pytest.raises(ChangedFileError, match=r"a\.npy: the memory-mapped file changed"):
        pickle.loads(pickled)
    (tmp_path / "a.npy").unlink()
    with pytest.raises(ChangedFileError, match=r"a\.npy: the memory-mapped file is gone"):
        pickle.loads(pickled)


def test_uncompressed_tiffs_are_read_as_maps_that_pickle_by_path(tmp_path):
    image = np.random.default_rng(0).integers(0, 255, (300, 200, 3), dtype=np.uint8)
    grey = image[..., 0]
    tifffile.imwrite(tmp_path / "rgb.tif", image)
    tifffile.imwrite(tmp_path / "grey.tif", grey)
    tifffile.imwrite(tmp_path / "planar.tif", np.moveaxis(image, -1, 0), photometric="rgb")
    for read, expected in (
        (read_image(tmp_path / "rgb.tif"), image),
        (read_image(tmp_path / "grey.tif"), grey[:, :, None]),
        (read_image(tmp_path / "planar.tif"), image),
        (read_mask(tmp_path / "grey.tif").values, grey),
    ):
        assert isinstance(read, MappedArray)
        pickled = pickle.dumps(read)
        assert len(pickled) < 1000
        assert np.array_equal(pickle.loads(pickled), expected)


def datasets_pickled(root: Path, side: int, suffix: str, cache: Path) -> int:
    """Bytes of the training and validation sets pickled, over tiles of ``side``²."""
    rng = np.random.default_rng(side)
    for split, count in (("train", 2), ("val", 1)):
        for i in range(count):
            image = rng.integers(0, 255, (side, side, 3), dtype=np.uint8)
            mask = rng.integers(0, 3, (side, side), dtype=np.uint8)
            write_pair(root, split, f"t{i}", image, mask, suffix, suffix)
    datamodule = segmentation_datamodule(
        FolderTiles(str(root)), 3, ["a", "b", "c"], patch_size=64, patches_per_image=2,
        batch_size=2, num_workers=0, mean=None, std=None, in_channels=None,
        decode_cache=DecodeCache(str(cache)),
    )  # fmt: skip
    datamodule.setup("fit")
    return len(pickle.dumps(datamodule.train_set)) + len(pickle.dumps(datamodule.val_set))


@pytest.mark.parametrize("suffix", [".tif", ".png"])  # mapped TIFFs; PNGs through the cache
def test_a_pickled_dataset_does_not_grow_with_its_data(tmp_path, suffix):
    small = datasets_pickled(tmp_path / "small", 128, suffix, tmp_path / "cache")
    large = datasets_pickled(tmp_path / "large", 1024, suffix, tmp_path / "cache")
    # 64x the pixels (3 tiles of 1024² RGB and mask: 12.6 MB); by value it grew as much.
    assert large - small < 4096, (small, large)
    assert large < 64 * 1024, large
