"""The user's cache folder is the platform's own place, or $XDG_CACHE_HOME where given.

A file's identity changes with its content, whatever size and times a copy keeps.
"""

import os
import shutil
import time
from pathlib import Path, PureWindowsPath

import platformdirs
import pytest
from platformdirs.macos import MacOS
from platformdirs.unix import Unix
from platformdirs.windows import Windows

from segscale.data.storage import caches
from segscale.data.storage.caches import cache_file, cache_folder, content_digest
from segscale.data.storage.decode_cache import DecodeCache


@pytest.fixture
def no_xdg(monkeypatch, tmp_path):
    """No XDG_CACHE_HOME, and a home of the test's."""
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_linux_keeps_it_in_dot_cache(no_xdg, monkeypatch):
    monkeypatch.setattr(platformdirs, "PlatformDirs", Unix)
    assert cache_folder() == no_xdg / ".cache" / "segscale"


def test_macos_keeps_it_in_library_caches(no_xdg, monkeypatch):
    monkeypatch.setattr(platformdirs, "PlatformDirs", MacOS)
    assert cache_folder() == no_xdg / "Library" / "Caches" / "segscale"


def test_windows_keeps_it_in_local_appdata(no_xdg, monkeypatch):
    monkeypatch.setattr(platformdirs, "PlatformDirs", Windows)
    # What Windows' shell names the folder (SHGetKnownFolderPath, asked through ctypes)
    local = {"CSIDL_LOCAL_APPDATA": r"C:\Users\me\AppData\Local"}
    monkeypatch.setattr(platformdirs.windows, "get_win_folder", local.__getitem__)
    expected = PureWindowsPath(r"C:\Users\me\AppData\Local\segscale\Cache")
    assert PureWindowsPath(cache_folder()) == expected  # no author folder
    assert PureWindowsPath(cache_file("validation", "x")).parent == expected / "validation"


@pytest.mark.parametrize("platform", [Unix, MacOS, Windows])
def test_xdg_cache_home_wins_on_every_platform(platform, monkeypatch, tmp_path):
    monkeypatch.setattr(platformdirs, "PlatformDirs", platform)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder() == tmp_path / "xdg" / "segscale"
    assert DecodeCache().store == tmp_path / "xdg" / "segscale" / "segscale-decoded"


def test_a_relative_xdg_cache_home_is_ignored(no_xdg, monkeypatch):
    monkeypatch.setattr(platformdirs, "PlatformDirs", Unix)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid by the specification
    assert cache_folder() == no_xdg / ".cache" / "segscale"


def test_the_validation_cache_and_the_decode_cache_share_it(no_xdg, monkeypatch):
    monkeypatch.setattr(platformdirs, "PlatformDirs", MacOS)
    folder = no_xdg / "Library" / "Caches" / "segscale"
    assert Path(cache_file("validation", "x")).parent == folder / "validation"
    assert DecodeCache().store == folder / "segscale-decoded"


@pytest.fixture(params=[True, False], ids=["change time", "content digest"])
def change_time(request, monkeypatch) -> bool:
    """Each test runs as on POSIX (inode change time) and as on Windows (a digest)."""
    monkeypatch.setattr(caches, "has_change_time", lambda: request.param)
    return request.param


def test_an_untouched_file_keeps_its_identity(tmp_path, change_time):
    path = tmp_path / "t.png"
    path.write_bytes(b"pixels")
    assert caches.source_identity(path) == caches.source_identity(path)
    assert len(caches.source_identity(path)) == 4


def test_content_replaced_with_the_same_size_and_mtime_changes_the_identity(tmp_path, change_time):
    path, other = tmp_path / "t.png", tmp_path / "other.png"
    path.write_bytes(b"old pixels")
    other.write_bytes(b"new pixels")
    before = path.stat()
    identity = caches.source_identity(path)
    time.sleep(0.02)  # past a tick of the kernel's coarse clock, which stamps the change time
    shutil.copy2(other, path)  # in place: the same inode
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ino,
    )
    assert caches.source_identity(path) != identity


def test_a_file_renamed_into_place_is_another(tmp_path, change_time):
    # rsync -t: a new file, renamed over the old, with the old times given to it.
    path, temporary = tmp_path / "t.png", tmp_path / ".t.png.tmp"
    path.write_bytes(b"old pixels")
    before = path.stat()
    identity = caches.source_identity(path)
    temporary.write_bytes(b"new pixels")
    os.utime(temporary, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(temporary, path)
    assert caches.source_identity(path) != identity


def test_the_digest_reads_the_whole_file_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(caches, "_CHUNK", 7)
    path = tmp_path / "t.png"
    path.write_bytes(bytes(range(100)))
    first = content_digest(path)
    path.write_bytes(bytes(range(99)) + b"\xff")  # only the last byte differs
    assert content_digest(path) != first
