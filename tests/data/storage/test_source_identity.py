"""A file's identity changes with its content, whatever size and times a copy keeps."""

import os
import shutil
import time

import pytest

from segscale.data.storage import source_identity
from segscale.data.storage.source_identity import content_digest


@pytest.fixture(params=[True, False], ids=["change time", "content digest"])
def change_time(request, monkeypatch) -> bool:
    """Each test runs as on POSIX (inode change time) and as on Windows (a digest)."""
    monkeypatch.setattr(source_identity, "has_change_time", lambda: request.param)
    return request.param


def test_an_untouched_file_keeps_its_identity(tmp_path, change_time):
    path = tmp_path / "t.png"
    path.write_bytes(b"pixels")
    assert source_identity.source_identity(path) == source_identity.source_identity(path)
    assert len(source_identity.source_identity(path)) == 4


def test_content_replaced_with_the_same_size_and_mtime_changes_the_identity(tmp_path, change_time):
    path, other = tmp_path / "t.png", tmp_path / "other.png"
    path.write_bytes(b"old pixels")
    other.write_bytes(b"new pixels")
    before = path.stat()
    identity = source_identity.source_identity(path)
    time.sleep(0.02)  # past a tick of the kernel's coarse clock, which stamps the change time
    shutil.copy2(other, path)  # in place: the same inode
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ino,
    )
    assert source_identity.source_identity(path) != identity


def test_a_file_renamed_into_place_is_another(tmp_path, change_time):
    # rsync -t: a new file, renamed over the old, with the old times given to it.
    path, temporary = tmp_path / "t.png", tmp_path / ".t.png.tmp"
    path.write_bytes(b"old pixels")
    before = path.stat()
    identity = source_identity.source_identity(path)
    temporary.write_bytes(b"new pixels")
    os.utime(temporary, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(temporary, path)
    assert source_identity.source_identity(path) != identity


def test_the_digest_reads_the_whole_file_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(source_identity, "_CHUNK", 7)
    path = tmp_path / "t.png"
    path.write_bytes(bytes(range(100)))
    first = content_digest(path)
    path.write_bytes(bytes(range(99)) + b"\xff")  # only the last byte differs
    assert content_digest(path) != first
