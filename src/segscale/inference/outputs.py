"""Prediction outputs written band by band: palette class masks and overlays (PNG, TIFF)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tifffile
from PIL import Image

from segscale.atomic_files import move_into_place, temporary_beside
from segscale.data.sources import display_rgb
from segscale.errors import ConfigError

FORMATS = ("png", "tif")


class BandImage:
    """An 8-bit image of known size filled in bands of rows, then saved atomically.

    ``tif``: the file is a memory-mapped uncompressed TIFF written as bands arrive, so a
    mask of any size costs no more memory than a band. ``png``: the pixels are held
    (1 byte per pixel for a mask, 3 for an overlay) and compressed at ``close``. With
    ``palette`` (K×3 RGB), the image stores class indices and every viewer shows the
    class colours. Until ``close`` the data is in a hidden temporary file beside
    ``path``, so an interrupted run leaves no truncated output.
    """

    def __init__(
        self, path: Path, shape: tuple[int, ...], file_format: str, palette: np.ndarray | None
    ) -> None:
        if file_format not in FORMATS:
            raise ConfigError(f"format={file_format!r} is not allowed; expected one of {FORMATS}")
        self.path, self.palette = path.with_suffix(f".{file_format}"), palette
        self.temporary = temporary_beside(self.path)
        # None once discarded.
        self.pixels: np.ndarray | None
        if file_format == "tif":
            extra: dict[str, Any] = {"photometric": "palette", "colormap": _tiff_colormap(palette)}
            if palette is None:
                extra = {"photometric": "rgb" if len(shape) == 3 else "minisblack"}
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
        """Finish the file and move it into place; return its path."""
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
        return move_into_place(self.temporary, self.path)

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
