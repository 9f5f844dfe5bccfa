"""Valid pixels per cell of each tile; the windows that hold ``min_valid`` of them, centres there.

Windows that hold at least ``min_valid`` valid pixels, and patch centres drawn among them.

From a tile's valid pixels per cell (``TileValidCells``, below), ``TileWindows``
bounds from below the valid pixels of any axis-aligned window of ``size`` pixels: a
cell the window covers whole counts all its valid pixels, one it covers in part only
those that cannot lie outside the part (its valid pixels less its uncovered area). The
bound is exact where a window's edges run along cell edges or through cells that are
all valid or all invalid, and never more than the truth, so a window it admits does
hold ``min_valid`` of valid pixels.

On the lattice of windows whose corner lies on a cell corner it is computed for the
whole tile at once (summed-area tables); a tile where no lattice window qualifies
takes no patch. ``draw`` picks a qualifying lattice window, moves it by up to a cell
(uniformly) and keeps the move if the window still qualifies, else tries again, and
after ``WINDOW_TRIES`` keeps the lattice window itself: centres about uniform over the
qualifying windows, each one qualifying. Its draws come from ``valid_rng(seed, epoch,
index)``, a stream of its own, so a patch stays a pure function of ``(seed, epoch,
index)`` (docs/architecture.md, "Randomness addressed by index").

Valid pixels per 16×16 cell of a tile, counted by the validation pass.

A pixel is valid when its mask holds a class (not ``ignore_index``: the ignored values
and unknown ones decode to it) and its image is not no-data (``segscale.data.storage.nodata``:
not that value in every band). The pass counts them per ``CELL``×``CELL`` cell as it
reads a pair in row chunks, so the patch sampler can tell which windows hold enough
valid pixels (``TileWindows``, above) without reading a tile at start-up. The
counts are exact, cached as zlib-compressed uint16 (a border of no-data compresses to
almost nothing), and take 1/128 of a uint8 mask's bytes in memory.
"""

from __future__ import annotations

import base64
import logging
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from segscale.data.sampling.class_locations import TileClassLocations, centre_on_pixel
from segscale.data.storage.nodata import parse_nodata, read_nodata_tag
from segscale.errors import ConfigError

log = logging.getLogger(__name__)

MIN_VALID_KEY = "datamodule.sampling.min_valid"
WINDOW_TRIES = 4
"""Moved windows tried before a draw keeps a lattice window as it is."""
_VALID_STREAM = 2  # spawn key of the valid-window stream (1: class_locations' centres)


def valid_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of patch ``(epoch, index)``'s valid-window draw.

    A child of the seed that ``patch_rng`` uses, beside ``centre_rng``'s: the patch's
    rotation, translation and transforms are drawn as without ``min_valid``.
    """
    sequence = np.random.SeedSequence([seed, epoch, index], spawn_key=(_VALID_STREAM,))
    return np.random.default_rng(sequence)


class TileWindows:
    """The windows of ``size`` pixels of one tile that hold ``min_valid`` valid pixels.

    ``min_valid`` is a share of the window's ``size``² pixels. ``count`` lattice windows
    qualify; ``best`` is the largest share the bound gives any lattice window.
    """

    def __init__(self, cells: TileValidCells, size: int, min_valid: float) -> None:
        self.cells = cells
        self.size = size
        self.min_valid = min_valid
        self.need = min_valid * size * size
        self.heights, self.widths = cells.cell_sizes(0), cells.cell_sizes(1)
        bounds = self._lattice_bounds()
        self.qualifying = bounds >= self.need
        self.row_ends = np.cumsum(self.qualifying.sum(axis=1))
        self.best = float(bounds.max()) / size**2

    @property
    def shape(self) -> tuple[int, int]:
        """The tile's height and width in pixels."""
        return self.cells.shape

    @property
    def count(self) -> int:
        """How many lattice windows qualify."""
        return int(self.row_ends[-1])

    @property
    def candidates(self) -> int:
        """How many lattice windows the tile has (``lattice_windows``), qualifying or not."""
        return int(self.qualifying.size)

    def holds(self, centre_x: np.ndarray | float, centre_y: np.ndarray | float) -> np.ndarray:
        """Whether the windows centred at ``(centre_x, centre_y)`` qualify (bool per window).

        Parts of a window outside the tile hold no valid pixel.
        """
        half = self.size / 2
        x0 = np.atleast_1d(np.asarray(centre_x, np.float64)) - half
        y0 = np.atleast_1d(np.asarray(centre_y, np.float64)) - half
        return self.valid_at_least(x0, y0) >= self.need

    def valid_at_least(self, x0: np.ndarray, y0: np.ndarray) -> np.ndarray:
        """The bound on the valid pixels of the windows from ``(x0, y0)`` (arrays, pixels)."""
        cols, over_x = self._spans(x0, self.widths)
        rows, over_y = self._spans(y0, self.heights)
        counts = self.cells.counts[rows[:, :, None], cols[:, None, :]].astype(np.float64)
        area = self.heights[rows][:, :, None] * self.widths[cols][:, None, :]
        covered = over_y[:, :, None] * over_x[:, None, :]
        return np.maximum(counts - (area - covered), 0.0).sum(axis=(1, 2))

    def _spans(self, starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per window from ``starts``: the cells along one axis it may reach, and its overlap.

        Cells outside the tile are clipped to its last one, with an overlap of 0.
        """
        span = self.size // CELL + 2  # the most cells a window of ``size`` reaches
        first = np.floor(starts / CELL).astype(np.int64)
        index = first[:, None] + np.arange(span)
        inside = (index >= 0) & (index < len(sizes))
        index = np.clip(index, 0, len(sizes) - 1)
        low = index * CELL
        high = low + sizes[index]
        ends = starts[:, None] + self.size
        overlap = np.minimum(ends, high) - np.maximum(starts[:, None], low)
        return index, np.where(inside, np.maximum(overlap, 0.0), 0.0)

    def _lattice_bounds(self) -> np.ndarray:
        """The bound for every window whose corner is a cell corner (rows × columns).

        Such a window covers ``m``×``m`` cells whole and, when ``size`` is no multiple
        of the cell, a strip of ``r`` pixels of the next column and row.
        """
        counts = self.cells.counts.astype(np.int64)
        m, r = divmod(self.size, CELL)
        height, width = self.shape
        rows = np.arange((height - self.size) // CELL + 1)[:, None]
        cols = np.arange((width - self.size) // CELL + 1)[None, :]
        table = _summed_area(counts)
        bounds = table[rows + m, cols + m] - table[rows, cols + m]
        bounds = bounds - table[rows + m, cols] + table[rows, cols]
        if r:
            h, w = self.heights[:, None], self.widths[None, :]
            right = np.maximum(counts - h * (w - r), 0).cumsum(axis=0)
            below = np.maximum(counts - w * (h - r), 0).cumsum(axis=1)
            corner = np.maximum(counts - (h * w - r * r), 0)
            right, below = np.pad(right, ((1, 0), (0, 0))), np.pad(below, ((0, 0), (1, 0)))
            bounds = bounds + right[rows + m, cols + m] - right[rows, cols + m]
            bounds = bounds + below[rows + m, cols + m] - below[rows + m, cols]
            bounds = bounds + corner[rows + m, cols + m]
        return bounds

    def draw(self, rng: np.random.Generator) -> tuple[float, float]:
        """The centre ``(x, y)`` of a qualifying window, drawn with ``rng`` (see the module)."""
        height, width = self.shape
        half = self.size / 2
        row = col = 0
        for _ in range(WINDOW_TRIES):
            row, col = self._lattice_window(int(rng.integers(self.count)))
            x0, y0 = (col + rng.random()) * CELL, (row + rng.random()) * CELL
            inside = x0 <= width - self.size and y0 <= height - self.size
            if inside and self.holds(x0 + half, y0 + half)[0]:
                return x0 + half, y0 + half
        return col * CELL + half, row * CELL + half

    def _lattice_window(self, n: int) -> tuple[int, int]:
        """Row and column of the ``n``-th qualifying lattice window, in row-major order."""
        row = int(np.searchsorted(self.row_ends, n, side="right"))
        before = int(self.row_ends[row - 1]) if row else 0
        return row, int(np.flatnonzero(self.qualifying[row])[n - before])


def lattice_windows(shape: tuple[int, int], size: int) -> int:
    """The windows of ``size`` pixels inside a tile of ``shape`` whose corner is a cell corner.

    The candidates ``TileWindows`` checks under ``min_valid`` (0 for a tile smaller
    than ``size``).
    """
    height, width = shape
    if min(height, width) < size:
        return 0
    return ((height - size) // CELL + 1) * ((width - size) // CELL + 1)


def _summed_area(values: np.ndarray) -> np.ndarray:
    """``table[i, j]`` = the sum of ``values[:i, :j]``."""
    return np.pad(values.cumsum(axis=0).cumsum(axis=1), ((1, 0), (1, 0)))


def centrable(locations: TileClassLocations, windows: TileWindows) -> TileClassLocations:
    """The kept pixels of one tile whose class-centred window qualifies (``windows``).

    Each class's pixel count shrinks in proportion to its kept pixels left (at least 1
    while any is), so that tiles are still drawn in proportion to their pixels of a
    class that centre a qualifying window.
    """
    height, width = windows.shape
    points, counts = [], []
    for class_points, count in zip(locations.points, locations.counts.tolist(), strict=True):
        rows, cols = class_points[:, 0], class_points[:, 1]
        centre_x, centre_y = centre_on_pixel(rows, cols, windows.size, height, width)
        keep = windows.holds(centre_x, centre_y) if len(class_points) else np.zeros(0, bool)
        points.append(class_points[keep])
        share = keep.mean() if len(keep) else 0.0
        counts.append(max(round(count * share), 1) if keep.any() else 0)
    return TileClassLocations(np.asarray(counts, np.int64), tuple(points))


def qualifying_tiles(
    cells: Sequence[TileValidCells], names: Sequence[str], size: int, min_valid: float
) -> tuple[list[int], list[TileWindows]]:
    """The tiles (indices) with a qualifying window, and their windows.

    A tile without one is left out, with a warning naming it (``names``); a dataset
    without any is refused with ``ConfigError`` naming ``MIN_VALID_KEY``.
    """
    windows = [TileWindows(tile, size, min_valid) for tile in cells]
    kept = [i for i, tile in enumerate(windows) if tile.count]
    for i, tile in enumerate(windows):
        if not tile.count:
            log.warning(
                "%s holds no %d-pixel window with %s=%g of valid pixels (at most %.3f) "
                "and is left out of training",
                names[i],
                size,
                MIN_VALID_KEY,
                min_valid,
                tile.best,
            )
    if not kept:
        best = max((tile.best for tile in windows), default=0.0)
        raise ConfigError(
            f"{MIN_VALID_KEY}={min_valid:g} is not allowed: no window of "
            f"datamodule.patch_size={size} pixels in the {len(windows)} training image(s) "
            f"holds that share of valid pixels (the best holds {best:.3f}); expected at "
            "most that, or a smaller patch. Valid: the mask holds a class (not an ignored "
            "value) and the image is not datamodule.sampling.nodata (or its GeoTIFF's "
            "no-data value) in every band"
        )
    return kept, [windows[i] for i in kept]


CELL = 16
"""Side of a cell in pixels: fine enough that a window's count is close to exact at its
edges (``TileWindows`` bounds what the edge cells can hold)."""
_COUNTS = np.dtype("<u2")  # stored little-endian whatever the machine


def cells_along(length: int) -> int:
    """The cells that cover ``length`` pixels (the last one may be narrower)."""
    return -(-length // CELL)


class ValidCellCounter:
    """Counts the valid pixels of one tile (``height``×``width``) per cell, fed in row chunks."""

    def __init__(self, height: int, width: int) -> None:
        self.height = height
        self.width = width
        self.counts = np.zeros((cells_along(height), cells_along(width)), np.int64)

    def add(self, valid: np.ndarray, first_row: int) -> None:
        """Count the valid pixels of ``valid`` (H×W bool, rows from ``first_row`` on)."""
        rows = valid.shape[0]
        if not rows:
            return
        # Placed in whole cells (zeros around), then summed over each cell's 16 rows and
        # its 16 columns in turn: two reshaped sums, in place of a reduction per cell.
        skip = first_row % CELL
        cell_rows = cells_along(skip + rows)
        padded = np.zeros((cell_rows * CELL, self.counts.shape[1] * CELL), np.uint8)
        padded[skip : skip + rows, : self.width] = valid
        per_cell_row = padded.reshape(cell_rows, CELL, -1).sum(axis=1, dtype=np.uint8)
        per_cell = per_cell_row.reshape(cell_rows, -1, CELL).sum(axis=2, dtype=np.int64)
        first = first_row // CELL
        self.counts[first : first + cell_rows] += per_cell

    def facts(self) -> dict[str, Any]:
        """The counts for the cache: the cell side, and base64 of zlib'd uint16 counts."""
        packed = zlib.compress(self.counts.astype(_COUNTS).tobytes(), 6)
        return {"cell": CELL, "counts": base64.b64encode(packed).decode()}


class ValidPixels:
    """A pair's valid pixels, fed chunk by chunk of its mask's class indices and no-data pixels.

    The no-data pixels are those the pass found in the image rows it read for its
    statistics (``segscale.data.storage.nodata.nodata_pixels``): no pixel is read or compared twice.
    """

    def __init__(self, height: int, width: int, num_classes: int) -> None:
        self.num_classes = num_classes
        self.counter = ValidCellCounter(height, width)

    def add(self, classes: np.ndarray, first_row: int, nodata: np.ndarray | None) -> None:
        """Count the valid pixels of a chunk (rows from ``first_row`` on).

        ``classes``: the mask's class indices; ``nodata``: the image's no-data pixels in
        the same rows (H×W bool; ``None``: the image has no no-data value).
        """
        valid = classes < self.num_classes  # ignore_index, and what decodes to it, is not
        if nodata is not None:
            valid &= ~nodata
        self.counter.add(valid, first_row)


@dataclass(frozen=True)
class Validity:
    """What the pass counts valid pixels with, besides the labels: the images' no-data value.

    ``nodata``: ``datamodule.sampling.nodata``; ``None`` takes each TIFF's ``GDAL_NODATA`` tag.
    """

    nodata: float | None = None

    def nodata_of(self, image_path: Path) -> float | None:
        """The no-data value of one image: ours, else its tag's (``ValueError`` if no number).

        A tag's NaN matches no pixel (the pass refuses NaN pixels): ``None``.
        """
        if self.nodata is not None:
            return float(self.nodata)
        text = read_nodata_tag(image_path)
        value = parse_nodata(text) if text is not None else None
        return value if value is not None and math.isfinite(value) else None


@dataclass(frozen=True)
class TileValidCells:
    """One tile's valid pixels per cell: ``counts[i, j]``, the cell at row ``i``, column ``j``."""

    counts: np.ndarray
    """uint16, ``cells_along(height)`` × ``cells_along(width)``."""
    shape: tuple[int, int]
    """The tile's height and width in pixels."""

    @classmethod
    def from_facts(cls, facts: dict[str, Any]) -> TileValidCells:
        """Decode what ``ValidCellCounter.facts`` stored, beside the tile's ``shape``."""
        height, width = facts["shape"]
        raw = zlib.decompress(base64.b64decode(facts["valid_cells"]["counts"]))
        counts = np.frombuffer(raw, _COUNTS).reshape(cells_along(height), cells_along(width))
        return cls(counts.astype(np.uint16), (int(height), int(width)))

    def cell_sizes(self, axis: int) -> np.ndarray:
        """The cells' heights (``axis`` 0) or widths (1) in pixels: ``CELL``, the last less."""
        length = self.shape[axis]
        sizes = np.full(self.counts.shape[axis], CELL, np.int64)
        sizes[-1] = length - CELL * (len(sizes) - 1)
        return sizes

    @property
    def nbytes(self) -> int:
        """Memory the counts take."""
        return int(self.counts.nbytes)
