"""What the validation pass learnt of each file, kept in the user's cache folder.

``<the user's cache folder>/validation/<dataset>.json`` (``segscale.data.storage.caches``: a
folder of the user's alone, refused where others can write it, since its class counts
are reported as they are), keyed by the image's and mask's path and identity
(``source_identity``: size, mtime, inode and change time), so a second run re-reads
only files that changed, a replacement that keeps size and mtime included. It holds
what does not depend on the label settings (``inspect_pair``), so other classes re-read
nothing either; class locations, valid cells and masks read on their image's grid are
kept for the settings that found them, and the images' sums, value range and no-data
pixels for the ``datamodule.sampling.nodata`` they were counted with.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from segscale.atomic_files import write_text_atomically
from segscale.data.checks.pair_inspection import inspect_pair, labels_key, validity_key
from segscale.data.classes.labels import LabelMap
from segscale.data.classes.palette import channels_as_read
from segscale.data.sampling.valid_windows import CELL, Validity
from segscale.data.storage.caches import app_folder, cache_file, source_identity
from segscale.data.storage.grids import pair_grids
from segscale.data.storage.sources import DEFAULT_MAX_IMAGE_PIXELS, ImageMaskPair, TileSource

log = logging.getLogger(__name__)

_CACHE_VERSION = 5  # 2: facts independent of the labels, with each mask's value counts;
# 3: each image's value range and its non-finite values; 4: each palette mask's palette;
# 5: sums and value range without the no-data pixels, which are counted (facts["nodata"])


class ValidationCache:
    """Per-pair facts kept on disk, valid while the files' identity is unchanged.

    The file is the user's (``cache_file``), named for the dataset (``TileSource.cache_key``),
    not the dataset's: a shared dataset folder stays as it is, a read-only one is cached.
    Raises ``ConfigError`` where the cache's folder is another user's or others can
    write it (``user_cache.private_folder``).
    """

    def __init__(self, source: TileSource, max_image_pixels: int | None) -> None:
        self.dataset = source.cache_key
        self.path = cache_file("validation", self.dataset)
        settings: list[Any] = [_CACHE_VERSION]
        # Another limit can turn a refused file into a readable one, or back. The default
        # is left out of the key so that caches written before the limit existed stay
        # valid: at Pillow's own limit a file read then reads the same now.
        if max_image_pixels != DEFAULT_MAX_IMAGE_PIXELS:
            settings.append({"max_image_pixels": max_image_pixels})
        self.settings = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
        self.max_image_pixels = max_image_pixels
        self.entries: dict[str, Any] = {}
        self.changed = False
        try:
            app_folder("validation")
        except OSError:
            return  # a home that cannot be written: nothing cached, and save() says so
        if self.path.is_file():
            try:
                stored = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                stored = {}
            if stored.get("settings") == self.settings and stored.get("dataset") == self.dataset:
                self.entries = stored.get("pairs", {})

    def cached(
        self,
        pair: ImageMaskPair,
        labels: LabelMap | None = None,
        locations_per_class: int = 0,
        validity: Validity | None = None,
        warp_masks: bool = False,
        nodata: float | None = None,
    ) -> dict[str, Any] | None:
        """The pair's cached facts if both files are unchanged; ``None`` if they must be read.

        Class locations (``locations_per_class > 0``) and valid cells (``validity``) are
        found with ``labels``: facts without them, or with them for other settings, must
        be read again (``read``; the labels are not part of the settings key, since
        nothing else depends on them). Facts cached before the files' grids were kept
        get them from the headers alone. Facts counted with another no-data setting
        (``nodata``: ``datamodule.sampling.nodata``) are read again.
        """
        entry = self.entries.get(_key(pair))
        wanted = locations_per_class if labels is not None else 0
        validity = validity if labels is not None else None
        if not entry or entry["stamp"] != _stamp(pair):
            return None
        facts = entry["facts"]
        if "grids_differ" not in facts:
            facts |= pair_grids(pair.image, pair.mask)
            self.changed = True
        if (
            (facts.get("nodata") or {}).get("setting", _UNSET) == nodata
            and _has_locations(facts, labels, wanted)
            and _has_valid_cells(facts, labels, validity)
            and bool(facts.get("mask_warped")) == (warp_masks and facts["grids_differ"])
        ):
            return facts
        return None

    def read(
        self,
        pair: ImageMaskPair,
        labels: LabelMap | None = None,
        locations_per_class: int = 0,
        validity: Validity | None = None,
        warp_masks: bool = False,
        nodata: float | None = None,
    ) -> dict[str, Any]:
        """Read the pair's facts afresh and keep them (``save`` writes them).

        Threads may read pairs at once: each keeps its own entry.
        """
        stamp = _stamp(pair)  # before reading: a change then reads again
        wanted = locations_per_class if labels is not None else 0
        validity = validity if labels is not None else None
        facts = inspect_pair(
            pair, labels, self.max_image_pixels, wanted, validity, warp_masks, nodata
        )
        self.entries[_key(pair)] = {"stamp": stamp, "facts": facts}
        self.changed = True
        return facts

    def save(self) -> None:
        """Write the cache atomically; where that fails (a read-only home), say so and go on."""
        if not self.changed:
            return
        stored = {"dataset": self.dataset, "settings": self.settings, "pairs": self.entries}
        try:
            write_text_atomically(self.path, json.dumps(stored))
        except OSError as error:
            log.warning("could not cache the validation in %s: %s", self.path, error)


_UNSET = object()
"""No no-data setting: facts from before one was kept."""


def _has_locations(facts: dict[str, Any], labels: LabelMap | None, per_class: int) -> bool:
    """Whether ``facts`` hold the class locations asked for (or none are asked for)."""
    if not per_class or labels is None or "mask_values" not in facts:
        return True  # a mask that could not be read has none to keep
    if channels_as_read(facts, labels.colour) != labels.channels:
        return True  # nor has one of the wrong kind (a problem the pass reports)
    kept = facts.get("class_locations") or {}
    return kept.get("per_class") == per_class and kept.get("labels") == labels_key(labels)


def _has_valid_cells(
    facts: dict[str, Any], labels: LabelMap | None, validity: Validity | None
) -> bool:
    """Whether ``facts`` hold the valid cells asked for (or none are asked for).

    A pair the pass refuses (unreadable, sizes or kinds that differ) has none to count.
    """
    if validity is None or labels is None or "mask_values" not in facts:
        return True
    if channels_as_read(facts, labels.colour) != labels.channels or "shape" not in facts:
        return True
    if facts["mask_problems"]:
        return True
    kept = facts.get("valid_cells")
    if not isinstance(kept, dict):
        return False
    counted = "counts" in kept or "problem" in kept
    same = {k: kept.get(k) for k in ("labels", "nodata_setting")} == validity_key(labels, validity)
    return counted and same and kept.get("cell") == CELL


def _key(pair: ImageMaskPair) -> str:
    return f"{pair.image.resolve()}|{pair.mask.resolve()}"


def _stamp(pair: ImageMaskPair) -> list[list[int | str]]:
    """The identity of both files of ``pair`` (``source_identity``), as entries keep it."""
    return [source_identity(pair.image), source_identity(pair.mask)]
