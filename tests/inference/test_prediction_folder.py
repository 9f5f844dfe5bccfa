import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from segscale.errors import ConfigError
from segscale.inference.prediction_folder import prediction_folder, unexpected_entries
from segscale.runs.folder import RunFolderBusyError, RunFolderLock


def _folder(root: Path, files: tuple[str, ...] = (), folders: tuple[str, ...] = ()) -> Path:
    root.mkdir()
    for name in folders:
        (root / name).mkdir()
    for name in files:
        (root / name).write_text("")
    return root


def test_a_folder_a_prediction_left_before_its_first_mask_is_fresh(tmp_path: Path):
    assert unexpected_entries(_folder(tmp_path / "new")) == []
    left = _folder(tmp_path / "left", files=(".lock", "predict.log"), folders=(".hydra",))
    assert unexpected_entries(left) == []


@pytest.mark.parametrize(
    ("files", "folders", "found"),
    [
        (("a.png", "a_overlay.png", "predict.log"), (".hydra",), ["a.png", "a_overlay.png"]),
        (("a.tif", "a.tfw"), (), ["a.tfw", "a.tif"]),
        (("notes.txt", ".hidden"), (), [".hidden", "notes.txt"]),
        ((".hydra",), (), [".hydra"]),  # the records' name, but a file
        ((), (".lock",), [".lock/"]),  # the lock's name, but a folder
        ((), ("predict.log",), ["predict.log/"]),  # a log's name, but a folder
        ((), ("masks",), ["masks/"]),  # a folder input's outputs, in subfolders
        (("predict.log.png",), (), ["predict.log.png"]),
    ],
)
def test_anything_else_in_the_folder_is_named(tmp_path, files, folders, found):
    assert unexpected_entries(_folder(tmp_path / "out", files, folders)) == found


def test_links_under_the_allowed_names_are_not_taken_for_them(tmp_path: Path):
    elsewhere = _folder(tmp_path / "elsewhere", files=("x",))
    folder = _folder(tmp_path / "out")
    os.symlink(elsewhere, folder / ".hydra")
    os.symlink(elsewhere / "x", folder / "predict.log")
    os.symlink(elsewhere / "x", folder / ".lock")
    assert unexpected_entries(folder) == [".hydra/", ".lock", "predict.log"]


def test_a_folder_with_another_prediction_s_masks_is_refused_before_the_prediction(tmp_path):
    folder = _folder(tmp_path / "out", files=("wide.png",))
    cfg = OmegaConf.create({"output_dir": str(folder)})
    refused = pytest.raises(ConfigError, match=r"out already holds 1 file\(s\) or folder")
    with refused, prediction_folder(cfg):
        pytest.fail("predicted into a folder holding another prediction's masks")
    assert sorted(p.name for p in folder.iterdir()) == ["wide.png"]  # the lock is gone


def test_a_folder_another_prediction_holds_is_refused_naming_it(tmp_path: Path):
    folder = tmp_path / "out"
    cfg = OmegaConf.create({"output_dir": str(folder)})
    busy = pytest.raises(RunFolderBusyError, match=rf"{folder} is in use by another prediction")
    with RunFolderLock(folder, what="prediction"), busy, prediction_folder(cfg):
        pytest.fail("two predictions held one folder")
    with prediction_folder(cfg) as held:  # free again
        assert held == folder and (folder / ".lock").is_file()
    assert list(folder.iterdir()) == []
