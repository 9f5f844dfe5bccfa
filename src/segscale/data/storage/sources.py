"""Where pixels come from: image/mask files, their readers and writers."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import tifffile
from PIL import Image, ImageMode

from segscale.atomic_files import write_atomically
from segscale.data.storage.mapped_arrays import mapped_array
from segscale.data.storage.rasters import Pixels, WindowedRaster
from segscale.errors import require


@dataclass(frozen=True)
class ImageMaskPair:
    """Paths of one image and its class-index mask."""

    image: Path
    mask: Path


@dataclass(frozen=True)
class FileProblem:
    """One file that cannot be used, and why.

    ``kind`` names a problem that many files can share ("images without a mask in
    /data/train/masks"): a report shows many problems of one kind as their count and a
    few examples, not one line each.
    """

    path: Path
    reason: str
    kind: str = ""


class TileSource(Protocol):
    """What a datamodule needs from a dataset: its files per split, paired."""

    @property
    def cache_key(self) -> str:
        """What names this dataset's files (its resolved root, its split settings).

        The validation pass keeps what it read under this key, in the user's cache
        (``segscale.data.storage.caches``).
        """

    def prepare(self) -> None:
        """Make the files available (generate, unpack, ...); called once per machine."""

    def has_split(self, split: str) -> bool:
        """Whether the dataset has ``split`` (``train``, ``val``, ``test``).

        True means the split may be asked for: ``scan`` still refuses one whose files
        are not there, naming what it looked for.
        """

    def pairs(self, split: str) -> list[ImageMaskPair]:
        """Image/mask pairs of a split."""

    def scan(self, split: str) -> tuple[list[ImageMaskPair], list[FileProblem]]:
        """The pairs of ``split`` and the files that could not be paired."""


TIFF_SUFFIXES = (".tif", ".tiff")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", *TIFF_SUFFIXES)
MASK_SUFFIXES = (".png", *TIFF_SUFFIXES)  # JPEG's lossy compression would alter labels
PIXEL_DTYPES = (np.uint8, np.uint16, np.float32)
READ_ERRORS = (OSError, ValueError, SyntaxError, EOFError, zlib.error)
"""What reading a broken file raises: Pillow (OSError, SyntaxError for bad headers and
checksums, EOFError for truncated streams), tifffile (ValueError, and zlib.error for a
truncated deflate stream) and our readers (ValueError)."""
DEFAULT_MAX_IMAGE_PIXELS = 2 * 89_478_485
"""Pillow's own hard limit (twice ``Image.MAX_IMAGE_PIXELS``): the default of ours, so
every image that Pillow reads reads here too."""
MAX_IMAGE_PIXELS_KEYS = "datamodule.max_image_pixels; max_image_pixels for predict.py"
"""The config keys that set the limit, as a refusal names them."""
_TO_RGB_MODES = ("P", "RGBA", "LA", "CMYK", "YCbCr")  # read_image converts these to RGB


class _PillowLimitSwitch:
    """Pillow's limit (one module global) off while any thread reads through ``_open_checked``.

    Counted, so that threads decode files side by side and the last one to finish puts
    the value back: none restores it while another still reads, or keeps another's.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readers = 0
        self._saved: int | None = None

    @contextmanager
    def off(self) -> Iterator[None]:
        """Pillow's limit is ``None`` inside (and was as it is before and after)."""
        with self._lock:
            if self._readers == 0:
                self._saved, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
            self._readers += 1
        try:
            yield
        finally:
            with self._lock:
                self._readers -= 1
                if self._readers == 0:
                    Image.MAX_IMAGE_PIXELS = self._saved


_PILLOW_LIMIT = _PillowLimitSwitch()


@dataclass(frozen=True)
class ImageHeader:
    """What an image file's header declares, as ``read_image`` would return the pixels."""

    width: int
    height: int
    channels: int
    dtype: str


def read_image(path: Path, max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS) -> Pixels:
    """An image file as an H×W×C array (uint8, uint16 or float32), or a raster standing for one.

    TIFFs are never decoded whole (``segscale.data.storage.rasters``): pixels stored uncompressed
    in one block come back memory-mapped (read-only), every other TIFF as a
    ``WindowedRaster`` that decodes only the blocks of the windows read from it, so a
    tile larger than RAM still works. PNG and JPEG files, which cannot be read by window,
    are decoded into memory, but only after their header's width × height passed
    ``max_image_pixels`` (``None``: no limit); a larger one is refused with a
    ``ValueError`` before anything is decoded (training reads them through the decode
    cache instead: ``segscale.data.storage.decode_cache``).
    """
    if path.suffix.lower() in TIFF_SUFFIXES:
        array = _read_tiff(path)
    else:
        with _open_checked(path, max_image_pixels) as img:
            array = np.asarray(img.convert("RGB") if img.mode in _TO_RGB_MODES else img)
    if array.ndim == 2:  # a raster of an image always has a channel axis
        array = np.asanyarray(array)[:, :, None]  # a memmap stays one
    _check_pixel_type(path, array.dtype)
    return array


def read_image_header(
    path: Path, max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
) -> ImageHeader:
    """The size, channels and pixel type of an image file, read without decoding pixels.

    Raises what ``read_image`` would for the same causes that a header shows: a file
    that is not an image, a size past ``max_image_pixels`` (TIFFs, never decoded whole, are
    exempt, as in ``read_image``), a pixel type that is not supported. A PNG's chunk
    checksums are verified too (``Image.verify``: it reads the file but inflates
    nothing), so a truncated or damaged PNG is found here.
    """
    if path.suffix.lower() in TIFF_SUFFIXES:
        return _tiff_header(path)
    with _open_checked(path, max_image_pixels) as img:
        to_rgb = img.mode in _TO_RGB_MODES
        channels = 3 if to_rgb else len(img.getbands())
        dtype = np.dtype("uint8" if to_rgb else ImageMode.getmode(img.mode).typestr)
        header = ImageHeader(img.width, img.height, channels, dtype.name)
        if img.format == "PNG":
            _verify_png(path, img)
    _check_pixel_type(path, dtype)
    return header


@dataclass(frozen=True)
class MaskFile:
    """A mask file as ``read_mask`` reads it: its raw values and, if it has one, its palette."""

    values: Pixels
    """H×W (class indices, grey levels, a palette mask's indices) or H×W×3 (colours)."""
    palette: np.ndarray | None = None
    """A palette mask's colour of each index (n×3 uint8): a PNG in palette mode ("P"),
    a TIFF with a colour map; ``None`` for every other mask. Whether the classes read the
    mask by these colours or by its indices is ``LabelMap.palette_table``'s to say."""


def read_mask(path: Path, max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS) -> MaskFile:
    """A mask file's raw values (H×W or H×W×3) and its palette, if it is a palette mask.

    Read as ``read_image`` reads images (TIFFs mapped or by window); ``max_image_pixels``
    limits the size of the files decoded whole. A palette mask's values are its indices,
    as stored: its palette comes beside them (``MaskFile.palette``), never applied here.
    """
    palette = None
    if path.suffix.lower() in TIFF_SUFFIXES:
        array = _read_tiff(path, mask=True)
        palette = tiff_palette(path)
        if isinstance(array, WindowedRaster):
            return MaskFile(array, palette)
    else:
        with _open_checked(path, max_image_pixels) as img:
            array = np.asarray(img.convert("RGB") if img.mode in ("RGBA", "LA") else img)
            if img.mode == "P":  # decoded by now: reading the palette decodes nothing more
                palette = _png_palette(img)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim == 3 and array.shape[2] == 4:  # RGBA: the alpha channel carries no label
        array = array[:, :, :3]
    return MaskFile(array, palette)


def _png_palette(img: Image.Image) -> np.ndarray | None:
    """The RGB colour of each index of a palette image (n×3 uint8; its alpha left out)."""
    colours = img.getpalette("RGB")
    return None if colours is None else np.asarray(colours, np.uint8).reshape(-1, 3)


def tiff_palette(path: Path) -> np.ndarray | None:
    """The colour map of a palette TIFF (n×3 uint8), ``None`` for any other TIFF.

    A TIFF stores 16-bit colours; the high byte is the 8-bit colour, whether the writer
    multiplied it by 257 (as ours and GDAL do) or shifted it by 8 bits.
    """
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        if page.photometric != tifffile.PHOTOMETRIC.PALETTE or page.colormap is None:
            return None
        colormap = np.asarray(page.colormap)
    return (colormap.T.astype(np.uint16) >> 8).astype(np.uint8)


def describe_read_error(path: Path, error: BaseException) -> str:
    """Why ``path`` could not be read, without the ``<path>: `` our readers put first."""
    reason = str(error)
    return reason.removeprefix(f"{path}: ") or type(error).__name__


def check_max_image_pixels(value: object, key: str) -> None:
    """Raise ``ConfigError`` naming ``key`` unless ``value`` is a pixel count >= 1 or None."""
    require(
        value,
        key,
        lambda v: v is None or (isinstance(v, int) and v >= 1),
        "a pixel count >= 1, or null for no limit",
    )


def _check_pixel_count(path: Path, width: int, height: int, max_image_pixels: int | None) -> None:
    """Raise ``ValueError`` naming the file, its size and the key, past the limit."""
    pixels = width * height
    if max_image_pixels is not None and pixels > max_image_pixels:
        raise ValueError(
            f"{path}: its header declares {width} x {height} = {pixels} pixels, more than "
            f"the limit of {max_image_pixels} pixels; if the file is trusted, raise the "
            f"limit ({MAX_IMAGE_PIXELS_KEYS})"
        )


@contextmanager
def _open_checked(path: Path, max_image_pixels: int | None) -> Iterator[Image.Image]:
    """``path`` opened by Pillow, its declared size within our limit; nothing decoded yet.

    Ours replaces Pillow's decompression-bomb check, which would raise (or warn) with a
    message that names neither the file nor our key: Pillow's is switched off for the
    duration of this read only, never for the rest of the process (threads that read at
    once decode side by side: ``_PillowLimitSwitch``).
    """
    with _PILLOW_LIMIT.off(), Image.open(path) as img:
        _check_pixel_count(path, img.width, img.height, max_image_pixels)
        yield img


def _verify_png(path: Path, img: Image.Image) -> None:
    """Check every chunk's checksum (no pixel is inflated); name the file if one fails."""
    try:
        img.verify()
    except (OSError, SyntaxError, EOFError) as error:
        raise ValueError(
            f"{path}: the PNG is truncated or damaged ({error}); expected a complete PNG file"
        ) from error


def _check_pixel_type(path: Path, dtype: np.dtype) -> None:
    if dtype not in PIXEL_DTYPES:
        raise ValueError(
            f"{path}: pixels of type {dtype} are not supported; expected uint8, uint16 or float32"
        )


def _read_tiff(path: Path, mask: bool = False) -> Pixels:
    """A TIFF's first image with its channel axis last, never decoded whole.

    Uncompressed pixels in one block are memory-mapped; any other TIFF (tiled or
    striped, compressed) is a ``WindowedRaster``, which decodes the blocks of the
    windows read from it. As a ``mask``, one band is an H×W raster and an alpha band is
    left out. Neither decodes anything here, so no TIFF is held to ``max_image_pixels``.
    """
    with tifffile.TiffFile(path) as tif:
        series = tif.series[0]
        axes = _image_axes(path, series)
        mappable = series.dataoffset is not None
    if not mappable:  # compressed, tiled or strided: read by window
        raster = WindowedRaster(path, squeeze=mask)
        if mask and len(raster.bands) == 4:  # RGBA: the alpha channel carries no label
            raster = WindowedRaster(path, bands=(1, 2, 3))
        return raster
    array = mapped_array(tifffile.memmap(path, mode="r"))  # pickles by path, not by value
    if array.ndim != len(axes):
        raise ValueError(f"{path}: expected one 2-D image with channels, found axes {axes!r}")
    extra = [i for i, axis in enumerate(axes) if axis not in "YX"]
    return np.moveaxis(array, extra[0], -1) if extra else array


def _tiff_header(path: Path) -> ImageHeader:
    """``read_image_header`` of a TIFF: its first series' shape and type."""
    with tifffile.TiffFile(path) as tif:
        series = tif.series[0]
        axes = _image_axes(path, series)
        dtype = np.dtype(series.dtype)
    _check_pixel_type(path, dtype)
    shape = dict(zip(axes, series.shape, strict=True))
    channels = int(np.prod([n for axis, n in shape.items() if axis not in "YX"]))
    return ImageHeader(shape["X"], shape["Y"], channels, dtype.name)


def _image_axes(path: Path, series: tifffile.TiffPageSeries) -> str:
    """The series' axes, if they are one 2-D image (Y, X) with at most one channel axis."""
    axes = series.axes
    extra = [axis for axis in axes if axis not in "YX"]
    if len(extra) > 1 or "Y" not in axes or "X" not in axes:
        raise ValueError(f"{path}: expected one 2-D image with channels, found axes {axes!r}")
    return axes


def write_image(path: Path, image: np.ndarray) -> None:
    """Write an H×W×3 uint8 array as a PNG."""
    write_atomically(path, lambda stream: Image.fromarray(image).save(stream, format="PNG"))


def write_mask(path: Path, mask: np.ndarray) -> None:
    """Write an H×W uint8 class-index array as a single-channel PNG."""
    picture = Image.fromarray(mask, mode="L")
    write_atomically(path, lambda stream: picture.save(stream, format="PNG"))


def display_rgb(image: np.ndarray, max_value: float) -> np.ndarray:
    """An image as 8-bit RGB for viewing: its first three channels (or grey), scaled.

    ``max_value`` is the full intensity of the pixel type (255, 65535, 1.0).
    """
    channels = image[..., :3] if image.ndim == 3 and image.shape[2] >= 3 else image[..., :1]
    if image.dtype != np.uint8 or max_value != 255:
        channels = np.clip(channels.astype(np.float32) * (255 / max_value), 0, 255)
    channels = np.asarray(channels, np.uint8)
    return np.repeat(channels, 3, axis=2) if channels.shape[2] == 1 else channels
