import json
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from segscale import progress
from segscale.data.checks import validation_cache
from segscale.data.checks.dataset_problems import InvalidDatasetError
from segscale.data.checks.validation import validate_dataset
from segscale.data.classes import mask_values
from segscale.data.classes.labels import LabelMap
from segscale.data.datasets.folder import FolderTiles
from segscale.data.storage.caches import cache_file
from segscale.data.storage.pixel_types import MAX_VALUES, check_image_headers
from segscale.data.storage.sources import DEFAULT_MAX_IMAGE_PIXELS
from segscale.errors import ConfigError
from segscale.runs.builders import build
from tests.conftest import REPO, compose_config, write_pair
from tests.helpers.declared_size import png_declaring
from tests.helpers.valid_maps import (
    NODATA_TEXT,
    cells_of,
    geotiff_dataset,
    tagged_border_dataset,
    valid_pixels_of,
)
from tests.test_output_folder_check import as_user, unprivileged  # noqa: F401 (a fixture)

NAMES = ("a", "b", "c")


def _dataset(root: Path, size: int = 32) -> Path:
    rng = np.random.default_rng(0)
    for split, names in (("train", ("t1", "t2")), ("val", ("v1",))):
        for name in names:
            image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            mask = rng.integers(0, 3, (size, size)).astype(np.uint8)
            mask[0, 0] = 255  # the ignore index is allowed
            write_pair(root, split, name, image, mask)
    return root


def _validate(
    root: Path,
    patch_size: int = 16,
    in_channels: int | None = None,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    **labels,
):
    return validate_dataset(
        FolderTiles(str(root)),
        LabelMap(3, 255, **labels),
        NAMES,
        patch_size,
        in_channels,
        max_image_pixels=max_image_pixels,
    )


def _cache_of(root: Path) -> Path:
    """Where the validation pass caches the folder dataset at ``root``."""
    return cache_file("validation", FolderTiles(str(root)).cache_key)


def _problems(root: Path, **kwargs) -> str:
    with pytest.raises(InvalidDatasetError) as error:
        _validate(root, **kwargs)
    return str(error.value)


def test_a_valid_dataset_gives_frequencies_and_channel_statistics(tmp_path: Path):
    report = _validate(_dataset(tmp_path))
    assert report.channels == 3 and report.dtype == "uint8" and report.max_value == 255
    assert report.class_counts["train"].sum() == 2 * (32 * 32 - 1)
    assert report.frequencies("val").sum() == pytest.approx(1.0)
    assert all(0.45 < m < 0.55 for m in report.channel_mean)  # uniform 0-255 pixels
    report.write(tmp_path / "run")
    rows = (tmp_path / "run/class_frequencies.csv").read_text().splitlines()
    assert rows[0] == "class,train_pixels,val_pixels,train,val" and len(rows) == 5
    assert rows[-1] == f"(ignored),2,1,{round(2 / 2048, 6)},{round(1 / 1024, 6)}"
    assert "class frequencies (train)" in report.table()
    assert "ignore_index 255: 2 px, 0.1% of training pixels, ignored" in report.table()
    stored = json.loads((tmp_path / "run/class_frequencies.json").read_text())
    assert stored["ignored"]["val"] == {"pixels": 1, "share": round(1 / 1024, 6)}
    assert sum(c["pixels"] for c in stored["val"].values()) == 1023  # the classes' own


def test_ignore_ids_are_confirmed_with_their_share(tmp_path: Path):
    root = _dataset(tmp_path)
    for split, name in (("train", "t1"), ("train", "t2"), ("val", "v1")):
        mask = np.asarray(Image.open(root / split / "masks" / f"{name}.png")).copy()
        mask[1:9] = 7  # a void value: 256 of 1024 pixels (row 0 holds the 255)
        mask[1:3] = 9  # another: 64 of them
        Image.fromarray(mask).save(root / split / "masks" / f"{name}.png")
    report = _validate(root, label_ids=[0, 1, 2], ignore_ids=[7, 9, 11])
    assert report.ignored_pixels("train") == 2 * 256 + 2  # the ignore index 255 as well
    assert report.ignored_share("train") == pytest.approx((2 * 256 + 2) / 2048)
    assert report.ignored_lines("train") == [  # each value counted on its own
        "ignore_ids [7]: 384 px, 18.8% of training pixels, ignored",
        "ignore_ids [9]: 128 px, 6.2% of training pixels, ignored",
        "ignore_ids [11]: 0 px, 0.0% of training pixels, ignored",
        "ignore_index 255: 2 px, 0.1% of training pixels, ignored",
    ]
    masks = [root / "train/masks/t1.png", root / "train/masks/t2.png"]
    assert report.ignored["train"].files[7] == masks
    assert report.frequencies("train").sum() == pytest.approx(1.0)  # of the labelled pixels
    assert "ignore_ids [7]: 192 px, 18.8% of validation pixels" in report.table("val")


def test_the_cache_is_the_users_not_the_datasets(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = _dataset(tmp_path / "data")
    _validate(root)
    assert sorted(p.name for p in root.iterdir()) == ["train", "val"]  # nothing added
    (written,) = (tmp_path / "cache/segscale/validation").iterdir()
    assert written == _cache_of(root)
    assert str(root.resolve()) in json.loads(written.read_text())["dataset"]
    splits = FolderTiles(str(root), splits={"train": "train", "val": "train"})
    assert splits.cache_key != FolderTiles(str(root)).cache_key  # its own file
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    _validate(root)
    assert (tmp_path / "home/.cache/segscale/validation" / written.name).is_file()


@pytest.mark.slow
def test_a_read_only_dataset_is_cached(unprivileged):  # noqa: F811 (the imported fixture)
    root = _dataset(unprivileged / "data")
    folders = [root, *(p for p in root.rglob("*") if p.is_dir())]
    for folder in reversed(folders):
        folder.chmod(0o555)
    cache = unprivileged / "cache"
    cache.mkdir(mode=0o777)
    script = (
        "import sys; from tests.data.checks.test_validation import _validate; "
        "from pathlib import Path; "
        "_validate(Path(sys.argv[1]))"
    )
    try:
        done = as_user(
            ["env", f"XDG_CACHE_HOME={cache}", sys.executable, "-c", script, str(root)], REPO
        )
    finally:
        for folder in folders:
            folder.chmod(0o755)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "could not cache" not in done.stderr
    assert len(list((cache / "segscale/validation").iterdir())) == 1


def test_missing_mask_and_missing_image(tmp_path: Path):
    root = _dataset(tmp_path)
    (root / "train/masks/t1.png").unlink()
    (root / "val/images/v1.png").unlink()
    message = _problems(root)
    assert "train/images/t1.png: no mask for it" in message
    assert "val/masks/v1.png: no image for it" in message


def test_many_files_without_a_partner_are_one_count_and_a_few_examples(tmp_path: Path):
    # CamVid's 367 list lines once gave 367 near-identical lines: a kind is summarised.
    root = _dataset(tmp_path)
    tiny = np.zeros((4, 4), np.uint8)
    for i in range(40):
        Image.fromarray(tiny).save(root / f"train/images/lonely{i:02}.png")
    (root / "val/masks/v1.png").unlink()  # one of another kind: listed as it is
    lines = _problems(root).splitlines()
    assert lines[0] == "41 problem(s) in the dataset (datamodule.source):"
    assert lines[1] == f"  40 images without a mask in {root}/train/masks, for example:"
    assert lines[2] == f"    {root}/train/images/lonely00.png: no mask for it in {root}/train/masks"
    assert lines[4].startswith(f"    {root}/train/images/lonely02.png")
    assert lines[5] == "    ... and 37 more"
    assert lines[6] == f"  {root}/val/images/v1.png: no mask for it in {root}/val/masks"
    assert len(lines) == 7


def test_size_mismatch(tmp_path: Path):
    root = _dataset(tmp_path)
    Image.fromarray(np.zeros((30, 32), np.uint8)).save(root / "train/masks/t2.png")
    message = _problems(root)
    assert "train/masks/t2.png: mask is 32x30 but its image t2.png is 32x32" in message


def test_unknown_mask_values_are_one_table_not_one_line_per_file(tmp_path: Path):
    root = _dataset(tmp_path)
    for name in ("t1", "t2", "v1"):
        split = "val" if name == "v1" else "train"
        mask = np.full((32, 32), 7, np.uint8)
        mask[:2] = 9 if name != "v1" else 1  # 9: 64 pixels in each of two files
        Image.fromarray(mask).save(root / f"{split}/masks/{name}.png")
    (root / "train/images/t1.png").unlink()
    lines = _problems(root).splitlines()
    assert lines[0] == "3 problem(s) in the dataset (datamodule.source):"
    assert lines[1].endswith("train/masks/t1.png: no image for it in " + str(root / "train/images"))
    assert lines[2] == (
        "  2 mask(s) hold 2 values that datamodule/classes does not know "
        "(it knows class indices 0-2 or the ignore index 255):"
    )
    assert lines[3].split() == ["value", "pixels", "files", "e.g.", "(in", f"{root})"]
    assert lines[4].split() == ["7", "1,920", "2", "train/masks/t2.png,", "val/masks/v1.png"]
    assert lines[5].split() == ["9", "64", "1", "train/masks/t2.png"]
    assert lines[6].startswith("  What to do: datamodule/classes=auto takes the classes")
    assert "datamodule.ignore_ids=[7, 9] to ignore these values" in lines[6]
    assert len(lines) == 7


def test_the_table_names_a_few_files_and_the_largest_values(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(mask_values, "MAX_ROWS", 2)
    root = _dataset(tmp_path)
    for i in range(5):
        write_pair(
            root,
            "train",
            f"x{i}",
            np.zeros((32, 32, 3), np.uint8),
            np.full((32, 32), 10 + i % 3, np.uint8),
        )
    lines = _problems(root).splitlines()
    assert lines[0].startswith("5 problem(s)") and "3 values" in lines[1]
    assert lines[3].split()[:3] == ["10", "2,048", "2"]  # the two values with most pixels
    assert lines[4].split()[:4] == ["11", "2,048", "2", "x1.png,"]
    assert lines[5] == "    ... and 1 more values (1,024 pixels)"
    assert "datamodule.ignore_ids=[10, 11, 12]" in lines[6]


def test_unknown_colours_in_an_rgb_mask(tmp_path: Path):
    root = _dataset(tmp_path)
    colours = [[0, 0, 0], [255, 0, 0], [0, 255, 0]]
    for mask in root.glob("*/masks/*.png"):
        indices = np.asarray(Image.open(mask))
        rgb = np.array(colours + [[9, 9, 9]] * 253, np.uint8)[indices]
        Image.fromarray(rgb).save(mask)
    message = _problems(root, label_ids=colours)
    assert "3 mask(s) hold a value that datamodule/classes does not know (it knows the colours" in (
        message
    )
    assert "\n    [9, 9, 9]  " in message and "datamodule.ignore_ids=[[9, 9, 9]]" in message
    assert _validate(root, label_ids=colours, ignore_ids=[[9, 9, 9]]).channels == 3


def test_unreadable_image_and_grey_mask_for_colour_labels(tmp_path: Path):
    root = _dataset(tmp_path)
    (root / "train/images/t1.png").write_bytes(b"not a png")
    message = _problems(root, label_ids=[[0, 0, 0], [1, 1, 1], [2, 2, 2]])
    assert "train/images/t1.png: image cannot be read" in message
    assert "masks/t2.png: mask has 1 channel(s), but datamodule.label_ids expects 3" in message


def test_channel_count_and_pixel_type_must_agree(tmp_path: Path):
    root = _dataset(tmp_path)
    Image.fromarray(np.zeros((32, 32), np.uint16)).save(root / "val/images/v1.png")
    message = _problems(root)
    assert "val/images/v1.png: has 1 channels" in message
    assert "val/images/v1.png: pixels are uint16" in message
    assert "has 3 channels, datamodule.in_channels takes 4" in _problems(
        _dataset(tmp_path / "x"), in_channels=4
    )


def test_patch_size_larger_than_every_image(tmp_path: Path):
    message = _problems(_dataset(tmp_path), patch_size=64)
    assert "no train image is at least datamodule.patch_size=64" in message
    assert "largest smaller side is 32 px" in message


def test_smaller_images_are_left_out_when_others_are_large_enough(tmp_path: Path):
    root = _dataset(tmp_path)
    for split in ("train", "val"):
        big = np.zeros((48, 48, 3), np.uint8), np.zeros((48, 48), np.uint8)
        write_pair(root, split, "big", *big)
    report = _validate(root, patch_size=40)
    assert [p.image.stem for p in report.pairs["train"]] == ["big"]
    assert report.class_counts["train"].sum() == 2 * (32 * 32 - 1) + 48 * 48


def test_three_different_faults_are_all_reported(tmp_path: Path):
    root = _dataset(tmp_path)
    (root / "train/masks/t1.png").unlink()
    Image.fromarray(np.full((32, 32), 9, np.uint8)).save(root / "train/masks/t2.png")
    Image.fromarray(np.zeros((31, 32), np.uint8)).save(root / "val/masks/v1.png")
    message = _problems(root)
    assert message.startswith("3 problem(s) in the dataset (datamodule.source):")
    assert "t1.png: no mask" in message and "1 mask(s) hold a value" in message
    assert "v1.png: mask is 32x31" in message


def test_the_pass_is_cached_by_size_and_modification_time(tmp_path: Path, monkeypatch):
    root = _dataset(tmp_path)
    reads = []
    inspect = validation_cache.inspect_pair
    monkeypatch.setattr(
        validation_cache, "inspect_pair", lambda p, *args: reads.append(p) or inspect(p, *args)
    )
    first = _validate(root)
    assert len(reads) == 3 and _cache_of(root).is_file()
    second = _validate(root)
    assert len(reads) == 3
    np.testing.assert_array_equal(first.class_counts["train"], second.class_counts["train"])
    Image.fromarray(np.full((32, 32), 9, np.uint8)).save(root / "val/masks/v1.png")
    assert "datamodule.ignore_ids=[9]" in _problems(root)  # the changed file is read again
    assert len(reads) == 4
    _validate(root, label_ids=[0, 1, 2], ignore_ids=[9])  # other labels: nothing read again
    assert len(reads) == 4


def test_an_image_whose_header_is_past_the_limit_is_listed(tmp_path: Path):
    root = _dataset(tmp_path)
    png_declaring(root / "train/images/t1.png", 20000, 20000)
    message = _problems(root)
    assert message.startswith("1 problem(s) in the dataset")
    assert (
        "train/images/t1.png: image cannot be read: its header declares 20000 x 20000 = "
        f"400000000 pixels, more than the limit of {DEFAULT_MAX_IMAGE_PIXELS} pixels"
    ) in message
    assert "datamodule.max_image_pixels" in message


def test_the_limit_applies_to_images_and_masks_and_keys_the_cache(tmp_path: Path):
    root = _dataset(tmp_path)
    assert _validate(root).channels == 3  # cached at the default limit
    message = _problems(root, max_image_pixels=1000)
    assert message.startswith("6 problem(s)")
    assert "train/masks/t1.png: mask cannot be read: its header declares 32 x 32 = 1024" in message
    assert "val/images/v1.png: image cannot be read: its header declares 32 x 32" in message
    # Back at the default, the refusals cached under the lower limit do not count.
    assert _validate(root).channels == 3
    assert _validate(root, max_image_pixels=1024).channels == 3


def test_the_datamodule_config_key_reaches_the_validation_pass(tmp_path: Path):
    root = _dataset(tmp_path)
    overrides = ("datamodule=folder", f"datamodule.source.root={root}", "datamodule.patch_size=16")
    cfg = compose_config("train", *overrides, "datamodule.max_image_pixels=1000")
    with pytest.raises(InvalidDatasetError, match="limit of 1000 pixels"):
        build(cfg.datamodule).check()
    default = compose_config("train")  # the synthetic datamodule has the key too
    assert default.datamodule.max_image_pixels == DEFAULT_MAX_IMAGE_PIXELS
    with pytest.raises(ConfigError, match=r"datamodule.max_image_pixels=0 is not allowed"):
        build(compose_config("train", *overrides, "datamodule.max_image_pixels=0").datamodule)


def test_header_check_lists_unreadable_images_and_wrong_channel_counts(tmp_path: Path):
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "good.png")
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "grey.png")
    (tmp_path / "noise.png").write_bytes(np.random.default_rng(0).bytes(300))
    png_declaring(tmp_path / "bomb.png", 20000, 20000)
    paths = [tmp_path / n for n in ("good.png", "grey.png", "noise.png", "bomb.png")]
    problems = check_image_headers(paths, 3, "the network")
    reasons = {problem.path.name: problem.reason for problem in problems}
    assert list(reasons) == ["grey.png", "noise.png", "bomb.png"]
    assert reasons["grey.png"] == "has 1 channels, the network takes 3"
    assert reasons["noise.png"].startswith("cannot be read: cannot identify image file")
    assert reasons["bomb.png"].startswith("cannot be read: its header declares 20000 x 20000")


def test_class_locations_are_kept_compact_and_cached(tmp_path: Path, monkeypatch):
    root = _dataset(tmp_path)
    reads = []
    inspect = validation_cache.inspect_pair

    def counted(pair, *args):
        reads.append(pair)
        return inspect(pair, *args)

    monkeypatch.setattr(validation_cache, "inspect_pair", counted)
    plain = _validate(root)  # a cache written without locations (as before they existed)
    assert plain.class_locations == {} and len(reads) == 3
    report = validate_dataset(
        FolderTiles(str(root)), LabelMap(3, 255), NAMES, 16, None, locations_per_class=20
    )
    assert len(reads) == 6  # the cached facts had no locations: read once more
    for split in ("train", "val"):
        assert len(report.class_locations[split]) == len(report.pairs[split])
    for pair, tile in zip(report.pairs["train"], report.class_locations["train"], strict=True):
        mask = np.asarray(Image.open(pair.mask))
        assert [len(p) for p in tile.points] == [20, 20, 20]
        assert all((mask[p[:, 0], p[:, 1]] == c).all() for c, p in enumerate(tile.points))
        assert tile.nbytes == 3 * 20 * 2 * 4
    cache = json.loads(_cache_of(root).read_text())
    entry = next(iter(cache["pairs"].values()))["facts"]["class_locations"]
    assert entry["per_class"] == 20 and len(entry["rows_cols"]) == 3
    again = validate_dataset(
        FolderTiles(str(root)), LabelMap(3, 255), NAMES, 16, None, locations_per_class=20
    )
    assert len(reads) == 6  # cached, and the same pixels come back
    first, second = report.class_locations["train"][1], again.class_locations["train"][1]
    assert all(np.array_equal(a, b) for a, b in zip(first.points, second.points, strict=True))
    _validate(root)  # a pass without locations uses the facts that have them
    assert len(reads) == 6
    validate_dataset(
        FolderTiles(str(root)), LabelMap(3, 255), NAMES, 16, None, locations_per_class=5
    )
    assert len(reads) == 9  # another number of locations: read again


def _float_dataset(root: Path, scale: float = 1.0) -> Path:
    """Float TIFFs of values 0 to ``scale`` (0.2 to 0.7 in the val split), class masks."""
    rng = np.random.default_rng(0)
    for split, names, low, high in (("train", ("t1", "t2"), 0, 1), ("val", ("v1",), 0.2, 0.7)):
        for name in names:
            image = rng.uniform(low, high, (32, 32, 3)).astype(np.float32) * scale
            mask = rng.integers(0, 3, (32, 32)).astype(np.uint8)
            write_pair(root, split, name, image, mask, image_suffix=".tif")
    return root


def test_nan_or_infinite_pixels_in_float_images_are_listed_file_by_file(tmp_path: Path):
    root = _float_dataset(tmp_path)
    for name, value in (("train/images/t1.tif", np.nan), ("val/images/v1.tif", -np.inf)):
        image = tifffile.imread(root / name)
        image[3, 4, 1] = value
        tifffile.imwrite(root / name, image)
    message = _problems(root)
    assert message.startswith("2 problem(s) in the dataset")
    for name in ("train/images/t1.tif", "val/images/v1.tif"):
        assert f"{root / name}: has 1 NaN or infinite pixel value(s); expected finite" in message
    assert str(root / "train/images/t2.tif") not in message


def test_the_training_images_value_range_is_recorded_per_channel(tmp_path: Path):
    floats = _validate(_float_dataset(tmp_path / "floats"))
    assert floats.value_range.channels == 3
    for low, high in zip(floats.value_range.low, floats.value_range.high, strict=True):
        assert 0 <= low < 0.01 and 0.99 < high <= 1.0  # the training images', not val's
    scaled = _validate(_float_dataset(tmp_path / "scaled", scale=255.0))
    assert all(250 < high <= 255 for high in scaled.value_range.high)
    uint8 = _validate(_dataset(tmp_path / "uint8"))
    assert uint8.value_range.low == (0.0,) * 3 and uint8.value_range.high == (255.0,) * 3


# Valid pixels per cell (datamodule.sampling.min_valid).


def _valid_pass(root: Path, min_valid: float = 0.5, patch_size: int = 32, **kwargs):
    source, labels = FolderTiles(str(root)), LabelMap(3, 255)
    return validate_dataset(source, labels, NAMES, patch_size, None, min_valid=min_valid, **kwargs)


@pytest.mark.parametrize("compress", [True, False])  # read by window, or memory-mapped
def test_the_geotiff_nodata_tag_and_ignored_mask_values_make_pixels_invalid(tmp_path, compress):
    root = geotiff_dataset(tmp_path, nodata=0, compress=compress)
    report = _valid_pass(root)
    assert len(report.valid_windows["train"]) == len(report.pairs["train"]) == 2
    for pair, windows in zip(report.pairs["train"], report.valid_windows["train"], strict=True):
        expected = cells_of(valid_pixels_of(pair.image, pair.mask, 0))
        np.testing.assert_array_equal(windows.cells.counts, expected.counts)
        assert windows.size == 32 and windows.count > 0
    entry = json.loads(_cache_of(root).read_text())["pairs"]
    kept = [e["facts"]["valid_cells"] for k, e in entry.items() if "/train/" in k]
    assert [k["nodata"] for k in kept] == [0.0, 0.0]  # the tag's value, kept per file
    assert "valid_windows" not in report.pairs and report.valid_windows.keys() == {"train"}


def test_the_setting_overrides_the_tag(tmp_path):
    root = geotiff_dataset(tmp_path, nodata=0)
    report = _valid_pass(root, nodata=7)  # no pixel is 7: only the mask counts
    pair, windows = report.pairs["train"][0], report.valid_windows["train"][0]
    expected = cells_of(valid_pixels_of(pair.image, pair.mask, None))
    np.testing.assert_array_equal(windows.cells.counts, expected.counts)


def test_images_without_a_qualifying_window_are_left_out_and_none_is_refused(tmp_path, caplog):
    root = geotiff_dataset(tmp_path)
    with caplog.at_level("WARNING"):
        report = _valid_pass(root, min_valid=0.8, locations_per_class=8)
    # t2's border of 40 px leaves at most 75% of a 32-pixel window valid; t1's, 100%.
    assert [p.image.name for p in report.pairs["train"]] == ["t1.tif"]
    assert len(report.class_locations["train"]) == len(report.valid_windows["train"]) == 1
    message = "t2.tif holds no 32-pixel window with datamodule.sampling.min_valid=0.8 of valid"
    assert message in caplog.text and "(at most 0.750)" in caplog.text
    assert [p.image.name for p in report.pairs["val"]] == ["v1.tif"]  # validation: all
    # A window of the whole tile: t1 holds (64 × 52 - 128) / 64² = 0.781 valid.
    refused = r"datamodule.sampling.min_valid=0.9 is not allowed: .*\(the best holds 0.781\)"
    with pytest.raises(ConfigError, match=refused):
        _valid_pass(root, min_valid=0.9, patch_size=64)
    assert len(_valid_pass(root, min_valid=0).pairs["train"]) == 2  # off: nothing left out


def test_a_nodata_tag_that_is_no_number_is_listed_unless_overridden(tmp_path):
    # Listed with min_valid or without: the training images' statistics leave no-data out.
    root = _dataset(tmp_path)
    image = np.ones((32, 32, 3), np.uint8)
    path = root / "train/images/t1.tif"
    tifffile.imwrite(path, image, extratags=[(42113, "s", 0, "n/a", True)])
    (root / "train/images/t1.png").unlink()
    with pytest.raises(InvalidDatasetError, match=r"t1.tif: its GDAL_NODATA tag holds 'n/a'"):
        _valid_pass(root)
    assert len(_valid_pass(root, nodata=0).pairs["train"]) == 2
    with pytest.raises(InvalidDatasetError, match=r"t1.tif: its GDAL_NODATA tag holds 'n/a'"):
        _validate(root)


def test_the_pass_over_the_files_logs_its_progress_when_not_on_a_terminal(
    tmp_path: Path, monkeypatch, caplog
):
    caplog.set_level("INFO")
    monkeypatch.setattr(progress, "QUIET_S", 0.0)  # a tiny pass is over in a moment
    _validate(_dataset(tmp_path))
    lines = [r.getMessage() for r in caplog.records if "files checked" in r.getMessage()]
    assert lines[0].startswith("dataset files checked: 1/3 (33%)")
    assert "left" in lines[1]  # the time left
    assert lines[-1].startswith("dataset files checked: 3/3 (100%)") and len(lines) == 3
    caplog.clear()
    _validate(tmp_path)  # cached: nothing to read, no line
    assert not [r for r in caplog.records if "files checked" in r.getMessage()]


def _damage_a_block(path: Path) -> None:
    """Overwrite one compressed block of a tiled TIFF: its header reads, that block does not."""
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        offset, count = page.dataoffsets[5], page.databytecounts[5]
    data = bytearray(path.read_bytes())
    data[offset : offset + count] = b"\xff" * count
    path.write_bytes(bytes(data))


def test_a_block_that_cannot_be_decoded_is_listed_for_images_and_masks(tmp_path: Path):
    rng = np.random.default_rng(0)
    for split, name in (("train", "t1"), ("train", "t2"), ("val", "v1")):
        for folder, array in (
            ("images", rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)),
            ("masks", rng.integers(0, 3, (64, 64)).astype(np.uint8)),
        ):
            (tmp_path / split / folder).mkdir(parents=True, exist_ok=True)
            path = tmp_path / split / folder / f"{name}.tif"
            tifffile.imwrite(path, array, tile=(16, 16), compression="zlib")
    _damage_a_block(tmp_path / "train/images/t1.tif")
    _damage_a_block(tmp_path / "train/masks/t2.tif")
    message = _problems(tmp_path)
    assert message.startswith("2 problem(s) in the dataset")
    assert "train/masks/t2.tif: mask cannot be read: rows 0-64, columns 0-64" in message
    assert "train/images/t1.tif: image cannot be read: rows 0-64, columns 0-64" in message


@pytest.mark.parametrize(
    ("dtype", "compress"),
    [("uint8", False), ("uint8", True), ("uint16", True), ("float32", False)],
    ids=["uint8 mapped", "uint8 by window", "uint16 by window", "float32 mapped"],
)
def test_the_mean_std_and_range_leave_the_geotiff_nodata_pixels_out(tmp_path, dtype, compress):
    images = tagged_border_dataset(tmp_path, dtype, compress)["train"]
    report = _validate(tmp_path, patch_size=32)
    nodata = np.float32(NODATA_TEXT[dtype]) if dtype == "float32" else int(NODATA_TEXT[dtype])
    valid = np.concatenate([image[~(image == nodata).all(axis=2)] for image in images])
    scale = MAX_VALUES[dtype]
    assert len(valid) == 2 * 80 * 64 - (8 * 80 + 56 * 20) - (8 * 80 + 56 * 36)
    mean, std = valid.astype(np.float64).mean(0) / scale, valid.astype(np.float64).std(0) / scale
    np.testing.assert_allclose(report.channel_mean, mean, atol=1e-6, rtol=0)
    np.testing.assert_allclose(report.channel_std, std, atol=1e-6, rtol=0)
    assert min(report.value_range.low) > (0 if dtype != "float32" else -1)  # no border value
