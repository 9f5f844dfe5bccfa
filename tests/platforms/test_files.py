import os
import sys

import pytest

from segscale.platforms import files


@pytest.fixture(params=["linux", "win32"])
def platform(request, monkeypatch):
    """This platform's branch, and Windows' where it only calls what Linux has too."""
    monkeypatch.setattr(sys, "platform", request.param)
    return request.param


def test_reads_and_writes_at_an_offset_on_each_branch(tmp_path, platform):
    path = tmp_path / "record"
    path.write_bytes(b"0123456789")
    fd = os.open(path, os.O_RDWR)
    try:
        files.write_at(fd, b"ab", 4)
        assert files.read_at(fd, 3, 3) == b"3ab"
        assert files.read_at(fd, 100, 8) == b"89"
    finally:
        os.close(fd)
    assert path.read_bytes() == b"0123ab6789"


def test_a_folder_opens_where_the_system_can_open_one(tmp_path, platform):
    fd = files.open_folder(tmp_path)
    if platform == "win32":
        assert fd is None
    else:
        assert fd is not None
        os.close(fd)


def test_a_link_is_not_followed_where_the_system_can_refuse_to(tmp_path, platform):
    (tmp_path / "target").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    if platform == "win32":  # no O_NOFOLLOW there: the link opens as its target
        os.close(files.open_unfollowed(tmp_path / "link"))
    else:
        with pytest.raises(OSError):
            files.open_unfollowed(tmp_path / "link")
    os.close(files.open_unfollowed(tmp_path / "target"))


def test_a_lock_is_exclusive_until_released(tmp_path):
    path = tmp_path / "locked"
    path.write_bytes(b"")
    first, second = os.open(path, os.O_RDONLY), os.open(path, os.O_RDONLY)
    try:
        assert files.lock(first, wait=False)
        assert not files.lock(second, wait=False)  # another open file: held
        files.unlock(first)
        assert files.lock(second, wait=False)
    finally:
        os.close(first)
        os.close(second)


def test_a_case_sensitive_file_system_is_found_so(tmp_path):
    folder = tmp_path / "Masks"
    folder.mkdir()
    assert not files.folds_case(folder)  # Linux's: masks/ is another name
    (tmp_path / "mASKS").mkdir()
    assert not files.folds_case(folder)  # and another folder


def test_a_file_system_that_finds_names_in_any_case_is_found_so(tmp_path, monkeypatch):
    folder = tmp_path / "Masks"
    folder.mkdir()
    asked = []

    def same_in_any_case(a, b):  # what NTFS and APFS answer
        asked.append((a, b))
        return str(a).casefold() == str(b).casefold()

    monkeypatch.setattr(files.os.path, "samefile", same_in_any_case)
    assert files.folds_case(folder)
    assert asked == [(folder, tmp_path / "mASKS")]


@pytest.mark.parametrize(
    ("platform", "folds"), [("linux", False), ("darwin", True), ("win32", True)]
)
def test_without_a_name_to_ask_by_the_platform_s_default(tmp_path, monkeypatch, platform, folds):
    monkeypatch.setattr(sys, "platform", platform)
    assert files.folds_case(tmp_path / "gone" / "123") is folds  # gone: nothing to ask
    assert files.folds_case(type(tmp_path)("/")) is folds  # no name with a case
