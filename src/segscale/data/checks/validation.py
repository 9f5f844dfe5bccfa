"""The pass over a dataset before training: every file checked, class frequencies counted.

Each pair is read once (``segscale.data.checks.pair_inspection``) and what it taught us is
cached (``segscale.data.checks.validation_cache``), so a second run, or one with other classes,
re-reads only files that changed. Every problem is listed at once
(``segscale.data.checks.dataset_problems``); what the pass found is a ``DatasetReport``
(``segscale.data.checks.dataset_report``). Asked for (class-balanced sampling), the pass also
keeps a few pixel locations of each class in each tile, and (``min_valid``) counts each
training tile's valid pixels per cell, to find its windows that hold enough of them.
The images' no-data pixels (``segscale.data.storage.nodata``) are counted in every split and
left out of the training images' statistics (``segscale.data.checks.dataset_report``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from segscale.data.checks.dataset_problems import InvalidDatasetError, problem_message
from segscale.data.checks.dataset_report import SPLIT_WORDS, DatasetReport, NodataReport
from segscale.data.checks.pair_inspection import mask_holds_an_image, too_many_values
from segscale.data.checks.pass_reading import PairRequest, read_pairs
from segscale.data.checks.validation_cache import ValidationCache
from segscale.data.checks.value_range import ValueRange
from segscale.data.classes.labels import LabelMap
from segscale.data.classes.mask_values import MaskValueCensus
from segscale.data.classes.palette import (
    beyond_palette,
    channels_as_read,
    is_palette,
    values_as_read,
)
from segscale.data.sampling.class_locations import TileClassLocations
from segscale.data.sampling.valid_windows import (
    TileValidCells,
    TileWindows,
    Validity,
    lattice_windows,
    qualifying_tiles,
)
from segscale.data.storage.grids import Grid, check_mask_alignment, grid_problem
from segscale.data.storage.pixel_types import MAX_VALUES
from segscale.data.storage.sources import (
    DEFAULT_MAX_IMAGE_PIXELS,
    FileProblem,
    ImageMaskPair,
    TileSource,
)

log = logging.getLogger(__name__)


def validate_dataset(
    source: TileSource,
    labels: LabelMap,
    class_names: Sequence[str],
    patch_size: int,
    in_channels: int | None,
    splits: Sequence[str] = ("train", "val"),
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    locations_per_class: int = 0,
    channels_from: str = "datamodule.in_channels",
    checkpoint: str | None = None,
    min_valid: float = 0.0,
    nodata: float | None = None,
    workers: int | None = None,
    mask_alignment: str = "refuse",
) -> DatasetReport:
    """Check every file of ``splits``; raise ``InvalidDatasetError`` listing all problems.

    Checks: every image has a mask and every mask an image; files are readable and
    their headers declare at most ``max_image_pixels`` (see ``read_image``); image
    and mask sizes match; masks hold only values of ``labels`` (classes, ignored values);
    all images have the same channel count (``in_channels`` when given) and pixel type,
    and finite pixels;
    at least one image of each split is at least ``patch_size`` on each side (smaller
    ones are left out, with a warning). The message lists each file's problems, then
    the unknown mask values of all files in one table, with what to do about them.
    ``channels_from`` says whose number ``in_channels`` is, for the message (a
    checkpoint's network, when evaluating). ``checkpoint``: the checkpoint evaluated,
    whose classes the masks are read with; the message's advice is then its.

    ``locations_per_class > 0`` also keeps up to that many pixels of each class in
    each tile (``DatasetReport.class_locations``); cached files read before without
    them (or with another number, or other labels) are read again once.

    Images' no-data is ``nodata`` or each GeoTIFF's tag (a tag that is no number is a
    problem of the training images, the first of ``splits``); its pixels are counted in
    every split and left out of the training images' mean, std and value range (a
    training set of no-data alone is refused); ``DatasetReport.nodata`` says what was
    found. ``min_valid > 0`` counts the valid pixels of the training tiles per cell and
    keeps the tiles that have a window of ``patch_size`` with that share of valid pixels
    (``DatasetReport.valid_windows``); the others are left out with a warning, and a
    dataset without any is refused (``qualifying_tiles``). Cached as class locations are.

    The files not cached are read on ``workers`` threads (``None``: the cores this
    process may use), once per machine (``segscale.data.checks.pass_reading``).

    A GeoTIFF mask on another grid than its GeoTIFF image (CRS, transform or size,
    ``segscale.data.storage.grids``) is a problem naming both grids; with ``mask_alignment``
    ``warp`` it is read on its image's grid instead (``DatasetReport.warped_masks``).
    """
    check_mask_alignment(mask_alignment)
    warp = mask_alignment == "warp"
    problems: list[FileProblem] = []
    unknown = MaskValueCensus(colour=labels.colour)
    scanned = {split: source.scan(split) for split in splits}
    requests = [
        PairRequest(
            pair,
            labels,
            locations_per_class,
            _validity(split, splits, min_valid, nodata),
            warp,
            nodata,
        )
        for split in splits
        for pair in scanned[split][0]
    ]
    read = iter(read_pairs(lambda: ValidationCache(source, max_image_pixels), requests, workers))
    facts: dict[str, list[tuple[ImageMaskPair, dict[str, Any]]]] = {}
    for split in splits:
        pairs, unpaired = scanned[split]
        problems += unpaired
        facts[split] = [(pair, _with_labels(pair, next(read), labels, unknown)) for pair in pairs]
        problems += [FileProblem(p.mask, r) for p, f in facts[split] for r in f["mask_problems"]]
        problems += _grid_problems(facts[split])
        problems += [FileProblem(p.image, r) for p, f in facts[split] for r in f["image_problems"]]
        if split == splits[0]:  # its statistics and windows leave no-data out
            problems += _nodata_problems(facts[split])
    readable = [(p, f) for split in splits for p, f in facts[split] if f["channels"] is not None]
    problems += _kind_problems(readable, in_channels, channels_from)
    problems += _all_nodata_problem(splits[0], facts[splits[0]])
    usable = {split: _large_enough(facts[split], patch_size, split) for split in splits}
    for split in splits:
        if not usable[split] and not problems and not unknown:
            problems.append(_too_small(split, facts[split], patch_size))
    if problems or unknown:
        raise InvalidDatasetError(problem_message(problems, unknown, labels, checkpoint))
    windows = {}
    counted: dict[Path, tuple[int, int]] | None = None
    if min_valid:
        usable[splits[0]], windows[splits[0]], counted = _with_valid_windows(
            usable[splits[0]], patch_size, min_valid
        )
    train = [f for _, f in facts[splits[0]]]
    mean, std = _channel_moments(train)
    ranges = [f["value_range"] for f in train if f["value_range"] is not None]
    locations = {
        s: [TileClassLocations.from_facts(f) for _, f in usable[s]]
        for s in (splits if locations_per_class else ())
    }
    return DatasetReport(
        pairs={s: [p for p, _ in usable[s]] for s in splits},
        class_counts={s: _class_counts(facts[s], len(class_names)) for s in splits},
        class_names=tuple(class_names),
        channels=train[0]["channels"],
        dtype=train[0]["dtype"],
        channel_mean=mean,
        channel_std=std,
        class_locations=locations,
        ignored={s: _ignored_values(facts[s], labels) for s in splits},
        ignore_ids=labels.ignore_ids,
        ignore_index=labels.ignore_index,
        value_range=ValueRange.spanning(ranges) if ranges else None,
        valid_windows=windows,
        warped_masks={
            p.mask: Grid.from_facts(f["image_grid"])
            for s in splits
            for p, f in usable[s]
            if f.get("mask_warped")
        },
        nodata=NodataReport.from_facts(facts, nodata, min_valid, patch_size, counted),
    )


def _grid_problems(facts: list[tuple[ImageMaskPair, dict[str, Any]]]) -> list[FileProblem]:
    """The masks on another grid than their image's, not read on the image's."""
    return [
        FileProblem(
            pair.mask,
            grid_problem(
                pair.image, Grid.from_facts(f["image_grid"]), Grid.from_facts(f["mask_grid"])
            ),
        )
        for pair, f in facts
        if f.get("grids_differ") and not f.get("mask_warped")
    ]


def _validity(
    split: str, splits: Sequence[str], min_valid: float, nodata: float | None
) -> Validity | None:
    """What valid pixels of ``split`` are counted with: only the training split's, if asked."""
    return Validity(nodata) if min_valid and split == splits[0] else None


def _nodata_problems(facts: list[tuple[ImageMaskPair, dict[str, Any]]]) -> list[FileProblem]:
    """The images whose no-data tag holds no number (their no-data could not be told)."""
    entries = [(pair, f.get("nodata") or {}) for pair, f in facts]
    return [FileProblem(pair.image, e["problem"]) for pair, e in entries if "problem" in e]


def _all_nodata_problem(
    split: str, facts: list[tuple[ImageMaskPair, dict[str, Any]]]
) -> list[FileProblem]:
    """The problem of training images that hold no-data alone: no statistics to take."""
    read = [f for _, f in facts if "pixels" in f and "pixels" in f["nodata"]]
    if not read or any(f["pixels"] > f["nodata"]["pixels"] for f in read):
        return []
    return [
        FileProblem(
            Path(f"datamodule.source.splits.{split}"),
            f"every pixel of the {len(read)} {SPLIT_WORDS.get(split, split)} image(s) is "
            "no-data (their GDAL_NODATA tag's value, or datamodule.sampling.nodata, in every "
            "band); expected images with data, or another no-data value",
        )
    ]


def _with_valid_windows(
    usable: list[tuple[ImageMaskPair, dict[str, Any]]], patch_size: int, min_valid: float
) -> tuple[
    list[tuple[ImageMaskPair, dict[str, Any]]], list[TileWindows], dict[Path, tuple[int, int]]
]:
    """The pairs that have a window with ``min_valid`` of valid pixels, and their windows.

    Also, per image, its qualifying and candidate windows (``0`` of them for a tile left out).
    """
    cells = [TileValidCells.from_facts(f) for _, f in usable]
    names = [str(pair.image) for pair, _ in usable]
    kept, windows = qualifying_tiles(cells, names, patch_size, min_valid)
    counted = {
        pair.image: (0, lattice_windows(c.shape, patch_size))
        for (pair, _), c in zip(usable, cells, strict=True)
    }
    for index, tile in zip(kept, windows, strict=True):
        counted[usable[index][0].image] = (tile.count, tile.candidates)
    return [usable[i] for i in kept], windows, counted


def _kind_problems(
    facts: list[tuple[ImageMaskPair, dict[str, Any]]],
    in_channels: int | None,
    channels_from: str,
) -> list[FileProblem]:
    """Images whose channel count or pixel type differs from the rest (or from ``in_channels``).

    ``channels_from``: whose number ``in_channels`` is (a config key, a checkpoint's network).
    """
    if not facts:
        return []
    problems = []
    expected = in_channels or facts[0][1]["channels"]
    source = (
        f"{channels_from} takes"
        if in_channels
        else f"the first image ({facts[0][0].image.name}) has"
    )
    dtype = facts[0][1]["dtype"]
    for pair, f in facts:
        if f["channels"] != expected:
            problems.append(
                FileProblem(pair.image, f"has {f['channels']} channels, {source} {expected}")
            )
        if f["dtype"] != dtype:
            problems.append(
                FileProblem(
                    pair.image,
                    f"pixels are {f['dtype']} but those of {facts[0][0].image.name} are {dtype}",
                )
            )
    return problems


def _large_enough(
    facts: list[tuple[ImageMaskPair, dict[str, Any]]], patch_size: int, split: str
) -> list[tuple[ImageMaskPair, dict[str, Any]]]:
    """The pairs at least ``patch_size`` on each side; the others are logged and skipped."""
    usable = [(p, f) for p, f in facts if "shape" in f and min(f["shape"]) >= patch_size]
    for pair, f in facts:
        if "shape" in f and min(f["shape"]) < patch_size:
            log.warning(
                "%s (%dx%d) is smaller than datamodule.patch_size=%d and is left out of %s",
                pair.image,
                f["shape"][1],
                f["shape"][0],
                patch_size,
                split,
            )
    return usable


def _too_small(split: str, facts: list[Any], patch_size: int) -> FileProblem:
    if not facts:
        return FileProblem(Path(f"datamodule.source.splits.{split}"), "no image/mask pairs found")
    largest = max(min(f["shape"]) for _, f in facts if "shape" in f)
    return FileProblem(
        facts[0][0].image.parent,
        f"no {split} image is at least datamodule.patch_size={patch_size} on each side "
        f"(the largest smaller side is {largest} px); lower the patch size",
    )


def _class_counts(
    facts: list[tuple[ImageMaskPair, dict[str, Any]]], num_classes: int
) -> np.ndarray:
    counts = np.zeros(num_classes, np.int64)
    for _, f in facts:
        counts += np.asarray(f["class_counts"], np.int64)
    return counts


def _ignored_values(
    facts: list[tuple[ImageMaskPair, dict[str, Any]]], labels: LabelMap
) -> MaskValueCensus:
    """The values of the masks of ``facts`` that ``labels`` ignore: pixels and files of each."""
    census = MaskValueCensus(colour=labels.colour)
    for pair, f in facts:
        if "class_counts" not in f:
            continue
        codes, counts = values_as_read(f, labels.colour)
        ignored = labels.known(codes) & (labels.decode_codes(codes) == labels.ignore_index)
        if ignored.any():
            census.add(pair.mask, codes[ignored], counts[ignored], is_palette(f))
    return census


def _channel_moments(facts: list[dict[str, Any]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Mean and standard deviation per channel over the pixels not no-data, scaled to 0-1.

    The pass's sums leave the no-data pixels out (``inspect_pair``); so does the count.
    """
    pixels = sum(f["pixels"] - f["nodata"]["pixels"] for f in facts)
    total = np.sum([f["sum"] for f in facts], axis=0)
    squares = np.sum([f["squares"] for f in facts], axis=0)
    scale = MAX_VALUES[facts[0]["dtype"]]
    mean = total / pixels
    std = np.sqrt(np.maximum(squares / pixels - mean**2, 0.0))
    return tuple((mean / scale).round(6).tolist()), tuple((std / scale).round(6).tolist())


def _with_labels(
    pair: ImageMaskPair, facts: dict[str, Any], labels: LabelMap, unknown: MaskValueCensus
) -> dict[str, Any]:
    """``facts`` read by ``inspect_pair``, with what ``labels`` make of the mask's values.

    Adds the mask's pixels per class (``class_counts``) and its problems under these
    labels (another kind of mask, too many values); its values that no class claims go
    to ``unknown``.
    """
    facts = {**facts, "mask_problems": list(facts["mask_problems"])}
    if "mask_values" not in facts:
        return facts
    channels = channels_as_read(facts, labels.colour)  # a palette mask's fit either kind
    if channels != labels.channels:
        kind = "RGB colours" if labels.colour else "class indices or grey levels"
        facts["mask_problems"].append(
            f"mask has {channels} channel(s), but datamodule.label_ids expects "
            f"{labels.channels} ({kind})"
        )
        return facts
    codes, counts = values_as_read(facts, labels.colour)
    beyond = beyond_palette(facts, labels.colour, pair.mask)
    facts["mask_problems"] += [beyond] if beyond else []
    if mask_holds_an_image(facts):
        facts["mask_problems"].append(too_many_values(facts))
    else:
        known = labels.known(codes)
        if not known.all():
            unknown.add(pair.mask, codes[~known], counts[~known], is_palette(facts))
    decoded = labels.decode_codes(codes)
    facts["class_counts"] = (
        np.bincount(decoded, weights=counts, minlength=256)[: labels.num_classes]
        .astype(np.int64)
        .tolist()
    )
    return facts
