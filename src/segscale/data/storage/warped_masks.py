"""Masks read on their image's grid (``datamodule.mask_alignment=warp``), window by window.

A mask on another grid than its image (``segscale.data.storage.grids``) is read through GDAL's
warper onto the image's grid, nearest neighbour, so each image pixel takes the label
value of the mask pixel it lies in and no value is blended into one no class has. Where
the mask does not cover the image, its pixels have no label: the warper's coverage band
says where, and there they are the ignore index (not a value of the mask, so they are
counted in no class and in no mask value). Nothing is written to disk: every window is
warped as it is read, by the validation pass as by the patches of a run.

A palette mask's indices are warped (nearest neighbour keeps each an index of the
file), and its palette is the file's: its classes are read from the indices as an
unwarped palette mask's are (``LabelMap.palette_table``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from segscale.data.classes.labels import LabelMap
from segscale.data.storage.grids import Grid
from segscale.data.storage.rasters import WindowedRaster
from segscale.data.storage.sources import MaskFile, tiff_palette


def warped_mask(path: Path, grid: Grid) -> tuple[MaskFile, WindowedRaster]:
    """The mask ``path``'s values on ``grid`` with its palette, and where it covers ``grid``.

    The values as ``read_mask`` reads a mask's (H×W for one band, H×W×3 for colours, an
    alpha band left out; a palette mask's indices, its colour map beside them); the
    coverage H×W, 0 where the mask does not reach.
    """
    values = WindowedRaster(path, squeeze=True, onto=grid)
    if len(values.bands) == 4:  # RGBA: the alpha channel carries no label
        values = WindowedRaster(path, bands=(1, 2, 3), onto=grid)
    assert values.coverage_band is not None  # a raster read onto a grid has one
    coverage = WindowedRaster(path, bands=(values.coverage_band,), squeeze=True, onto=grid)
    return MaskFile(values, tiff_palette(path)), coverage


class WarpedLabels:
    """A mask's class indices on its image's grid (H×W uint8), decoded window by window.

    Pixels the mask does not cover are the ignore index; a palette mask is read by its
    colours or by index as ``labels`` read it. Pickles by path, as its rasters.
    """

    def __init__(self, path: Path, grid: Grid, labels: LabelMap) -> None:
        mask, self.coverage = warped_mask(path, grid)
        self.values = mask.values
        self.palette_table = labels.palette_table(mask.palette)
        self.labels = labels
        self.shape = (grid.height, grid.width)
        self.dtype = np.dtype(np.uint8)
        self.ndim = 2

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        classes = self.labels.decode(np.asarray(self.values[index]), self.palette_table)
        classes[np.asarray(self.coverage[index]) == 0] = self.labels.ignore_index
        return classes

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self[:, :]
        return whole if dtype is None else whole.astype(dtype)
