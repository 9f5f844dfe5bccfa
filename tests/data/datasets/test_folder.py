from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from segscale.data.datasets.folder import FolderTiles
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


def _write(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return path


def _camvid_like(root: Path, names: dict[str, list[str]]) -> Path:
    """CamVid as distributed: train/, trainannot/, ... and train.txt of SegNet's paths."""
    for split, stems in names.items():
        lines = []
        for stem in stems:
            image, mask = _blank()
            _write(root / split / f"{stem}.png", image)
            _write(root / f"{split}annot" / f"{stem}.png", mask)
            lines.append(
                f"/SegNet/CamVid/{split}/{stem}.png /SegNet/CamVid/{split}annot/{stem}.png"
            )
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root


def test_separate_image_and_mask_folders_per_split_named_freely(tmp_path: Path):
    _camvid_like(tmp_path, {"train": ["a", "b"], "val": ["c"]})
    splits = {
        "train": {"images": "train", "masks": "trainannot"},
        "val": {"images": "val", "masks": "valannot"},
    }
    source = FolderTiles(str(tmp_path), splits=splits)
    pairs = source.pairs("train")
    assert [(p.image.parent.name, p.mask.parent.name) for p in pairs] == [
        ("train", "trainannot")
    ] * 2
    assert [p.image.stem for p in source.pairs("val")] == ["c"]


def test_camvid_lists_of_image_and_mask_paths_are_found_by_their_trailing_parts(tmp_path: Path):
    # The default splits: train/ has no images/ and masks/, so train.txt is the split.
    _camvid_like(tmp_path, {"train": ["a", "b"], "val": ["c"], "test": ["d"]})
    with (tmp_path / "train.txt").open("a") as listing:
        listing.write("train/a.png trainannot/b.png  # relative to the list's folder\n")
        listing.write(f"{tmp_path}/train/b.png {tmp_path}/trainannot/a.png\n")  # absolute
    source = FolderTiles(str(tmp_path))
    pairs = source.pairs("train")
    assert [(p.image.name, p.mask.name) for p in pairs] == [
        ("a.png", "a.png"),
        ("b.png", "b.png"),
        ("a.png", "b.png"),
        ("b.png", "a.png"),
    ]
    assert pairs[0].image == tmp_path / "train/a.png"
    assert pairs[0].mask == tmp_path / "trainannot/a.png"
    assert [p.image.stem for p in source.pairs("test")] == ["d"]
    # {list: ...} names a list anywhere under the root; its paths may start from the root.
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists/train.txt").write_text("train/a.png trainannot/a.png\n")
    listed = FolderTiles(str(tmp_path), splits={"train": {"list": "lists/train.txt"}})
    assert [p.mask for p in listed.pairs("train")] == [tmp_path / "trainannot/a.png"]


def test_list_lines_that_name_nothing_or_too_much_are_problems(tmp_path: Path):
    _camvid_like(tmp_path, {"train": ["a"]})
    (tmp_path / "train.txt").write_text(
        "train/a.png trainannot/a.png\n"
        "/SegNet/CamVid/train/zzz.png /SegNet/CamVid/trainannot/zzz.png\n"
        "train/a.png trainannot/missing.png\n"
        "a b c\n"
    )
    pairs, problems = FolderTiles(str(tmp_path)).scan("train")
    assert len(pairs) == 1
    assert [str(p.path).rsplit(":", 1)[1] for p in problems] == ["2", "3", "4"]
    assert problems[0].reason.startswith("image '/SegNet/CamVid/train/zzz.png' not found")
    assert problems[1].kind == "lines of train.txt whose mask is missing"
    assert "3 fields; expected an image name, or an image path and its mask path" in (
        problems[2].reason
    )


def test_name_suffixes_pair_a_cityscapes_like_tree_and_pass_over_other_files(tmp_path: Path):
    image, mask = _blank()
    for city, frame in (("aachen", "aachen_000000_000019"), ("bonn", "bonn_000001_000002")):
        _write(tmp_path / "leftImg8bit/train" / city / f"{frame}_leftImg8bit.png", image)
        _write(tmp_path / "gtFine/train" / city / f"{frame}_gtFine_labelIds.png", mask)
        _write(tmp_path / "gtFine/train" / city / f"{frame}_gtFine_color.png", image)
    split = {"train": {"images": "leftImg8bit/train", "masks": "gtFine/train"}}
    for image_suffix in ("_leftImg8bit", "_leftImg8bit.png"):  # with or without extension
        source = FolderTiles(
            str(tmp_path), splits=split, image_suffix=image_suffix, mask_suffix="_gtFine_labelIds"
        )
        pairs, problems = source.scan("train")
        assert problems == []
        assert [(p.image.parent.name, p.mask.name) for p in pairs] == [
            ("aachen", "aachen_000000_000019_gtFine_labelIds.png"),
            ("bonn", "bonn_000001_000002_gtFine_labelIds.png"),
        ]
    wrong = FolderTiles(str(tmp_path), splits=split, image_suffix="_left", mask_suffix="_gtFine")
    pairs, problems = wrong.scan("train")
    assert pairs == [] and len(problems) == 2
    assert "no image file name ends with datamodule.source.image_suffix='_left'" in (
        problems[0].reason
    )


def test_a_missing_folder_names_the_keys_and_the_other_forms(tmp_path: Path):
    _camvid_like(tmp_path, {"train": ["a"]})
    (tmp_path / "train.txt").unlink()
    with pytest.raises(ConfigError) as refused:
        FolderTiles(str(tmp_path)).scan("train")
    message = str(refused.value)
    assert message.startswith(
        f"datamodule.source.splits.train='train': the folder {tmp_path}/train has no images/ "
        "and no masks/ subfolder (datamodule.source.images='images', datamodule.source.masks="
        f"'masks') and there is no list {tmp_path}/train.txt; expected one of: "
    )
    assert "datamodule.source.splits.train={images:train,masks:trainannot}" in message
    assert "datamodule.source.splits.train={list:train.txt}" in message
    mapped = {"train": {"images": "train", "masks": "train_labels"}}
    with pytest.raises(
        ConfigError, match=r"^datamodule.source.splits.train.masks='train_labels': "
    ):
        FolderTiles(str(tmp_path), splits=mapped).scan("train")
    listed = {"train": {"list": "lists/train.txt"}}
    with pytest.raises(
        ConfigError, match=r"^datamodule.source.splits.train.list='lists/train.txt'"
    ):
        FolderTiles(str(tmp_path), splits=listed).scan("train")


@pytest.mark.parametrize(
    ("splits", "message"),
    [
        ("train", r"^datamodule.source.splits='train' is not allowed: expected a mapping"),
        ({"train": ["a", "b"]}, r"^datamodule.source.splits.train=\['a', 'b'\] is not allowed"),
        ({"train": {"images": "a"}}, r"allowed \(it needs images and masks\): expected one of"),
        ({"train": {"image": "a", "masks": "b"}}, r"allowed \(unknown key 'image'\)"),
        ({"train": {"images": 3, "masks": "b"}}, r"^datamodule.source.splits.train.images=3 is"),
    ],
)
def test_a_split_of_the_wrong_form_is_a_config_error(tmp_path: Path, splits, message):
    with pytest.raises(ConfigError, match=message):
        FolderTiles(str(tmp_path), splits=splits)


def test_a_list_of_names_with_its_own_folders_pairs_like_pascal_voc(tmp_path: Path):
    image, mask = _blank()
    for stem in ("2007_000032", "2007_000039"):
        _write(tmp_path / "JPEGImages" / f"{stem}.jpg", image)
        _write(tmp_path / "SegmentationClass" / f"{stem}.png", mask)
    (tmp_path / "ImageSets/Segmentation").mkdir(parents=True)
    (tmp_path / "ImageSets/Segmentation/train.txt").write_text("2007_000039\n2007_000032\n")
    split = {
        "list": "ImageSets/Segmentation/train.txt",
        "images": "JPEGImages",
        "masks": "SegmentationClass",
    }
    pairs = FolderTiles(str(tmp_path), splits={"train": split}).pairs("train")
    assert [(p.image.name, p.mask.name) for p in pairs] == [
        ("2007_000039.jpg", "2007_000039.png"),
        ("2007_000032.jpg", "2007_000032.png"),
    ]


@pytest.mark.parametrize("folds", [False, True])
def test_names_pair_in_any_case_where_the_file_system_finds_them_so(tmp_path, monkeypatch, folds):
    # A camera's IMG_0001.JPG beside a labelling tool's img_0001.png: one file on NTFS
    # and APFS (which open either name), two on Linux's file systems.
    from segscale.data.datasets import lists, name_pairing

    monkeypatch.setattr(name_pairing, "folds_case", lambda folder: folds)
    monkeypatch.setattr(lists, "folds_case", lambda folder: folds)
    write_pair(tmp_path, "train", "IMG_0001", *_blank(), image_suffix=".jpg")
    (tmp_path / "train/masks/IMG_0001.png").rename(tmp_path / "train/masks/img_0001.png")
    write_pair(tmp_path, "train", "b", *_blank())
    pairs, problems = FolderTiles(str(tmp_path)).scan("train")
    paired = [(p.image.name, p.mask.name) for p in pairs]
    if folds:
        assert paired == [("b.png", "b.png"), ("IMG_0001.jpg", "img_0001.png")] and not problems
    else:
        assert paired == [("b.png", "b.png")]
        assert {p.path.name for p in problems} == {"IMG_0001.jpg", "img_0001.png"}
    # a list's names are found as the file system finds them too
    write_pair(tmp_path, ".", "Tile_A", *_blank())
    (tmp_path / "masks/Tile_A.png").rename(tmp_path / "masks/tile_a.png")
    (tmp_path / "val.txt").write_text("TILE_A\n", encoding="utf-8")
    pairs, problems = FolderTiles(str(tmp_path)).scan("val")
    assert [(p.image.name, p.mask.name) for p in pairs] == (
        [("Tile_A.png", "tile_a.png")] if folds else []
    )
    assert bool(problems) is not folds
