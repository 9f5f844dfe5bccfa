"""Where the pixels come from: image and mask files, their readers, grids, caches, tiles."""

from __future__ import annotations

from typing import TYPE_CHECKING

from segscale.data import exported_names

if TYPE_CHECKING:
    from segscale.data.storage.decode_cache import CachedFile, DecodeCache
    from segscale.data.storage.grids import Grid, WarpedLabels, read_grid
    from segscale.data.storage.mapped_arrays import ChangedFileError, MappedArray
    from segscale.data.storage.pixel_types import check_image_headers
    from segscale.data.storage.rasters import Pixels, UnreadableWindowError, WindowedRaster
    from segscale.data.storage.sources import (
        FileProblem,
        ImageHeader,
        ImageMaskPair,
        MaskFile,
        TileSource,
        read_image,
        read_mask,
    )
    from segscale.data.storage.tiles import (
        LabelledMask,
        Tile,
        UnreadableTileError,
        UnreadableTiles,
        open_tiles,
    )

_WHERE = {
    "CachedFile": "decode_cache",
    "ChangedFileError": "mapped_arrays",
    "DecodeCache": "decode_cache",
    "FileProblem": "sources",
    "Grid": "grids",
    "ImageHeader": "sources",
    "ImageMaskPair": "sources",
    "LabelledMask": "tiles",
    "MappedArray": "mapped_arrays",
    "MaskFile": "sources",
    "Pixels": "rasters",
    "Tile": "tiles",
    "TileSource": "sources",
    "UnreadableTileError": "tiles",
    "UnreadableTiles": "tiles",
    "UnreadableWindowError": "rasters",
    "WarpedLabels": "grids",
    "WindowedRaster": "rasters",
    "check_image_headers": "pixel_types",
    "open_tiles": "tiles",
    "read_grid": "grids",
    "read_image": "sources",
    "read_mask": "sources",
}
"""Each public name and the module that defines it, imported when the name is first used."""

__all__ = [
    "CachedFile",
    "ChangedFileError",
    "DecodeCache",
    "FileProblem",
    "Grid",
    "ImageHeader",
    "ImageMaskPair",
    "LabelledMask",
    "MappedArray",
    "MaskFile",
    "Pixels",
    "Tile",
    "TileSource",
    "UnreadableTileError",
    "UnreadableTiles",
    "UnreadableWindowError",
    "WarpedLabels",
    "WindowedRaster",
    "check_image_headers",
    "open_tiles",
    "read_grid",
    "read_image",
    "read_mask",
]
__getattr__, __dir__ = exported_names(__name__, _WHERE)
