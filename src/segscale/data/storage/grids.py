"""Where a GeoTIFF's pixels lie on the ground, and a mask that lies elsewhere than its image.

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
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from segscale.data.storage.sources import TIFF_SUFFIXES
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
