from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from segscale.data.labels import LabelMap
from segscale.data.sources import ImageMaskPair, load_tiles, read_image, read_mask_values


def test_uncompressed_tiff_is_memory_mapped_with_channels_last(tmp_path: Path):
    pixels = np.random.default_rng(0).integers(0, 65535, (5, 40, 30), dtype=np.uint16)
    tifffile.imwrite(tmp_path / "planar.tif", pixels, photometric="minisblack")
    image = read_image(tmp_path / "planar.tif")
    assert isinstance(image.base, np.memmap) or isinstance(image, np.memmap)
    assert image.shape == (40, 30, 5) and image.dtype == np.uint16
    np.testing.assert_array_equal(image, pixels.transpose(1, 2, 0))


def test_compressed_tiff_is_decoded_and_16_bit_png_keeps_its_depth(tmp_path: Path):
    pixels = np.arange(24 * 20 * 3, dtype=np.uint8).reshape(24, 20, 3)
    tifffile.imwrite(tmp_path / "z.tif", pixels, compression="zlib")
    np.testing.assert_array_equal(read_image(tmp_path / "z.tif"), pixels)
    grey = (np.arange(24 * 20, dtype=np.uint16) * 100).reshape(24, 20)
    Image.fromarray(grey).save(tmp_path / "g.png")
    image = read_image(tmp_path / "g.png")
    assert image.shape == (24, 20, 1) and image.dtype == np.uint16
    np.testing.assert_array_equal(image[:, :, 0], grey)


def test_unsupported_pixel_type_names_the_file(tmp_path: Path):
    tifffile.imwrite(tmp_path / "f64.tif", np.zeros((4, 4), np.float64))
    with pytest.raises(ValueError, match=r"f64.tif: pixels of type float64"):
        read_image(tmp_path / "f64.tif")


def test_colour_masks_are_decoded_and_class_index_tiffs_stay_mapped(tmp_path: Path):
    colours = np.array([[255, 255, 255], [0, 0, 255]], np.uint8)
    indices = np.random.default_rng(1).integers(0, 2, (16, 12)).astype(np.uint8)
    Image.fromarray(colours[indices]).save(tmp_path / "rgb.png")
    tifffile.imwrite(tmp_path / "index.tif", indices)
    Image.fromarray(np.zeros((16, 12, 3), np.uint8)).save(tmp_path / "image.png")
    assert read_mask_values(tmp_path / "rgb.png").shape == (16, 12, 3)
    (colour,) = load_tiles(
        [ImageMaskPair(tmp_path / "image.png", tmp_path / "rgb.png")],
        LabelMap(2, 255, label_ids=colours.tolist()),
    )
    np.testing.assert_array_equal(colour.mask, indices)
    (plain,) = load_tiles(
        [ImageMaskPair(tmp_path / "image.png", tmp_path / "index.tif")], LabelMap(2)
    )
    assert isinstance(plain.mask, np.memmap)
    np.testing.assert_array_equal(plain.mask, indices)
