"""The user's cache folder is the platform's own place, or $XDG_CACHE_HOME where given."""

from pathlib import Path, PureWindowsPath

import platformdirs
import pytest
from platformdirs.macos import MacOS
from platformdirs.unix import Unix
from platformdirs.windows import Windows

from segscale.data.storage.decode_cache import DecodeCache
from segscale.data.storage.user_cache import cache_file, cache_folder


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
