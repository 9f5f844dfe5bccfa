"""Rasters read where they lie: a window of pixels at a time, never the whole file.

A training run draws small patches from large images, so it needs only the pixels of
each patch's window. Files whose pixels lie uncompressed in one block (uncompressed
TIFFs, the decode cache's entries) are memory-mapped (``np.memmap``): the kernel pages
in what a window touches, and every process of the machine shares those pages (a
spawned process too: ``segscale.data.storage.mapped_arrays`` pickles a map by path). Every
other TIFF (tiled or striped, compressed or not: GeoTIFFs, COGs) is a
``WindowedRaster``, read through rasterio, whose GDAL driver decodes only the blocks a
window touches, into a block cache of ``GDAL_CACHE_MB`` per process. rasterio rather
than tifffile's zarr store: GDAL decodes every compression TIFFs use (deflate, LZW,
JPEG, ZSTD, WebP, LERC) without further packages, reads the GeoTIFF no-data tag, and is
what the field's tools read these files with.

A ``WindowedRaster`` behaves as a read-only H×W×C (or H×W) array for what segscale does
with images: ``shape``, ``dtype``, ``ndim``, ``len``, and indexing by row and column
slices (with steps) and channels, which returns a NumPy array of just those pixels;
``np.asarray`` of a whole one reads it all. It pickles by path (a ``ddp_spawn`` rank or
a spawned DataLoader worker opens the file again), and a forked worker opens its own
GDAL dataset: a GDAL handle is not to be shared across ``fork``.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import cv2
import numpy as np

if TYPE_CHECKING:  # grids reads files through sources, which imports this module
    from segscale.data.storage.grids import Grid

GDAL_CACHE_MB = 64
"""GDAL's block cache in each process that reads windows (GDAL's own default is 5 % of
the machine's memory in every process: ranks × workers of it)."""

BAND_ROWS = 256
"""Rows read at a time for a strided row slice (every n-th row): memory stays bounded."""

Index = Any
"""What ``raster[...]`` takes: a slice of rows, or of rows and columns (and channels)."""


class Pixels(Protocol):
    """An image or mask as segscale reads it: an array, or a raster read by window.

    An array decoded or memory-mapped; slicing either gives an array of just those pixels.
    """

    @property
    def shape(self) -> tuple[int, ...]:
        """H×W or H×W×C."""

    @property
    def dtype(self) -> np.dtype:
        """The pixel type."""

    @property
    def ndim(self) -> int:
        """2 or 3."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: Index) -> Any: ...


class UnreadableWindowError(OSError):
    """A window of a raster file that could not be decoded: the file is damaged or truncated."""

    def __init__(self, message: str, path: Path) -> None:
        super().__init__(message)
        self.path = path


class WindowedRaster:
    """A TIFF read by window through rasterio: only the blocks a window touches are decoded.

    ``bands`` (1-based, as GDAL counts) are the channels it stands for (default: all);
    with ``squeeze`` one band is an H×W array, as a mask of class indices is. ``nodata``
    is the file's no-data value (GeoTIFF's ``GDAL_NODATA`` tag), if it has one.

    ``onto``: the file read on another grid (``segscale.data.storage.grids.Grid``: a mask on its
    image's), through GDAL's warper (``WarpedVRT``, nearest neighbour: each pixel takes
    the value of the file's pixel it falls in), window by window. The warper adds a band
    after the file's, ``coverage_band``: 255 where the file covers the grid, 0 elsewhere.
    """

    def __init__(
        self,
        path: Path,
        bands: tuple[int, ...] | None = None,
        squeeze: bool = False,
        onto: Grid | None = None,
    ) -> None:
        self.path = Path(path)
        self.onto = onto
        self._handles: dict[int, Any] = {}  # process id → its open dataset
        self._lock = threading.Lock()
        dataset = self._dataset()
        count = dataset.count - 1 if onto is not None else dataset.count
        self.coverage_band = dataset.count if onto is not None else None
        self.bands = bands or tuple(range(1, count + 1))
        self.squeeze = squeeze and len(self.bands) == 1
        height, width = dataset.height, dataset.width
        self.shape = (height, width) if self.squeeze else (height, width, len(self.bands))
        self.dtype = np.dtype(dataset.dtypes[self.bands[0] - 1])
        self.nodata: float | None = dataset.nodata if onto is None else None

    @property
    def ndim(self) -> int:
        """2 (H×W) or 3 (H×W×C), as the array it stands for."""
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype)

    def __getitem__(self, index: Index) -> np.ndarray:
        rows, cols, channels = _split(index, self.ndim)
        y0, y1, y_step = rows.indices(self.shape[0])
        x0, x1, x_step = cols.indices(self.shape[1])
        if y_step < 1 or x_step < 1:
            raise IndexError(f"{self.path}: a raster is read forward only (got steps < 1)")
        if y1 <= y0 or x1 <= x0:  # nothing to read: an empty array of the right shape
            size = (len(range(y0, y1, y_step)), len(range(x0, x1, x_step)), *self.shape[2:])
            empty = np.empty(size, self.dtype)
            return empty[:, :, channels] if self.ndim == 3 else empty
        if y_step == 1:
            window = self._read_window(y0, y1, x0, x1)
        else:
            window = np.concatenate(list(self._strided_rows(y0, y1, y_step, x0, x1)))
        window = window[:, ::x_step]
        return window[:, :, channels] if self.ndim == 3 else window

    def _strided_rows(self, y0: int, y1: int, step: int, x0: int, x1: int) -> Iterator[np.ndarray]:
        """Every ``step``-th row from ``y0``, read a band of rows at a time."""
        band = max(step, BAND_ROWS - BAND_ROWS % step)
        for start in range(y0, y1, band):
            yield self._read_window(start, min(start + band, y1), x0, x1)[::step]

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_handles": {}, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def band_rows(self, y0: int, y1: int) -> np.ndarray:
        """Rows ``y0`` to ``y1`` as GDAL decodes them, band after band: an H×W×C view.

        The same pixels as ``self[y0:y1]`` without interleaving them (a copy of the rows
        that reading a whole band at a time does not need): each channel is contiguous.
        """
        bands = self._read_bands(y0, min(y1, self.shape[0]), 0, self.shape[1])
        return bands[0] if self.squeeze else np.moveaxis(bands, 0, -1)

    def _read_window(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """The window's pixels (H×W×C, or H×W), decoded from the blocks it touches."""
        bands = self._read_bands(y0, y1, x0, x1)
        if self.squeeze:
            return bands[0]
        return interleaved(bands)

    def _read_bands(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """The window's bands (C×H×W), decoded from the blocks it touches."""
        from rasterio.windows import Window

        dataset = self._dataset()
        try:
            bands = dataset.read(list(self.bands), window=Window(x0, y0, x1 - x0, y1 - y0))
        except OSError as error:  # rasterio's RasterioIOError: a damaged or truncated block
            reason = error.__cause__ or error  # GDAL's own message is the cause
            raise UnreadableWindowError(
                f"{self.path}: rows {y0}-{y1}, columns {x0}-{x1} cannot be read ({reason})",
                self.path,
            ) from None
        return bands

    def close(self) -> None:
        """Close this process's dataset (the next read opens it again)."""
        handle = self._handles.pop(os.getpid(), None)
        if handle is not None:
            handle.close()
            if self.onto is not None:  # the file the warper read
                handle.src_dataset.close()

    def _dataset(self) -> Any:
        """The dataset open in this process: one opened before a fork is never used after it."""
        pid = os.getpid()
        handle = self._handles.get(pid)
        if handle is None:
            with self._lock:
                handle = self._handles.get(pid)
                if handle is None:
                    handle = _open(self.path)
                    if self.onto is not None:
                        handle = _warped(handle, self.onto)
                    self._handles = {pid: handle}  # a parent's handle is dropped, not closed
        return handle


def _open(path: Path) -> Any:
    """``path`` opened by rasterio, with GDAL's block cache set to ``GDAL_CACHE_MB``."""
    import rasterio
    from rasterio.errors import NotGeoreferencedWarning

    _set_block_cache()
    with warnings.catch_warnings():  # plain TIFFs have no georeference: nothing to say
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        try:
            return rasterio.open(path, sharing=False)
        except rasterio.errors.RasterioIOError as error:
            raise ValueError(f"{path}: cannot be read ({error})") from None


def _warped(dataset: Any, grid: Grid) -> Any:
    """``dataset`` read on ``grid`` (nearest neighbour), with a coverage band after its own."""
    from affine import Affine
    from rasterio.enums import Resampling
    from rasterio.vrt import WarpedVRT

    return WarpedVRT(
        dataset,
        crs=grid.crs,
        transform=Affine(*grid.transform),
        width=grid.width,
        height=grid.height,
        resampling=Resampling.nearest,
        add_alpha=True,
    )


_cache_set_in: int | None = None


def _set_block_cache() -> None:
    """GDAL's block cache of this process: ``GDAL_CACHE_MB``, unless the user set one."""
    global _cache_set_in
    if _cache_set_in == os.getpid():
        return
    _cache_set_in = os.getpid()
    if "GDAL_CACHEMAX" in os.environ:  # the user's own choice
        return
    from rasterio.env import set_gdal_config

    # An integer is bytes here (GDAL's environment variable reads small numbers as MB).
    set_gdal_config("GDAL_CACHEMAX", GDAL_CACHE_MB << 20)


MERGED_TYPES = frozenset(
    np.dtype(t) for t in ("uint8", "int8", "uint16", "int16", "int32", "float32", "float64")
)
"""The pixel types ``cv2.merge`` interleaves (OpenCV's own depths)."""


def interleaved(bands: np.ndarray) -> np.ndarray:
    """C×H×W bands (as GDAL reads them) as one contiguous H×W×C array.

    ``cv2.merge`` writes the interleaved pixels in one pass, some 30× faster than NumPy's
    strided copy of ``moveaxis``, which took longer than decoding the window's blocks
    (about 1 ms against 0.2 ms for a 512² RGB window); NumPy does the types OpenCV lacks.
    """
    if len(bands) == 1:
        return bands[0][:, :, None]
    if bands.dtype in MERGED_TYPES and len(bands) <= 512:  # OpenCV's most channels
        return cv2.merge(list(bands))
    return np.ascontiguousarray(np.moveaxis(bands, 0, -1))


def _split(index: Index, ndim: int) -> tuple[slice, slice, Any]:
    """``index`` as a row slice, a column slice and the channels (``slice(None)``: all)."""
    parts = index if isinstance(index, tuple) else (index,)
    if parts and parts[0] is Ellipsis:
        parts = parts[1:]
    if len(parts) > ndim or not all(isinstance(p, slice) for p in parts[:2]):
        raise IndexError(f"a raster takes slices of rows and columns, got {index!r}")
    rows = parts[0] if len(parts) > 0 else slice(None)
    cols = parts[1] if len(parts) > 1 else slice(None)
    channels = parts[2] if len(parts) > 2 else slice(None)
    return rows, cols, channels
