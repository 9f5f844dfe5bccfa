"""Patch datasets: random patches for training, a fixed grid for validation; their samples.

A patch as the DataLoader collates it: image, mask, key, and the tile it left out if any.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch
from omegaconf import ListConfig
from torch.utils.data import Dataset

from segscale.data.augment import Augmentation, PatchPose, cut_patch, patch_rng
from segscale.data.sampling.class_locations import (
    CLASS_RATIO_TRIES,
    WEIGHT_RULES,
    ClassCentres,
    TileClassLocations,
    centre_on_pixel,
    centre_rng,
    check_max_class_ratio,
    class_probabilities,
    within_class_ratio,
)
from segscale.data.sampling.valid_windows import MIN_VALID_KEY, TileWindows, centrable, valid_rng
from segscale.data.storage.nodata import check_nodata
from segscale.data.storage.rasters import UnreadableWindowError
from segscale.data.storage.tiles import SKIP_KEY, Tile, UnreadableTileError, UnreadableTiles
from segscale.errors import ConfigError, integer_at_least, require

PatchKey = tuple[int, int]
"""``(epoch, index)``: the address of one random patch."""
SAMPLING_MODES = ("uniform", "class_balanced")
_KEY = "datamodule.sampling"


@dataclass(frozen=True, init=False)
class PatchSampling:
    """Where training patches are centred: ``datamodule.sampling``.

    ``uniform``: anywhere in the tile (the default). ``class_balanced``: with
    probability ``p`` on a pixel of a class drawn with ``class_weights`` (``present``:
    equally over the classes present in the training tiles; ``inverse_frequency``: in
    inverse proportion to their pixels; or one weight per class), else as ``uniform``.
    The validation pass keeps up to ``locations_per_class`` pixels of each class in each
    tile to centre patches on.

    ``min_valid`` (a share in [0, 1]; 0: off) takes only patches whose window holds at
    least that share of valid pixels (``segscale.data.sampling.valid_windows``); with
    ``class_balanced``, a class-centred patch is centred only where its window does.
    A pixel is valid when its mask holds a class and its image is not ``nodata`` in
    every band (``None``: each GeoTIFF's ``GDAL_NODATA`` tag, where it has one).
    """

    mode: str
    p: float
    class_weights: str | tuple[float, ...]
    locations_per_class: int
    min_valid: float
    nodata: float | None
    max_class_ratio: float | None

    def __init__(
        self,
        mode: Literal["uniform", "class_balanced"] = "uniform",
        p: float = 0.5,
        class_weights: Literal["present", "inverse_frequency"] | Sequence[float] = "present",
        locations_per_class: int = 256,
        min_valid: float = 0.0,
        nodata: float | None = None,
        max_class_ratio: float | None = None,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise ConfigError(
                f"{_KEY}.{next(iter(unknown))} is not a sampling setting: expected "
                "mode, p, class_weights, locations_per_class, min_valid, nodata or max_class_ratio"
            )
        require(mode, f"{_KEY}.mode", lambda v: v in SAMPLING_MODES, f"one of {SAMPLING_MODES}")
        require(p, f"{_KEY}.p", _is_probability, "a probability in [0, 1]")
        require(
            locations_per_class,
            f"{_KEY}.locations_per_class",
            integer_at_least(1),
            "an integer >= 1",
        )
        require(min_valid, MIN_VALID_KEY, _is_probability, "a share of valid pixels in [0, 1]")
        check_nodata(nodata)
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "p", float(p))
        object.__setattr__(self, "class_weights", _weights(class_weights))
        object.__setattr__(self, "locations_per_class", locations_per_class)
        object.__setattr__(self, "min_valid", float(min_valid))
        object.__setattr__(self, "nodata", None if nodata is None else float(nodata))
        object.__setattr__(self, "max_class_ratio", check_max_class_ratio(max_class_ratio))

    @property
    def class_balanced(self) -> bool:
        """Whether patches are centred on classes (and class locations are needed)."""
        return self.mode == "class_balanced"

    def check_classes(self, num_classes: int) -> None:
        """Refuse explicit ``class_weights`` that do not give one weight per class."""
        weights = self.class_weights
        if not isinstance(weights, str) and len(weights) != num_classes:
            raise ConfigError(
                f"{_KEY}.class_weights={list(weights)} has {len(weights)} entries for "
                f"{num_classes} classes; expected one weight per class"
            )

    def centres(
        self,
        locations: Sequence[TileClassLocations],
        class_names: Sequence[str],
        windows: Sequence[TileWindows] | None = None,
    ) -> ClassCentres | None:
        """The class-centre draws over tiles with ``locations``; ``None`` for ``uniform``.

        With ``windows`` (``min_valid``), only the kept pixels whose centred window
        qualifies are centres, and each tile's pixels of a class count in proportion.
        """
        if not self.class_balanced:
            return None
        if windows is not None:
            before = np.sum([tile.counts for tile in locations], axis=0)
            locations = [centrable(t, w) for t, w in zip(locations, windows, strict=True)]
        counts = np.sum([tile.counts for tile in locations], axis=0)
        if windows is not None:
            self._check_centrable(before, counts, class_names)
        probabilities = class_probabilities(self.class_weights, counts, class_names)
        return ClassCentres(locations, probabilities, self.p)

    def _check_centrable(
        self, before: np.ndarray, counts: np.ndarray, class_names: Sequence[str]
    ) -> None:
        """Refuse classes to centre on that have pixels, but none ``min_valid`` admits.

        Classes with no pixel at all are ``class_probabilities``' to refuse.
        """
        weights = self.class_weights
        wanted = before > 0
        if not isinstance(weights, str):
            wanted &= np.asarray(weights) > 0
        elif counts.any():  # a rule: the classes left are centred on
            return
        lost = [class_names[c] for c in np.flatnonzero(wanted & (counts == 0)).tolist()]
        if lost:
            shown = weights if isinstance(weights, str) else list(weights)
            raise ConfigError(
                f"{_KEY}.class_weights={shown}: no kept pixel of {', '.join(lost)} centres "
                f"a window with {MIN_VALID_KEY}={self.min_valid:g} of valid pixels; expected "
                f"weight 0 for such classes, or a lower {MIN_VALID_KEY}"
            )


def _is_probability(value: Any) -> bool:
    return isinstance(value, (int, float)) and 0.0 <= value <= 1.0


def _weights(value: Any) -> str | tuple[float, ...]:
    """``class_weights`` checked: a rule's name or non-negative numbers, not all zero."""
    key = f"{_KEY}.class_weights"
    if isinstance(value, str):
        require(value, key, lambda v: v in WEIGHT_RULES, f"one of {WEIGHT_RULES} or a list")
        return value
    require(
        value,
        key,
        _are_weights,
        f"one of {WEIGHT_RULES} or a list of non-negative weights, one per class, not all 0",
    )
    return tuple(float(w) for w in value)


def _are_weights(value: Any) -> bool:
    if not isinstance(value, (list, tuple, ListConfig)):
        return False
    numbers = all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in value)
    return numbers and min(value, default=-1) >= 0 and sum(value) > 0


@dataclass(frozen=True)
class PatchDraw:
    """Where patch ``(epoch, index)`` comes from: its tile, its window, its centre class.

    ``centre_class`` is the class it is centred on (``None``: centred anywhere).
    """

    tile: int
    pose: PatchPose
    centre_class: int | None


class RandomPatchDataset(Dataset):
    """Random, augmented patches cut from large tiles, addressed by ``(epoch, index)``.

    Like MATLAB's ``randomPatchExtractionDatastore``: one epoch is
    ``patches_per_image × len(tiles)`` patches, and patch ``index`` comes from tile
    ``index % len(tiles)``. Everything about a patch (its window centre, rotation,
    translation and further transforms) is a pure function of ``(seed, epoch, index)``.
    With ``centres`` (class-balanced sampling), a patch that it centres on a class
    comes from the tile it draws; its rotation, translation and transforms are those
    of the uniform patch of the same key. With ``windows`` (``min_valid``, one per
    tile), a patch whose window (translated, not rotated) does not qualify is moved:
    a class-centred one back to its untranslated centre (which qualifies), any other
    to a window ``windows`` draws from ``valid_rng``; its rotation and transforms stay.
    ``max_class_ratio`` draws a patch one class dominates again, as patch ``index +
    retry × len(self)`` (``draw`` gives the first draw). An epoch's patches are the
    indices below ``len(self)``, and the training sampler draws only those (the few that
    make no full global batch are left out, never padded with others). Indices past
    ``len(self)`` address further fresh patches, which only ``bench.py`` draws, to time
    patches it has not cut yet. An integer key means epoch 0.
    """

    def __init__(
        self,
        tiles: list[Tile],
        patch_size: int,
        patches_per_image: int,
        augmentation: Augmentation,
        seed: int = 0,
        ignore_index: int = 255,
        centres: ClassCentres | None = None,
        unreadable: UnreadableTiles | None = None,
        windows: Sequence[TileWindows] | None = None,
        max_class_ratio: float | None = None,
    ) -> None:
        if not tiles:
            raise ValueError("RandomPatchDataset needs at least one tile")
        if centres is not None and len(centres.locations) != len(tiles):
            raise ValueError(f"{len(centres.locations)} class locations for {len(tiles)} tiles")
        if windows is not None and len(windows) != len(tiles):
            raise ValueError(f"{len(windows)} valid windows for {len(tiles)} tiles")
        self.tiles = tiles
        self.patch_size = patch_size
        self.patches_per_image = patches_per_image
        self.augmentation = augmentation
        self.seed = seed
        self.ignore_index = ignore_index
        self.centres = centres
        self.unreadable = unreadable or UnreadableTiles()
        self.windows = list(windows) if windows is not None else None
        self.max_class_ratio = max_class_ratio

    def __len__(self) -> int:
        return self.patches_per_image * len(self.tiles)

    def pose(self, epoch: int, index: int) -> PatchPose:
        """The window that patch ``(epoch, index)`` is cut with."""
        return self._draw(epoch, index)[1].pose

    def draw(self, epoch: int, index: int) -> PatchDraw:
        """The tile, window and centre class of patch ``(epoch, index)``."""
        return self._draw(epoch, index)[1]

    def __getitem__(self, key: PatchKey | int) -> dict[str, Any]:
        epoch, index = (0, key) if isinstance(key, int) else key
        # A tile that cannot be read (``unreadable.skip``): the patch is one fresh patch
        # of the next tile instead (index past the epoch's, of tile ``index + attempt``).
        # The sample names the first tile left out: its own (every broken tile is the
        # first for its own patches).
        left_out = None
        for attempt in range(2 * len(self.tiles)):
            substitute = index if attempt == 0 else index + attempt + len(self)
            try:
                rng, image, mask = self._cut(epoch, substitute)
            except UnreadableWindowError as error:
                self.unreadable.handle(error)
                left_out = left_out or error
                continue
            image, mask = self.augmentation.transform(image, mask, rng)
            return as_sample(image, mask, (epoch, index), left_out)
        raise UnreadableTileError(f"no tile of the training set can be read ({SKIP_KEY})")

    def _cut(self, epoch: int, index: int) -> tuple[np.random.Generator, np.ndarray, np.ndarray]:
        """Patch ``index``'s generator and pixels, re-drawn under ``max_class_ratio``."""
        ratio, size, ignore = self.max_class_ratio, self.patch_size, self.ignore_index
        for retry in range(1 if ratio is None else CLASS_RATIO_TRIES):
            rng, draw = self._draw(epoch, index + retry * len(self))
            tile = self.tiles[draw.tile]
            image, mask = cut_patch(tile.image, tile.mask, draw.pose, size, ignore)
            if ratio is None or within_class_ratio(mask, ignore, ratio):
                break
        return rng, image, mask

    def _draw(self, epoch: int, index: int) -> tuple[np.random.Generator, PatchDraw]:
        rng = patch_rng(self.seed, epoch, index)
        tile = index % len(self.tiles)
        height, width = self.tiles[tile].shape
        half = self.patch_size / 2
        # The untransformed window lies inside the tile; rotation and translation may
        # then reach past the border, and those pixels become ignore_index.
        centre_x = rng.uniform(half, width - half)
        centre_y = rng.uniform(half, height - half)
        centre_class = None
        picked = self.centres.draw(centre_rng(self.seed, epoch, index)) if self.centres else None
        if picked is not None:
            tile, centre_class, row, col = picked
            height, width = self.tiles[tile].shape
            x, y = centre_on_pixel(row, col, self.patch_size, height, width)
            centre_x, centre_y = float(x), float(y)
        pose = self.augmentation.pose(rng, centre_x, centre_y)
        if self.windows is not None:
            untranslated = (centre_x, centre_y)
            pose = self._valid(pose, self.windows[tile], untranslated, picked, (epoch, index))
        return rng, PatchDraw(tile, pose, centre_class)

    def _valid(
        self,
        pose: PatchPose,
        windows: TileWindows,
        untranslated: tuple[float, float],
        picked: Any,
        key: PatchKey,
    ) -> PatchPose:
        """``pose``, or one moved to a window that holds ``min_valid`` (see the class).

        ``picked``: the class-centre draw, if the patch is centred on a class.
        """
        if windows.holds(pose.centre_x, pose.centre_y)[0]:
            return pose
        if picked is not None:  # its pixel was kept: its untranslated window qualifies
            return replace(pose, centre_x=untranslated[0], centre_y=untranslated[1])
        centre_x, centre_y = windows.draw(valid_rng(self.seed, *key))
        return replace(pose, centre_x=centre_x, centre_y=centre_y)


class GridPatchDataset(Dataset):
    """Every tile covered by a fixed grid of patches, each pixel counted exactly once.

    The grid steps by ``patch_size``; the last row and column are moved back to end at
    the tile border, and the pixels they share with their neighbour are set to
    ``ignore_index`` in the mask so that metrics count every pixel once. The same grid
    comes out every epoch, in the same order.
    """

    def __init__(
        self,
        tiles: list[Tile],
        patch_size: int,
        ignore_index: int = 255,
        unreadable: UnreadableTiles | None = None,
    ) -> None:
        self.tiles = tiles
        self.patch_size = patch_size
        self.ignore_index = ignore_index
        self.unreadable = unreadable or UnreadableTiles()
        self.windows: list[tuple[int, int, int, int, int]] = []  # tile, y, x, skip_y, skip_x
        for t, tile in enumerate(tiles):
            height, width = tile.shape
            for y, skip_y in _grid(height, patch_size):
                for x, skip_x in _grid(width, patch_size):
                    self.windows.append((t, y, x, skip_y, skip_x))

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        t, y, x, skip_y, skip_x = self.windows[index]
        size, tile = self.patch_size, self.tiles[t]
        left_out = None
        try:
            image = tile.image[y : y + size, x : x + size]
            mask = tile.mask[y : y + size, x : x + size].copy()
        except UnreadableWindowError as error:
            self.unreadable.handle(error)  # skipped: a window whose pixels all count for nothing
            left_out = error
            image = np.zeros((size, size, tile.image.shape[2]), tile.image.dtype)
            mask = np.full((size, size), self.ignore_index, np.uint8)
        mask[:skip_y, :] = self.ignore_index
        mask[:, :skip_x] = self.ignore_index
        return as_sample(image, mask, (t, y, x), left_out)


def grid_inference(patch_size: int) -> dict[str, Any]:
    """The sliding-window settings that predict a whole tile as ``GridPatchDataset`` does.

    Tiles of ``patch_size`` without overlap, and each pixel from the first tile that
    covers it (``blend: none``): the last row and column, moved back inside the tile,
    score only the pixels no earlier tile did, as the grid's ignored margins make them.
    Stored in checkpoints, so that ``evaluate.py`` measures what validation measured.
    """
    return {"tile_size": int(patch_size), "overlap": 0.0, "blend": "none"}


def _grid(length: int, size: int) -> list[tuple[int, int]]:
    """Window starts along one axis, with how many leading pixels repeat the last window."""
    if size > length:
        raise ValueError(f"patch size {size} is larger than an image side of {length} pixels")
    starts = [(s, 0) for s in range(0, length - size + 1, size)]
    covered = starts[-1][0] + size
    if covered < length:
        starts.append((length - size, covered - (length - size)))
    return starts


LEFT_OUT = "left_out"
"""A sample's field: the file of a tile it left out (``skip_unreadable``), or ``""``."""
LEFT_OUT_REASON = "left_out_reason"
"""A sample's field: why that file was left out (what could not be read), or ``""``."""


def as_sample(
    image: np.ndarray,
    mask: np.ndarray,
    key: tuple[int, ...],
    left_out: UnreadableWindowError | None = None,
) -> dict[str, Any]:
    """A sample as the DataLoader collates it: tensors, and the tile it left out if any.

    The left-out tile travels with the sample because a DataLoader worker's own record
    of it never reaches the training process, which lists it in ``summary.json``
    (``LeftOutTiles``); two strings a sample, empty almost always.
    """
    # Images and masks stay in their file's types (uint8 masks, uint8/uint16 images) on
    # their way through the DataLoader: 4× (images) and 8× (masks) less to copy between
    # processes than float32 and int64. The LightningModule converts them on the device.
    return {
        "image": torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))),
        "mask": torch.from_numpy(np.ascontiguousarray(mask)),
        "key": torch.tensor(key, dtype=torch.long),
        LEFT_OUT: "" if left_out is None else str(left_out.path),
        LEFT_OUT_REASON: "" if left_out is None else str(left_out),
    }
