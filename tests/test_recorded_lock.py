import json
import os
import sys

from segscale.platforms import files
from segscale.recorded_lock import RecordedLock, flock_works


def test_the_record_starts_after_the_bytes_windows_locks_against_readers(tmp_path):
    lock = RecordedLock(tmp_path / ".lock")
    lock.acquire()
    try:
        record = (tmp_path / ".lock").read_bytes()
        assert record[: files.LOCKED_BYTES] == b"\n" * files.LOCKED_BYTES
        assert json.loads(record[files.LOCKED_BYTES :])["pid"] == os.getpid()
    finally:
        lock.release()


def test_the_holder_is_read_without_the_locked_bytes(tmp_path):
    # What a reader cannot read of a file Windows has locked (its first byte) is not needed
    # to name the holder.
    facts = {"pid": 4321, "host": "node7", "started": "2026-01-01T00:00:00+00:00"}
    (tmp_path / ".lock").write_bytes(b"\x00" + json.dumps(facts).encode())
    holder = RecordedLock(tmp_path / ".lock").holder()
    assert holder == "pid 4321 on host node7, started 2026-01-01T00:00:00+00:00"


def test_on_windows_the_lock_deletes_its_own_file_and_folders_are_not_probed(tmp_path, monkeypatch):
    # filelock's Windows lock deletes its file on release, and Windows deletes no file
    # that is open: the file is left to it. Native locks work on every file system
    # Windows writes to; it opens no folder to probe.
    monkeypatch.setattr(sys, "platform", "win32")
    assert flock_works(tmp_path)
    lock = RecordedLock(tmp_path / ".lock")
    lock.acquire()
    lock.release()
    assert (tmp_path / ".lock").exists()  # left to filelock (whose lock here is flock's)
    monkeypatch.setattr(sys, "platform", "linux")
    lock.acquire()
    lock.release()
    assert not (tmp_path / ".lock").exists()  # deleted: the folder is as it was
