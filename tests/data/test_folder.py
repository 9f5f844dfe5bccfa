from pathlib import Path

import numpy as np
import pytest

from segscale.data.folder import FolderTiles
from segscale.errors import ConfigError
from tests.conftest import write_pair


def _blank(size: int = 8) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((size, size, 3), np.uint8), np.zeros((size, size), np.uint8)


def test_images_and_masks_pair_by_stem_across_formats_and_subfolders(tmp_path: Path):
    write_pair(tmp_path, "train", "a", *_blank(), image_suffix=".jpg")
    write_pair(tmp_path, "train", "zone1/b", *_blank(), image_suffix=".tif", mask_suffix=".tif")
    write_pair(tmp_path, "val", "c", *_blank())
    source = FolderTiles(str(tmp_path))
    source.prepare()
    pairs = source.pairs("train")
    assert [(p.image.name, p.mask.name) for p in pairs] == [("a.jpg", "a.png"), ("b.tif", "b.tif")]
    assert pairs[1].image.parent.name == "zone1"
    assert [p.image.name for p in source.pairs("val")] == ["c.png"]


def test_unpaired_and_ambiguous_files_are_problems_not_pairs(tmp_path: Path):
    write_pair(tmp_path, "train", "a", *_blank())
    (tmp_path / "train/masks/a.png").rename(tmp_path / "train/masks/orphan.png")
    write_pair(tmp_path, "train", "b", *_blank())
    write_pair(tmp_path, "train", "b", *_blank(), image_suffix=".tif")
    pairs, problems = FolderTiles(str(tmp_path)).scan("train")
    assert [p.image.name for p in pairs] == ["b.png"]
    reasons = {(p.path.name, p.reason.split(" ")[0]) for p in problems}
    assert reasons == {("a.png", "no"), ("orphan.png", "no"), ("b.tif", "same")}


def test_split_lists_name_stems_or_relative_paths(tmp_path: Path):
    for name in ("a", "b", "sub/c"):
        image, mask = _blank()
        write_pair(tmp_path, "all", name, image, mask)
    (tmp_path / "train.txt").write_text("a\n# a comment\n\nsub/c.png\n")
    (tmp_path / "val.txt").write_text("b.png  # trailing comment\nmissing\n")
    source = FolderTiles(
        str(tmp_path),
        images="all/images",
        masks="all/masks",
        splits={"train": "train.txt", "val": "val.txt"},
    )
    source.prepare()
    assert [p.image.stem for p in source.pairs("train")] == ["a", "c"]
    pairs, problems = source.scan("val")
    assert [p.image.stem for p in pairs] == ["b"]
    assert len(problems) == 1 and "val.txt:2" in str(problems[0].path)
    assert "no image 'missing'" in problems[0].reason


def test_a_split_name_finds_its_folder_or_else_its_list(tmp_path: Path):
    write_pair(tmp_path, "test", "a", *_blank())
    write_pair(tmp_path, ".", "b", *_blank())  # root/images, root/masks: for the lists
    (tmp_path / "test.txt").write_text("b\n")  # the folder comes first
    (tmp_path / "val.txt").write_text("b\n")
    source = FolderTiles(str(tmp_path))
    assert source.has_split("test")  # by default, as train and val
    assert [p.image.stem for p in source.pairs("test")] == ["a"]
    assert [p.image.stem for p in source.pairs("val")] == ["b"]


def test_missing_root_or_split_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"datamodule.source.root=.*is not a folder"):
        FolderTiles(str(tmp_path / "nowhere")).prepare()
    with pytest.raises(ConfigError, match=r"datamodule.source.splits.val='v.txt'.*does not exist"):
        FolderTiles(str(tmp_path), splits={"train": "train", "val": "v.txt"}).scan("val")
    looked_for = rf"neither the folder {tmp_path}/test \(with images/ and masks/\) nor the list"
    with pytest.raises(ConfigError, match=rf"datamodule.source.splits.test='test': {looked_for}"):
        FolderTiles(str(tmp_path)).scan("test")
    with pytest.raises(ConfigError, match=r"datamodule.source.splits.test is not set"):
        FolderTiles(str(tmp_path), splits={"test": None}).scan("test")


@pytest.mark.parametrize("listed", [False, True], ids=["folders", "list"])
def test_a_jpeg_mask_a_dangling_link_and_a_folder_named_png_are_said_to_be_what_they_are(
    tmp_path: Path, listed: bool
):
    write_pair(tmp_path, "train", "t1", *_blank(), mask_suffix=".jpg")  # a JPEG mask
    write_pair(tmp_path, "train", "t2", *_blank())
    (tmp_path / "train/images/t2.png").unlink()
    (tmp_path / "train/images/t2.png").mkdir()  # a folder named like an image
    write_pair(tmp_path, "train", "t3", *_blank())
    (tmp_path / "train/masks/t3.png").unlink()
    (tmp_path / "train/masks/t3.png").symlink_to(tmp_path / "gone.png")  # dangling
    write_pair(tmp_path, "train", "t4", *_blank())
    splits = {"train": "train"}
    if listed:  # the same files through a list under root/images and root/masks
        for kind in ("images", "masks"):
            (tmp_path / "train" / kind).rename(tmp_path / kind)
        (tmp_path / "train.txt").write_text("t1\nt2\nt3\nt4\n")
        splits = {"train": "train.txt"}
    pairs, problems = FolderTiles(str(tmp_path), splits=splits).scan("train")
    assert [p.image.name for p in pairs] == ["t4.png"]
    reasons = {p.path.name: p.reason for p in problems}
    assert reasons["t1.jpg"].startswith("a JPG mask; masks must be PNG/TIF/TIFF")
    assert reasons["t2.png"] == "a folder, not an image file; rename or move it"
    assert reasons["t3.png"] == f"a link to {tmp_path / 'gone.png'}, which does not exist"
    assert len(problems) == 3  # the partners are not also "no mask/image for it"
