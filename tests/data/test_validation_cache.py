"""The cached pass: valid cells are read again when missing or counted for other settings."""

import json

import numpy as np
import pytest

from segscale.data import validation_cache
from segscale.data.folder import FolderTiles
from segscale.data.labels import LabelMap
from segscale.data.user_cache import cache_file
from segscale.data.validation import validate_dataset
from tests.data.valid_maps import geotiff_dataset

NAMES = ("a", "b", "c")


@pytest.fixture
def reads(monkeypatch) -> list:
    """The pairs the pass reads (rather than takes from the cache)."""
    read = []
    inspect = validation_cache.inspect_pair
    monkeypatch.setattr(
        validation_cache, "inspect_pair", lambda p, *args: read.append(p) or inspect(p, *args)
    )
    return read


def run_pass(root, min_valid=0.0, nodata=None, labels=None):
    labels = labels or LabelMap(3, 255)
    source = FolderTiles(str(root))
    return validate_dataset(source, labels, NAMES, 32, None, min_valid=min_valid, nodata=nodata)


def stored(root) -> dict:
    """The cached facts of each training pair, by image name."""
    pairs = json.loads(cache_file("validation", FolderTiles(str(root)).cache_key).read_text())
    return {k.split("|")[0].rsplit("/", 1)[1]: e["facts"] for k, e in pairs["pairs"].items()}


def test_a_pass_cached_without_valid_cells_is_read_again_once(tmp_path, reads):
    root = geotiff_dataset(tmp_path)
    run_pass(root)  # as a pass before min_valid existed: no valid cells in the cache
    assert len(reads) == 3 and "valid_cells" not in stored(root)["t1.tif"]
    first = run_pass(root, min_valid=0.5)
    assert len(reads) == 5  # the two training pairs; validation pairs need none
    assert run_pass(root, min_valid=0.9).valid_windows["train"]  # another share: cached
    assert len(reads) == 5
    run_pass(root)  # without min_valid, the facts with valid cells do
    assert len(reads) == 5
    again = run_pass(root, min_valid=0.5)
    for a, b in zip(first.valid_windows["train"], again.valid_windows["train"], strict=True):
        np.testing.assert_array_equal(a.cells.counts, b.cells.counts)


def test_another_nodata_setting_or_other_labels_count_again(tmp_path, reads):
    root = geotiff_dataset(tmp_path)
    run_pass(root, min_valid=0.5)
    assert len(reads) == 3
    run_pass(root, min_valid=0.5, nodata=7)
    assert len(reads) == 5 and stored(root)["t1.tif"]["valid_cells"]["nodata"] == 7.0
    run_pass(root, min_valid=0.5, labels=LabelMap(3, 255, ignore_ids=[9]))
    assert len(reads) == 7


@pytest.mark.parametrize(
    "damaged",
    [
        {"cell": 16},  # the key of another setting, no counts
        "nonsense",
        {"cell": 32, "counts": "AAAA"},  # another cell size
    ],
)
def test_a_damaged_or_foreign_entry_is_counted_again_not_crashed_on(tmp_path, reads, damaged):
    root = geotiff_dataset(tmp_path)
    run_pass(root, min_valid=0.5)
    path = cache_file("validation", FolderTiles(str(root)).cache_key)
    cache = json.loads(path.read_text())
    for entry in cache["pairs"].values():
        entry["facts"]["valid_cells"] = damaged
    path.write_text(json.dumps(cache))
    report = run_pass(root, min_valid=0.5)
    assert len(reads) == 5 and len(report.valid_windows["train"]) == 2
