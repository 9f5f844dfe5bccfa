"""The no-data the pass found: values, pixels and qualifying windows, per split and image."""

import numpy as np
import pytest

from segscale.data.checks.dataset_problems import InvalidDatasetError
from segscale.data.checks.validation import validate_dataset
from segscale.data.classes.labels import LabelMap
from segscale.data.datasets.folder import FolderTiles
from segscale.data.sampling.valid_windows import CELL
from tests.conftest import write_pair
from tests.helpers.valid_maps import tagged_border_dataset

NAMES = ("a", "b", "c")


def _check(root, patch_size=32, **kwargs):
    source, labels = FolderTiles(str(root)), LabelMap(3, 255)
    return validate_dataset(source, labels, NAMES, patch_size, None, **kwargs)


def qualifying_windows(valid: np.ndarray, size: int, min_valid: float) -> tuple[int, int]:
    """Lattice windows (corners on cell corners) with ``min_valid`` of valid pixels, by brute
    force, and all of them."""
    height, width = valid.shape
    shares = [
        valid[y : y + size, x : x + size].mean()
        for y in range(0, height - size + 1, CELL)
        for x in range(0, width - size + 1, CELL)
    ]
    return int(sum(s >= min_valid for s in shares)), len(shares)


@pytest.mark.parametrize("compress", [False, True], ids=["mapped", "by window"])
def test_each_image_s_nodata_pixels_and_qualifying_windows_are_counted(tmp_path, compress):
    images = tagged_border_dataset(tmp_path, "uint8", compress)
    report = _check(tmp_path, min_valid=0.6)
    found = report.nodata
    assert found.setting is None and found.min_valid == 0.6 and found.patch_size == 32
    train = found.splits["train"]
    empty = [(image == 0).all(axis=2) for image in images["train"]]
    assert [int(e.sum()) for e in empty] == [8 * 80 + 56 * 20, 8 * 80 + 56 * 36]
    assert [i.pixels for i in train.per_image] == [int(e.sum()) for e in empty]
    assert [i.image.name for i in train.per_image] == ["t1.tif", "t2.tif"]
    assert {(i.value, i.source, i.total) for i in train.per_image} == {(0.0, "GDAL_NODATA", 5120)}
    assert train.images == train.with_value == 2
    assert train.nodata_pixels == sum(int(e.sum()) for e in empty) and train.pixels == 10240
    assert train.share == pytest.approx(train.nodata_pixels / 10240)
    # Every mask pixel holds a class: valid is not no-data. 32-px windows on a 16-px grid.
    expected = [qualifying_windows(~e, 32, 0.6) for e in empty]
    assert [i.windows for i in train.per_image] == expected
    assert expected[0][1] == 3 * 4 and 0 < expected[1][0] < expected[0][0]
    assert train.windows == (sum(q for q, _ in expected), sum(c for _, c in expected))
    # A tile without a qualifying window is left out of training, and its count kept.
    left_out = _check(tmp_path, patch_size=64, min_valid=0.7)
    assert [p.image.name for p in left_out.pairs["train"]] == ["t1.tif"]
    expected = [qualifying_windows(~e, 64, 0.7) for e in empty]
    assert expected == [(1, 2), (0, 2)]
    assert [i.windows for i in left_out.nodata.splits["train"].per_image] == expected
    val = found.splits["val"]
    assert val.windows is None and [i.windows for i in val.per_image] == [None]
    assert val.nodata_pixels == int((images["val"][0] == 0).all(axis=2).sum())


def test_the_setting_is_every_image_s_value_and_an_image_without_one_has_no_row(tmp_path):
    tagged_border_dataset(tmp_path)
    report = _check(tmp_path, nodata=0)
    assert {i.source for i in report.nodata.splits["train"].per_image} == {
        "datamodule.sampling.nodata"
    }
    plain = tmp_path / "plain"
    image = np.zeros((32, 32, 3), np.uint8)  # zeros, but no tag: data
    image[:, 16:] = 7
    for split, name in (("train", "t1"), ("train", "t2"), ("val", "v1")):
        write_pair(plain, split, name, image, np.zeros((32, 32), np.uint8), image_suffix=".tif")
    found = _check(plain).nodata.splits["train"]
    assert (found.with_value, found.nodata_pixels, found.per_image) == (0, 0, ())
    assert "  training images: none of 2 has a no-data value" in _check(plain).nodata.lines()
    assert _check(plain, nodata=0).nodata.splits["train"].with_value == 2
    assert _check(plain, nodata=5).nodata.splits["train"].per_image == ()  # covers nothing
    image[:] = 0
    for name in ("t1", "t2"):
        write_pair(plain, "train", name, image, np.zeros((32, 32), np.uint8), image_suffix=".tif")
    with pytest.raises(
        InvalidDatasetError, match=r"every pixel of the 2 training image\(s\) is no-data"
    ):
        _check(plain, nodata=0)


def test_the_table_shows_the_value_its_source_the_pixels_and_the_windows(tmp_path):
    tagged_border_dataset(tmp_path)
    lines = _check(tmp_path, min_valid=0.6).nodata.lines()
    text = "\n".join(lines)
    assert lines[0] == "no-data (each GeoTIFF's GDAL_NODATA tag; datamodule.sampling.nodata=null):"
    assert (
        "training images: 2 of 2 with a no-data value, 2 holding no-data pixels: 4,416 px "
        "(43.12% of 10,240); left out of the mean, std and value range"
    ) in text
    assert "candidate windows of 32 px with datamodule.sampling.min_valid=0.6: " in text
    header = lines.index(next(line for line in lines if line.strip().startswith("image")))
    columns = ["image", "no-data", "from", "pixels", "share", "windows", "(min_valid", "0.6)"]
    assert lines[header].split() == columns
    assert lines[header + 1].split()[:5] == ["t1.tif", "0", "GDAL_NODATA", "1,760", "34.38%"]
    summary = _check(tmp_path, min_valid=0.6).nodata.summary()
    assert summary["setting"] is None and summary["splits"]["train"]["images_with_nodata"] == 2
    first = summary["splits"]["train"]["per_image"][0]
    assert first["pixels"] == 1760 and first["from"] == "GDAL_NODATA" and first["value"] == 0.0
    assert summary["splits"]["train"]["windows"]["candidates"] == 24
