"""Palette masks: read by their palettes' colours when the classes are colours, else by index."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tifffile

from segscale.data.checks.dataset_problems import InvalidDatasetError, problem_message
from segscale.data.checks.mask_value_scan import colour_masks, scan_mask_values
from segscale.data.checks.validation import validate_dataset
from segscale.data.classes.class_discovery import infer_classes
from segscale.data.classes.labels import LabelMap, class_colours, code_of
from segscale.data.classes.mask_values import MaskValueCensus
from segscale.data.classes.palette import (
    GUARANTEED_CLASSES,
    MIN_DELTA_E,
    RESERVED,
    delta_e,
    one_palette,
    srgb_to_lab,
    warn_indistinct,
)
from segscale.data.datasets.folder import FolderTiles
from segscale.data.storage.decode_cache import DecodeCache
from segscale.data.storage.tiles import LabelledMask, open_tiles
from segscale.errors import ConfigError
from segscale.runs.builders import build
from tests.conftest import compose_config, write_pair
from tests.helpers.palette_files import (
    DUBAI,
    UNLABELLED,
    voc_palette,
    write_palette_mask,
    write_short_palette_png,
)

CAMVID = [
    "Sky",
    "Building",
    "Pole",
    "Road",
    "Pavement",
    "Tree",
    "SignSymbol",
    "Fence",
    "Car",
    "Pedestrian",
    "Bicyclist",
    "Unlabelled",
]


def _least_distance(colours):
    distances = delta_e(colours, colours)
    np.fill_diagonal(distances, np.inf)
    return distances.min()


def test_lab_of_known_colours():
    # Reference values (D65): white L=100, black 0, sRGB red (53.24, 80.09, 67.20).
    lab = srgb_to_lab(np.array([[255, 255, 255], [0, 0, 0], [255, 0, 0]]))
    np.testing.assert_allclose(lab, [[100, 0, 0], [0, 0, 0], [53.24, 80.09, 67.20]], atol=0.1)


@pytest.mark.parametrize("count", [2, 12, 23, GUARANTEED_CLASSES])
def test_automatic_colours_keep_the_promised_distance(count):
    colours = class_colours(None, count)
    assert _least_distance(colours) >= MIN_DELTA_E
    assert delta_e(colours, np.array(RESERVED)).min() >= MIN_DELTA_E
    assert np.array_equal(colours, class_colours(None, count))  # deterministic


def test_camvid_classes_get_distinct_colours():
    # CamVid as distributed has index masks and no colours: all twelve are automatic.
    # The old palette gave SignSymbol (255,128,0) and Pedestrian (255,127,14).
    assert _least_distance(class_colours(None, len(CAMVID))) >= MIN_DELTA_E


def test_filled_colours_are_distinct_from_the_given_ones():
    given = [[128, 128, 128], [128, 0, 0], [192, 192, 128], [128, 64, 128]]  # CamVid's
    colours = class_colours(given, len(CAMVID))
    assert colours[: len(given)].tolist() == given  # given colours stay as given
    assert delta_e(colours[len(given) :], np.array(given)).min() >= MIN_DELTA_E
    assert _least_distance(colours[len(given) :]) >= MIN_DELTA_E


def test_many_classes_still_get_different_colours():
    colours = class_colours(None, 256)
    assert len({tuple(c) for c in colours.tolist()}) == 256


def test_indistinct_given_colours_warn_by_name():
    with pytest.warns(UserWarning, match="SignSymbol .* Pedestrian"):
        warn_indistinct(
            [[0, 0, 255], [255, 128, 0], [255, 127, 14]], ["Tree", "SignSymbol", "Pedestrian"]
        )


COLOURS = np.array([*DUBAI, UNLABELLED], np.uint8)
"""The colour of each class of ``_tile``'s maps; class 5's is the void colour."""
ORDERS = {"t0": [5, 3, 1, 0, 4, 2], "t1": [2, 4, 0, 5, 1, 3], "v0": [4, 5, 3, 2, 1, 0]}
"""Each palette mask's palette: entry i holds the colour of class ORDERS[name][i]."""
NAMES = ["building", "land", "road", "vegetation", "water"]


def _tile(size: int, seed: int, classes: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """A random image and a class map of 8×8 blocks of classes ``0 … classes-1``."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, classes, (size // 8, size // 8)).astype(np.uint8)
    image = rng.integers(0, 256, (size, size, 3)).astype(np.uint8)
    return image, blocks.repeat(8, axis=0).repeat(8, axis=1)


def _dubai(root: Path, rgb: bool = True) -> dict[str, np.ndarray]:
    """Train t0, t1 palette masks, each its own palette order, and t2 (RGB, or a palette
    mask in the classes' order); val v0, a palette mask with an unused colour too.
    Returns each mask's class map (5: the void colour)."""
    maps = {}
    files = (("train", "t0", 0), ("train", "t1", 1), ("train", "t2", 2), ("val", "v0", 10))
    for split, name, index in files:
        image, classes = _tile(64, seed=index)
        maps[name] = classes
        write_pair(root, split, name, image, COLOURS[classes])
        order = ORDERS.get(name, None if rgb else list(range(6)))
        if order is not None:
            unused = [(1, 2, 3)] if name == "v0" else []
            path = root / split / "masks" / f"{name}.png"
            write_palette_mask(path, classes, COLOURS.tolist(), order, unused)
    return maps


def _void(classes: np.ndarray) -> np.ndarray:
    """The class indices of a ``_dubai`` map: the void colour is the ignore index."""
    return np.where(classes == 5, 255, classes).astype(np.uint8)


def _plain(colours) -> str:
    return str([list(c) for c in colours]).replace(" ", "")


def test_palettes_in_their_own_orders_train_on_their_colours_as_rgb_masks_do(tmp_path):
    maps = _dubai(tmp_path / "data")
    cfg = compose_config(
        "train",
        "datamodule=folder",
        f"datamodule.source.root={tmp_path / 'data'}",
        "datamodule/classes=potsdam_rgb",  # label_ids: the class colours
        "datamodule.num_classes=5",
        f"datamodule.class_names=[{','.join(NAMES)}]",
        f"datamodule.class_colors={_plain(DUBAI)}",
        f"datamodule.ignore_ids={_plain([UNLABELLED])}",
        "datamodule.patch_size=32",
        "datamodule.num_workers=0",
        "datamodule.sampling.mode=class_balanced",
    )
    datamodule = build(cfg.datamodule, _convert_="all")
    datamodule.setup("fit")
    report = datamodule.check()
    train = [_void(maps[name]) for name in ("t0", "t1", "t2")]
    counts = np.bincount(np.concatenate([t.ravel() for t in train]), minlength=256)[:5]
    assert report.class_counts["train"].tolist() == counts.tolist()
    # The tiles as training cuts them (from the decode cache): class indices, whatever order
    tiles = [*datamodule.train_set.tiles, *datamodule.val_set.tiles]
    for tile, truth in zip(tiles, [*train, _void(maps["v0"])], strict=True):
        np.testing.assert_array_equal(np.asarray(tile.mask), truth)
    # class-balanced centres lie on their class in palette and RGB masks alike
    kept = 0
    for locations, truth in zip(report.class_locations["train"], train, strict=True):
        for index, points in enumerate(locations.points):
            assert (truth[points[:, 0], points[:, 1]] == index).all()
            kept += len(points)
    assert kept > 0
    patch = datamodule.train_set[(0, 0)]["mask"]
    assert set(np.unique(np.asarray(patch)).tolist()) <= {0, 1, 2, 3, 4, 255}


def test_the_pass_counts_palette_masks_as_the_rgb_masks_of_their_colours(tmp_path, monkeypatch):
    # The one-pass reader's class counts, class locations and valid cells (the void
    # colour is no valid pixel) of palette masks, each its own order, are those of the
    # same masks saved as RGB, read on threads as one.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    maps = _dubai(tmp_path / "palette")
    for split, name in (("train", "t0"), ("train", "t1"), ("train", "t2"), ("val", "v0")):
        write_pair(tmp_path / "rgb", split, name, _tile(64, 0)[0], COLOURS[maps[name]])
    labels = LabelMap(5, 255, DUBAI, [UNLABELLED])
    reports = {
        kind: validate_dataset(
            FolderTiles(str(tmp_path / kind)),
            labels,
            NAMES,
            16,
            None,
            locations_per_class=12,
            min_valid=0.3,
            workers=2,
        )
        for kind in ("palette", "rgb")
    }
    palette, rgb = reports["palette"], reports["rgb"]
    assert palette.class_counts["train"].tolist() == rgb.class_counts["train"].tolist()
    assert palette.class_counts["val"].tolist() == rgb.class_counts["val"].tolist()
    valid = [w.cells.counts for w in palette.valid_windows["train"]]
    assert len(valid) == 3 and 0 < min(c.min() for c in valid) < 256  # void: cells short
    theirs_valid = [w.cells.counts for w in rgb.valid_windows["train"]]
    for ours, theirs in zip(valid, theirs_valid, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    train = [_void(maps[name]) for name in ("t0", "t1", "t2")]
    located = zip(
        palette.class_locations["train"], rgb.class_locations["train"], train, strict=True
    )
    for ours, theirs, truth in located:
        for index, (points, expected) in enumerate(zip(ours.points, theirs.points, strict=True)):
            np.testing.assert_array_equal(points, expected)
            assert (truth[points[:, 0], points[:, 1]] == index).all()


def test_one_palette_file_read_by_colour_and_by_index_is_two_cache_entries(tmp_path):
    image, classes = _tile(48, seed=1, classes=5)
    order = [3, 1, 4, 0, 2]
    write_pair(tmp_path, "train", "a", image, classes)
    write_palette_mask(tmp_path / "train/masks/a.png", classes, DUBAI, order)
    pair = FolderTiles(str(tmp_path)).pairs("train")[0]
    cache = DecodeCache(str(tmp_path / "cache"))
    by_colour = open_tiles([pair], LabelMap(5, 255, DUBAI), cache=cache)[0].mask
    by_index = open_tiles([pair], LabelMap(5), cache=cache)[0].mask
    np.testing.assert_array_equal(by_colour, classes)
    np.testing.assert_array_equal(by_index, np.argsort(order)[classes])  # the stored indices
    records = [json.loads(r.read_text()) for r in cache.store.glob("*.json")]
    variants = [r["identity"]["variant"] for r in records]
    assert len([v for v in variants if v.startswith("mask ")]) == 2  # and the image's
    in_memory = open_tiles([pair], LabelMap(5, 255, DUBAI), cache=None)[0].mask
    np.testing.assert_array_equal(in_memory, classes)


@pytest.mark.parametrize("compression", [None, "zlib"])
def test_a_palette_tiff_is_read_by_its_colour_map_window_by_window(tmp_path, compression):
    image, classes = _tile(48, seed=2, classes=5)
    order = np.array([2, 0, 4, 1, 3])
    colormap = np.zeros((3, 256), np.uint16)
    colormap[:, :5] = np.array(DUBAI, np.uint16)[order].T * 257
    write_pair(tmp_path, "train", "a", image, classes)
    write_pair(tmp_path, "val", "b", image, classes)
    for split in ("train", "val"):
        tifffile.imwrite(
            tmp_path / split / "masks/a.tif" if split == "train" else tmp_path / "val/masks/b.tif",
            np.argsort(order)[classes].astype(np.uint8),
            photometric="palette",
            colormap=colormap,
            compression=compression,
        )
        (tmp_path / split / "masks" / ("a.png" if split == "train" else "b.png")).unlink()
    labels = LabelMap(5, 255, DUBAI)
    report = validate_dataset(FolderTiles(str(tmp_path)), labels, NAMES, 16, None)
    assert report.class_counts["train"].tolist() == np.bincount(classes.ravel()).tolist()
    (tile,) = open_tiles(report.pairs["train"], labels)
    assert isinstance(tile.mask, LabelledMask)  # decoded as windows are read
    np.testing.assert_array_equal(tile.mask[8:40, 4:20], classes[8:40, 4:20])


def test_voc_palette_masks_are_read_by_index_and_their_border_is_ignored(tmp_path):
    maps = {}
    for split, name, index in (("train", "t0", 0), ("train", "t1", 1), ("val", "v0", 10)):
        image, classes = _tile(48, seed=3 + index)
        classes[::8] = 255  # VOC's border, index 255 (colour 224, 224, 192)
        maps[name] = classes
        write_pair(tmp_path, split, name, image, classes)
        write_palette_mask(tmp_path / split / f"masks/{name}.png", classes, voc_palette().tolist())
    source, labels = FolderTiles(str(tmp_path)), LabelMap(6, 255)
    report = validate_dataset(source, labels, [f"c{i}" for i in range(6)], 16, None)
    train = np.concatenate([maps["t0"].ravel(), maps["t1"].ravel()])
    assert report.class_counts["train"].tolist() == np.bincount(train, minlength=256)[:6].tolist()
    cache = DecodeCache(str(tmp_path / "cache"))
    tiles = open_tiles(report.pairs["train"], labels, cache=cache)
    for tile, name in zip(tiles, ("t0", "t1"), strict=True):
        np.testing.assert_array_equal(np.asarray(tile.mask), maps[name])
    census = scan_mask_values(source)  # classes=auto: one palette, so by index
    assert not census.colour and len(census.palette_files) == 2
    found = infer_classes(census)
    assert found.label_ids == (0, 1, 2, 3, 4, 5)  # 255 is the ignore index, left out
    assert "(grey levels (2 palette mask(s) read by index))" in found.yaml("/data")
    # colour classes (a classes file of VOC's colours) read the same files by colour
    coloured = scan_mask_values(source, colour=True)
    assert coloured.colour and code_of((224, 224, 192)) in coloured.pixels


@pytest.mark.parametrize("rgb", [True, False])
def test_classes_auto_counts_palette_and_rgb_masks_as_one_set_of_colours(tmp_path, rgb):
    maps = _dubai(tmp_path, rgb)
    source = FolderTiles(str(tmp_path))
    census = scan_mask_values(source)
    assert census.colour and len(census.palette_files) == (2 if rgb else 3)
    found = infer_classes(census, ignore_ids=[list(UNLABELLED)])
    by_code = sorted(range(5), key=lambda c: code_of(DUBAI[c]))
    assert found.label_ids == tuple(DUBAI[c] for c in by_code)
    train = [maps[name] for name in ("t0", "t1", "t2")]
    assert found.pixels == tuple(int(sum((m == c).sum() for m in train)) for c in by_code)
    assert found.files == tuple(sum(bool((m == c).any()) for m in train) for c in by_code)
    palettes = "palette mask(s) read by their palettes' colours"
    assert f"(RGB colours ({2 if rgb else 3} {palettes}))" in found.yaml("/data")
    kinds = re.escape(f"are RGB colour masks ({2 if rgb else 3} {palettes}), so")
    with pytest.raises(ConfigError, match=kinds):
        infer_classes(census, ignore_ids=[0])
    settings = found.settings()  # and what was found reads every mask, val's too
    labels = LabelMap(5, 255, settings["label_ids"], settings["ignore_ids"])
    report = validate_dataset(source, labels, found.class_names, 16, None)
    assert report.class_counts["train"].tolist() == list(found.pixels)


def _facts(channels: int, values: list[int], palette: list[int] | None = None) -> dict:
    """The facts ``inspect_pair`` keeps of a mask holding ``values`` (one pixel each)."""
    return {
        "mask_channels": channels,
        "mask_values": [[v, 1] for v in values],
        **({"mask_palette": palette} if palette is not None else {}),
    }


def test_classes_auto_reads_palettes_by_index_only_where_indices_and_colours_pair_one_to_one():
    red, green, blue = code_of((255, 0, 0)), code_of((0, 255, 0)), code_of((0, 0, 255))
    voc = [_facts(1, [0, 1], [red, green, blue]), _facts(1, [1, 2], [red, green, blue])]
    assert one_palette(voc) and not colour_masks(voc)
    unused = [_facts(1, [0], [red, green]), _facts(1, [0], [red, blue])]  # index 1 unused
    assert one_palette(unused) and not colour_masks(unused)
    swapped = [_facts(1, [0, 1], [red, green]), _facts(1, [0, 1], [green, red])]
    assert not one_palette(swapped) and colour_masks(swapped)
    # no index has two colours, but red two indices: by index it would be two classes
    shifted = [_facts(1, [0], [red, green]), _facts(1, [1], [blue, red])]
    assert not one_palette(shifted) and colour_masks(shifted)
    assert colour_masks([*voc, _facts(3, [red])])  # an RGB mask: the classes are colours
    grey = [_facts(1, [0]), _facts(1, [1]), _facts(1, [2])]
    assert not colour_masks([*swapped, *grey])  # most masks grey: grey, as before


def test_a_palette_mask_s_unknown_colour_and_index_beyond_its_palette_are_said_so(tmp_path):
    image, classes = _tile(32, seed=4, classes=5)
    with_odd = classes.copy()
    with_odd[:2] = 6  # 64 pixels of a colour no class has
    colours = [*DUBAI, UNLABELLED, (9, 9, 9)]
    write_pair(tmp_path, "train", "t0", image, classes)
    write_palette_mask(tmp_path / "train/masks/t0.png", with_odd, colours, [6, 4, 2, 0, 1, 3, 5])
    beyond = classes.copy()
    beyond[0, :3] = 7  # index 7 of a palette of 5
    write_pair(tmp_path, "train", "t1", image, classes)
    write_short_palette_png(tmp_path / "train/masks/t1.png", beyond, DUBAI)
    write_pair(tmp_path, "val", "v0", image, COLOURS[classes])  # an RGB mask
    source = FolderTiles(str(tmp_path))
    with pytest.raises(InvalidDatasetError) as refused:
        validate_dataset(source, LabelMap(5, 255, DUBAI), NAMES, 16, None)
    message = str(refused.value)
    assert (
        "t1.png: palette PNG whose index 7 (3 pixels) lies beyond its palette of 5 colours"
        in message
    )
    lines = message.splitlines()
    row = next(line for line in lines if line.strip().startswith("[9, 9, 9]"))
    assert row.split()[3:] == ["64", "1", "t0.png"]
    assert (
        "1 of these masks is a palette mask, read by the colours of its palette, as the "
        "classes are colours: t0.png" in message
    )
    # class indices read the same palette masks by index, and say so
    with pytest.raises(InvalidDatasetError) as by_index:
        validate_dataset(source, LabelMap(3), NAMES[:3], 16, None)
    assert (
        "2 of these masks are palette masks, read by index, as the classes are not colours "
        "(RGB triplets in datamodule.label_ids read palette masks by their colours): "
        "t0.png, t1.png" in str(by_index.value)
    )


def test_evaluate_s_table_of_unknown_values_says_how_palette_masks_were_read():
    census = MaskValueCensus(colour=True)
    census.add(Path("/data/masks/a.png"), [code_of((9, 9, 9))], [4], palette=True)
    census.add(Path("/data/masks/b.png"), [code_of((9, 9, 9))], [2])  # an RGB mask
    message = problem_message([], census, LabelMap(5, 255, DUBAI), checkpoint="best.ckpt")
    assert "no class of ckpt='best.ckpt' has" in message
    assert (
        "1 of these masks is a palette mask, read by the colours of its palette, as the "
        "classes are colours: a.png" in message
    )
