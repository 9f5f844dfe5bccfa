"""Where pixels come from: image/mask files, their readers and writers, tiles in memory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import tifffile
from PIL import Image

from segscale.data.labels import LabelMap


@dataclass(frozen=True)
class ImageMaskPair:
    """Paths of one image and its class-index mask."""

    image: Path
    mask: Path


@dataclass(frozen=True)
class Tile:
    """One image (H×W×C, uint8/uint16/float32) and its mask (H×W uint8 class indices).

    Either array may be a read-only memory map of the file (large uncompressed TIFFs).
    """

    image: np.ndarray
    mask: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        """Height and width in pixels."""
        return self.mask.shape[0], self.mask.shape[1]


@dataclass(frozen=True)
class FileProblem:
    """One file that cannot be used, and why."""

    path: Path
    reason: str


class TileSource(Protocol):
    """What a datamodule needs from a dataset: its files per split, paired."""

    @property
    def cache_dir(self) -> Path:
        """A folder where the validation pass may cache what it read."""

    def prepare(self) -> None:
        """Make the files available (generate, unpack, ...); called once per machine."""

    def has_split(self, split: str) -> bool:
        """Whether the dataset has ``split`` (``train``, ``val``, ``test``)."""

    def pairs(self, split: str) -> list[ImageMaskPair]:
        """Image/mask pairs of a split."""

    def scan(self, split: str) -> tuple[list[ImageMaskPair], list[FileProblem]]:
        """The pairs of ``split`` and the files that could not be paired."""


TIFF_SUFFIXES = (".tif", ".tiff")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", *TIFF_SUFFIXES)
MASK_SUFFIXES = (".png", *TIFF_SUFFIXES)  # JPEG's lossy compression would alter labels
PIXEL_DTYPES = (np.uint8, np.uint16, np.float32)


def read_image(path: Path) -> np.ndarray:
    """An image file as an H×W×C array (uint8, uint16 or float32).

    TIFFs whose pixels are stored uncompressed in one block come back memory-mapped
    (read-only): only the pages that patches touch are read, so a tile larger than RAM
    still works. Every other file is decoded into memory.
    """
    if path.suffix.lower() in TIFF_SUFFIXES:
        array = _read_tiff(path)
    else:
        with Image.open(path) as img:
            if img.mode in ("P", "RGBA", "LA", "CMYK", "YCbCr"):
                img = img.convert("RGB")
            array = np.asarray(img)
    if array.ndim == 2:
        array = array[:, :, None]
    if array.dtype not in PIXEL_DTYPES:
        raise ValueError(
            f"{path}: pixels of type {array.dtype} are not supported; expected "
            "uint8, uint16 or float32"
        )
    return array


def read_mask_values(path: Path) -> np.ndarray:
    """A mask file's raw values: H×W (class indices, grey levels) or H×W×3 (colours)."""
    if path.suffix.lower() in TIFF_SUFFIXES:
        array = _read_tiff(path)
    else:
        with Image.open(path) as img:
            array = np.asarray(img.convert("RGB") if img.mode in ("RGBA", "LA") else img)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim == 3 and array.shape[2] == 4:  # RGBA: the alpha channel carries no label
        array = array[:, :, :3]
    return array


def _read_tiff(path: Path) -> np.ndarray:
    """A TIFF's first image with its channel axis last, memory-mapped when possible."""
    with tifffile.TiffFile(path) as tif:
        series = tif.series[0]
        axes = series.axes
        try:
            array = tifffile.memmap(path, mode="r")
        except ValueError:  # compressed, tiled or strided: decode into memory
            array = series.asarray()
    extra = [i for i, axis in enumerate(axes) if axis not in "YX"]
    if len(extra) > 1 or array.ndim != len(axes):
        raise ValueError(f"{path}: expected one 2-D image with channels, found axes {axes!r}")
    return np.moveaxis(array, extra[0], -1) if extra else array


def write_image(path: Path, image: np.ndarray) -> None:
    """Write an H×W×3 uint8 array as a PNG."""
    Image.fromarray(image).save(path)


def write_mask(path: Path, mask: np.ndarray) -> None:
    """Write an H×W uint8 class-index array as a single-channel PNG."""
    Image.fromarray(mask, mode="L").save(path)


def load_tiles(pairs: list[ImageMaskPair], labels: LabelMap) -> list[Tile]:
    """Decode every pair once (memory-mapped TIFFs stay mapped), masks to class indices.

    The pairs are expected to have passed ``segscale.data.validation`` (sizes agree,
    mask values known); a size mismatch is still refused here.
    """
    tiles = []
    for pair in pairs:
        image, raw = read_image(pair.image), read_mask_values(pair.mask)
        if image.shape[:2] != raw.shape[:2]:
            raise ValueError(
                f"{pair.mask}: mask is {raw.shape[1]}x{raw.shape[0]} but its image "
                f"{pair.image} is {image.shape[1]}x{image.shape[0]}; they must match"
            )
        # Class-index uint8 masks are used as they are, so a memory-mapped mask stays so.
        mask = raw if labels.is_identity(raw) else labels.decode(raw)
        tiles.append(Tile(image, mask))
    return tiles


def display_rgb(image: np.ndarray, max_value: float) -> np.ndarray:
    """An image as 8-bit RGB for viewing: its first three channels (or grey), scaled.

    ``max_value`` is the full intensity of the pixel type (255, 65535, 1.0).
    """
    channels = image[..., :3] if image.ndim == 3 and image.shape[2] >= 3 else image[..., :1]
    if image.dtype != np.uint8 or max_value != 255:
        channels = np.clip(channels.astype(np.float32) * (255 / max_value), 0, 255)
    channels = np.asarray(channels, np.uint8)
    return np.repeat(channels, 3, axis=2) if channels.shape[2] == 1 else channels
