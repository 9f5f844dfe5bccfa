import logging
from pathlib import Path

import numpy as np
import pytest
import rasterio
import tifffile
from PIL import Image
from rasterio.control import GroundControlPoint

from segscale.inference.prediction.georeference import read_georeference
from segscale.inference.prediction.outputs import BandImage
from tests.inference.prediction.test_georeference import NORTH_UP, ROTATED, UTM, geotiff

PALETTE = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255]], np.uint8)
LABELS = np.random.default_rng(3).integers(0, 3, (30, 40)).astype(np.uint8)
RGB = np.random.default_rng(4).integers(0, 256, (30, 40, 3)).astype(np.uint8)


def _save(path: Path, pixels: np.ndarray, file_format: str, palette=None, georeference=None):
    image = BandImage(path, pixels.shape, file_format, palette, georeference)
    image.write(0, pixels[:17])  # in two bands, as the sliding window writes
    image.write(17, pixels[17:])
    return image.close()


def _georeference(tmp_path: Path, **profile):
    path = geotiff(tmp_path / "in.tif", RGB, **profile)
    return read_georeference(path)


def _todays_tiff(path: Path, pixels: np.ndarray, palette: np.ndarray | None) -> bytes:
    """The TIFF as BandImage wrote it before georeferencing: tifffile.memmap, these args."""
    if palette is None:
        extra = {"photometric": "rgb" if pixels.ndim == 3 else "minisblack"}
    else:
        colormap = np.zeros((3, 256), np.uint16)
        colormap[:, : len(palette)] = palette.T.astype(np.uint16) * 257
        extra = {"photometric": "palette", "colormap": colormap}
    mapped = tifffile.memmap(path, shape=pixels.shape, dtype=np.uint8, **extra)
    mapped[:] = pixels
    mapped.flush()
    del mapped
    return path.read_bytes()


@pytest.mark.parametrize(("pixels", "palette"), [(LABELS, PALETTE), (RGB, None), (LABELS, None)])
def test_without_georeference_a_tif_is_byte_identical_to_before(tmp_path: Path, pixels, palette):
    written = _save(tmp_path / "out", pixels, "tif", palette)
    assert written.read_bytes() == _todays_tiff(tmp_path / "today.tif", pixels, palette)


def test_without_georeference_a_png_gets_no_world_file_and_loses_a_stale_one(tmp_path: Path):
    (tmp_path / "out.pgw").write_text("stale\n")
    written = _save(tmp_path / "out", LABELS, "png", PALETTE)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png"]
    np.testing.assert_array_equal(np.asarray(Image.open(written)), LABELS)


@pytest.mark.parametrize(("pixels", "palette"), [(LABELS, PALETTE), (RGB, None)])
def test_a_tif_carries_the_inputs_crs_and_transform(tmp_path: Path, pixels, palette):
    georeference = _georeference(tmp_path, crs=UTM, transform=NORTH_UP, nodata=0)
    written = _save(tmp_path / "out", pixels, "tif", palette, georeference)
    with rasterio.open(written) as mask:
        assert mask.crs == rasterio.crs.CRS.from_string(UTM)
        assert mask.transform == NORTH_UP
        assert mask.nodata is None  # class 0 (or black) is data, whatever the input said
        np.testing.assert_array_equal(np.moveaxis(mask.read(), 0, -1).squeeze(), pixels)
    assert tifffile.memmap(written, mode="r").shape == pixels.shape  # still memory-mappable


@pytest.mark.parametrize("area_or_point", ["Area", "Point"])
@pytest.mark.parametrize("transform", [NORTH_UP, ROTATED])
def test_a_png_gets_a_world_file_that_gdal_reads_as_the_inputs_transform(
    tmp_path: Path, transform, area_or_point
):
    tags = {"AREA_OR_POINT": area_or_point}
    georeference = _georeference(tmp_path, crs=UTM, transform=transform, tags=tags)
    written = _save(tmp_path / "out", LABELS, "png", PALETTE, georeference)
    world_file = tmp_path / "out.pgw"
    assert len(world_file.read_text().splitlines()) == 6
    with rasterio.open(written) as mask:
        np.testing.assert_allclose(tuple(mask.transform)[:6], tuple(transform)[:6], atol=1e-9)
    with rasterio.open(tmp_path / "in.tif") as image:
        np.testing.assert_allclose(tuple(image.transform)[:6], tuple(transform)[:6], atol=1e-9)


def test_ground_control_points_give_a_png_no_world_file_and_a_warning(tmp_path: Path, caplog):
    points = [
        GroundControlPoint(0, 0, 500000.0, 5200000.0),
        GroundControlPoint(30, 40, 500040.0, 5199970.0),
        GroundControlPoint(0, 40, 500040.0, 5200000.0),
    ]
    georeference = _georeference(tmp_path, gcps=points, crs=UTM)
    with caplog.at_level(logging.WARNING):
        _save(tmp_path / "out", LABELS, "png", PALETTE, georeference)
    assert not (tmp_path / "out.pgw").exists()
    assert "out.png: no world file" in caplog.text and "format=tif keeps them" in caplog.text
    with rasterio.open(_save(tmp_path / "gcp", LABELS, "tif", PALETTE, georeference)) as mask:
        assert len(mask.gcps[0]) == 3 and mask.gcps[1] == rasterio.crs.CRS.from_string(UTM)


def test_a_discarded_image_leaves_nothing(tmp_path: Path):
    georeference = _georeference(tmp_path, crs=UTM, transform=NORTH_UP)
    (tmp_path / "in.tif").unlink()
    for file_format in ("png", "tif"):
        image = BandImage(tmp_path / "out", LABELS.shape, file_format, PALETTE, georeference)
        image.write(0, LABELS[:5])
        image.discard()
    assert not list(tmp_path.iterdir())


def test_a_dotted_name_keeps_its_dots(tmp_path: Path):
    # Two inputs "scene.1.tif" and "scene.2.tif" must not both become "scene.png".
    georeference = _georeference(tmp_path, crs=UTM, transform=NORTH_UP)
    written = _save(tmp_path / "scene.1", LABELS, "png", PALETTE, georeference)
    assert written.name == "scene.1.png" and (tmp_path / "scene.1.pgw").is_file()
