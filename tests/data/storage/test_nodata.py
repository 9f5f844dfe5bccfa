"""The images' no-data value: the GeoTIFF tag read from the header, or the config's."""

import math
import warnings

import numpy as np
import pytest
import rasterio
import tifffile
from PIL import Image
from rasterio.errors import NotGeoreferencedWarning

from segscale.data.storage.nodata import (
    GDAL_NODATA,
    check_nodata,
    nodata_pixels,
    parse_nodata,
    read_nodata_tag,
)
from segscale.errors import ConfigError


def geotiff(path, nodata, **layout) -> None:
    """A 3-band uint8 GeoTIFF written by rasterio (GDAL), with a no-data value."""
    profile = {"driver": "GTiff", "width": 32, "height": 24, "count": 3, "dtype": "uint8"}
    with warnings.catch_warnings():  # a plain raster: no georeference to warn of
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        with rasterio.open(path, "w", nodata=nodata, **profile, **layout) as dataset:
            dataset.write(np.zeros((3, 24, 32), np.uint8))


@pytest.mark.parametrize(
    "layout", [{}, {"compress": "deflate", "tiled": True, "blockxsize": 16, "blockysize": 16}]
)
def test_the_tag_gdal_writes_is_read_from_the_header(tmp_path, layout):
    # Uncompressed: memory-mapped by segscale, so rasterio's dataset.nodata is not there.
    path = tmp_path / "geo.tif"
    geotiff(path, 7, **layout)
    assert read_nodata_tag(path) == "7"
    assert parse_nodata(read_nodata_tag(path)) == 7.0


def test_files_without_the_tag_have_none(tmp_path):
    tifffile.imwrite(tmp_path / "plain.tif", np.zeros((8, 8, 3), np.uint8))
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "image.png")
    assert read_nodata_tag(tmp_path / "plain.tif") is None
    assert read_nodata_tag(tmp_path / "image.png") is None


def tagged(path, text: str):
    """A TIFF whose GDAL_NODATA tag holds ``text`` (any text, as a hand-made file may)."""
    extra = [(GDAL_NODATA, "s", 0, text, True)]
    tifffile.imwrite(path, np.zeros((8, 8, 3), np.uint8), extratags=extra)
    return path


@pytest.mark.parametrize(
    ("text", "value"),
    [("-9999", -9999.0), ("-3.4028234663852886e+38", -3.4028234663852886e38), ("0.5", 0.5)],
)
def test_the_forms_gdal_writes_are_numbers(tmp_path, text, value):
    assert parse_nodata(read_nodata_tag(tagged(tmp_path / "a.tif", text))) == value
    assert math.isnan(parse_nodata("nan")) and parse_nodata("-inf") == -math.inf


@pytest.mark.parametrize("text", ["1_000", "0x10", "1,5", "12abc", "None", "1e5e5", "", "- 1"])
def test_a_tag_that_is_no_number_is_refused_naming_the_tag_and_the_key(tmp_path, text):
    # Python's float() takes "1_000"; GDAL reads it as 1. Neither guess is made.
    read = read_nodata_tag(tagged(tmp_path / "a.tif", text))
    with pytest.raises(ValueError, match=r"GDAL_NODATA tag holds .*datamodule.sampling.nodata"):
        parse_nodata(read)


@pytest.mark.parametrize("value", [None, 0, -9999.5, 65535])
def test_the_config_takes_a_finite_number_or_null(value):
    check_nodata(value)


@pytest.mark.parametrize("value", ["0", True, float("nan"), float("inf"), [0]])
def test_the_config_refuses_anything_else_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"datamodule.sampling.nodata=.* is not allowed"):
        check_nodata(value)


def test_a_pixel_is_no_data_only_in_every_band():
    rows = np.array([[[0, 0, 0], [0, 0, 1], [5, 5, 5]]], np.uint8)
    np.testing.assert_array_equal(nodata_pixels(rows, 0.0), [[True, False, False]])
    np.testing.assert_array_equal(nodata_pixels(rows, 5.0), [[False, False, True]])
    np.testing.assert_array_equal(nodata_pixels(rows, -1.0), [[False, False, False]])
    np.testing.assert_array_equal(nodata_pixels(rows, 0.5), [[False, False, False]])
    floats = np.array([[[np.nan, np.nan], [-3.4e38, -3.4e38]]], np.float32)
    assert not nodata_pixels(floats, math.nan).any()  # NaN pixels are refused elsewhere
    # GDAL writes float32's lowest value rounded; in the pixels' type it is that value.
    np.testing.assert_array_equal(nodata_pixels(floats, -3.4e38), [[False, True]])
    np.testing.assert_array_equal(nodata_pixels(rows.astype(np.uint16), 5), [[False, False, True]])


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "float32"])
@pytest.mark.parametrize("bands", [1, 3, 4, 6])
def test_every_band_is_compared_for_each_type_and_band_count(dtype, bands):
    # Up to 4 bands OpenCV compares them at once, beyond NumPy band by band: the same.
    rows = np.random.default_rng(bands).integers(0, 2, (9, 11, bands)).astype(dtype)
    rows[0, 0] = 0
    found = nodata_pixels(rows, 0.0)
    assert found.dtype == bool and found.shape == (9, 11) and found[0, 0]
    np.testing.assert_array_equal(found, (rows == 0).all(axis=2))
    apart = np.moveaxis(np.ascontiguousarray(np.moveaxis(rows, 2, 0)), 0, -1)  # GDAL's bands
    np.testing.assert_array_equal(nodata_pixels(apart, 0.0), found)
