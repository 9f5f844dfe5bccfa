"""PNG and JPEG files decoded once per machine, memory-mapped; a bad entry is rebuilt."""

import json
import logging
import threading

import numpy as np
import pytest

from segscale.data.decode_cache import DecodeCache
from segscale.errors import ConfigError


def counted(array: np.ndarray):
    """A decoder of ``array`` that counts its calls."""
    calls = []

    def decode() -> np.ndarray:
        calls.append(1)
        return array

    return decode, calls


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "tile.png"
    path.write_bytes(b"stands for a PNG")
    return path


PIXELS = np.arange(40 * 30 * 3, dtype=np.uint16).reshape(40, 30, 3)


def test_an_entry_is_decoded_once_and_mapped_after(tmp_path, source):
    cache = DecodeCache(str(tmp_path / "cache"))
    decode, calls = counted(PIXELS)
    first = cache.open(source, "image", decode)
    again = DecodeCache(str(tmp_path / "cache")).open(source, "image", decode)
    assert calls == [1]
    for array in (first, again):
        assert isinstance(array, np.memmap) and not array.flags.writeable
        np.testing.assert_array_equal(array, PIXELS)
    # Another variant of the same file (a mask decoded with other labels) is its own.
    cache.open(source, "mask other labels", decode)
    assert calls == [1, 1]


def test_one_process_builds_an_entry_and_the_others_wait(tmp_path, source):
    cache = DecodeCache(str(tmp_path / "cache"))
    started, calls, results = threading.Event(), [], []

    def slow() -> np.ndarray:
        calls.append(1)
        started.set()
        threading.Event().wait(0.3)
        return PIXELS

    first = threading.Thread(target=lambda: results.append(cache.open(source, "image", slow)))
    first.start()
    started.wait()
    results.append(cache.open(source, "image", slow))  # waits for the lock, then maps
    first.join()
    assert calls == [1] and all(np.array_equal(r, PIXELS) for r in results)


def damage_truncated(entry):
    data = entry.with_suffix(".npy")
    data.write_bytes(data.read_bytes()[:-100])


def damage_record(entry):
    entry.write_text("{half a rec")


def damage_shape(entry):
    record = json.loads(entry.read_text())
    record["shape"] = [30, 40, 3]
    entry.write_text(json.dumps(record))


def damage_missing_record(entry):
    entry.unlink()


def damage_missing_array(entry):
    entry.with_suffix(".npy").unlink()


@pytest.mark.parametrize(
    "damage",
    [
        damage_truncated,
        damage_record,
        damage_shape,
        damage_missing_record,
        damage_missing_array,
    ],
)
def test_a_damaged_or_partial_entry_is_rebuilt_never_read(tmp_path, source, damage):
    cache = DecodeCache(str(tmp_path / "cache"))
    decode, calls = counted(PIXELS)
    cache.open(source, "image", decode)
    (entry,) = (tmp_path / "cache").glob("*.json")
    damage(entry)
    np.testing.assert_array_equal(cache.open(source, "image", decode), PIXELS)
    assert calls == [1, 1]


def test_a_changed_source_is_decoded_again(tmp_path, source):
    cache = DecodeCache(str(tmp_path / "cache"))
    decode, calls = counted(PIXELS)
    cache.open(source, "image", decode)
    source.write_bytes(b"another PNG, longer than the first")
    cache.open(source, "image", decode)
    assert calls == [1, 1]


def test_the_oldest_entries_make_room_and_what_cannot_fit_is_decoded_in_memory(tmp_path, caplog):
    size = PIXELS.nbytes  # 7200 bytes
    cache = DecodeCache(str(tmp_path / "cache"), max_gb=2.5 * size / 1e9)
    sources = []
    for name in "abc":
        (tmp_path / f"{name}.png").write_bytes(name.encode())
        sources.append(tmp_path / f"{name}.png")
    for path in sources:
        cache.open(path, "image", lambda: PIXELS)
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 2  # a's made room for c's
    too_big = DecodeCache(str(tmp_path / "cache"), max_gb=0.5 * size / 1e9)
    with caplog.at_level(logging.WARNING):
        array = too_big.open(sources[0], "image", lambda: PIXELS)
    assert not isinstance(array, np.memmap) and np.array_equal(array, PIXELS)
    assert "a.png: not cached" in caplog.text and "decoded into memory" in caplog.text


def test_a_full_disk_trains_from_the_source(tmp_path, source, monkeypatch, caplog):
    import errno

    from segscale.data import decode_cache

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(decode_cache, "write_atomically", full)
    with caplog.at_level(logging.WARNING):
        array = DecodeCache(str(tmp_path / "cache")).open(source, "image", lambda: PIXELS)
    assert np.array_equal(array, PIXELS) and "the disk is full" in caplog.text
    assert not list((tmp_path / "cache").glob("*.npy"))


@pytest.mark.parametrize("bad", [0, -1, True, "10"])
def test_the_size_limit_is_checked(bad):
    with pytest.raises(ConfigError, match=r"datamodule.decode_cache.max_gb"):
        DecodeCache(max_gb=bad)
