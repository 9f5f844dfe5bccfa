"""Where pixels come from: image/mask files, their readers and writers, tiles in memory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class ImageMaskPair:
    """Paths of one image and its class-index mask."""

    image: Path
    mask: Path


@dataclass(frozen=True)
class Tile:
    """One decoded image (H×W×C uint8) and its mask (H×W uint8 class indices)."""

    image: np.ndarray
    mask: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        """Height and width in pixels."""
        return self.mask.shape[0], self.mask.shape[1]


class TileSource(Protocol):
    """What a datamodule needs from a dataset: files per split and class metadata."""

    class_names: tuple[str, ...]
    in_channels: int

    def prepare(self) -> None:
        """Make the files available (generate, unpack, ...); called once per machine."""

    def pairs(self, split: str) -> list[ImageMaskPair]:
        """Image/mask pairs of a split."""

    def min_image_side(self) -> int:
        """Smallest height or width over all images, for checking the patch size."""


def read_image(path: Path) -> np.ndarray:
    """Decode an image file to an H×W×C uint8 array."""
    with Image.open(path) as img:
        array = np.asarray(img.convert("RGB") if img.mode in ("P", "RGBA", "L") else img)
    if array.ndim == 2:
        array = array[:, :, None]
    return np.ascontiguousarray(array)


def read_mask(path: Path) -> np.ndarray:
    """Decode a class-index mask file to an H×W uint8 array."""
    with Image.open(path) as img:
        if img.mode not in ("L", "P"):
            raise ValueError(
                f"{path}: expected a single-channel class-index mask, got mode {img.mode}"
            )
        return np.ascontiguousarray(np.asarray(img, dtype=np.uint8))


def write_image(path: Path, image: np.ndarray) -> None:
    """Write an H×W×3 uint8 array as a PNG."""
    Image.fromarray(image).save(path)


def write_mask(path: Path, mask: np.ndarray) -> None:
    """Write an H×W uint8 class-index array as a single-channel PNG."""
    Image.fromarray(mask, mode="L").save(path)


def load_tiles(pairs: list[ImageMaskPair]) -> list[Tile]:
    """Decode every pair once into memory, checking that image and mask sizes agree."""
    tiles = []
    for pair in pairs:
        image, mask = read_image(pair.image), read_mask(pair.mask)
        if image.shape[:2] != mask.shape:
            raise ValueError(
                f"{pair.mask}: mask is {mask.shape[1]}x{mask.shape[0]} but its image "
                f"{pair.image} is {image.shape[1]}x{image.shape[0]}; they must match"
            )
        tiles.append(Tile(image, mask))
    return tiles
