"""Splits given as trees: images/ and masks/ folders side by side at any depth (Dubai's tiles)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from segscale.data.datasets.folder import FolderTiles
from segscale.errors import ConfigError


def _write(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return path


def _tile(root: Path, tile: str, parts: int = 2, images: str = "images", masks: str = "masks"):
    """``<tile>/images/image_part_00N.jpg`` ↔ ``<tile>/masks/image_part_00N.png``."""
    for part in range(1, parts + 1):
        _write(root / tile / images / f"image_part_{part:03}.jpg", np.zeros((8, 8, 3), np.uint8))
        _write(root / tile / masks / f"image_part_{part:03}.png", np.zeros((8, 8, 3), np.uint8))


def _dubai(root: Path, tiles: tuple[int, ...] = (1, 2, 3)) -> Path:
    for tile in tiles:
        _tile(root, f"Tile {tile}")
    return root


def _keys(source: FolderTiles, split: str, root: Path) -> list[str]:
    pairs, problems = source.scan(split)
    assert problems == [], problems
    return [f"{p.image.relative_to(root).as_posix()} {p.mask.name}" for p in pairs]


def test_a_tree_of_tiles_pairs_each_tiles_folders_with_names_repeated(tmp_path: Path):
    root = _dubai(tmp_path / "Semantic segmentation dataset", (1, 2, 10))
    source = FolderTiles(str(root), splits={"train": {"tree": "."}})
    # Natural order (Tile 2 before Tile 10); each image with the mask of its own tile.
    assert _keys(source, "train", root) == [
        f"Tile {t}/images/image_part_00{i}.jpg image_part_00{i}.png"
        for t in (1, 2, 10)
        for i in (1, 2)
    ]
    pairs = source.pairs("train")
    assert all(p.image.parent.parent == p.mask.parent.parent for p in pairs)
    # A subfolder of the root is a tree too: one tile alone.
    one = FolderTiles(str(root), splits={"val": {"tree": "Tile 2"}})
    assert [p.image.parent.parent.name for p in one.pairs("val")] == ["Tile 2", "Tile 2"]


def test_a_tree_pairs_at_any_depth_and_under_other_folder_names(tmp_path: Path):
    _tile(tmp_path, "2019/zone a", 1, "rgb", "labels")
    _tile(tmp_path, "2020", 1, "rgb", "labels")
    _write(tmp_path / "2020/rgb/more/image_part_009.jpg", np.zeros((8, 8, 3), np.uint8))
    _write(tmp_path / "2020/labels/more/image_part_009.png", np.zeros((8, 8), np.uint8))
    source = FolderTiles(
        str(tmp_path), splits={"train": {"tree": ".", "images": "rgb", "masks": "labels"}}
    )
    assert _keys(source, "train", tmp_path) == [
        "2019/zone a/rgb/image_part_001.jpg image_part_001.png",
        "2020/rgb/image_part_001.jpg image_part_001.png",
        "2020/rgb/more/image_part_009.jpg image_part_009.png",
    ]
    renamed = FolderTiles(str(tmp_path), images="rgb", masks="labels", splits={"t": {"tree": "."}})
    assert len(renamed.pairs("t")) == 3  # the source's folder names, without the split's


def test_a_list_names_keys_folders_or_image_paths_and_except_takes_the_rest(tmp_path: Path):
    root = _dubai(tmp_path / "dubai", (1, 2, 3, 4))
    (root / "val.txt").write_text(
        "Tile 3\n"  # a folder of the tree: both its pairs, spaces unquoted
        "Tile 1/image_part_002  # a key\n"
        "'Tile 2/images/image_part_001.jpg'\n"  # the image's path, in quotes
        "./Tile 4/image_part_001.png/\n"
    )
    splits = {"train": {"tree": ".", "except": "val"}, "val": {"tree": ".", "list": "val.txt"}}
    source = FolderTiles(str(root), splits=splits)
    assert _keys(source, "val", root) == [
        "Tile 3/images/image_part_001.jpg image_part_001.png",
        "Tile 3/images/image_part_002.jpg image_part_002.png",
        "Tile 1/images/image_part_002.jpg image_part_002.png",
        "Tile 2/images/image_part_001.jpg image_part_001.png",
        "Tile 4/images/image_part_001.jpg image_part_001.png",
    ]
    assert _keys(source, "train", root) == [
        "Tile 1/images/image_part_001.jpg image_part_001.png",
        "Tile 2/images/image_part_002.jpg image_part_002.png",
        "Tile 4/images/image_part_002.jpg image_part_002.png",
    ]


def test_a_tree_lists_lines_that_name_nothing_or_a_pair_twice_are_problems(tmp_path: Path):
    root = _dubai(tmp_path / "dubai")
    (root / "val.txt").write_text("Tile 9\nTile 3\nTile 3/image_part_001\n'Tile 1\n")
    source = FolderTiles(str(root), splits={"val": {"tree": ".", "list": "val.txt"}})
    pairs, problems = source.scan("val")
    assert [p.image.parent.parent.name for p in pairs] == ["Tile 3"] * 3
    lines = [(str(p.path).rsplit(":", 1)[1], p.reason) for p in problems]
    assert lines[0] == ("1", f"'Tile 9' is no key, image or folder of the tree {root} "
                        "(its keys are such as 'Tile 1/image_part_001')")  # fmt: skip
    assert lines[1][0] == "4" and lines[1][1].startswith("the quote ' at column 1 is not closed")
    assert lines[2][0] == "3" and lines[2][1].startswith("repeats the pair at ")
    assert f"{root}/val.txt:2" in lines[2][1]


def test_one_key_from_two_folders_of_a_tree_is_refused_naming_both(tmp_path: Path):
    _write(tmp_path / "a/images/b/c.jpg", np.zeros((8, 8, 3), np.uint8))
    _write(tmp_path / "a/masks/b/c.png", np.zeros((8, 8), np.uint8))
    _write(tmp_path / "a/b/images/c.jpg", np.zeros((8, 8, 3), np.uint8))
    _write(tmp_path / "a/b/masks/c.png", np.zeros((8, 8), np.uint8))
    pairs, problems = FolderTiles(str(tmp_path), splits={"t": {"tree": "."}}).scan("t")
    assert [p.image for p in pairs] == [tmp_path / "a/images/b/c.jpg"]
    (problem,) = problems
    assert problem.path == tmp_path / "a/b/images/c.jpg"
    assert problem.reason.startswith(f"its key 'a/b/c' is also that of {tmp_path}/a/images/b/c.jpg")


def test_a_folder_without_its_partner_and_a_tree_without_any_are_said(tmp_path: Path):
    _tile(tmp_path, "Tile 1")
    _tile(tmp_path, "Tile 2")
    (tmp_path / "Tile 2/masks").rename(tmp_path / "Tile 2/labels")
    pairs, problems = FolderTiles(str(tmp_path), splits={"t": {"tree": "."}}).scan("t")
    assert len(pairs) == 2
    (problem,) = problems
    assert problem.path == tmp_path / "Tile 2/images"
    assert (
        problem.reason
        == f"no masks/ folder beside it, in {tmp_path}/Tile 2: its files pair with nothing"
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        ConfigError, match=r"splits.t.tree='empty': no images/ folder with a masks/"
    ):
        FolderTiles(str(tmp_path), splits={"t": {"tree": "empty"}}).scan("t")
    with pytest.raises(ConfigError, match=r"splits.t.tree='nowhere': .* is not a folder"):
        FolderTiles(str(tmp_path), splits={"t": {"tree": "nowhere"}}).scan("t")
    with pytest.raises(ConfigError, match=r"^datamodule.source.images='all/images': a tree"):
        FolderTiles(str(tmp_path), images="all/images", splits={"t": {"tree": "."}}).scan("t")


def test_a_share_is_drawn_by_key_the_same_every_time_and_except_takes_the_rest(tmp_path: Path):
    root = _dubai(tmp_path / "dubai", tuple(range(1, 11)))  # 20 pairs
    splits = {"train": {"tree": ".", "except": "val"}, "val": {"tree": ".", "share": 0.25}}
    val = FolderTiles(str(root), splits=splits).pairs("val")
    train = FolderTiles(str(root), splits=splits).pairs("train")
    assert len(val) == 5 and len(train) == 15
    assert not {p.image for p in val} & {p.image for p in train}
    # BLAKE2b of the keys: these five on every machine, for every seed, in the tree's order.
    drawn = ["Tile 1/2", "Tile 5/1", "Tile 6/2", "Tile 9/2", "Tile 10/1"]
    assert [f"{p.image.parent.parent.name}/{p.image.stem[-1]}" for p in val] == drawn
    # Another tile added: the pairs drawn before stay drawn, but for the boundary's.
    _tile(root, "Tile 11")
    again = FolderTiles(str(root), splits=splits).pairs("val")
    assert len(again) == 6 and {p.image for p in val} <= {p.image for p in again}


@pytest.mark.parametrize(
    ("split", "message"),
    [
        ({"tree": ".", "share": 1.5}, r"splits.val.share=1.5 is not allowed: expected the share"),
        ({"tree": ".", "share": True}, r"splits.val.share=True is not allowed"),
        ({"tree": ".", "share": "a"}, r"splits.val.share='a' is not allowed"),
        ({"images": "a", "masks": "b", "share": 0.2}, r"\(share chooses among the pairs of a tree"),
        ({"tree": ".", "share": 0.2, "list": "v.txt"}, r"\(list and share: a tree's part is"),
        ({"tree": ".", "except": "val"}, r"\(except='val' names itself; expected another split"),
        ({"tree": ".", "except": "test"}, r"\(except='test' names no split that is set"),
        ({"tree": ".", "except": "rest"}, r"names a split that is itself the rest of another"),
        ({"tree": ".", "images": "a/b"}, r"\(images='a/b': in a tree, the name of its images"),
        ({"tree": ".", "masks": "a\\b"}, r"\(masks='a\\\\b': in a tree, the name of its masks"),
        ({"tree": ".", "masks": ".."}, r"\(masks='..': in a tree, the name of its masks"),
        ({"tree": ".", "images": ""}, r"\(images='': in a tree, the name of its images"),
        ({"tree": ".", "share": float("nan")}, r"splits.val.share=nan is not allowed"),
        ({"tree": ".", "share": 0}, r"splits.val.share=0 is not allowed"),
        ({"tree": ".", "share": 1}, r"splits.val.share=1 is not allowed"),
        ({"tree": 3}, r"splits.val.tree=3 is not allowed: expected the folder whose images/"),
    ],
)
def test_a_tree_split_of_the_wrong_form_is_refused_naming_the_key(split, message):
    rest = {"tree": ".", "except": "train"}
    splits = {"train": {"tree": "."}, "val": split, "test": None, "rest": rest}
    with pytest.raises(ConfigError, match=message):
        FolderTiles("/data", splits=splits)


def test_a_listed_folder_is_a_whole_folder_not_the_start_of_a_name(tmp_path: Path):
    root = _dubai(tmp_path, (1, 10))
    (root / "val.txt").write_text("Tile 1\n")
    source = FolderTiles(str(root), splits={"val": {"tree": ".", "list": "val.txt"}})
    assert [p.image.parent.parent.name for p in source.pairs("val")] == ["Tile 1", "Tile 1"]


def test_a_tree_list_written_on_windows_names_its_keys(tmp_path: Path):
    root = _dubai(tmp_path)
    (root / "val.txt").write_bytes(b"\xef\xbb\xbfTile 2\\image_part_001\r\nTile 3\\\r\n")
    source = FolderTiles(str(root), splits={"val": {"tree": ".", "list": "val.txt"}})
    assert _keys(source, "val", root) == [
        "Tile 2/images/image_part_001.jpg image_part_001.png",
        "Tile 3/images/image_part_001.jpg image_part_001.png",
        "Tile 3/images/image_part_002.jpg image_part_002.png",
    ]
