"""Valid pixels per 16×16 cell of a tile, counted by the validation pass.

A pixel is valid when its mask holds a class (not ``ignore_index``: the ignored values
and unknown ones decode to it) and its image is not no-data (``segscale.data.storage.nodata``:
not that value in every band). The pass counts them per ``CELL``×``CELL`` cell as it
reads a pair in row chunks, so the patch sampler can tell which windows hold enough
valid pixels (``segscale.data.sampling.valid_windows``) without reading a tile at start-up. The
counts are exact, cached as zlib-compressed uint16 (a border of no-data compresses to
almost nothing), and take 1/128 of a uint8 mask's bytes in memory.
"""

from __future__ import annotations

import base64
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from segscale.data.storage.nodata import parse_nodata, read_nodata_tag

CELL = 16
"""Side of a cell in pixels: fine enough that a window's count is close to exact at its
edges (``segscale.data.sampling.valid_windows`` bounds what the edge cells can hold)."""
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
