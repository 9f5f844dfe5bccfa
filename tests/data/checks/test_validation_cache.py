"""The cached pass: changed files read again; valid cells when missing or for other settings."""

import hashlib
import json
import os
import shutil
import sys
import time

import numpy as np
import pytest
from PIL import Image

from segscale.data.checks import validation_cache
from segscale.data.checks.validation import validate_dataset
from segscale.data.classes.labels import LabelMap
from segscale.data.datasets.folder import FolderTiles
from segscale.data.storage import caches
from segscale.data.storage.caches import cache_file
from segscale.errors import ConfigError
from tests.conftest import write_pair
from tests.helpers.valid_maps import geotiff_dataset

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
    # Another no-data value: every image's no-data pixels and sums change, val's too.
    run_pass(root, min_valid=0.5, nodata=7)
    assert len(reads) == 6 and stored(root)["t1.tif"]["valid_cells"]["nodata"] == 7.0
    assert stored(root)["v1.tif"]["nodata"] == {
        "setting": 7,
        "value": 7.0,
        "from": "datamodule.sampling.nodata",
        "pixels": 0,
    }
    run_pass(root, min_valid=0.5, labels=LabelMap(3, 255, ignore_ids=[9]), nodata=7)
    assert len(reads) == 8  # the training images' valid cells alone


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


@pytest.mark.parametrize("change_time", [True, False], ids=["change time", "content digest"])
def test_a_mask_replaced_with_the_same_size_and_mtime_is_counted_again(
    tmp_path, reads, monkeypatch, change_time
):
    # Without a change time (Windows), the identity holds a digest of the content.
    monkeypatch.setattr(caches, "has_change_time", lambda: change_time)
    root, replacement = tmp_path / "data", tmp_path / "new.png"
    image = np.zeros((32, 32, 3), np.uint8)
    for split, name in (("train", "t1"), ("val", "v1")):
        write_pair(root, split, name, image, np.zeros((32, 32), np.uint8))
    mask = root / "train/masks/t1.png"
    Image.fromarray(np.zeros((32, 32), np.uint8)).save(mask, compress_level=0)
    Image.fromarray(np.full((32, 32), 2, np.uint8)).save(replacement, compress_level=0)
    assert mask.stat().st_size == replacement.stat().st_size  # uncompressed: the shape's size
    assert run_pass(root).class_counts["train"].tolist() == [1024, 0, 0]
    before = mask.stat()
    time.sleep(0.02)  # past a tick of the kernel's coarse clock, which stamps the change time
    shutil.copy2(replacement, mask)  # cp -p: the same size, and the old mtime put back
    os.utime(mask, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (mask.stat().st_size, mask.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert run_pass(root).class_counts["train"].tolist() == [0, 0, 1024]
    assert len(reads) == 3  # the two pairs, then the changed one alone


@pytest.mark.skipif(sys.platform == "win32", reason="no owner or mode bits on Windows")
def test_the_cache_folder_is_private_and_a_shared_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    root = geotiff_dataset(tmp_path)
    run_pass(root)
    for folder in (tmp_path / "home/segscale", tmp_path / "home/segscale/validation"):
        assert (folder.stat().st_mode & 0o777) == 0o700, folder
    (tmp_path / "home/segscale/validation").chmod(0o777)
    with pytest.raises(ConfigError) as refused:
        run_pass(root)
    folder = tmp_path / "home/segscale/validation"
    assert f"the cache folder {folder} can be written by others (mode 777)" in str(refused.value)
    assert "XDG_CACHE_HOME=<a folder of yours>" in str(refused.value)


def test_facts_cached_before_nodata_was_left_out_of_the_sums_are_read_again(tmp_path, reads):
    # Version 4 cached sums over every pixel: its key is not this version's, and an entry
    # without the no-data it was counted with (copied into this version's file) is read.
    root = geotiff_dataset(tmp_path)
    run_pass(root)
    assert len(reads) == 3
    path = cache_file("validation", FolderTiles(str(root)).cache_key)
    cache = json.loads(path.read_text())
    old = hashlib.sha1(json.dumps([4], sort_keys=True).encode()).hexdigest()[:16]
    assert cache["settings"] != old
    for entry in cache["pairs"].values():
        del entry["facts"]["nodata"]
    path.write_text(json.dumps(cache))
    report = run_pass(root)
    assert len(reads) == 6 and report.nodata.splits["train"].nodata_pixels > 0
    run_pass(root)
    assert len(reads) == 6  # cached again, with it
