"""Where a GeoTIFF input lies on the Earth, carried over to the predictions made from it.

A prediction has the input's pixel grid, so the input's GeoTIFF tags place it exactly:
a TIFF output carries them verbatim, a PNG output gets a world file (``.pgw``) with
the same affine transform. Nothing here decodes pixels or needs GDAL.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tifffile

from segscale.data.storage.sources import TIFF_SUFFIXES

GEOTIFF_TAGS = {
    33550: "ModelPixelScaleTag",
    33922: "ModelTiepointTag",
    34264: "ModelTransformationTag",
    34735: "GeoKeyDirectoryTag",
    34736: "GeoDoubleParamsTag",
    34737: "GeoAsciiParamsTag",
    50844: "RPCCoefficientTag",  # GDAL's sensor model: it refers to pixels, so it holds too
}
"""The tags that georeference a TIFF; any one of them makes an input georeferenced."""
GDAL_METADATA = 42112
GDAL_NODATA = 42113
_PIXEL_SCALE, _TIEPOINTS, _TRANSFORMATION, _GEO_KEYS = 33550, 33922, 34264, 34735
_ASCII = 2  # the TIFF data type of text
_RASTER_TYPE_KEY, _PIXEL_IS_POINT = 1025, 2  # GTRasterTypeGeoKey, RasterPixelIsPoint

ExtraTag = tuple[int, int, int, Any, bool]
"""One TIFF tag as tifffile's ``extratags`` take it: code, data type, count, value, once."""
Affine = tuple[float, float, float, float, float, float]
"""``(a, b, c, d, e, f)``: pixel corner ``(col, row)`` lies at ``x = a·col + b·row + c``,
``y = d·col + e·row + f`` (rasterio's ``Affine``; GDAL's geotransform reordered)."""


@dataclass(frozen=True)
class Georeference:
    """The georeferencing of one input image, ready to write beside its predictions."""

    tags: tuple[ExtraTag, ...]
    """The input's GeoTIFF tags, values as read, and its dataset-level GDAL metadata;
    GDAL's nodata is left out: every class index is a class, every overlay colour a
    colour, and the input's per-band metadata describes its bands, not the outputs'."""
    transform: Affine | None
    """Pixel to map coordinates as GDAL reads the tags; ``None`` when they define no
    affine transform (ground control points or an RPC model only, or incomplete tags)."""

    def world_file(self) -> str | None:
        """The six lines of a world file (``.pgw``), or ``None`` without a transform.

        A world file names the centre of the upper-left pixel, half a pixel in from
        the corner that ``transform`` starts at.
        """
        if self.transform is None:
            return None
        a, b, c, d, e, f = self.transform
        lines = (a, d, b, e, c + (a + b) / 2, f + (d + e) / 2)
        return "".join(f"{value!r}\n" for value in lines)


def read_georeference(path: Path) -> Georeference | None:
    """The georeferencing that the TIFF ``path`` declares, or ``None`` (any other file).

    Only the first image's tags are read; no pixel is decoded. Raises what tifffile
    raises for a file that is not a TIFF (``ValueError``, ``OSError``).
    """
    if path.suffix.lower() not in TIFF_SUFFIXES:
        return None
    with tifffile.TiffFile(path) as tif:
        page = tif.series[0].keyframe
        tags = {tag.code: tag for tag in page.tags if tag.code in GEOTIFF_TAGS}
        if not tags:
            return None
        metadata = page.tags.get(GDAL_METADATA)
        if metadata is not None and metadata.dtype == _ASCII:
            tags[GDAL_METADATA] = metadata
        extra = {code: _extra_tag(tif, tag) for code, tag in sorted(tags.items())}
    if GDAL_METADATA in extra:
        kept = _dataset_metadata(extra.pop(GDAL_METADATA)[3])
        if kept is not None:
            extra[GDAL_METADATA] = (GDAL_METADATA, _ASCII, len(kept), kept, True)
    values = {code: tag[3] for code, tag in extra.items() if tag[1] != _ASCII}
    return Georeference(tuple(extra.values()), _affine(values))


def _extra_tag(tif: tifffile.TiffFile, tag: tifffile.TiffTag) -> ExtraTag:
    """``tag`` as an ``extratags`` entry; text as its raw bytes, numbers as a tuple.

    tifffile returns text decoded and stripped of spaces; the GeoKey directory points
    into GeoAsciiParams by byte offset, so the bytes are copied as they are.
    """
    if tag.dtype == _ASCII:
        tif.filehandle.seek(tag.valueoffset)
        raw = tif.filehandle.read(tag.count)
        return (tag.code, _ASCII, len(raw), raw, True)
    values = tuple(np.atleast_1d(np.asarray(tag.value)).ravel().tolist())
    return (tag.code, int(tag.dtype), len(values), values, True)


def _affine(values: dict[int, tuple[float, ...]]) -> Affine | None:
    """The transform that GDAL reads from these tags (its rules and precedence)."""
    scale = values.get(_PIXEL_SCALE, ())
    tiepoints = values.get(_TIEPOINTS, ())
    matrix = values.get(_TRANSFORMATION, ())
    if len(scale) >= 2 and scale[0] != 0 and scale[1] != 0:
        if len(tiepoints) < 6:
            return None
        # GDAL takes the first tie point and, against the GeoTIFF specification, reads
        # a negative ScaleY as north-up too.
        i, j, _, x, y, _ = tiepoints[:6]
        a, b, d, e = float(scale[0]), 0.0, 0.0, -abs(float(scale[1]))
        c, f = x - i * a, y - j * e
    elif len(matrix) == 16:
        a, b, _, c, d, e, _, f = (float(v) for v in matrix[:8])
    else:
        return None
    if _pixel_is_point(values.get(_GEO_KEYS, ())):  # tied to pixel centres, not corners
        c, f = c - (a + b) / 2, f - (d + e) / 2
    return (a, b, float(c), d, e, float(f))


def _pixel_is_point(keys: tuple[float, ...]) -> bool:
    """Whether the GeoKey directory says ``RasterPixelIsPoint``."""
    entries = [keys[k : k + 4] for k in range(4, len(keys) - 3, 4)]
    return any(
        entry[0] == _RASTER_TYPE_KEY and entry[1] == 0 and entry[3] == _PIXEL_IS_POINT
        for entry in entries
    )


def _dataset_metadata(xml: bytes) -> bytes | None:
    """GDAL's metadata XML with only the items that still describe a prediction.

    Items of one band (``sample=``) and of the ``IMAGE_STRUCTURE`` domain (how the
    input's pixels were stored) are dropped; ``None`` if nothing is left or the XML
    cannot be parsed (expat refuses entity-expansion bombs).
    """
    try:
        root = ElementTree.fromstring(xml.rstrip(b"\x00"))
    except ElementTree.ParseError:
        return None
    for item in list(root):
        if "sample" in item.attrib or item.get("domain") == "IMAGE_STRUCTURE":
            root.remove(item)
    if not len(root):
        return None
    root[-1].tail = "\n"  # the closing tag on its own line, as GDAL writes it
    return ElementTree.tostring(root, encoding="utf-8", xml_declaration=False)
