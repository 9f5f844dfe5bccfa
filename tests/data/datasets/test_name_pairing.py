from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from segscale.data.checks.dataset_problems import InvalidDatasetError
from segscale.data.checks.validation import validate_dataset
from segscale.data.classes.labels import LabelMap
from segscale.data.datasets.folder import FolderTiles


def _write(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return path


def _tiles(root: Path) -> Path:
    for stem in ("a", "b"):
        _write(root / "train" / f"{stem}.png", np.zeros((8, 8, 3), np.uint8))
        _write(root / "trainannot" / f"{stem}.png", np.zeros((8, 8), np.uint8))
    return root


def _scan(root: Path, text: str):
    (root / "train.txt").write_text(text)
    return FolderTiles(str(root), splits={"train": "train.txt"}).scan("train")


def test_a_repeated_pair_names_both_lines(tmp_path: Path):
    _tiles(tmp_path)
    listing = tmp_path / "train.txt"
    # the second line names the first's files another way: absolute, and through "./"
    _, problems = _scan(
        tmp_path,
        "train/a.png trainannot/a.png\n"
        f"{tmp_path}/train/a.png ./trainannot/a.png\n"
        "train/b.png trainannot/b.png\n",
    )
    assert len(problems) == 1
    assert problems[0].path == Path(f"{listing}:2")
    assert f"{listing}:1" in problems[0].reason and "twice" in problems[0].reason


def test_a_pair_repeated_through_a_link_is_a_repeated_pair(tmp_path: Path):
    _tiles(tmp_path)
    (tmp_path / "copy.png").symlink_to(tmp_path / "train/a.png")
    _, problems = _scan(tmp_path, "train/a.png trainannot/a.png\ncopy.png trainannot/a.png\n")
    assert [p.path for p in problems] == [Path(f"{tmp_path / 'train.txt'}:2")]


def test_one_image_with_two_masks_is_no_repeat(tmp_path: Path):
    # Two annotators' masks of one image are two pairs: not refused.
    _tiles(tmp_path)
    text = "train/a.png trainannot/a.png\ntrain/a.png trainannot/b.png\n"
    pairs, problems = _scan(tmp_path, text)
    assert problems == [] and len(pairs) == 2


@pytest.mark.parametrize(
    "text",
    [
        "trainannot/a.png trainannot/a.png\n",  # a mask as its own image
        "train/a.png trainannot/a.png\ntrainannot/a.png trainannot/b.png\n",  # another's mask
    ],
)
def test_a_mask_listed_as_an_image_is_named(tmp_path: Path, text: str):
    _tiles(tmp_path)
    _, problems = _scan(tmp_path, text)
    line = len(text.splitlines())
    assert [p.path for p in problems] == [Path(f"{tmp_path / 'train.txt'}:{line}")]
    assert f"{tmp_path / 'trainannot/a.png'}" in problems[0].reason
    assert "mask" in problems[0].reason


def test_one_folder_for_images_and_masks_pairs_each_file_with_itself_and_is_refused(
    tmp_path: Path,
):
    _tiles(tmp_path)
    split = {"train": {"images": "trainannot", "masks": "trainannot"}}
    _, problems = FolderTiles(str(tmp_path), splits=split).scan("train")
    assert len(problems) == 2
    assert all("image and its own mask" in p.reason for p in problems)


def test_the_validation_pass_refuses_a_repeated_line_naming_the_list(tmp_path: Path):
    _tiles(tmp_path)
    (tmp_path / "train.txt").write_text("train/a.png trainannot/a.png\n" * 2)
    (tmp_path / "val.txt").write_text("train/b.png trainannot/b.png\n")
    source = FolderTiles(str(tmp_path), splits={"train": "train.txt", "val": "val.txt"})
    with pytest.raises(InvalidDatasetError) as refused:
        validate_dataset(source, LabelMap(3), ("x", "y", "z"), 4, None)
    assert f"{tmp_path / 'train.txt'}:2:" in str(refused.value)


@pytest.mark.parametrize(
    "second",
    [
        "train\\a.png trainannot\\a.png",  # written on Windows
        "hard.png trainannot/a.png",  # a hard link: the same file under another name
        "train/../train/a.png trainannot/./a.png",
    ],
)
def test_a_pair_named_another_way_is_still_a_repeat(tmp_path: Path, second: str):
    _tiles(tmp_path)
    (tmp_path / "hard.png").hardlink_to(tmp_path / "train/a.png")
    _, problems = _scan(tmp_path, f"train/a.png trainannot/a.png\n{second}\n")
    assert [p.path for p in problems] == [Path(f"{tmp_path / 'train.txt'}:2")]
    assert problems[0].reason.startswith(f"repeats the pair at {tmp_path / 'train.txt'}:1")


def test_one_name_lines_naming_one_image_twice_are_a_repeat(tmp_path: Path):
    for name in ("a", "b"):
        _write(tmp_path / "images" / f"{name}.png", np.zeros((8, 8, 3), np.uint8))
        _write(tmp_path / "masks" / f"{name}.png", np.zeros((8, 8), np.uint8))
    _, problems = _scan(tmp_path, "a\nb\na.png\n")
    assert [p.path for p in problems] == [Path(f"{tmp_path / 'train.txt'}:3")]
    assert f"{tmp_path / 'train.txt'}:1" in problems[0].reason
