import warnings
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image, ImageFile

from segscale.data.storage.rasters import WindowedRaster
from segscale.data.storage.sources import (
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageHeader,
    read_image,
    read_image_header,
    read_mask,
)
from tests.helpers.declared_size import png_declaring


def test_uncompressed_tiff_is_memory_mapped_with_channels_last(tmp_path: Path):
    pixels = np.random.default_rng(0).integers(0, 65535, (5, 40, 30), dtype=np.uint16)
    tifffile.imwrite(tmp_path / "planar.tif", pixels, photometric="minisblack")
    image = read_image(tmp_path / "planar.tif")
    assert isinstance(image.base, np.memmap) or isinstance(image, np.memmap)
    assert image.shape == (40, 30, 5) and image.dtype == np.uint16
    np.testing.assert_array_equal(image, pixels.transpose(1, 2, 0))


def test_compressed_tiff_is_read_by_window_and_16_bit_png_keeps_its_depth(tmp_path: Path):
    pixels = np.arange(24 * 20 * 3, dtype=np.uint8).reshape(24, 20, 3)
    tifffile.imwrite(tmp_path / "z.tif", pixels, compression="zlib")
    image = read_image(tmp_path / "z.tif")
    assert isinstance(image, WindowedRaster) and image.shape == (24, 20, 3)
    np.testing.assert_array_equal(np.asarray(image), pixels)
    grey = (np.arange(24 * 20, dtype=np.uint16) * 100).reshape(24, 20)
    Image.fromarray(grey).save(tmp_path / "g.png")
    image = read_image(tmp_path / "g.png")
    assert image.shape == (24, 20, 1) and image.dtype == np.uint16
    np.testing.assert_array_equal(image[:, :, 0], grey)


def test_unsupported_pixel_type_names_the_file(tmp_path: Path):
    tifffile.imwrite(tmp_path / "f64.tif", np.zeros((4, 4), np.float64))
    with pytest.raises(ValueError, match=r"f64.tif: pixels of type float64"):
        read_image(tmp_path / "f64.tif")


def _forbid_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    def decode(self: ImageFile.ImageFile) -> None:
        raise AssertionError(f"{self.filename} was decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", decode)


@pytest.mark.parametrize("reader", [read_image, read_mask])
def test_a_header_past_the_limit_is_refused_before_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader
):
    path = png_declaring(tmp_path / "bomb.png", 20000, 20000)
    _forbid_decoding(monkeypatch)
    pillow_limit = Image.MAX_IMAGE_PIXELS
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Pillow's own warning must not fire either
        with pytest.raises(ValueError) as refused:
            reader(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: its header declares 20000 x 20000 = 400000000 pixels")
    assert f"limit of {DEFAULT_MAX_IMAGE_PIXELS} pixels" in message
    assert "datamodule.max_image_pixels" in message and "max_image_pixels for predict.py" in message
    assert pillow_limit == Image.MAX_IMAGE_PIXELS  # Pillow's limit is left as it was


@pytest.mark.parametrize("limit", [400_000_000, None])
def test_a_raised_limit_lets_the_header_through(tmp_path: Path, limit: int | None):
    path = png_declaring(tmp_path / "big.png", 20000, 20000)
    # The size check passes; decoding then finds only 8x8 pixels of data.
    with pytest.raises(OSError, match="truncated"):
        read_image(path, max_image_pixels=limit)
    with pytest.raises(OSError, match="truncated"):
        read_mask(path, max_image_pixels=limit)


def test_sizes_between_pillows_warning_and_its_limit_read_without_a_warning(tmp_path: Path):
    path = png_declaring(tmp_path / "large.png", 10000, 10000)  # > Pillow's 89478485
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(OSError, match="truncated"):
            read_image(path)


def test_tiffs_are_exempt_from_the_limit_as_they_are_never_decoded_whole(tmp_path: Path):
    pixels = np.zeros((30, 40, 3), np.uint8)
    tifffile.imwrite(tmp_path / "z.tif", pixels, compression="zlib")
    tifffile.imwrite(tmp_path / "plain.tif", pixels)
    windowed = read_image(tmp_path / "z.tif", max_image_pixels=1000)
    assert isinstance(windowed, WindowedRaster) and windowed.shape == (30, 40, 3)
    assert read_mask(tmp_path / "z.tif", max_image_pixels=1000).values.shape == (30, 40, 3)
    assert read_image_header(tmp_path / "z.tif", 1000) == ImageHeader(40, 30, 3, "uint8")
    mapped = read_image(tmp_path / "plain.tif", max_image_pixels=1000)
    assert isinstance(mapped.base, np.memmap) or isinstance(mapped, np.memmap)
    assert read_image_header(tmp_path / "plain.tif", 1000) == ImageHeader(40, 30, 3, "uint8")


def test_the_header_gives_size_channels_and_type_as_read_image_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    Image.fromarray(np.zeros((24, 20), np.uint16)).save(tmp_path / "grey16.png")
    Image.fromarray(np.zeros((24, 20, 4), np.uint8)).save(tmp_path / "rgba.png")
    Image.fromarray(np.zeros((24, 20, 3), np.uint8)).save(tmp_path / "photo.jpg")
    planar = np.zeros((5, 24, 20), np.float32)
    tifffile.imwrite(tmp_path / "bands.tif", planar, photometric="minisblack")
    expected = {
        "grey16.png": ImageHeader(20, 24, 1, "uint16"),
        "rgba.png": ImageHeader(20, 24, 3, "uint8"),  # read_image drops alpha
        "photo.jpg": ImageHeader(20, 24, 3, "uint8"),
        "bands.tif": ImageHeader(20, 24, 5, "float32"),
    }
    for name, header in expected.items():
        image = read_image(tmp_path / name)
        assert (header.height, header.width, header.channels) == image.shape
        assert header.dtype == image.dtype.name
    _forbid_decoding(monkeypatch)
    for name, header in expected.items():
        assert read_image_header(tmp_path / name) == header


def test_the_header_check_finds_damaged_pngs_and_unsupported_types(tmp_path: Path):
    pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "good.png")
    data = (tmp_path / "good.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    (tmp_path / "flipped.png").write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match=r"cut.png: the PNG is truncated or damaged \(Trunc"):
        read_image_header(tmp_path / "cut.png")
    with pytest.raises(ValueError, match=r"flipped.png: the PNG is .* \(broken PNG file \(bad"):
        read_image_header(tmp_path / "flipped.png")
    Image.fromarray(np.zeros((4, 4), bool)).save(tmp_path / "bits.png")
    tifffile.imwrite(tmp_path / "f64.tif", np.zeros((4, 4), np.float64))
    for name, dtype in (("bits.png", "bool"), ("f64.tif", "float64")):
        with pytest.raises(ValueError, match=rf"{name}: pixels of type {dtype} are not supported"):
            read_image(tmp_path / name)
        with pytest.raises(ValueError, match=rf"{name}: pixels of type {dtype} are not supported"):
            read_image_header(tmp_path / name)


def test_a_palette_mask_gives_its_indices_and_its_palette_beside_them(tmp_path: Path):
    indices = np.array([[0, 1, 2], [2, 2, 1]], np.uint8)
    colours = [(60, 16, 152), (132, 41, 246), (110, 193, 228)]
    picture = Image.fromarray(indices)
    picture.putpalette([v for colour in colours for v in colour])
    picture.info["transparency"] = 0  # a tRNS chunk: alpha carries no label, as in RGBA
    picture.save(tmp_path / "p.png")
    mask = read_mask(tmp_path / "p.png")
    np.testing.assert_array_equal(mask.values, indices)
    assert mask.palette is not None and mask.palette[:3].tolist() == [list(c) for c in colours]
    shown = np.asarray(Image.open(tmp_path / "p.png").convert("RGB"))  # what a viewer shows
    np.testing.assert_array_equal(mask.palette[mask.values], shown)
    # a TIFF's 16-bit colour map: the 8-bit colour x 257 (ours, GDAL's) or shifted by 8
    for name, scale in (("x257.tif", 257), ("shifted.tif", 256)):
        colormap = np.zeros((3, 256), np.uint16)
        colormap[:, :3] = np.array(colours, np.uint16).T * scale
        tifffile.imwrite(tmp_path / name, indices, photometric="palette", colormap=colormap)
        tiff = read_mask(tmp_path / name)
        np.testing.assert_array_equal(tiff.values, indices)
        assert tiff.palette is not None and tiff.palette[:3].tolist() == [list(c) for c in colours]
    Image.fromarray(indices).save(tmp_path / "grey.png")
    Image.fromarray(np.zeros((2, 3, 3), np.uint8)).save(tmp_path / "rgb.png")
    tifffile.imwrite(tmp_path / "grey.tif", indices)
    for name in ("grey.png", "rgb.png", "grey.tif"):
        assert read_mask(tmp_path / name).palette is None
