"""Prediction outputs written band by band: palette class masks and overlays (PNG, TIFF)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import tifffile
from PIL import Image

from segscale.atomic_files import move_into_place, temporary_beside, write_text_atomically
from segscale.data.storage.sources import display_rgb
from segscale.errors import ConfigError
from segscale.inference.prediction.georeference import Georeference

log = logging.getLogger(__name__)

FORMATS = ("png", "tif")
WORLD_FILE_SUFFIX = ".pgw"
"""The world file of a PNG output: ``<name>.pgw`` beside ``<name>.png``."""


class BandImage:
    """An 8-bit image of known size filled in bands of rows, then saved atomically.

    It is saved as ``path`` plus ``.<file_format>`` (``path`` names it without a suffix).
    ``tif``: the file is a memory-mapped uncompressed TIFF written as bands arrive, so a
    mask of any size costs no more memory than a band. ``png``: the pixels are held
    (1 byte per pixel for a mask, 3 for an overlay) and compressed at ``close``. With
    ``palette`` (K×3 RGB), the image stores class indices and every viewer shows the
    class colours. Until ``close`` the data is in a hidden temporary file beside
    ``path``, so an interrupted run leaves no truncated output.

    With ``georeference`` (the input's), a ``tif`` carries its GeoTIFF tags and a
    ``png`` gets a world file ``<name>.pgw``; without, the files are what they were
    before georeferencing existed, byte for byte.
    """

    def __init__(
        self,
        path: Path,
        shape: tuple[int, ...],
        file_format: str,
        palette: np.ndarray | None,
        georeference: Georeference | None = None,
    ) -> None:
        if file_format not in FORMATS:
            raise ConfigError(f"format={file_format!r} is not allowed; expected one of {FORMATS}")
        # Not with_suffix: the stem of "scene.2024.tif" is "scene.2024", not "scene".
        self.path = path.with_name(f"{path.name}.{file_format}")
        self.palette = palette
        self.georeference = georeference
        self.temporary = temporary_beside(self.path)
        # None once discarded.
        self.pixels: np.ndarray | None
        if file_format == "tif":
            extra: dict[str, Any] = {"photometric": "palette", "colormap": _tiff_colormap(palette)}
            if palette is None:
                extra = {"photometric": "rgb" if len(shape) == 3 else "minisblack"}
            if georeference is not None:  # only then: other files stay as they were
                extra["extratags"] = georeference.tags
            self.pixels = tifffile.memmap(self.temporary, shape=shape, dtype=np.uint8, **extra)
        else:
            self.pixels = np.zeros(shape, np.uint8)
        self.file_format = file_format

    def write(self, y0: int, band: np.ndarray) -> None:
        """Store rows ``y0 … y0 + len(band)``."""
        if self.pixels is None:  # what indexing None would raise
            raise TypeError("the image was discarded; it takes no more rows")
        self.pixels[y0 : y0 + len(band)] = band

    def close(self) -> Path:
        """Finish the file and move it into place; return its path.

        An ``OSError`` that names no file (a full disk, met by a write) is given this
        image's name.
        """
        try:
            return self._finish()
        except OSError as error:
            if error.filename is None:
                error.filename = str(self.path)
            raise

    def _finish(self) -> Path:
        if self.pixels is None:  # what flushing or reading None would raise
            raise AttributeError("the image was discarded; it cannot be closed")
        if self.file_format == "tif":
            assert isinstance(self.pixels, np.memmap)  # a "tif" image is memory-mapped
            self.pixels.flush()
            del self.pixels
        else:
            picture = Image.fromarray(self.pixels)
            if self.palette is not None:  # an "L" image becomes "P", its values unchanged
                picture.putpalette(_png_palette(self.palette))
            picture.save(self.temporary, format="PNG")
            self._write_world_file()
        return move_into_place(self.temporary, self.path)

    def _write_world_file(self) -> None:
        """Write ``<name>.pgw`` if the input is georeferenced by a transform, else remove it.

        Written before the image is moved into place, so a PNG that exists has its
        world file.
        """
        world_file = self.path.with_suffix(WORLD_FILE_SUFFIX)
        lines = None if self.georeference is None else self.georeference.world_file()
        if lines is not None:
            write_text_atomically(world_file, lines)
            return
        # One left by an earlier run would place this image where that one lay.
        world_file.unlink(missing_ok=True)
        if self.georeference is not None:
            log.warning(
                "%s: no world file; its input is georeferenced by ground control points "
                "or a sensor model, which a world file cannot express (format=tif keeps them)",
                self.path,
            )

    def discard(self) -> None:
        """Drop the unfinished file."""
        self.pixels = None
        self.temporary.unlink(missing_ok=True)


def overlay(
    image: np.ndarray, labels: np.ndarray, colours: np.ndarray, alpha: float, max_value: float
) -> np.ndarray:
    """The image (as 8-bit RGB) with each pixel's class colour blended over it."""
    base = display_rgb(np.asarray(image), max_value).astype(np.float32)
    return (
        (base * (1 - alpha) + colours[labels].astype(np.float32) * alpha).round().astype(np.uint8)
    )


def _png_palette(colours: np.ndarray) -> list[int]:
    palette = np.zeros((256, 3), np.uint8)
    palette[: len(colours)] = colours
    return palette.ravel().tolist()


def _tiff_colormap(colours: np.ndarray | None) -> np.ndarray | None:
    if colours is None:
        return None
    colormap = np.zeros((3, 256), np.uint16)
    colormap[:, : len(colours)] = colours.T.astype(np.uint16) * 257
    return colormap
