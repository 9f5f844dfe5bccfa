"""PNG and JPEG files decoded once per machine, memory-mapped; a bad entry is rebuilt.

The cache owns a folder of its own and deletes nothing else; a file replaced with the
same size and times is decoded again; an entry whose pixels changed is rebuilt.
"""

import errno
import json
import logging
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from segscale.data.storage import caches, decode_cache
from segscale.data.storage.decode_cache import STORE, DecodeCache
from segscale.errors import ConfigError
from tests.conftest import REPO
from tests.test_output_folder_check import as_user, unprivileged  # noqa: F401 (a fixture)


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


def records(cache: DecodeCache) -> list:
    """The entries' records in the cache's own folder."""
    return sorted(cache.store.glob("[0-9a-f]*.json"))


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
    assert cache.store == tmp_path / "cache" / STORE and len(records(cache)) == 2


def test_the_default_folder_is_private_and_one_others_can_write_is_refused(
    tmp_path, source, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    umask = os.umask(0o002)  # a umask that leaves folders group-writable
    try:
        DecodeCache().open(source, "image", lambda: PIXELS)
    finally:
        os.umask(umask)
    for folder in (tmp_path / "home/segscale", tmp_path / "home/segscale" / STORE):
        assert (folder.stat().st_mode & 0o777) == 0o700, folder
    (tmp_path / "home/segscale").chmod(0o775)
    with pytest.raises(ConfigError) as refused:
        DecodeCache().open(source, "image", lambda: PIXELS)
    assert f"the cache folder {tmp_path / 'home/segscale'} can be written by others" in str(
        refused.value
    )
    assert "chmod 700" in str(refused.value)
    assert "datamodule.decode_cache.folder=<a folder of yours>" in str(refused.value)


@pytest.mark.skipif(sys.platform == "win32", reason="no owner or mode bits on Windows")
def test_a_store_another_user_owns_or_others_can_write_is_refused(tmp_path, source, monkeypatch):
    cache = DecodeCache(str(tmp_path / "scratch"))
    cache.open(source, "image", lambda: PIXELS)
    cache.store.chmod(0o770)
    with pytest.raises(ConfigError, match=r"can be written by others \(mode 770\)"):
        DecodeCache(str(tmp_path / "scratch")).open(source, "image", lambda: PIXELS)
    cache.store.chmod(0o700)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(cache.store).st_uid + 1)
    with pytest.raises(ConfigError, match="belongs to another user"):
        DecodeCache(str(tmp_path / "scratch")).open(source, "image", lambda: PIXELS)


def test_a_folder_of_that_name_the_cache_did_not_make_is_refused(tmp_path, source):
    (tmp_path / "scratch" / STORE).mkdir(parents=True, mode=0o700)
    (tmp_path / "scratch" / STORE / "mine.txt").write_text("a user's")
    with pytest.raises(ConfigError, match=r"is not segscale's decode cache \(it holds mine\.txt"):
        DecodeCache(str(tmp_path / "scratch")).open(source, "image", lambda: PIXELS)
    # A tag of another program's is not ours either.
    (tmp_path / "scratch" / STORE / "mine.txt").unlink()
    (tmp_path / "scratch" / STORE / "CACHEDIR.TAG").write_text("Signature: 8a477f59...\n")
    with pytest.raises(ConfigError, match="not segscale's decode cache"):
        DecodeCache(str(tmp_path / "scratch")).open(source, "image", lambda: PIXELS)
    assert (tmp_path / "scratch" / STORE / "CACHEDIR.TAG").read_text().endswith("...\n")


def test_eviction_never_deletes_a_file_the_cache_did_not_write(tmp_path):
    scratch = tmp_path / "scratch"  # a node-local disk holding the user's own files
    scratch.mkdir()
    lookalike = "0123456789abcdef0123456789abcdef"
    users = {
        "results.npy": b"\x93NUMPY the user's",
        "results.json": b'{"acc": 0.9}',
        f"{lookalike}.npy": b"named like an entry",
        f"{lookalike}.json": b'{"identity": {"source": "x"}}',
        f"{lookalike}.lock": b"",
        "build-0.lock": b"",
        ".results.json.abcd1234.tmp": b"named like a temporary",
    }
    for name, data in users.items():
        (scratch / name).write_bytes(data)
    size = PIXELS.nbytes
    cache = DecodeCache(str(scratch), max_gb=1.5 * size / 1e9)  # room for one entry
    sources = []
    for i in range(6):
        sources.append(tmp_path / f"t{i}.png")
        sources[-1].write_bytes(f"stands for PNG {i}".encode())
    cache.open(sources[0], "image", lambda: PIXELS)
    # In the cache's own folder: files named like entries that the cache did not write.
    inside = {
        f"{lookalike}.json": b'{"identity": {"format": 2, "source": "/elsewhere"}}',
        f"{lookalike}.npy": b"not an entry's array",
        "fedcba9876543210fedcba9876543210.npy": b"an array without a record",
        "notes.txt": b"the user's notes",
        "results.json": b"{}",  # beside an array larger than the limit: no entry, not counted
        "results.npy": bytes(2 * size),
    }
    for name, data in inside.items():
        (cache.store / name).write_bytes(data)
    for path in sources[1:] + sources[:2]:  # each one evicts the one before it
        assert isinstance(cache.open(path, "image", lambda: PIXELS), np.memmap)
    for name, data in users.items():
        assert (scratch / name).read_bytes() == data, name
    for name, data in inside.items():
        assert (cache.store / name).read_bytes() == data, name
    ours = [r for r in records(cache) if r.stem != lookalike]
    assert len(ours) == 1  # the cache did evict its own entries, six times
    assert sorted(p.name for p in scratch.iterdir()) == sorted([*users, STORE])


def test_the_locks_are_few_and_shared_not_one_left_per_entry(tmp_path):
    cache = DecodeCache(str(tmp_path / "cache"), max_gb=1.5 * PIXELS.nbytes / 1e9)
    for i in range(40):
        (tmp_path / f"t{i}.png").write_bytes(f"stands for PNG {i}".encode())
        cache.open(tmp_path / f"t{i}.png", "image", lambda: PIXELS)
    locks = sorted(p.name for p in cache.store.glob("*.lock"))
    assert len(records(cache)) == 1 and 0 < len(locks) <= 16
    assert all(len(name) == len("build-0.lock") for name in locks)


def test_a_hit_makes_an_entry_the_most_recently_used(tmp_path):
    cache = DecodeCache(str(tmp_path / "cache"), max_gb=2.5 * PIXELS.nbytes / 1e9)
    paths = {}
    for name in "abc":
        paths[name] = tmp_path / f"{name}.png"
        paths[name].write_bytes(name.encode())
    decode, calls = counted(PIXELS)
    cache.open(paths["a"], "image", decode)
    cache.open(paths["b"], "image", decode)
    cache.open(paths["a"], "image", decode)  # a hit: a is now used after b
    cache.open(paths["c"], "image", decode)  # room for two: b, used longest ago, goes
    assert len(calls) == 3
    cache.open(paths["a"], "image", decode)
    assert len(calls) == 3  # a was kept
    cache.open(paths["b"], "image", decode)
    assert len(calls) == 4  # b was evicted


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


def damage_truncated(record):
    data = record.with_suffix(".npy")
    data.write_bytes(data.read_bytes()[:-100])


def damage_record(record):
    record.write_text("{half a rec")


def damage_shape(record):
    entry = json.loads(record.read_text())
    entry["shape"] = [30, 40, 3]
    record.write_text(json.dumps(entry))


def damage_missing_record(record):
    record.unlink()


def damage_missing_array(record):
    record.with_suffix(".npy").unlink()


def damage_pixels(record):
    """One pixel changed in place: same size, same shape, same header."""
    data = bytearray(record.with_suffix(".npy").read_bytes())
    data[-1] ^= 0x01
    record.with_suffix(".npy").write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        damage_truncated,
        damage_record,
        damage_shape,
        damage_missing_record,
        damage_missing_array,
        damage_pixels,
    ],
)
def test_a_damaged_or_partial_entry_is_rebuilt_never_read(tmp_path, source, damage):
    cache = DecodeCache(str(tmp_path / "cache"))
    decode, calls = counted(PIXELS)
    cache.open(source, "image", decode)
    (record,) = records(cache)
    damage(record)
    np.testing.assert_array_equal(cache.open(source, "image", decode), PIXELS)
    assert calls == [1, 1]
    np.testing.assert_array_equal(cache.open(source, "image", decode), PIXELS)
    assert calls == [1, 1]  # rebuilt whole: mapped from then on


def test_a_zeroed_cached_mask_is_found_and_rebuilt_from_the_png(tmp_path, caplog):
    mask = np.random.default_rng(0).integers(0, 5, (64, 48), dtype=np.uint8)
    path = tmp_path / "v1.png"
    Image.fromarray(mask).save(path)
    cache = DecodeCache(str(tmp_path / "cache"))
    cache.open(path, "mask", lambda: np.asarray(Image.open(path)))
    (record,) = records(cache)
    array_file = record.with_suffix(".npy")
    entry = np.load(array_file, mmap_mode="r+")
    entry[:] = 0  # every pixel one class: same shape, same size, same header
    entry.flush()
    del entry
    with caplog.at_level(logging.WARNING):
        mapped = DecodeCache(str(tmp_path / "cache")).open(
            path, "mask", lambda: np.asarray(Image.open(path))
        )
    np.testing.assert_array_equal(mapped, mask)
    assert isinstance(mapped, np.memmap)  # the rebuilt entry, mapped
    assert f"{path}: its entry in the decode cache ({array_file})" in caplog.text
    assert "no longer matches the digest of the pixels" in caplog.text


def test_a_changed_source_is_decoded_again(tmp_path, source):
    cache = DecodeCache(str(tmp_path / "cache"))
    decode, calls = counted(PIXELS)
    cache.open(source, "image", decode)
    source.write_bytes(b"another PNG, longer than the first")
    cache.open(source, "image", decode)
    assert calls == [1, 1]


def replace_keeping_size_and_times(path, other):
    """``cp -p other path``: another content, the same size, the old mtime put back."""
    before = path.stat()
    time.sleep(0.02)  # past a tick of the kernel's coarse clock, which stamps the change time
    shutil.copy2(other, path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


@pytest.mark.parametrize("change_time", [True, False], ids=["change time", "content digest"])
def test_a_file_replaced_with_the_same_size_and_mtime_is_decoded_again(
    tmp_path, monkeypatch, change_time
):
    # Without a change time (Windows), the identity holds a digest of the content.
    monkeypatch.setattr(caches, "has_change_time", lambda: change_time)
    rng = np.random.default_rng(0)
    old, new = (rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(2))
    path, replacement = tmp_path / "t.png", tmp_path / "new/t.png"
    replacement.parent.mkdir()
    Image.fromarray(old).save(path, compress_level=0)  # uncompressed: the size is the shape's
    Image.fromarray(new).save(replacement, compress_level=0)
    assert path.stat().st_size == replacement.stat().st_size
    cache = DecodeCache(str(tmp_path / "cache"))
    read = lambda: np.asarray(Image.open(path))  # noqa: E731
    np.testing.assert_array_equal(cache.open(path, "image", read), old)
    replace_keeping_size_and_times(path, replacement)
    np.testing.assert_array_equal(cache.open(path, "image", read), new)


def entry_key(cache: DecodeCache, source) -> str:
    """The key of ``source``'s entry, from the records in the cache's folder."""
    for record in records(cache):
        if json.loads(record.read_text())["identity"]["source"] == str(source.resolve()):
            return record.stem
    raise AssertionError(f"no entry of {source}")


def mapped_elsewhere(monkeypatch, keys: set[str], suffix: str = ".npy") -> None:
    """Deleting entries ``keys``' files fails, as on Windows while another process maps them."""
    unlink = Path.unlink

    def refused(path, missing_ok=False):
        if path.stem in keys and path.suffix == suffix:
            raise PermissionError(
                13,
                "The process cannot access the file because it is being used by another process",
                str(path),
            )
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refused)


def whole_entries(cache: DecodeCache) -> set[str]:
    """The keys of entries with both their record and their array; no array lacks its record."""
    arrays = {p.stem for p in cache.store.glob("[0-9a-f]*.npy")}
    assert arrays <= {r.stem for r in records(cache)}  # never an array without its record
    return arrays


def test_an_entry_in_use_is_left_whole_for_a_later_eviction(tmp_path, monkeypatch, caplog):
    cache = DecodeCache(str(tmp_path / "cache"), max_gb=2.5 * PIXELS.nbytes / 1e9)  # room for 2
    paths = []
    for name in "abcd":
        paths.append(tmp_path / f"{name}.png")
        paths[-1].write_bytes(name.encode())
    decode, calls = counted(PIXELS)
    cache.open(paths[0], "image", decode)
    cache.open(paths[1], "image", decode)
    a = entry_key(cache, paths[0])
    mapped_elsewhere(monkeypatch, {a})
    assert np.array_equal(cache.open(paths[2], "image", decode), PIXELS)  # b made room
    c = entry_key(cache, paths[2])
    assert whole_entries(cache) == {a, c} and len(calls) == 3  # b's went
    mapped_elsewhere(monkeypatch, {a, c})  # every entry in use: c's decoded into memory
    with caplog.at_level(logging.WARNING):
        assert np.array_equal(cache.open(paths[3], "image", decode), PIXELS)
    assert "d.png: not cached" in caplog.text and "the entries in use fill" in caplog.text
    assert whole_entries(cache) == {a, c} and len(calls) == 4
    for path in paths[::2]:  # what was in use is still there, and read from the cache
        assert np.array_equal(cache.open(path, "image", decode), PIXELS)
    assert len(calls) == 4
    monkeypatch.undo()  # no longer mapped: the next eviction takes the oldest, a
    cache.open(paths[3], "image", decode)
    assert whole_entries(cache) == {c, entry_key(cache, paths[3])}


def test_a_record_that_outlives_its_array_is_no_entry_and_goes_later(tmp_path, monkeypatch):
    cache = DecodeCache(str(tmp_path / "cache"), max_gb=1.5 * PIXELS.nbytes / 1e9)  # room for 1
    a_path, b_path = tmp_path / "a.png", tmp_path / "b.png"
    a_path.write_bytes(b"a")
    b_path.write_bytes(b"b")
    decode, calls = counted(PIXELS)
    cache.open(a_path, "image", decode)
    a = entry_key(cache, a_path)
    mapped_elsewhere(monkeypatch, {a}, suffix=".json")  # its record is being read
    cache.open(b_path, "image", decode)
    assert whole_entries(cache) == {entry_key(cache, b_path)}  # a's array went, b fits
    assert (cache.store / f"{a}.json").is_file()  # its record stayed: it vouches for nothing
    monkeypatch.undo()
    assert np.array_equal(cache.open(a_path, "image", decode), PIXELS)
    assert len(calls) == 3  # decoded again, not read from an entry without an array
    assert [r.stem for r in records(cache)] == [a]  # b made room for a, its record with it


def test_the_oldest_entries_make_room_and_what_cannot_fit_is_decoded_in_memory(tmp_path, caplog):
    size = PIXELS.nbytes  # 7200 bytes
    cache = DecodeCache(str(tmp_path / "cache"), max_gb=2.5 * size / 1e9)
    sources = []
    for name in "abcdef":
        (tmp_path / f"{name}.png").write_bytes(name.encode())
        sources.append(tmp_path / f"{name}.png")
    for path in sources[:3]:
        cache.open(path, "image", lambda: PIXELS)
    assert len(list(cache.store.glob("*.npy"))) == 2  # a's made room for c's
    too_big = DecodeCache(str(tmp_path / "cache"), max_gb=0.5 * size / 1e9)
    with caplog.at_level(logging.WARNING):
        arrays = [too_big.open(path, "image", lambda: PIXELS) for path in sources[3:]]
    for array in arrays:
        assert not isinstance(array, np.memmap) and np.array_equal(array, PIXELS)
    assert "d.png: not cached" in caplog.text and "decoded into memory" in caplog.text
    assert "raise datamodule.decode_cache.max_gb (now 3.6e-06)" in caplog.text
    assert len(caplog.records) == 1  # once for the cache, not once a file


def test_a_full_disk_trains_from_the_source(tmp_path, source, monkeypatch, caplog):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(decode_cache, "write_atomically", full)
    with caplog.at_level(logging.WARNING):
        array = DecodeCache(str(tmp_path / "cache")).open(source, "image", lambda: PIXELS)
    assert np.array_equal(array, PIXELS) and "the disk is full" in caplog.text
    assert "datamodule.decode_cache.folder=<a folder on a disk with room>" in caplog.text
    assert "max_gb" not in caplog.text
    assert not list((tmp_path / "cache").rglob("*.npy"))


def test_a_folder_that_is_a_file_warns_once_and_says_so(tmp_path, caplog):
    (tmp_path / "cache").write_text("a file, not a folder")
    cache = DecodeCache(str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING):
        for name in "abc":
            (tmp_path / f"{name}.png").write_bytes(name.encode())
            assert np.array_equal(cache.open(tmp_path / f"{name}.png", "x", lambda: PIXELS), PIXELS)
    (warning,) = caplog.records
    assert f"the decode cache's folder {tmp_path / 'cache'} is not a folder" in warning.message
    assert "datamodule.decode_cache.folder=<a writable folder>" in warning.message
    assert "datamodule.decode_cache=null" in warning.message
    assert "max_gb" not in warning.message


def test_a_read_only_folder_warns_once_and_says_so(unprivileged):  # noqa: F811 (the fixture)
    for name in "abcd":
        (unprivileged / f"{name}.png").write_bytes(name.encode())
    script = (
        "import sys, numpy as np; from pathlib import Path; "
        "from segscale.data.storage.decode_cache import DecodeCache; "
        "cache = DecodeCache(sys.argv[1]); "
        "print([type(cache.open(Path(sys.argv[2]) / f'{n}.png', 'x', lambda: np.zeros(3))).__name__"
        " for n in 'abcd'])"
    )
    # A cache that cannot be written serves the entries it holds; a folder where none
    # can be made serves none. Either says so once, not once a file.
    filled = DecodeCache(str(unprivileged / "filled"))
    filled.open(unprivileged / "a.png", "x", lambda: np.zeros(3))
    filled.store.chmod(0o500)
    for folder, served in (("filled", "MappedArray"), ("read_only", "ndarray")):
        done = as_user(
            [sys.executable, "-c", script, str(unprivileged / folder), str(unprivileged)], REPO
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == str([served, "ndarray", "ndarray", "ndarray"])
        assert done.stderr.count("cannot be written") == 1, done.stderr
        assert "Permission denied" in done.stderr and "max_gb" not in done.stderr
        assert "datamodule.decode_cache.folder=<a writable folder>" in done.stderr


@pytest.mark.parametrize("bad", [0, -1, True, "10"])
def test_the_size_limit_is_checked(bad):
    with pytest.raises(ConfigError, match=r"datamodule.decode_cache.max_gb"):
        DecodeCache(max_gb=bad)


def test_filling_the_cache_counts_its_folder_once_not_once_per_entry(tmp_path, monkeypatch):
    # Counting the entries' bytes for every new entry made filling a cache quadratic in
    # its entries (issue 49); the limit still holds, as the tests above show.
    cache = DecodeCache(str(tmp_path / "cache"), max_gb=100 * PIXELS.nbytes / 1e9)
    counts = []
    real = decode_cache._entries
    monkeypatch.setattr(decode_cache, "_entries", lambda store: counts.append(1) or real(store))
    decode, calls = counted(PIXELS)
    for index in range(30):
        path = tmp_path / f"{index}.png"
        path.write_bytes(str(index).encode())
        cache.open(path, "image", decode)
    assert len(calls) == 30 and len(records(cache)) == 30
    assert len(counts) <= 2  # the first entry's, and one more should a second pass
    monkeypatch.setattr(decode_cache, "RECOUNT_S", 0.0)  # a count is never recent: each counts
    path = tmp_path / "one more.png"
    path.write_bytes(b"more")
    cache.open(path, "image", decode)
    assert len(counts) <= 3


def test_a_count_older_than_recount_s_sees_what_another_process_wrote(tmp_path, monkeypatch):
    room_for_two = 2.5 * PIXELS.nbytes / 1e9
    ours, theirs = (DecodeCache(str(tmp_path / "cache"), max_gb=room_for_two) for _ in "ab")
    decode, _ = counted(PIXELS)
    paths = []
    for name in "abc":
        paths.append(tmp_path / f"{name}.png")
        paths[-1].write_bytes(name.encode())
    ours.open(paths[0], "image", decode)  # counted: one entry
    theirs.open(paths[1], "image", decode)  # another process's: two, the limit reached
    monkeypatch.setattr(decode_cache, "RECOUNT_S", 0.0)
    ours.open(paths[2], "image", decode)  # counted again: the oldest makes room
    assert whole_entries(ours) == {entry_key(ours, p) for p in paths[1:]}
