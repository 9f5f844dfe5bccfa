"""GeoTIFF masks on another grid than their image: refused naming both, or warped onto it."""

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
from PIL import Image
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.transform import from_origin
from rasterio.warp import calculate_default_transform, reproject

from segscale.data.checks import validation_cache
from segscale.data.checks.dataset_problems import InvalidDatasetError
from segscale.data.checks.validation import validate_dataset
from segscale.data.classes.labels import LabelMap
from segscale.data.datasets.folder import FolderTiles
from segscale.data.storage.caches import cache_file
from segscale.data.storage.grids import Grid, read_grid
from segscale.data.storage.tiles import open_tiles
from segscale.errors import ConfigError
from segscale.runs.builders import build
from tests.conftest import compose_config

NAMES = ("a", "b", "c")
WIDTH, HEIGHT, PIXEL = 96, 80, 10.0
UTM = from_origin(500000.0, 5000000.0, PIXEL, PIXEL)  # EPSG:32632, 10 m pixels


def class_map() -> np.ndarray:
    """Classes 0-2 in blocks of 16 px, so that a pixel inside a block has a known class."""
    rows, cols = np.mgrid[:HEIGHT, :WIDTH]
    return ((rows // 16 + cols // 16) % 3).astype(np.uint8)


def write_geotiff(path: Path, bands: np.ndarray, crs: str, transform) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    bands = bands if bands.ndim == 3 else bands[None]
    profile = {"driver": "GTiff", "count": len(bands), "dtype": "uint8", "crs": crs}
    profile |= {"height": bands.shape[1], "width": bands.shape[2], "transform": transform}
    with rasterio.open(path, "w", compress="deflate", **profile) as dataset:
        dataset.write(bands)


def in_wgs84(classes: np.ndarray) -> tuple[np.ndarray, object]:
    """The class map as a mask exported in EPSG:4326: another CRS, transform and size."""
    left, top = UTM.c, UTM.f
    transform, width, height = calculate_default_transform(
        "EPSG:32632",
        "EPSG:4326",
        WIDTH,
        HEIGHT,
        left,
        top - HEIGHT * PIXEL,
        left + WIDTH * PIXEL,
        top,
    )
    mask = np.full((height, width), 255, np.uint8)
    reproject(
        classes,
        mask,
        src_transform=UTM,
        src_crs="EPSG:32632",
        dst_transform=transform,
        dst_crs="EPSG:4326",
        resampling=Resampling.nearest,
    )
    return mask, transform


def dataset(root: Path, mask_kind: str) -> Path:
    """Train t1 (the pair under test, mask of ``mask_kind``) and t2, val v1 (aligned pairs)."""
    classes = class_map()
    image = np.stack([classes * 80, classes * 40, np.full_like(classes, 7)])
    for split, name in (("train", "t1"), ("train", "t2"), ("val", "v1")):
        write_geotiff(root / split / "images" / f"{name}.tif", image, "EPSG:32632", UTM)
        mask_path = root / split / "masks" / f"{name}.tif"
        if name != "t1" or mask_kind == "same":
            write_geotiff(mask_path, classes, "EPSG:32632", UTM)
        elif mask_kind == "wgs84":
            mask, transform = in_wgs84(classes)
            write_geotiff(mask_path, mask, "EPSG:4326", transform)
        elif mask_kind == "shifted":  # the same CRS, 3 pixels further east
            shifted = from_origin(UTM.c + 3 * PIXEL, UTM.f, PIXEL, PIXEL)
            write_geotiff(mask_path, classes, "EPSG:32632", shifted)
        elif mask_kind == "other zone":  # the same numbers in another CRS: 6° further east
            write_geotiff(mask_path, classes, "EPSG:32633", UTM)
        elif mask_kind == "spelt otherwise":  # EPSG:32632 as a PROJ string: another WKT
            proj = "+proj=utm +zone=32 +datum=WGS84 +units=m +no_defs"
            write_geotiff(mask_path, classes, proj, UTM)
        elif mask_kind == "rounded":  # the same grid, its origin written with rounding
            rounded = from_origin(UTM.c + 1e-7, UTM.f - 1e-7, PIXEL, PIXEL)
            write_geotiff(mask_path, classes, "EPSG:32632", rounded)
        elif mask_kind == "png":  # a plain PNG mask beside the GeoTIFF image
            mask_path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(classes).save(mask_path.with_suffix(".png"))
        elif mask_kind == "part":  # covers the left 48 columns only
            write_geotiff(mask_path, classes[:, :48], "EPSG:32632", UTM)
    return root


def check(root: Path, alignment: str = "refuse", **kwargs):
    source = FolderTiles(str(root))
    return validate_dataset(
        source, LabelMap(3), NAMES, 16, None, mask_alignment=alignment, **kwargs
    )


def refusal(root: Path) -> str:
    with pytest.raises(InvalidDatasetError) as error:
        check(root)
    return str(error.value)


def test_a_mask_in_another_crs_is_refused_naming_both_files_and_grids(tmp_path):
    root = dataset(tmp_path, "wgs84")
    message = refusal(root)
    assert message.startswith("1 problem(s) in the dataset")
    line = next(line for line in message.splitlines() if "t1.tif" in line)
    assert f"{root / 'train/masks/t1.tif'}: mask lies on another grid than its image t1.tif" in line
    assert "the mask is EPSG:4326, " in line and "the image EPSG:32632, 96x80 px" in line
    assert "transform (10, 0, 500000, 0, -10, 5000000)" in line  # the image's
    mask_grid = read_grid(root / "train/masks/t1.tif")
    assert mask_grid is not None and f"{mask_grid.width}x{mask_grid.height} px" in line
    assert "datamodule.mask_alignment=warp" in line
    assert "is 96x80 but" not in message  # the grids say it: no second line on the sizes


def test_the_same_crs_with_another_transform_is_refused(tmp_path):
    line = refusal(dataset(tmp_path, "shifted"))
    assert "the mask is EPSG:32632, 96x80 px, transform (10, 0, 500030, 0, -10, 5000000)" in line
    assert "the image EPSG:32632, 96x80 px, transform (10, 0, 500000, 0, -10, 5000000)" in line


def test_the_same_transform_in_another_crs_is_refused(tmp_path):
    line = refusal(dataset(tmp_path, "other zone"))
    assert "the mask is EPSG:32633, 96x80 px, transform (10, 0, 500000, 0, -10, 5000000)" in line
    assert "the image EPSG:32632, 96x80 px, transform (10, 0, 500000, 0, -10, 5000000)" in line


@pytest.mark.parametrize("kind", ["same", "rounded", "spelt otherwise", "png"])
def test_the_same_grid_and_a_mask_without_georeference_are_accepted(tmp_path, kind):
    report = check(dataset(tmp_path, kind))
    assert len(report.pairs["train"]) == 2 and report.warped_masks == {}


def test_warp_reads_the_mask_on_the_image_grid(tmp_path):
    root = dataset(tmp_path, "wgs84")
    report = check(root, "warp", locations_per_class=8, min_valid=0.5)
    mask = root / "train/masks/t1.tif"
    assert report.warped_masks == {mask: read_grid(root / "train/images/t1.tif")}
    tile = open_tiles(report.pairs["train"], LabelMap(3), warped_masks=report.warped_masks)[0]
    classes = class_map()
    assert tile.mask.shape == tile.image.shape[:2] == (HEIGHT, WIDTH)
    assert tile.mask[40:41, 70:71][0, 0] == classes[40, 70] == 0  # inside a block
    assert tile.mask[40:41, 40:41][0, 0] == classes[40, 40] == 1
    inside = np.zeros_like(classes, bool)
    inside[4:-4, 4:-4] = True  # away from the edges, where nearest neighbours may differ
    blocks = (np.arange(HEIGHT)[:, None] % 16 > 1) & (np.arange(WIDTH)[None, :] % 16 > 1)
    warped = np.asarray(tile.mask)
    np.testing.assert_array_equal(warped[inside & blocks], classes[inside & blocks])
    assert (report.class_counts["train"].sum()) <= 2 * HEIGHT * WIDTH
    locations = report.class_locations["train"][0]
    for c, points in enumerate(locations.points):  # kept on the image's grid
        assert (warped[points[:, 0], points[:, 1]] == c).all()


def test_warped_pixels_the_mask_does_not_cover_are_ignored(tmp_path, monkeypatch):
    # Another size on the same CRS and origin: the right half of the image has no label.
    root = dataset(tmp_path, "part")
    assert "mask lies on another grid" in refusal(root)
    report = check(root, "warp", min_valid=0.2)
    pairs, grids = report.pairs["train"], report.warped_masks
    mask = np.asarray(open_tiles(pairs, LabelMap(3), warped_masks=grids)[0].mask)
    np.testing.assert_array_equal(mask[:, :48], class_map()[:, :48])
    assert (mask[:, 48:] == 255).all()
    assert report.class_counts["train"].sum() == HEIGHT * WIDTH + HEIGHT * 48  # t2 whole, t1 half
    assert report.ignored_pixels("train") == 0  # no mask value: not counted as one
    cells = report.valid_windows["train"][0].cells.counts
    assert cells[:, :3].min() == 256 and cells[:, 3:].max() == 0


COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
"""The colour of each class of ``class_map`` in the palette masks."""


def write_palette_geotiff(path: Path, classes: np.ndarray, crs: str, transform, order) -> None:
    """``classes`` as a palette GeoTIFF whose entry i holds the colour of class ``order[i]``.

    Pixels of 255 (no class: ``in_wgs84``'s fill) keep index 255, black in its colour map.
    """
    index_of = np.full(256, 255, np.uint8)
    index_of[list(order)] = np.arange(len(order))
    profile = {"driver": "GTiff", "count": 1, "dtype": "uint8", "crs": crs}
    profile |= {"height": classes.shape[0], "width": classes.shape[1], "transform": transform}
    with rasterio.open(path, "w", compress="deflate", photometric="palette", **profile) as out:
        out.write(index_of[classes][None])
        out.write_colormap(1, {i: (*COLOURS[c], 255) for i, c in enumerate(order)})


def test_a_warped_palette_mask_is_read_by_its_colours_on_the_image_grid(tmp_path):
    # Each mask a palette GeoTIFF in an order of its own; t1's in EPSG:4326, warped onto
    # its image: nearest neighbour keeps its indices, its colour map gives their classes.
    root = dataset(tmp_path, "wgs84")
    classes = class_map()
    orders = {"t1": [2, 0, 1], "t2": [1, 2, 0], "v1": [0, 1, 2]}
    for split, name in (("train", "t1"), ("train", "t2"), ("val", "v1")):
        path = root / split / "masks" / f"{name}.tif"
        if name == "t1":
            mask, transform = in_wgs84(classes)
            write_palette_geotiff(path, mask, "EPSG:4326", transform, orders[name])
        else:
            write_palette_geotiff(path, classes, "EPSG:32632", UTM, orders[name])
    labels = LabelMap(3, 255, COLOURS, ignore_ids=[(0, 0, 0)])
    source = FolderTiles(str(root))
    report = validate_dataset(
        source, labels, NAMES, 16, None, locations_per_class=8, mask_alignment="warp"
    )
    assert set(report.warped_masks) == {root / "train/masks/t1.tif"}
    tiles = open_tiles(report.pairs["train"], labels, warped_masks=report.warped_masks)
    warped = np.asarray(tiles[0].mask)
    inside = np.zeros_like(classes, bool)
    inside[4:-4, 4:-4] = True
    blocks = (np.arange(HEIGHT)[:, None] % 16 > 1) & (np.arange(WIDTH)[None, :] % 16 > 1)
    np.testing.assert_array_equal(warped[inside & blocks], classes[inside & blocks])
    np.testing.assert_array_equal(np.asarray(tiles[1].mask), classes)
    # The pass's counts and locations are those of the classes the run's tiles read.
    truth = np.concatenate([warped.ravel(), classes.ravel()])
    assert report.class_counts["train"].tolist() == np.bincount(truth, minlength=256)[:3].tolist()
    for c, points in enumerate(report.class_locations["train"][0].points):
        assert len(points) and (warped[points[:, 0], points[:, 1]] == c).all()
    # Read by index (labels that are no colours), the warped file gives its indices.
    by_index = validate_dataset(source, LabelMap(3), NAMES, 16, None, mask_alignment="warp")
    indices = open_tiles(by_index.pairs["train"], LabelMap(3), warped_masks=by_index.warped_masks)
    stored = np.argsort(orders["t1"])[classes]
    np.testing.assert_array_equal(
        np.asarray(indices[0].mask)[inside & blocks], stored[inside & blocks]
    )


def test_the_cache_keeps_warped_and_plain_masks_apart_and_upgrades_old_entries(
    tmp_path, monkeypatch
):
    root = dataset(tmp_path, "wgs84")
    reads = []
    inspect = validation_cache.inspect_pair
    monkeypatch.setattr(
        validation_cache, "inspect_pair", lambda p, *args: reads.append(p) or inspect(p, *args)
    )
    check(root, "warp")
    assert len(reads) == 3
    check(root, "warp")
    assert len(reads) == 3  # cached, warped
    refusal(root)
    assert len(reads) == 4  # the warped mask's facts are not the plain mask's: read again
    # A cache written before the grids were kept: the headers are read, not the pixels.
    path = cache_file("validation", FolderTiles(str(root)).cache_key)
    stored = json.loads(path.read_text())
    for entry in stored["pairs"].values():
        for key in ("image_grid", "mask_grid", "grids_differ", "mask_warped"):
            entry["facts"].pop(key)
    path.write_text(json.dumps(stored))
    assert "mask lies on another grid" in refusal(root)
    assert len(reads) == 4


def test_grids_compare_by_ground_within_a_hundredth_of_a_pixel():
    grid = Grid("WKT", "EPSG:32632", (10.0, 0.0, 500000.0, 0.0, -10.0, 5000000.0), 96, 80)
    near = Grid(grid.crs, grid.name, (10.0, 0.0, 500000.09, 0.0, -10.0, 5000000.0), 96, 80)
    far = Grid(grid.crs, grid.name, (10.0, 0.0, 500000.11, 0.0, -10.0, 5000000.0), 96, 80)
    finer = Grid(grid.crs, grid.name, (10.002, 0.0, 500000.0, 0.0, -10.0, 5000000.0), 96, 80)
    assert grid.same_as(near) and not grid.same_as(far)
    assert not grid.same_as(finer)  # 96 columns on: 0.019 of a pixel off
    assert not grid.same_as(Grid(grid.crs, grid.name, grid.transform, 96, 81))
    assert Grid.from_facts(json.loads(json.dumps(grid.facts()))) == grid
    # One CRS in two spellings is one CRS (GDAL's comparison, not the text's).
    utm = CRS.from_epsg(32632)
    spelt = CRS.from_proj4("+proj=utm +zone=32 +datum=WGS84 +units=m +no_defs").to_wkt()
    assert spelt != utm.to_wkt()
    first = Grid(utm.to_wkt(), "EPSG:32632", grid.transform, 96, 80)
    assert first.same_as(Grid(spelt, "EPSG:32632", grid.transform, 96, 80))
    assert not first.same_as(Grid(CRS.from_epsg(32633).to_wkt(), "", grid.transform, 96, 80))


def test_the_key_takes_refuse_or_warp_only():
    for data in ("synthetic", "folder"):
        cfg = compose_config("train", f"datamodule={data}", "datamodule.source.root=/data")
        assert cfg.datamodule.mask_alignment == "refuse"
    cfg = compose_config("train", "datamodule.mask_alignment=bend")
    with pytest.raises(ConfigError, match=r"datamodule\.mask_alignment='bend' is not allowed"):
        build(cfg.datamodule)
    with pytest.raises(ConfigError, match=r"expected refuse .* or warp"):
        check(Path("/nonexistent"), "true")


def test_a_run_s_tiles_read_warped_masks_on_the_image_grid(tmp_path):
    from segscale.data.datamodule import segmentation_datamodule
    from segscale.data.storage.grids import WarpedLabels

    root = dataset(tmp_path, "wgs84")
    datamodule = segmentation_datamodule(
        FolderTiles(str(root)),
        3,
        NAMES,
        patch_size=16,
        in_channels=None,
        mean=None,
        std=None,
        num_workers=0,
        mask_alignment="warp",
    )
    datamodule.setup("fit")
    assert datamodule.train_set is not None and datamodule.val_set is not None
    first = datamodule.train_set.tiles[0]
    assert isinstance(first.mask, WarpedLabels) and first.shape == (HEIGHT, WIDTH)
    assert first.mask[40:41, 70:71][0, 0] == class_map()[40, 70]
    assert not isinstance(datamodule.val_set.tiles[0].mask, WarpedLabels)  # on its own grid
