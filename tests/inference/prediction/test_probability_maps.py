import math
from pathlib import Path

import numpy as np
import pytest
import rasterio

from segscale.errors import ConfigError
from segscale.inference.prediction import probability_maps
from segscale.inference.prediction.georeference import read_georeference
from segscale.inference.prediction.probability_maps import (
    ProbabilityFiles,
    ProbabilityOutputs,
    RasterFile,
    encode,
    normalised_entropy,
)
from tests.inference.prediction.test_georeference import NORTH_UP, UTM, geotiff


@pytest.mark.parametrize(
    ("probabilities", "confidence", "message"),
    [
        ("float32", "none", "probabilities='float32' is not allowed: expected one of none, "),
        ("UINT8", "none", "probabilities='UINT8' is not allowed"),
        (" uint8", "none", "probabilities=' uint8' is not allowed"),
        (True, "none", "probabilities=True is not allowed"),
        (None, "none", "probabilities=None is not allowed"),
        (8, "none", "probabilities=8 is not allowed"),
        ("none", "float16", "confidence='float16' is not allowed: expected one of none, uint8"),
        ("none", True, "confidence=True is not allowed"),
        ("none", "", "confidence='' is not allowed"),
    ],
)
def test_unknown_encodings_are_refused_naming_the_key(probabilities, confidence, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        ProbabilityOutputs(probabilities, confidence)


def test_the_files_asked_for_are_named_by_their_suffixes():
    assert ProbabilityOutputs().suffixes == []
    assert ProbabilityOutputs("float16", "none").suffixes == ["_probabilities"]
    assert ProbabilityOutputs("none", "uint8").suffixes == ["_confidence", "_entropy"]


def test_uint8_stores_the_rounded_value_times_255():
    values = np.array([0.0, 0.5 / 255, 0.499, 0.5, 1.0, 1.0000001], np.float32)
    np.testing.assert_array_equal(encode(values, "uint8"), [0, 0, 127, 128, 255, 255])
    assert encode(values, "float16").dtype == np.float16


def test_entropy_is_divided_by_log_k_and_zero_probabilities_add_nothing():
    uniform = np.full((4, 1, 1), 0.25, np.float32)
    certain = np.array([1.0, 0, 0, 0], np.float32).reshape(4, 1, 1)
    half = np.array([0.5, 0.5, 0, 0], np.float32).reshape(4, 1, 1)
    entropy = normalised_entropy(np.concatenate([uniform, certain, half], axis=2))
    np.testing.assert_allclose(entropy, [[1.0, 0.0, math.log(2) / math.log(4)]], atol=1e-6)
    assert entropy.dtype == np.float32


def test_a_raster_keeps_band_names_scale_and_the_inputs_georeference(tmp_path: Path):
    image = np.zeros((6, 5, 3), np.uint8)
    source = geotiff(tmp_path / "in.tif", image, crs=UTM, transform=NORTH_UP, tags={"SITE": "x"})
    names = ["road & <rail>", "forêt", '"water"']  # XML and non-ASCII in the class names
    raster = RasterFile(tmp_path / "p.tif", (6, 5), names, "uint8", read_georeference(source))
    values = np.random.default_rng(0).dirichlet(np.ones(3), (6, 5)).astype(np.float32)
    values = np.moveaxis(values, -1, 0)
    raster.write(0, values[:, :4])
    raster.write(4, values[:, 4:])
    assert raster.close() == tmp_path / "p.tif"
    with rasterio.open(tmp_path / "p.tif") as written:
        assert written.descriptions == tuple(names)
        assert written.scales == (1 / 255,) * 3 and written.offsets == (0.0,) * 3
        assert written.crs == UTM and written.transform == NORTH_UP
        assert written.tags()["SITE"] == "x"  # the input's dataset metadata stays
        np.testing.assert_array_equal(written.read(), np.rint(values * 255))


def test_a_float_raster_of_a_plain_input_has_no_georeference(tmp_path: Path):
    raster = RasterFile(tmp_path / "c.tif", (3, 4), ["confidence"], "float32", None)
    values = np.linspace(0, 1, 12, dtype=np.float32).reshape(1, 3, 4)
    raster.write(0, values)
    raster.close()
    with rasterio.open(tmp_path / "c.tif") as written:
        assert written.crs is None and written.descriptions == ("confidence",)
        assert written.scales == (1.0,)
        np.testing.assert_array_equal(written.read(), values)


def test_bands_are_the_classes_in_the_checkpoints_order_not_sorted(tmp_path: Path):
    names = ("water", "building", "asphalt")  # a checkpoint's order, not the sorted one
    values = (0.5, 0.375, 0.125)  # exact in float16: band k holds class k's value
    probabilities = np.stack([np.full((3, 4), value, np.float32) for value in values])
    files = ProbabilityFiles(tmp_path / "scene", (3, 4), names, ProbabilityOutputs("float16"), None)
    files.write(0, probabilities)
    (path,) = files.close()
    with rasterio.open(path) as written:
        assert written.descriptions == names
        assert [float(np.unique(written.read(band))[0]) for band in (1, 2, 3)] == list(values)


def test_discarded_files_leave_nothing(tmp_path: Path):
    outputs = ProbabilityOutputs("float16", "uint8")
    files = ProbabilityFiles(tmp_path / "scene", (4, 4), ("a", "b"), outputs, None)
    files.write(0, np.full((2, 2, 4), 0.5, np.float32))
    files.discard()
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_cannot_be_begun_takes_the_others_begun_with_it(tmp_path: Path, monkeypatch):
    begin = probability_maps.temporary_beside

    def full_at_entropy(path: Path) -> Path:
        if path.name == "scene_entropy.tif":
            raise OSError(28, "No space left on device")
        return begin(path)

    monkeypatch.setattr(probability_maps, "temporary_beside", full_at_entropy)
    outputs = ProbabilityOutputs("uint8", "uint8")
    with pytest.raises(OSError, match="No space"):
        ProbabilityFiles(tmp_path / "scene", (4, 4), ("a", "b"), outputs, None)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_at_close_names_the_file(tmp_path: Path, monkeypatch):
    raster = RasterFile(tmp_path / "scene_entropy.tif", (2, 2), ["entropy"], "uint8", None)

    def full(temporary: Path, path: Path) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(probability_maps, "move_into_place", full)
    with pytest.raises(OSError, match="No space") as raised:
        raster.close()
    assert raised.value.filename == str(tmp_path / "scene_entropy.tif")
