from pathlib import Path

import numpy as np
import pytest
import rasterio
import tifffile
from PIL import Image
from rasterio.control import GroundControlPoint
from rasterio.transform import Affine

from segscale.inference.prediction.georeference import (
    GDAL_METADATA,
    GDAL_NODATA,
    Georeference,
    read_georeference,
)

UTM = "EPSG:32633"
NORTH_UP = Affine(0.5, 0.0, 500123.25, 0.0, -0.75, 5200456.5)
ROTATED = Affine.translation(500123.25, 5200456.5) @ Affine.rotation(30) @ Affine.scale(0.5, -0.75)


def geotiff(path: Path, image: np.ndarray, **profile) -> Path:
    """``image`` (H×W×C) written by GDAL, with ``profile`` (crs, transform, gcps, nodata);
    ``tags`` / ``band_tags`` become dataset / band 1 metadata."""
    tags, band_tags = profile.pop("tags", {}), profile.pop("band_tags", {})
    height, width, count = image.shape
    profile.update(driver="GTiff", width=width, height=height, count=count, dtype=image.dtype)
    with rasterio.open(path, "w", **profile) as dataset:
        dataset.write(np.moveaxis(image, -1, 0))
        dataset.update_tags(**tags)
        dataset.update_tags(1, **band_tags)
    return path


def _image() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (30, 40, 3)).astype(np.uint8)


def _gdal_transform(path: Path) -> tuple[float, ...]:
    with rasterio.open(path) as dataset:
        return tuple(dataset.transform)[:6]


@pytest.mark.parametrize(
    ("transform", "area_or_point"),
    [(NORTH_UP, "Area"), (NORTH_UP, "Point"), (ROTATED, "Area"), (ROTATED, "Point")],
)
def test_the_transform_is_the_one_gdal_reads(tmp_path: Path, transform, area_or_point):
    # North-up is stored as tie point + pixel scale, rotated as a transformation matrix;
    # PixelIsPoint ties pixel centres, which GDAL moves half a pixel to the corner.
    path = geotiff(
        tmp_path / "in.tif",
        _image(),
        crs=UTM,
        transform=transform,
        tags={"AREA_OR_POINT": area_or_point},
    )
    georeference = read_georeference(path)
    assert georeference is not None and georeference.transform is not None
    np.testing.assert_allclose(georeference.transform, tuple(transform)[:6], rtol=0, atol=1e-9)
    assert georeference.transform == pytest.approx(_gdal_transform(path), abs=1e-9)


def test_the_world_file_names_the_centre_of_the_upper_left_pixel():
    a, b, c, d, e, f = tuple(ROTATED)[:6]
    lines = Georeference((), (a, b, c, d, e, f)).world_file()
    assert lines is not None and lines.endswith("\n")
    centre = ROTATED @ (0.5, 0.5)
    assert [float(line) for line in lines.splitlines()] == [a, d, b, e, *centre]


def test_the_geotiff_tags_are_copied_as_written(tmp_path: Path):
    path = geotiff(tmp_path / "in.tif", _image(), crs=UTM, transform=NORTH_UP)
    georeference = read_georeference(path)
    assert georeference is not None
    copied = {code: value for code, _, _, value, _ in georeference.tags}
    with tifffile.TiffFile(path) as tif:
        tags = tif.pages[0].tags
        assert set(copied) == {33550, 33922, 34735, 34737} & {tag.code for tag in tags}
        for code in (33550, 33922, 34735):
            assert copied[code] == tags[code].value
        assert copied[34737] == tags[34737].value.encode() + b"\x00"


def test_ascii_params_keep_their_bytes_and_big_endian_values_read_right(tmp_path: Path):
    # GeoKeys address GeoAsciiParams by byte offset: a leading space must survive
    # (tifffile's decoded value strips it).
    path = tmp_path / "big.tif"
    keys = (1, 1, 0, 2, 1024, 0, 1, 1, 1026, 34737, 5, 1)
    extratags = [
        (33550, 12, 3, (2.0, 3.0, 0.0), True),
        (33922, 12, 6, (0.0, 0.0, 0.0, 10.0, 20.0, 0.0), True),
        (34735, 3, len(keys), keys, True),
        (34737, 2, 0, b" name|", True),
    ]
    tifffile.imwrite(path, _image(), byteorder=">", extratags=extratags)
    georeference = read_georeference(path)
    assert georeference is not None
    copied = {code: value for code, _, _, value, _ in georeference.tags}
    assert copied[34737] == b" name|\x00" and copied[34735] == keys
    assert georeference.transform == (2.0, 0.0, 10.0, 0.0, -3.0, 20.0)
    assert georeference.transform == _gdal_transform(path)


def test_ground_control_points_are_copied_but_give_no_transform(tmp_path: Path):
    points = [
        GroundControlPoint(0, 0, 500000.0, 5200000.0),
        GroundControlPoint(30, 40, 500040.0, 5199970.0),
        GroundControlPoint(0, 40, 500040.0, 5200000.0),
    ]
    path = geotiff(tmp_path / "in.tif", _image(), gcps=points, crs=UTM)
    georeference = read_georeference(path)
    assert georeference is not None
    assert georeference.transform is None and georeference.world_file() is None
    assert 33922 in {tag[0] for tag in georeference.tags}


def test_only_dataset_metadata_is_kept_and_nodata_never(tmp_path: Path):
    path = geotiff(
        tmp_path / "in.tif",
        _image(),
        crs=UTM,
        transform=NORTH_UP,
        nodata=0,
        tags={"ACQUIRED": "2024-05-01"},
        band_tags={"STATISTICS_MEAN": "12.5"},
    )
    with tifffile.TiffFile(path) as tif:  # the input has them all
        assert {GDAL_METADATA, GDAL_NODATA} <= {tag.code for tag in tif.pages[0].tags}
    georeference = read_georeference(path)
    assert georeference is not None
    copied = {code: value for code, _, _, value, _ in georeference.tags}
    assert GDAL_NODATA not in copied
    assert b'<Item name="ACQUIRED">2024-05-01</Item>' in copied[GDAL_METADATA]
    assert b"STATISTICS_MEAN" not in copied[GDAL_METADATA]


def test_band_metadata_alone_leaves_no_metadata_tag(tmp_path: Path):
    path = geotiff(tmp_path / "in.tif", _image(), crs=UTM, transform=NORTH_UP, band_tags={"X": "1"})
    georeference = read_georeference(path)
    assert georeference is not None
    assert GDAL_METADATA not in {tag[0] for tag in georeference.tags}


def test_unparsable_gdal_metadata_is_dropped(tmp_path: Path):
    path = tmp_path / "in.tif"
    extratags = [
        (33550, 12, 3, (1.0, 1.0, 0.0), True),
        (33922, 12, 6, (0.0, 0.0, 0.0, 5.0, 6.0, 0.0), True),
        (GDAL_METADATA, 2, 0, b"<GDALMetadata><Item", True),
    ]
    tifffile.imwrite(path, _image(), extratags=extratags)
    georeference = read_georeference(path)
    assert georeference is not None
    assert [tag[0] for tag in georeference.tags] == [33550, 33922]


def test_images_without_georeferencing_have_none(tmp_path: Path):
    tifffile.imwrite(tmp_path / "plain.tif", _image())
    Image.fromarray(_image()).save(tmp_path / "plain.png")
    # GDAL metadata without any GeoTIFF tag is not georeferencing.
    extratags = [(GDAL_METADATA, 2, 0, b'<GDALMetadata><Item name="A">1</Item></GDALMetadata>')]
    tifffile.imwrite(tmp_path / "meta.tif", _image(), extratags=extratags)
    for name in ("plain.tif", "plain.png", "meta.tif"):
        assert read_georeference(tmp_path / name) is None
