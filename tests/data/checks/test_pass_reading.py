"""The pass's reading: on threads as one thread reads, once per machine, a shared file once."""

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

from segscale.data.checks import validation_cache
from segscale.data.checks.dataset_problems import InvalidDatasetError
from segscale.data.checks.validation import validate_dataset
from segscale.data.classes.labels import LabelMap
from segscale.data.datasets.folder import FolderTiles
from segscale.data.storage.caches import cache_file
from tests.conftest import write_pair
from tests.helpers.valid_maps import geotiff_dataset

NAMES = ("a", "b", "c")


@pytest.fixture
def reads(monkeypatch) -> list:
    """The pairs the pass reads, with the thread that read each."""
    read = []
    inspect = validation_cache.inspect_pair

    def counted(pair, *args):
        read.append((pair, threading.current_thread().name))
        time.sleep(0.05)  # long enough for the other threads to take theirs
        return inspect(pair, *args)

    monkeypatch.setattr(validation_cache, "inspect_pair", counted)
    return read


def mixed_dataset(root: Path) -> Path:
    """GeoTIFFs with a no-data border (``geotiff_dataset``) and PNG and TIFF pairs beside."""
    geotiff_dataset(root)
    rng = np.random.default_rng(4)
    for index in range(4):
        image = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
        mask = rng.integers(0, 3, (40, 48)).astype(np.uint8)
        suffix = ".tif" if index % 2 else ".png"
        write_pair(root, "train", f"p{index}", image, mask, suffix, suffix)
    return root


def run(root: Path, workers: int, labels: LabelMap | None = None):
    return validate_dataset(
        FolderTiles(str(root)),
        labels or LabelMap(3, 255),
        NAMES,
        16,
        None,
        locations_per_class=8,
        min_valid=0.3,
        workers=workers,
    )


def cached_pairs(root: Path) -> dict:
    return json.loads(cache_file("validation", FolderTiles(str(root)).cache_key).read_text())[
        "pairs"
    ]


def test_threads_give_the_report_and_cache_of_one_thread(tmp_path, monkeypatch, reads):
    root = mixed_dataset(tmp_path / "data")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "one"))
    serial = run(root, workers=1)
    serial_cache = cached_pairs(root)
    assert {name for _, name in reads} == {"MainThread"}
    reads.clear()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "three"))
    parallel = run(root, workers=3)
    assert len({name for _, name in reads}) == 3 and len(reads) == 7  # 6 train, 1 val
    assert all(name.startswith("dataset-check") for _, name in reads)
    assert cached_pairs(root) == serial_cache  # every fact, as one thread found it
    for split in ("train", "val"):
        assert parallel.pairs[split] == serial.pairs[split]
        np.testing.assert_array_equal(parallel.class_counts[split], serial.class_counts[split])
        for mine, theirs in zip(
            parallel.class_locations[split], serial.class_locations[split], strict=True
        ):
            assert all(map(np.array_equal, mine.points, theirs.points))
    assert (parallel.channel_mean, parallel.channel_std, parallel.value_range) == (
        serial.channel_mean,
        serial.channel_std,
        serial.value_range,
    )
    windows = zip(parallel.valid_windows["train"], serial.valid_windows["train"], strict=True)
    for mine, theirs in windows:
        np.testing.assert_array_equal(mine.cells.counts, theirs.cells.counts)
        np.testing.assert_array_equal(mine.qualifying, theirs.qualifying)
    assert parallel.table() == serial.table()


def test_threads_list_the_problems_one_thread_lists(tmp_path, monkeypatch):
    root = mixed_dataset(tmp_path / "data")
    tifffile.imwrite(root / "train/masks/p1.tif", np.full((40, 48), 9, np.uint8))  # unknown
    (root / "train/masks/p2.png").write_bytes(b"not a png")
    messages = []
    for workers in (1, 3):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / f"cache-{workers}"))
        with pytest.raises(InvalidDatasetError) as error:
            run(root, workers)
        messages.append(str(error.value))
    assert messages[0] == messages[1]
    assert (
        "p2.png: mask cannot be read" in messages[0] and "datamodule.ignore_ids=[9]" in messages[0]
    )


def test_two_passes_at_once_read_each_file_once(tmp_path, reads, caplog):
    # Two ranks that torchrun started check the dataset at the same time: the second
    # waits for the first (the lock beside the cache file), then reads the cache.
    caplog.set_level("INFO")
    root = mixed_dataset(tmp_path / "data")
    reports = []
    passes = [threading.Thread(target=lambda: reports.append(run(root, 2))) for _ in range(2)]
    for each in passes:
        each.start()
        time.sleep(0.02)
    for each in passes:
        each.join(timeout=120)
    assert len(reports) == 2 and reports[0].table() == reports[1].table()
    assert len(reads) == 7 and len({pair for pair, _ in reads}) == 7
    waited = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for")]
    assert len(waited) == 1 and "which is checking these dataset files" in waited[0]
    assert not list(cache_file("validation", "").parent.glob("*.lock"))  # let go of


def test_a_file_in_two_splits_is_read_once(tmp_path, reads):
    root = mixed_dataset(tmp_path / "data")
    source = FolderTiles(str(root), splits={"train": "train", "val": "train"})
    report = validate_dataset(source, LabelMap(3, 255), NAMES, 16, None, min_valid=0.3, workers=3)
    assert len(reads) == 6 and report.pairs["val"] == report.pairs["train"]


def test_without_a_cache_folder_each_pass_reads_on_its_own(tmp_path, monkeypatch, reads, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # no folder can be made in it
    root = mixed_dataset(tmp_path / "data")
    assert len(run(root, 3).pairs["train"]) == 6
    assert len(reads) == 7 and "could not cache the validation" in caplog.text


def test_a_failing_read_stops_the_pass_and_its_threads(tmp_path, monkeypatch):
    root = mixed_dataset(tmp_path / "data")
    started = []

    def broken(pair, *args):
        started.append(pair)
        raise MemoryError("no memory for this one")

    monkeypatch.setattr(validation_cache, "inspect_pair", broken)
    with pytest.raises(MemoryError, match="no memory"):
        run(root, 2)
    assert len(started) < 7  # the files not started are dropped
    assert not [t for t in threading.enumerate() if t.name.startswith("dataset-check")]
