"""Tiles with a no-data border and unlabelled areas, their valid pixels, and patches' share."""

import warnings
from pathlib import Path

import numpy as np
import rasterio
import tifffile
from PIL import Image
from rasterio.errors import NotGeoreferencedWarning

from segscale.data.augment import PatchPose, cut_patch
from segscale.data.datasets.synthetic import draw_tile
from segscale.data.sampling.valid_windows import TileValidCells, ValidCellCounter
from segscale.data.storage.tiles import Tile


def cells_of(valid: np.ndarray) -> TileValidCells:
    """What the validation pass counts of a tile whose valid pixels are ``valid`` (H×W bool)."""
    counter = ValidCellCounter(*valid.shape)
    counter.add(valid, 0)
    return TileValidCells.from_facts({"shape": list(valid.shape), "valid_cells": counter.facts()})


def bordered_tile(size: int, index: int, border: int = 40) -> tuple[Tile, np.ndarray]:
    """A synthetic tile with a no-data border (0 in every band, yet labelled) on the left
    and an unlabelled area (255) in its mask; and its valid pixels."""
    image, mask = (a.copy() for a in draw_tile(size, seed=0, index=index))
    image[:, : border + 10 * (index % 2)] = 0
    mask[size // 2 : size // 2 + 40, size // 2 : size // 2 + 50] = 255
    valid = (mask < 6) & ~(image == 0).all(axis=2)
    return Tile(image, mask), valid


def patch_share(valid: np.ndarray, pose: PatchPose, size: int) -> float:
    """The share of valid pixels in the patch cut at ``pose`` (nearest pixels, as masks)."""
    cut = cut_patch(valid[:, :, None].astype(np.uint8), valid.astype(np.uint8), pose, size, 0)[1]
    return float(cut.mean())


def rotation_reach(degrees: float) -> float:
    """The share of a square that its rotation by ``degrees`` about its centre leaves."""
    u = (np.arange(1000) + 0.5) / 1000 - 0.5
    x, y = np.meshgrid(u, u)
    theta = np.deg2rad(degrees)
    turned_x, turned_y = (
        np.cos(theta) * x - np.sin(theta) * y,
        np.sin(theta) * x + np.cos(theta) * y,
    )
    return float(1 - ((np.abs(turned_x) <= 0.5) & (np.abs(turned_y) <= 0.5)).mean())


def geotiff_dataset(root: Path, nodata: float | None = 0, compress: bool = True) -> Path:
    """A folder dataset of GeoTIFF images with a no-data border of 0, written by rasterio
    with a ``GDAL_NODATA`` tag of ``nodata``, and PNG masks of classes 0-2 that label the
    border too, with an unlabelled (255) block. Train: t1, t2 (border 12 and 40 px); val: v1.
    """
    rng = np.random.default_rng(0)
    layout = {"compress": "deflate", "tiled": True, "blockxsize": 16, "blockysize": 16}
    for split, names in (("train", ("t1", "t2")), ("val", ("v1",))):
        for i, name in enumerate(names):
            image = rng.integers(1, 256, (3, 64, 64)).astype(np.uint8)
            image[:, :, : 12 + 28 * i] = 0
            mask = rng.integers(0, 3, (64, 64)).astype(np.uint8)
            mask[40:48, 40:56] = 255
            path = root / split / "images" / f"{name}.tif"
            path.parent.mkdir(parents=True, exist_ok=True)
            profile = {"driver": "GTiff", "width": 64, "height": 64, "count": 3, "dtype": "uint8"}
            extra = layout if compress else {}
            with warnings.catch_warnings():  # a plain raster: no georeference to warn of
                warnings.simplefilter("ignore", NotGeoreferencedWarning)
                with rasterio.open(path, "w", nodata=nodata, **profile, **extra) as out:
                    out.write(image)
            (root / split / "masks").mkdir(parents=True, exist_ok=True)
            Image.fromarray(mask).save(root / split / "masks" / f"{name}.png")
    return root


def valid_pixels_of(image_path: Path, mask_path: Path, nodata: float | None) -> np.ndarray:
    """The valid pixels of a pair as the pass should count them (3 classes, 255 ignored)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        with rasterio.open(image_path) as dataset:
            image = np.moveaxis(dataset.read(), 0, -1)
    valid = np.asarray(Image.open(mask_path)) < 3
    return valid if nodata is None else valid & ~(image == nodata).all(axis=2)


NODATA_TEXT = {"uint8": "0", "uint16": "0", "float32": "-9999"}
"""The GDAL_NODATA tag of ``tagged_border_dataset``'s images, per pixel type."""


def tagged_border_dataset(
    root: Path, dtype: str = "uint8", compress: bool = False
) -> dict[str, list[np.ndarray]]:
    """GeoTIFFs written by tifffile with a ``GDAL_NODATA`` tag (42113, ``NODATA_TEXT``) and
    a no-data border: the tag's value in every band over the top 8 rows and the left 20
    columns (t2: 36). Inside, one pixel holds it in one band only (not no-data). PNG masks
    of classes 0-2 label every pixel. Train: t1, t2 (80×64); val: v1. Returns the images.
    """
    rng = np.random.default_rng(1)
    nodata = float(NODATA_TEXT[dtype])
    written: dict[str, list[np.ndarray]] = {}
    for split, names in (("train", ("t1", "t2")), ("val", ("v1",))):
        for i, name in enumerate(names):
            if dtype == "float32":
                image = rng.random((64, 80, 3), dtype=np.float32)
            else:
                image = rng.integers(1, np.iinfo(dtype).max, (64, 80, 3)).astype(dtype)
            image[:8] = nodata
            image[:, : 20 + 16 * i] = nodata
            image[30, 50, 1] = nodata  # one band only: data
            path = root / split / "images" / f"{name}.tif"
            path.parent.mkdir(parents=True, exist_ok=True)
            layout = {"compression": "zlib", "tile": (16, 16)} if compress else {}
            tag = [(42113, "s", 0, NODATA_TEXT[dtype], True)]
            tifffile.imwrite(path, image, extratags=tag, **layout)
            (root / split / "masks").mkdir(parents=True, exist_ok=True)
            mask = rng.integers(0, 3, (64, 80)).astype(np.uint8)
            Image.fromarray(mask).save(root / split / "masks" / f"{name}.png")
            written.setdefault(split, []).append(image)
    return written
