"""Sliding-window inference: whole images of any size, in memory bounded by one row of tiles.

Tiles are cut in row-major order and their class probabilities are blended with a
Gaussian window (see ``gaussian_window``). Accumulators exist only for the band of
image rows that the current row of tiles covers; rows that no later tile can reach
are finished and handed out at once, so peak memory does not grow with image height.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice

import numpy as np
import torch
import torch.nn.functional as F

from segscale.data.storage.rasters import Pixels
from segscale.errors import ConfigError
from segscale.inference.test_time_augmentation import augmented_probabilities, check_tta
from segscale.models.networks import network_input_multiple

Model = Callable[[torch.Tensor], torch.Tensor]
"""Float32 ``N×C×h×w`` in the image's raw value range → logits ``N×K×h×w``."""

Origin = tuple[int, int]
"""``(y, x)``: the top-left pixel of a tile in the image."""

OnTiles = Callable[[int, int, int, int], None]
"""Called after each batch of tiles, for progress: ``(done, tiles, row, rows)``, the image's
tiles done and in all, the row of tiles (1-based) the batch's last one lies in, and the
image's rows of tiles."""

MIN_WEIGHT = 1e-4
"""Floor of the blending window, relative to its peak of 1 (see ``gaussian_window``)."""

BLENDS = ("gaussian", "none")
"""How tiles that share pixels combine: ``SlidingWindow``'s ``blend``."""


def tile_starts(length: int, tile: int, stride: int) -> list[int]:
    """Tile starts along an axis of ``length`` pixels: ``0, stride, 2·stride, …``.

    The last tile is moved back to end exactly at ``length``, so no tile hangs over the
    border; an axis shorter than ``tile`` gets the single start 0.
    """
    if length <= tile:
        return [0]
    return [*range(0, length - tile, stride), length - tile]


def gaussian_window(height: int, width: int) -> np.ndarray:
    """Blending weights for one ``height×width`` tile: float32, peak 1, floor ``MIN_WEIGHT``.

    A separable Gaussian with sigma = side / 8 (as nnU-Net uses): pixels near a tile's
    border saw the least context, and often the network's zero padding, so a
    neighbouring tile that holds them nearer its centre should dominate there. The
    floor keeps the weight strictly positive, so pixels that only one tile covers
    (near the image border) still get that tile's prediction rather than 0 / 0.
    """
    rows, cols = _gaussian(height), _gaussian(width)
    return np.maximum(np.outer(rows, cols), MIN_WEIGHT).astype(np.float32)


def _gaussian(size: int) -> np.ndarray:
    offset = np.arange(size, dtype=np.float64) - (size - 1) / 2
    sigma = size / 8
    return np.exp(-0.5 * (offset / sigma) ** 2)


class SlidingWindow:
    """Predicts label maps of images of any size by blending overlapping tiles.

    ``tile_size``: tile side in pixels fed to the network. ``overlap``: fraction of a
    tile shared with its neighbour, in [0, 1); the stride is
    ``round(tile_size × (1 − overlap))``, at least 1. ``batch_size``: tiles per forward
    pass. ``tta``: test-time augmentation of each batch of tiles, averaged in probability
    space (``test_time_augmentation.TRANSFORMS``): ``none``; ``flip``, the tile and its
    left-right and up-down flips (3× the compute); ``d4``, the 8 rotations and flips of
    the square (8×). ``tta_scales``: the tile is also resized by each factor before the
    network and its probabilities back (``[1.0]``: as is); the views multiply, so ``d4``
    at 3 scales costs about 24×. ``blend``: ``gaussian`` weighs the
    tiles that share a pixel with ``gaussian_window``; ``none`` gives each pixel the
    prediction of the first tile (row-major) that covers it, which with ``overlap=0`` is
    the validation grid of training (``GridPatchDataset``: the last row and column of
    tiles moved back inside the image score only the pixels no earlier tile scored).
    """

    def __init__(
        self,
        tile_size: int = 512,
        overlap: float = 0.25,
        batch_size: int = 8,
        tta: str = "none",
        tta_scales: Sequence[float] = (1.0,),
        blend: str = "gaussian",
    ) -> None:
        _require(tile_size, "inference.tile_size", _is_int(1), "an integer >= 1")
        _require(overlap, "inference.overlap", _is_fraction, "a number with 0 <= overlap < 1")
        _require(batch_size, "inference.batch_size", _is_int(1), "an integer >= 1")
        _require(blend, "inference.blend", lambda v: v in BLENDS, f"one of {BLENDS}")
        self.tile_size = tile_size
        self.overlap = float(overlap)
        self.batch_size = batch_size
        self.tta_scales = check_tta(tta, tta_scales)
        self.tta = tta
        self.blend = blend
        self.stride = max(1, round(tile_size * (1 - self.overlap)))

    def tile_origins(self, height: int, width: int) -> Iterator[Origin]:
        """Top-left ``(y, x)`` of every tile of a ``height×width`` image, row-major.

        Tiles are ``min(tile_size, height) × min(tile_size, width)`` pixels; the count is
        ``len(tile_starts(height, …)) × len(tile_starts(width, …))``, for progress bars.
        """
        columns = tile_starts(width, self.tile_size, self.stride)
        for y in tile_starts(height, self.tile_size, self.stride):
            for x in columns:
                yield y, x

    def predict(
        self,
        model: Model,
        image: Pixels,
        num_classes: int,
        device: torch.device | str = "cpu",
        on_band: Callable[[int, np.ndarray], None] | None = None,
        on_tiles: OnTiles | None = None,
    ) -> np.ndarray | None:
        """Label map of ``image``: the argmax of the blended tile probabilities.

        ``image``: ``H×W×C`` or ``H×W`` (one channel), any numeric dtype, possibly a
        read-only ``np.memmap``; it is read one tile at a time. ``model`` (already on
        ``device`` and in eval mode) gets float32 ``N×C×h×w`` tiles in the image's raw
        value range and returns ``N×num_classes×h×w`` logits. Labels are uint8 when
        ``num_classes <= 255``, else uint16.

        Without ``on_band``, returns the ``H×W`` label map. With it, calls
        ``on_band(y0, labels)`` for consecutive bands of rows (``labels`` is
        ``rows×W``), in order from ``y0 = 0``, covering every row exactly once, each as
        soon as no later tile can change it, keeps none of them and returns None.
        ``on_tiles``: told of each batch of tiles done (``OnTiles``).
        """
        dtype = np.uint8 if num_classes <= 255 else np.uint16
        labels: np.ndarray | None = None if on_band else np.empty(image.shape[:2], dtype=dtype)
        bands = self.probability_bands(model, image, num_classes, device, on_tiles)
        for y0, probabilities in bands:
            band = probabilities.argmax(axis=0).astype(dtype)
            if on_band is None:
                assert labels is not None  # made above when there is no on_band
                labels[y0 : y0 + len(band)] = band
            else:
                on_band(y0, band)
        return labels

    def probability_bands(
        self,
        model: Model,
        image: Pixels,
        num_classes: int,
        device: torch.device | str = "cpu",
        on_tiles: OnTiles | None = None,
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Blended class probabilities, band by band: ``(y0, float32 K×rows×W)``.

        Same arguments and band order as ``predict``; each pixel's probabilities are
        the window-weighted mean of the softmax of every tile that covers it, and sum
        to 1. Bands are yielded as soon as they are final, so progress is ``y0 + rows``
        out of ``H``; ``on_tiles`` is told of each batch of tiles (``OnTiles``).
        """
        if image.ndim not in (2, 3) or 0 in image.shape:
            raise ValueError(f"image must be a non-empty H×W×C or H×W array, got {image.shape}")
        if image.ndim == 2:
            image = np.asarray(image)[:, :, None]  # a view: a memmap stays unread
        height, width = image.shape[:2]
        tile_shape = (min(self.tile_size, height), min(self.tile_size, width))
        first_wins = self.blend == "none"
        window = np.ones(tile_shape, np.float32) if first_wins else gaussian_window(*tile_shape)
        bands = _BandAccumulator(num_classes, tile_shape[0], width, window, first_wins)
        rows = {y: row for row, y in enumerate(tile_starts(height, self.tile_size, self.stride))}
        count = len(rows) * len(tile_starts(width, self.tile_size, self.stride))
        done = 0
        for origins in _batches(self.tile_origins(height, width), self.batch_size):
            tiles = np.stack([_read_tile(image, origin, tile_shape) for origin in origins])
            probabilities = self._probabilities(model, tiles, num_classes, device)
            for (y, x), tile in zip(origins, probabilities * window, strict=True):
                if y > bands.top:
                    yield bands.top, bands.release(y)
                bands.add(y, x, tile)
            done += len(origins)
            if on_tiles is not None:
                on_tiles(done, count, rows[origins[-1][0]] + 1, len(rows))
        yield bands.top, bands.release(height)

    @torch.inference_mode()
    def _probabilities(
        self, model: Model, tiles: np.ndarray, num_classes: int, device: torch.device | str
    ) -> np.ndarray:
        """Softmax of ``tiles`` (float32 ``N×h×w×C``) as float32 ``N×K×h×w`` on the host."""
        height, width = tiles.shape[1:3]
        batch = _pad_to(torch.from_numpy(tiles).to(device).permute(0, 3, 1, 2), self.tile_size)
        probabilities = augmented_probabilities(
            lambda views: _softmax(model, views, num_classes),
            batch,
            self.tta,
            self.tta_scales,
            _input_multiple(model) if self.tta_scales != (1.0,) else 1,
        )
        return probabilities[:, :, :height, :width].cpu().numpy()


class _BandAccumulator:
    """Weighted probability sums for the rows ``top … top + rows − 1`` only.

    Tiles must arrive row-major; once a tile starting at row ``y`` arrives, rows above
    ``y`` are final (later tiles start at ``y`` or below) and ``release(y)`` hands them
    out and shifts the buffers up, so they never hold more than one tile's height.
    ``first_wins``: a pixel keeps the first tile's values, later tiles add nothing to it.
    """

    def __init__(
        self, num_classes: int, rows: int, width: int, window: np.ndarray, first_wins: bool
    ) -> None:
        self.top = 0
        self.window = window
        self.first_wins = first_wins
        # Host memory, not the device's: it holds a full image row, the device only a batch.
        self.sums = np.zeros((num_classes, rows, width), dtype=np.float32)
        self.weights = np.zeros((rows, width), dtype=np.float32)

    def add(self, y: int, x: int, weighted: np.ndarray) -> None:
        """Add one tile's window-weighted probabilities (``K×h×w``) at image pixel (y, x)."""
        rows = slice(y - self.top, y - self.top + weighted.shape[1])
        columns = slice(x, x + weighted.shape[2])
        if self.first_wins:
            unscored = self.weights[rows, columns] == 0
            self.sums[:, rows, columns] += weighted * unscored
            self.weights[rows, columns] += self.window * unscored
            return
        self.sums[:, rows, columns] += weighted
        self.weights[rows, columns] += self.window

    def release(self, end: int) -> np.ndarray:
        """Blended probabilities (``K×rows×W``) of image rows ``top … end − 1``; drops them."""
        count = end - self.top
        band = self.sums[:, :count] / self.weights[:count]
        kept = self.weights.shape[0] - count
        self.sums[:, :kept] = self.sums[:, count:]
        self.sums[:, kept:] = 0
        self.weights[:kept] = self.weights[count:]
        self.weights[kept:] = 0
        self.top = end
        return band


def _read_tile(image: Pixels, origin: Origin, shape: tuple[int, int]) -> np.ndarray:
    y, x = origin
    return np.asarray(image[y : y + shape[0], x : x + shape[1]], dtype=np.float32)


def _pad_to(batch: torch.Tensor, size: int) -> torch.Tensor:
    """Pad ``N×C×h×w`` at the right and bottom up to ``size×size``."""
    height, width = batch.shape[-2:]
    if width < size:
        batch = F.pad(batch, (0, size - width, 0, 0), mode=_pad_mode(size - width, width))
    if height < size:
        batch = F.pad(batch, (0, 0, 0, size - height), mode=_pad_mode(size - height, height))
    return batch


def _pad_mode(amount: int, length: int) -> str:
    # Reflection keeps image statistics across the seam; it needs padding < length,
    # so shorter axes are edge-replicated instead.
    return "reflect" if amount < length else "replicate"


def _input_multiple(model: Model) -> int:
    """What ``model``'s input sides must be a multiple of (a resized tile is padded to it)."""
    # A checkpoint's module wraps its network (normalization first); a bare network is its own.
    network = getattr(model, "network", model)
    return network_input_multiple(network) if isinstance(network, torch.nn.Module) else 1


def _softmax(model: Model, batch: torch.Tensor, num_classes: int) -> torch.Tensor:
    logits = model(batch)
    expected = (batch.shape[0], num_classes, *batch.shape[2:])
    if tuple(logits.shape) != expected:
        raise ValueError(
            f"model returned logits of shape {tuple(logits.shape)} for tiles of shape "
            f"{tuple(batch.shape)}; expected {expected} (num_classes={num_classes})"
        )
    return logits.float().softmax(dim=1)


def _batches(origins: Iterable[Origin], size: int) -> Iterator[list[Origin]]:
    iterator = iter(origins)
    while batch := list(islice(iterator, size)):
        yield batch


def _is_int(minimum: int) -> Callable[[object], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def _is_fraction(value: object) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    return math.isfinite(value) and 0 <= value < 1


def _require(value: object, key: str, ok: Callable[[object], bool], expected: str) -> None:
    if not ok(value):
        raise ConfigError(f"{key}={value!r} is not allowed: expected {expected}")
