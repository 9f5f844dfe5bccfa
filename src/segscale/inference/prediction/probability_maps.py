"""Class probabilities, top-class confidence and entropy, written as GeoTIFFs by rows.

``predict.py`` writes them beside the masks when asked (``probabilities``,
``confidence``): ``<name>_probabilities.tif`` holds one band per class (band
descriptions are the class names), ``<name>_confidence.tif`` the top class's
probability and ``<name>_entropy.tif`` the entropy of the class probabilities divided
by ``log(K)`` (0: one class certain, 1: all K equally likely). They are always
GeoTIFF, whatever ``format`` the masks have, since PNG holds neither many bands nor
float values; a GeoTIFF input's georeference goes with them, as with a ``tif`` mask.

``uint8`` stores ``round(value × 255)`` (GDAL's scale 1/255 is recorded per band, so
GIS software shows the values in 0-1); ``float16`` / ``float32`` store the values as
such. Each file is a memory-mapped uncompressed TIFF filled as the sliding window
hands out its bands of rows, so an image of any size costs no more memory than a band,
and it lies in a hidden temporary file until it is complete (``atomic_files``).
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import numpy as np
import tifffile

from segscale.atomic_files import move_into_place, temporary_beside
from segscale.errors import ConfigError
from segscale.inference.prediction.georeference import GDAL_METADATA, Georeference

PROBABILITY_ENCODINGS = ("none", "uint8", "float16")
"""``probabilities``: no file, ``round(p × 255)`` as uint8, or float16 values."""
CONFIDENCE_ENCODINGS = ("none", "uint8", "float32")
"""``confidence``: no files, ``round(v × 255)`` as uint8, or float32 values."""
PROBABILITIES_SUFFIX = "_probabilities"
CONFIDENCE_SUFFIX = "_confidence"
ENTROPY_SUFFIX = "_entropy"
_DTYPES = {"uint8": np.uint8, "float16": np.float16, "float32": np.float32}
_ASCII = 2  # the TIFF data type of text


@dataclass(frozen=True)
class ProbabilityOutputs:
    """Which probability files a prediction writes: ``predict.yaml``'s two keys, checked."""

    probabilities: str = "none"
    confidence: str = "none"

    def __post_init__(self) -> None:
        for key, value, allowed in (
            ("probabilities", self.probabilities, PROBABILITY_ENCODINGS),
            ("confidence", self.confidence, CONFIDENCE_ENCODINGS),
        ):
            # A bool or null is refused too: "in" would not match them against strings.
            if not isinstance(value, str) or value not in allowed:
                raise ConfigError(
                    f"{key}={value!r} is not allowed: expected one of {', '.join(allowed)}"
                )

    @property
    def suffixes(self) -> list[str]:
        """What the files' names add to the mask's name, in the order they are written."""
        suffixes = [PROBABILITIES_SUFFIX] if self.probabilities != "none" else []
        if self.confidence != "none":
            suffixes += [CONFIDENCE_SUFFIX, ENTROPY_SUFFIX]
        return suffixes


class RasterFile:
    """A GeoTIFF of ``len(band_names)`` bands, ``height×width``, filled by rows.

    Values in 0-1 arrive as float32 ``bands×rows×W`` and are stored in ``encoding``
    (``uint8``: ``round(v × 255)``). The file is pixel-interleaved, so a band of rows is
    one contiguous stretch of it; it becomes ``path`` at ``close``.
    """

    def __init__(
        self,
        path: Path,
        size: tuple[int, int],
        band_names: list[str],
        encoding: str,
        georeference: Georeference | None,
    ) -> None:
        self.path = path
        self.temporary = temporary_beside(path)
        self.encoding = encoding
        shape = (*size, len(band_names)) if len(band_names) > 1 else size
        tags = list(georeference.tags) if georeference is not None else []
        metadata = _band_metadata(band_names, encoding, _dataset_metadata(tags))
        tags = [tag for tag in tags if tag[0] != GDAL_METADATA]
        tags.append((GDAL_METADATA, _ASCII, len(metadata), metadata, True))
        extra: dict[str, Any] = {"photometric": "minisblack", "extratags": tags}
        if len(band_names) > 1:
            extra["planarconfig"] = "contig"
        self.pixels: np.ndarray | None = tifffile.memmap(
            self.temporary, shape=shape, dtype=_DTYPES[encoding], metadata=None, **extra
        )

    def write(self, y0: int, bands: np.ndarray) -> None:
        """Store rows ``y0 … y0 + rows`` of every band (``bands×rows×W``, values 0-1)."""
        if self.pixels is None:
            raise TypeError("the file was discarded; it takes no more rows")
        rows = np.moveaxis(bands, 0, -1) if self.pixels.ndim == 3 else bands[0]
        self.pixels[y0 : y0 + rows.shape[0]] = encode(rows, self.encoding)

    def close(self) -> Path:
        """Finish the file and move it into place; return its path.

        An ``OSError`` that names no file (a full disk) is given this file's name, as
        ``BandImage.close`` does for the masks.
        """
        if self.pixels is None:
            raise AttributeError("the file was discarded; it cannot be closed")
        assert isinstance(self.pixels, np.memmap)  # made by tifffile.memmap
        try:
            self.pixels.flush()
            self.pixels = None  # unmapped before it is moved
            return move_into_place(self.temporary, self.path)
        except OSError as error:
            if error.filename is None:
                error.filename = str(self.path)
            raise

    def discard(self) -> None:
        """Drop the unfinished file."""
        self.pixels = None
        self.temporary.unlink(missing_ok=True)


def encode(values: np.ndarray, encoding: str) -> np.ndarray:
    """``values`` (0-1) as stored: ``round(v × 255)`` for ``uint8``, else cast."""
    if encoding == "uint8":
        return np.rint(np.clip(values, 0, 1) * 255).astype(np.uint8)
    return values.astype(_DTYPES[encoding])


def confidence(probabilities: np.ndarray) -> np.ndarray:
    """The top class's probability per pixel (``K×…`` → ``…``)."""
    return probabilities.max(axis=0)


def normalised_entropy(probabilities: np.ndarray) -> np.ndarray:
    """``−Σ p·ln p / ln K`` per pixel (``K×…`` → ``…``), in 0-1; 0 for one class.

    A zero probability adds nothing (the limit of ``p·ln p``), not ``0 × −inf``.
    """
    num_classes = probabilities.shape[0]
    if num_classes < 2:
        return np.zeros(probabilities.shape[1:], np.float32)
    logs = np.log(np.maximum(probabilities, np.finfo(np.float32).tiny))
    entropy = -(probabilities * logs).sum(axis=0) / math.log(num_classes)
    return np.clip(entropy, 0, 1).astype(np.float32)


class ProbabilityFiles:
    """The probability, confidence and entropy files of one image, as ``outputs`` asks."""

    def __init__(
        self,
        stem: Path,
        size: tuple[int, int],
        class_names: tuple[str, ...],
        outputs: ProbabilityOutputs,
        georeference: Georeference | None,
    ) -> None:
        self.outputs = outputs
        self.files: list[RasterFile] = []
        layout = [(PROBABILITIES_SUFFIX, list(class_names), outputs.probabilities)]
        layout += [(CONFIDENCE_SUFFIX, ["confidence"], outputs.confidence)]
        layout += [(ENTROPY_SUFFIX, ["entropy"], outputs.confidence)]
        try:
            for suffix, band_names, encoding in layout:
                if encoding != "none":
                    path = _named(stem, suffix)
                    self.files.append(RasterFile(path, size, band_names, encoding, georeference))
        except BaseException:  # the files begun before stay no more than this one
            self.discard()
            raise

    def write(self, y0: int, probabilities: np.ndarray) -> None:
        """Store rows ``y0 …`` from the blended probabilities ``K×rows×W``."""
        values = []
        if self.outputs.probabilities != "none":
            values.append(probabilities)
        if self.outputs.confidence != "none":
            values += [confidence(probabilities)[None], normalised_entropy(probabilities)[None]]
        for file, bands in zip(self.files, values, strict=True):
            file.write(y0, bands)

    def close(self) -> list[Path]:
        """Finish every file and move it into place; return their paths."""
        return [file.close() for file in self.files]

    def discard(self) -> None:
        """Drop every unfinished file."""
        for file in self.files:
            file.discard()


def _named(stem: Path, suffix: str) -> Path:
    # Not with_suffix: the stem of "scene.2024.tif" is "scene.2024", not "scene".
    return stem.with_name(f"{stem.name}{suffix}.tif")


def _dataset_metadata(tags: list[Any]) -> ElementTree.Element:
    """The input's dataset-level GDAL metadata among ``tags``, or an empty element.

    ``Georeference`` kept only its dataset-level items, and only XML that parses.
    """
    for tag in tags:
        if tag[0] == GDAL_METADATA:
            return ElementTree.fromstring(bytes(tag[3]).rstrip(b"\x00"))
    return ElementTree.Element("GDALMetadata")


def _band_metadata(names: list[str], encoding: str, root: ElementTree.Element) -> bytes:
    """GDAL's metadata XML: ``root``'s items, then each band's description (and scale)."""
    for sample, name in enumerate(names):
        _item(root, "DESCRIPTION", sample, "description", name)
        if encoding == "uint8":  # GDAL unscales value × 1/255 + 0 back to 0-1
            _item(root, "SCALE", sample, "scale", repr(1 / 255))
            _item(root, "OFFSET", sample, "offset", "0")
    return ElementTree.tostring(root, encoding="utf-8", xml_declaration=False)


def _item(root: ElementTree.Element, name: str, sample: int, role: str, text: str) -> None:
    item = ElementTree.SubElement(root, "Item", name=name, sample=str(sample), role=role)
    # GDAL escapes a value before it escapes the XML, and unescapes twice when reading.
    item.text = escape(text, {'"': "&quot;"})
