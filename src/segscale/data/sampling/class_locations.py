"""Class-balanced patches: where each class's pixels lie, centres drawn on a class, a ratio cap.

Where each class's pixels lie in each tile, and patch centres drawn on a class.

The validation pass keeps, for every tile and class, up to ``per_class`` of the class's
pixels (``(row, col)``, int32), drawn uniformly without replacement: a few kilobytes a
tile, never a copy of the mask. Which pixels are kept is a pure function of the mask
(each pixel's priority is a fixed hash of its position, the ``per_class`` lowest win),
so a fresh pass, a cached one and every rank's own pass keep the same pixels.

``ClassCentres`` turns them into patch centres for class-balanced sampling: a class
drawn with the requested weights, a tile in proportion to its pixels of that class, one
of the tile's kept pixels of it. Its draws come from ``centre_rng(seed, epoch, index)``,
a stream of its own beside the patch's generator, so a patch is still a pure function of
``(seed, epoch, index)`` (docs/architecture.md, "Randomness addressed by index"), and a
patch that is not class-centred is exactly the patch that uniform sampling draws.

The crop class-ratio cap: ``datamodule.sampling.max_class_ratio``.

mmseg's ``RandomCrop(cat_max_ratio=0.75)`` for aerial imagery: a training patch whose
largest class covers ``max_class_ratio`` or more of its labelled pixels (ignored pixels
do not count) is drawn again, at most ``CLASS_RATIO_TRIES`` times in all, and the last
draw is kept. A patch with no labelled pixel, or with one class only, is drawn again
too, as in mmseg. Each draw is an index-addressed patch of its own
(``RandomPatchDataset``), so which patch comes out stays a pure function of
``(seed, epoch, index)`` on every rank and DataLoader worker.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from segscale.errors import ConfigError, require

WEIGHT_RULES = ("present", "inverse_frequency")
"""``datamodule.sampling.class_weights`` by name: uniform over the classes present in
the training tiles, or in inverse proportion to their pixel counts."""
_CENTRE_STREAM = 1  # spawn key of the class-centre stream under the patch's seed
_COORDINATES = np.dtype("<i4")  # stored little-endian whatever the machine


def centre_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of patch ``(epoch, index)``'s class-centre draws.

    A child of the seed that ``patch_rng`` uses (same entropy, its own spawn key): as
    index-addressed as that one and independent of it, so the patch's rotation,
    translation and transforms are drawn exactly as under uniform sampling.
    """
    sequence = np.random.SeedSequence([seed, epoch, index], spawn_key=(_CENTRE_STREAM,))
    return np.random.default_rng(sequence)


def _priority(positions: np.ndarray) -> np.ndarray:
    """A fixed pseudo-random uint64 per flat pixel position (SplitMix64's finalizer).

    A bijection, so no two pixels tie; it depends on the position alone, not on the
    order or the chunks in which pixels are seen.
    """
    z = positions.astype(np.uint64)  # a copy, worked on in place: two arrays, not nine
    z += np.uint64(0x9E3779B97F4A7C15)
    shifted = np.empty_like(z)
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        np.right_shift(z, np.uint64(shift), out=shifted)
        z ^= shifted
        z *= np.uint64(factor)
    np.right_shift(z, np.uint64(31), out=shifted)
    z ^= shifted
    return z


CANDIDATES_PER_KEPT = 4
"""A chunk's pixels that may be kept are first looked for among its pixels of lowest
priority: a share of the chunk that holds this many times the pixels kept, over the classes."""

MAX_CANDIDATES = 1 << 16
"""At most this many such pixels (1 MiB with their priorities) are remembered per chunk."""


@lru_cache(maxsize=64)
def _lowest_priorities(offset: int, length: int, share: float) -> tuple[np.ndarray, np.ndarray]:
    """The positions ``offset`` to ``offset + length`` whose priority is in the lowest ``share``.

    With their priorities (both read-only). A function of the chunk's place alone, so
    the tiles of one size share it: each chunk's positions are hashed once per process.
    """
    positions = np.arange(offset, offset + length, dtype=np.int64)
    priorities = _priority(positions)
    chosen = np.flatnonzero(priorities < np.uint64(share * 2.0**64))
    positions, priorities = positions[chosen], priorities[chosen]
    positions.flags.writeable = priorities.flags.writeable = False
    return positions, priorities


class LocationSampler:
    """Keeps up to ``per_class`` pixels of each class of one mask, fed in row chunks.

    ``add`` takes class indices (values ``>= num_classes``, the ignore index among them,
    are no class); ``facts`` gives what the validation cache stores.
    """

    def __init__(self, num_classes: int, per_class: int, width: int) -> None:
        self.num_classes = num_classes
        self.per_class = per_class
        self.width = width
        empty = np.zeros(0, np.uint64)
        self._kept = [(empty, empty.astype(np.int64)) for _ in range(num_classes)]

    def add(self, classes: np.ndarray, first_row: int, members: np.ndarray | None = None) -> None:
        """Offer the pixels of ``classes`` (uint8 class indices, rows from ``first_row`` on, H×W).

        ``members``: the pixels of each class index in ``classes``, where they are
        counted already (the pass counts the mask's values).

        Only a chunk's ``per_class`` lowest priorities of a class can be kept, so each
        class is looked for first among the chunk's pixels of lowest priority
        (``_lowest_priorities``, sized by ``CANDIDATES_PER_KEPT``); a class with fewer of
        them than it may keep, and than it has, is looked for among all its pixels.
        """
        flat = classes.reshape(-1)
        if members is None:
            members = np.bincount(flat, minlength=self.num_classes)
        members = members[: self.num_classes]
        if not members.any():
            return
        offset = first_row * self.width
        wanted = CANDIDATES_PER_KEPT * self.per_class * self.num_classes
        if wanted < min(len(flat), MAX_CANDIDATES):
            candidates, priorities = _lowest_priorities(offset, len(flat), wanted / len(flat))
        else:  # every pixel is a candidate
            candidates = np.arange(offset, offset + len(flat), dtype=np.int64)
            priorities = _priority(candidates)
        of_class = flat[candidates - offset]
        for c in np.flatnonzero(members).tolist():
            chosen = of_class == c
            positions, kept = candidates[chosen], priorities[chosen]
            if len(positions) < min(self.per_class, members[c]):  # too few: all of the class
                positions = np.flatnonzero(flat == c).astype(np.int64) + offset
                kept = _priority(positions)
            self._keep(c, kept, positions)

    def _keep(self, c: int, priorities: np.ndarray, positions: np.ndarray) -> None:
        kept_priorities, kept_positions = self._kept[c]
        priorities = np.concatenate([kept_priorities, priorities])
        positions = np.concatenate([kept_positions, positions])
        if len(priorities) > self.per_class:
            lowest = np.argpartition(priorities, self.per_class - 1)[: self.per_class]
            priorities, positions = priorities[lowest], positions[lowest]
        self._kept[c] = priorities, positions

    def facts(self) -> dict[str, Any]:
        """The kept pixels for the cache: per class, base64 of (row, col) int32 pairs."""
        encoded = []
        for _, positions in self._kept:
            positions = np.sort(positions)  # the order of a set, not of its discovery
            pairs = np.stack([positions // self.width, positions % self.width], axis=1)
            encoded.append(base64.b64encode(pairs.astype(_COORDINATES).tobytes()).decode())
        return {"per_class": self.per_class, "rows_cols": encoded}


@dataclass(frozen=True)
class TileClassLocations:
    """One tile's pixel count per class and its kept pixels of each class."""

    counts: np.ndarray
    """Pixels of each class in the tile (int64, one entry per class)."""
    points: tuple[np.ndarray, ...]
    """Per class, the kept pixels as an ``(n, 2)`` int32 array of ``(row, col)``."""

    @classmethod
    def from_facts(cls, facts: dict[str, Any]) -> TileClassLocations:
        """Decode what ``LocationSampler.facts`` stored, beside the tile's class counts."""
        points = tuple(
            np.frombuffer(base64.b64decode(text), _COORDINATES).reshape(-1, 2).astype(np.int32)
            for text in facts["class_locations"]["rows_cols"]
        )
        return cls(np.asarray(facts["class_counts"], np.int64), points)

    @property
    def nbytes(self) -> int:
        """Memory the kept pixels take."""
        return sum(p.nbytes for p in self.points)


def class_probabilities(
    class_weights: str | Sequence[float], counts: np.ndarray, class_names: Sequence[str]
) -> np.ndarray:
    """The share of class-centred patches each class should get (sums to 1).

    ``class_weights``: ``present`` (equal for every class with training pixels),
    ``inverse_frequency`` (proportional to 1/pixels, for those classes) or one
    non-negative weight per class. A class without training pixels can take no patch
    centre: a positive weight for it is refused.
    """
    key = "datamodule.sampling.class_weights"
    present = counts > 0
    if not present.any():
        raise ConfigError(f"{key}: the training tiles hold no labelled pixel of any class")
    if class_weights == "present":
        weights = present.astype(np.float64)
    elif class_weights == "inverse_frequency":
        weights = np.where(present, 1.0 / np.maximum(counts, 1), 0.0)
    elif isinstance(class_weights, str):
        raise ConfigError(
            f"{key}={class_weights!r} is not allowed: expected one of {list(WEIGHT_RULES)} "
            "or one weight per class"
        )
    else:
        weights = np.asarray(class_weights, np.float64)
        absent = [class_names[c] for c in np.flatnonzero((weights > 0) & ~present).tolist()]
        if absent:
            raise ConfigError(
                f"{key}={list(class_weights)} gives weight to classes without pixels in the "
                f"training tiles ({', '.join(absent)}); give them 0"
            )
    return weights / weights.sum()


class ClassCentres:
    """Draws class-balanced patch centres over a list of tiles.

    ``locations[t]`` belongs to tile ``t``; ``probabilities`` is the share of class-
    centred patches per class (``class_probabilities``); ``p`` the share of patches
    that are class-centred at all.
    """

    def __init__(
        self, locations: Sequence[TileClassLocations], probabilities: np.ndarray, p: float
    ) -> None:
        self.locations = list(locations)
        self.p = p
        self.class_cdf = np.cumsum(probabilities)
        # Per class, tiles in proportion to their pixels of it: every pixel of the class
        # in the training split is then equally likely to be the centre.
        counts = np.stack([tile.counts for tile in self.locations])
        self.tile_cdf = np.cumsum(counts, axis=0).astype(np.float64)

    def draw(self, rng: np.random.Generator) -> tuple[int, int, int, int] | None:
        """``(tile, class, row, col)`` of a class-centred patch, or ``None`` (prob. 1-p)."""
        if rng.random() >= self.p:
            return None
        c = _pick(self.class_cdf, rng.random())
        t = _pick(self.tile_cdf[:, c], rng.random())
        points = self.locations[t].points[c]
        row, col = points[rng.integers(len(points))]
        return t, c, int(row), int(col)


def centre_on_pixel(
    row: Any, col: Any, size: int, height: int, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """The window centre (x, y) that puts pixel ``(row, col)`` at the patch's middle pixel.

    Patch pixel ``size // 2`` then samples that pixel exactly (``cut_patch``'s centre is
    continuous: pixel ``j`` spans ``[j, j + 1)``). Near a border the window is moved back
    inside the tile, as uniform windows lie: the pixel stays in the patch, off its
    middle. Takes single pixels or arrays of them.
    """
    offset = 0.5 + (size - 1) / 2 - size // 2
    half = size / 2
    return np.clip(col + offset, half, width - half), np.clip(row + offset, half, height - half)


def _pick(cdf: np.ndarray, u: float) -> int:
    """The entry that ``u`` in [0, 1) falls in, each in proportion to its share of ``cdf``.

    ``cdf`` is cumulative and need not end at 1; an entry of zero share is never picked
    (``side="right"`` steps over it).
    """
    # The clip only guards the last entry against rounding (u * cdf[-1] stays < cdf[-1]).
    return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(cdf) - 1)


MAX_CLASS_RATIO_KEY = "datamodule.sampling.max_class_ratio"
CLASS_RATIO_TRIES = 10
"""Draws of one patch before the last is kept whatever its classes (mmseg's 10)."""


def check_max_class_ratio(value: Any) -> float | None:
    """``max_class_ratio`` checked: ``None`` (off) or a share in (0, 1]."""
    require(value, MAX_CLASS_RATIO_KEY, _is_ratio, "null (off) or a share in (0, 1], e.g. 0.75")
    return None if value is None else float(value)


def _is_ratio(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and 0.0 < value <= 1.0)


def within_class_ratio(mask: np.ndarray, ignore_index: int, max_class_ratio: float) -> bool:
    """Whether ``mask``'s largest class covers less than ``max_class_ratio`` of its labels.

    False for a mask with fewer than two classes (mmseg's rule).
    """
    labels = mask[mask != ignore_index]
    counts = np.bincount(labels.ravel())
    counts = counts[counts > 0]
    return bool(len(counts) > 1 and counts.max() < max_class_ratio * counts.sum())
