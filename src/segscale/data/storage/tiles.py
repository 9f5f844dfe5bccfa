"""The tiles a run trains and validates on: opened where they lie, never decoded whole.

``open_tiles`` gives each image/mask pair as a ``Tile`` whose image and mask are read a
window at a time (``segscale.data.storage.rasters``): TIFFs mapped or read by window, PNG and
JPEG files through the machine's decode cache (``segscale.data.storage.decode_cache``). A mask
whose values are not already class indices (grey levels, colours, label IDs, a palette
mask's colours) is decoded window by window as it is read (``LabelledMask``), except a
PNG's, whose class indices the decode cache keeps, and a mask on another grid than its
image's, read on the image's grid (``datamodule.mask_alignment=warp``:
``segscale.data.storage.grids``). So no rank holds the decoded dataset: what a rank holds
grows with the patches it cuts, not with the images, and the pixels it reads sit in the
page cache, which the ranks and workers of a machine share.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from segscale.data.classes.labels import LabelMap
from segscale.data.storage.decode_cache import CachedFile, DecodeCache
from segscale.data.storage.grids import Grid, WarpedLabels
from segscale.data.storage.rasters import Pixels, UnreadableWindowError
from segscale.data.storage.sources import (
    DEFAULT_MAX_IMAGE_PIXELS,
    TIFF_SUFFIXES,
    ImageMaskPair,
    read_image,
    read_image_header,
    read_mask,
)
from segscale.errors import ConfigError

log = logging.getLogger(__name__)

SKIP_KEY = "datamodule.skip_unreadable"


class UnreadableTileError(ConfigError):
    """A tile that cannot be read any more, found mid-run (the dataset check read it whole).

    Raised in a DataLoader worker, it reaches the training loop re-made from its text,
    traceback first: only the last line, its own message, is kept.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message.rsplit(f"{type(self).__name__}: ", 1)[-1].strip())


@dataclass
class UnreadableTiles:
    """What a dataset does with a tile it cannot read mid-run: stop the run, or skip it.

    ``skip`` (``datamodule.skip_unreadable``): leave the tile out, with one warning per
    file and process; else ``UnreadableTileError`` names the file.
    """

    skip: bool = False
    warned: set[str] = field(default_factory=set)

    def handle(self, error: UnreadableWindowError) -> None:
        """Raise ``UnreadableTileError`` for ``error``, or note that its tile is left out."""
        if not self.skip:
            raise UnreadableTileError(
                f"{error}: the file changed, or the disk failed, since the dataset check read "
                f"it whole. Replace the file, or give {SKIP_KEY}=true to leave it out, then "
                "resume with ckpt_path=auto (in this run folder)"
            )
        if str(error.path) not in self.warned:
            self.warned.add(str(error.path))
            log.warning("%s; left out (%s=true)", error, SKIP_KEY)


class LabelledMask:
    """A mask's class indices (H×W uint8), decoded from its raw values as windows are read.

    ``palette_table``: a palette mask's, when ``labels`` read it by its colours
    (``LabelMap.palette_table``).
    """

    def __init__(
        self, raw: Pixels, labels: LabelMap, palette_table: np.ndarray | None = None
    ) -> None:
        self.raw = raw
        self.labels = labels
        self.palette_table = palette_table
        self.shape = (raw.shape[0], raw.shape[1])
        self.dtype = np.dtype(np.uint8)
        self.ndim = 2

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        return self.labels.decode(np.asarray(self.raw[index]), self.palette_table)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self[:, :]
        return whole if dtype is None else whole.astype(dtype)


Mask = Pixels
"""A tile's mask: class indices, as an array (mapped or decoded) or read by window."""


@dataclass(frozen=True)
class Tile:
    """One image (H×W×C, uint8/uint16/float32) and its mask (H×W uint8 class indices).

    Either may be read a window at a time: a memory map, a ``WindowedRaster``, a
    ``LabelledMask`` (see the module's docstring); slicing either gives an array.
    """

    image: Pixels
    mask: Mask

    @property
    def shape(self) -> tuple[int, int]:
        """Height and width in pixels."""
        return self.mask.shape[0], self.mask.shape[1]


def open_tiles(
    pairs: list[ImageMaskPair],
    labels: LabelMap,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    cache: DecodeCache | None = None,
    warped_masks: Mapping[Path, Grid] | None = None,
) -> list[Tile]:
    """Open every pair where it lies (see the module's docstring); decode no TIFF.

    PNG and JPEG files go through ``cache`` (``None``: decoded into memory, as every
    rank then holds them), each opened when first read (``CachedFile``): by the
    DataLoader workers, in parallel, as training runs, not here. The pairs are expected
    to have passed ``segscale.data.checks.validation`` (sizes agree, mask values known); a
    size mismatch is still refused here, and so is a file past ``max_image_pixels`` (see
    ``read_image``).
    ``warped_masks``: masks read on another grid, their image's (``WarpedLabels``).
    """
    tiles = []
    warped_masks = warped_masks or {}
    if cache is not None and not cache.ready():
        cache = None  # it cannot be used: decoded into memory (ready said why)
    for pair in pairs:
        image = _open_image(pair.image, max_image_pixels, cache)
        if pair.mask in warped_masks:
            mask: Mask = WarpedLabels(pair.mask, warped_masks[pair.mask], labels)
        else:
            mask = _open_mask(pair.mask, labels, max_image_pixels, cache)
        if image.shape[:2] != mask.shape[:2]:
            raise ValueError(
                f"{pair.mask}: mask is {mask.shape[1]}x{mask.shape[0]} but its image "
                f"{pair.image} is {image.shape[1]}x{image.shape[0]}; they must match"
            )
        tiles.append(Tile(image, mask))
    return tiles


def open_now(tiles: list[Tile]) -> None:
    """Open the decode-cache entries of ``tiles`` in this process, building the missing ones.

    For a measurement of reading from the cache as training reads it once filled
    (``bench.py``), which a first fill by the workers would otherwise slow down.
    """
    for tile in tiles:
        for pixels in (tile.image, tile.mask):
            if isinstance(pixels, CachedFile):
                pixels.opened()


def _open_image(path: Path, max_image_pixels: int | None, cache: DecodeCache | None) -> Pixels:
    """An image: a TIFF where it lies, another file through the decode cache, when read."""
    if path.suffix.lower() in TIFF_SUFFIXES or cache is None:
        return read_image(path, max_image_pixels)
    header = read_image_header(path, max_image_pixels)
    shape = (header.height, header.width, header.channels)
    decode = partial(_decoded_image, path, max_image_pixels)
    return CachedFile(cache, path, "image", decode, shape, header.dtype)


def _open_mask(
    path: Path, labels: LabelMap, max_image_pixels: int | None, cache: DecodeCache | None
) -> Mask:
    """A mask's class indices: a TIFF's decoded as read, another file's through the cache.

    A palette mask is read by its colours or by index as ``labels`` read it
    (``LabelMap.palette_table``).
    """
    if path.suffix.lower() in TIFF_SUFFIXES:
        mask = read_mask(path, max_image_pixels)
        table = labels.palette_table(mask.palette)
        # Class-index uint8 masks are used as they are: a mapped mask stays mapped.
        if table is None and labels.is_identity(mask.values):
            return mask.values
        return LabelledMask(mask.values, labels, table)
    decode = partial(_decoded_mask, path, labels, max_image_pixels)
    if cache is None:
        return decode()
    # The class indices are kept: decoded once, for the labels they were decoded with. The
    # labels' description tells colour labels from others, so a palette mask read by its
    # colours and the same file read by index are two entries.
    variant = "mask " + json.dumps(labels.describe(), sort_keys=True)
    header = read_image_header(path, max_image_pixels)
    return CachedFile(cache, path, variant, decode, (header.height, header.width), np.uint8)


def _decoded_image(path: Path, max_image_pixels: int | None) -> np.ndarray:
    """A PNG or JPEG image decoded whole (what its decode-cache entry holds)."""
    return np.asarray(read_image(path, max_image_pixels))


def _decoded_mask(path: Path, labels: LabelMap, max_image_pixels: int | None) -> np.ndarray:
    """A PNG or JPEG mask's class indices (H×W uint8), decoded whole with ``labels``."""
    mask = read_mask(path, max_image_pixels)
    raw, table = np.asarray(mask.values), labels.palette_table(mask.palette)
    return raw if table is None and labels.is_identity(raw) else labels.decode(raw, table)
