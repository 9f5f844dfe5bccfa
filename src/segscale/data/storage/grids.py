"""Where a GeoTIFF's pixels lie on the ground; a mask that lies elsewhere, read on its image's grid.

A mask labels its image pixel by pixel only when both lie on the same grid: the same
coordinate reference system (CRS), the same affine transform from pixels to ground
coordinates, the same size. A mask exported in another CRS (EPSG:4326 beside UTM
images) or clipped to another extent has the image's size by chance at best, and
trains on labels shifted off their pixels without any error. So the validation pass
reads each TIFF's grid from its header (``read_grid``, through rasterio: GDAL reads
every way a GeoTIFF declares its CRS) and refuses a pair whose grids differ
(``grid_problem``, naming both files and both grids), unless
``datamodule.mask_alignment=warp`` asks for the mask to be read on its image's grid
(``segscale.data.storage.rasters.WindowedRaster``'s ``onto``: GDAL's warper, nearest neighbour,
so every pixel keeps a label value of the mask).

A file without a georeference (a PNG, a plain TIFF) has no grid: beside it any image or
mask is taken as its sizes say, as plain PNG masks beside GeoTIFFs are.

Masks read on their image's grid (``datamodule.mask_alignment=warp``), window by window.

A mask on another grid than its image (above) is read through GDAL's warper onto the
image's grid, nearest neighbour, so each image pixel takes the label value
of the mask pixel it lies in and no value is blended into one no class has. Where
the mask does not cover the image, its pixels have no label: the warper's coverage band
says where, and there they are the ignore index (not a value of the mask, so they are
counted in no class and in no mask value). Nothing is written to disk: every window is
warped as it is read, by the validation pass as by the patches of a run.

A palette mask's indices are warped (nearest neighbour keeps each an index of the
file), and its palette is the file's: its classes are read from the indices as an
unwarped palette mask's are (``LabelMap.palette_table``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from segscale.data.classes.labels import LabelMap
from segscale.data.storage.rasters import WindowedRaster
from segscale.data.storage.sources import TIFF_SUFFIXES, MaskFile, tiff_palette
from segscale.errors import require

MASK_ALIGNMENT_KEY = "datamodule.mask_alignment"
MASK_ALIGNMENTS = ("refuse", "warp")
"""``refuse``: a mask on another grid than its image's is a problem of the dataset;
``warp``: it is read on the image's grid."""

TOLERANCE_PIXELS = 0.01
"""Two grids are the same when each corner of the raster lies within this share of a
pixel of the same ground point in both (transforms written with rounding agree)."""


def check_mask_alignment(value: object) -> None:
    """Refuse a ``datamodule.mask_alignment`` other than ``refuse`` or ``warp``."""
    require(
        value,
        MASK_ALIGNMENT_KEY,
        lambda v: v in MASK_ALIGNMENTS,
        "refuse (a mask on another grid than its image is a problem) or warp (the mask "
        "is read on its image's grid, nearest neighbour)",
    )


@dataclass(frozen=True)
class Grid:
    """A raster's pixels on the ground: CRS (WKT), affine transform, width and height."""

    crs: str
    """The CRS as WKT, what GDAL compares."""
    name: str
    """The CRS as people write it (``EPSG:32632``), for messages."""
    transform: tuple[float, float, float, float, float, float]
    """``(a, b, c, d, e, f)``: pixel corner ``(col, row)`` lies at ``x = a·col + b·row + c``,
    ``y = d·col + e·row + f`` (rasterio's ``Affine``)."""
    width: int
    height: int

    def facts(self) -> dict[str, Any]:
        """The grid as the validation cache stores it."""
        return {
            "crs": self.crs,
            "name": self.name,
            "transform": list(self.transform),
            "size": [self.width, self.height],
        }

    @classmethod
    def from_facts(cls, facts: dict[str, Any]) -> Grid:
        """The grid that ``facts`` stored."""
        a, b, c, d, e, f = (float(v) for v in facts["transform"])
        width, height = (int(v) for v in facts["size"])
        return cls(str(facts["crs"]), str(facts["name"]), (a, b, c, d, e, f), width, height)

    def same_as(self, other: Grid) -> bool:
        """Whether ``other`` puts the same pixels on the same ground (``TOLERANCE_PIXELS``)."""
        if (self.width, self.height) != (other.width, other.height):
            return False
        if not _same_crs(self.crs, other.crs):
            return False
        a, b, _, d, e, _ = self.transform
        pixel = min(math.hypot(a, d), math.hypot(b, e))  # a column's step, a row's
        corners = [(0, 0), (self.width, 0), (0, self.height), (self.width, self.height)]
        return all(
            math.dist(_ground(self.transform, c), _ground(other.transform, c))
            <= TOLERANCE_PIXELS * pixel
            for c in corners
        )

    def describe(self) -> str:
        """``EPSG:32632, 2048x2048 px, transform (0.5, 0, 500000, 0, -0.5, 5800000)``."""
        numbers = ", ".join(f"{v:.10g}" for v in self.transform)
        return f"{self.name}, {self.width}x{self.height} px, transform ({numbers})"


def read_grid(path: Path) -> Grid | None:
    """The grid of the TIFF ``path`` from its header; ``None`` without a CRS (or not a TIFF).

    Raises ``ValueError`` naming the file where GDAL cannot open it.
    """
    if path.suffix.lower() not in TIFF_SUFFIXES:
        return None
    import rasterio
    from rasterio.errors import NotGeoreferencedWarning, RasterioIOError

    with warnings.catch_warnings():  # plain TIFFs have no georeference: nothing to say
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        try:
            with rasterio.open(path) as dataset:
                crs, transform = dataset.crs, dataset.transform
                width, height = dataset.width, dataset.height
        except RasterioIOError as error:
            raise ValueError(f"{path}: cannot be read ({error})") from None
    if crs is None:
        return None
    name = crs.to_string()
    a, b, c, d, e, f = (float(v) for v in tuple(transform)[:6])
    shown = name if len(name) <= 80 else name[:77] + "..."  # a CRS without an EPSG code
    return Grid(crs.to_wkt(), shown, (a, b, c, d, e, f), width, height)


def pair_grids(image: Path, mask: Path) -> dict[str, Any]:
    """What the validation pass keeps of a pair's grids, from the files' headers.

    ``image_grid`` and ``mask_grid`` (``Grid.facts``, ``None`` for a file without a
    georeference, or one GDAL cannot open: its reader says why), and ``grids_differ``:
    both have a grid and they are not the same.
    """
    image_grid, mask_grid = _grid_or_none(image), _grid_or_none(mask)
    differ = image_grid is not None and mask_grid is not None and not image_grid.same_as(mask_grid)
    return {
        "image_grid": image_grid.facts() if image_grid is not None else None,
        "mask_grid": mask_grid.facts() if mask_grid is not None else None,
        "grids_differ": differ,
    }


def _grid_or_none(path: Path) -> Grid | None:
    try:
        return read_grid(path)
    except ValueError:  # not a raster GDAL reads: the pass's readers say what it is
        return None


def grid_problem(image: Path, image_grid: Grid, mask_grid: Grid) -> str:
    """The problem of a mask on another grid than its image's (the mask's path is shown first)."""
    return (
        f"mask lies on another grid than its image {image.name}: the mask is "
        f"{mask_grid.describe()}, the image {image_grid.describe()}; they must be the same "
        f"(export the mask on the image's grid), or set {MASK_ALIGNMENT_KEY}=warp to read "
        "the mask on the image's grid"
    )


def _ground(transform: tuple[float, ...], pixel: tuple[int, int]) -> tuple[float, float]:
    a, b, c, d, e, f = transform
    col, row = pixel
    return a * col + b * row + c, d * col + e * row + f


def _same_crs(first: str, second: str) -> bool:
    """Whether two WKT strings name one CRS (GDAL's comparison, not the text's)."""
    if first == second:
        return True
    from rasterio.crs import CRS

    return bool(CRS.from_wkt(first) == CRS.from_wkt(second))


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
