"""An image's no-data value: ``datamodule.sampling.nodata``, or its GeoTIFF's no-data tag.

Large rasters (mosaics, orthophotos clipped to a footprint) fill the area they do not
cover with one value, which GDAL records in the TIFF tag ``GDAL_NODATA`` (42113) as
text. A pixel is no-data when every band holds that value. The validation pass reads the
tag from the file's header (no pixel decoded), so it is found for memory-mapped TIFFs as
for those read through rasterio; ``datamodule.sampling.nodata`` overrides it for every
image.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import tifffile

from segscale.data.storage.sources import TIFF_SUFFIXES
from segscale.errors import require

GDAL_NODATA = 42113
"""The TIFF tag in which GDAL writes a raster's no-data value, as ASCII text."""
NODATA_KEY = "datamodule.sampling.nodata"

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf|infinity)", re.I)
"""The forms GDAL writes a no-data value in (``0``, ``-9999``, ``-3.4e+38``, ``nan``); an
allow-list, since Python's ``float`` also takes ``1_000`` and other forms GDAL does not."""


def check_nodata(value: Any) -> None:
    """Refuse a ``datamodule.sampling.nodata`` that is neither ``None`` nor a finite number.

    Non-finite values are refused: the validation pass refuses images holding NaN or
    infinite pixels, so no pixel could equal one.
    """
    require(
        value,
        NODATA_KEY,
        lambda v: v is None or (isinstance(v, (int, float)) and math.isfinite(v)),
        "a finite number (the images' no-data value) or null (the GeoTIFF tag's, where "
        "an image has one)",
    )


def read_nodata_tag(path: Path) -> str | None:
    """The text of the ``GDAL_NODATA`` tag of a TIFF image's first page; ``None`` without one.

    Only the header is read. Files that are not TIFFs have no such tag.
    """
    if path.suffix.lower() not in TIFF_SUFFIXES:
        return None
    with tifffile.TiffFile(path) as tif:
        tag = tif.pages[0].tags.get(GDAL_NODATA)
    if tag is None:
        return None
    value = tag.value
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    return text.strip().rstrip("\x00").strip()


def parse_nodata(text: str) -> float:
    """The number a ``GDAL_NODATA`` tag holds; ``ValueError`` naming it unless it is one."""
    if not _NUMBER.fullmatch(text):
        raise ValueError(
            f"its GDAL_NODATA tag holds {text!r}, not a number; expected the no-data value "
            f"as GDAL writes it, or set {NODATA_KEY} to the images' no-data value"
        )
    return float(text)


def nodata_pixels(rows: np.ndarray, nodata: float) -> np.ndarray:
    """Which pixels of ``rows`` (H×W×C) hold ``nodata`` in every band (H×W bool).

    The value is taken in the pixels' type, as GDAL compares it: a tag's ``-3.4e+38``
    is float32's lowest value in a float32 image. One that the type cannot hold (a
    fraction or ``-9999`` for uint8, NaN) matches nothing.
    """
    if np.issubdtype(rows.dtype, np.floating):
        value = rows.dtype.type(nodata)
    else:
        limits = np.iinfo(rows.dtype)
        if not math.isfinite(nodata) or nodata != int(nodata):
            return np.zeros(rows.shape[:2], bool)
        if not limits.min <= nodata <= limits.max:
            return np.zeros(rows.shape[:2], bool)
        value = rows.dtype.type(int(nodata))
    contiguous = rows.flags.c_contiguous  # bands apart (GDAL's): compared one by one below
    if contiguous and rows.shape[2] <= 4 and rows.dtype.name in ("uint8", "uint16", "float32"):
        # OpenCV's range check of every band at once, 30x faster than NumPy's reduction
        # along the short last axis; equal to the value is inside [value, value].
        bounds = (float(value),) * rows.shape[2]
        return cv2.inRange(rows, bounds, bounds) > 0
    # Band by band: a reduction along the last, short axis takes 10x longer.
    nodata_everywhere = rows[:, :, 0] == value
    for band in range(1, rows.shape[2]):
        nodata_everywhere &= rows[:, :, band] == value
    return nodata_everywhere
