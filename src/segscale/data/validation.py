"""The pass over a dataset before training: every file checked, class frequencies counted.

What a file taught us is cached in the user's cache folder
(``$XDG_CACHE_HOME/segscale/validation/<dataset>.json``, ``segscale.data.user_cache``),
keyed by the image's and mask's path, size and modification time, so a second run
re-reads only files that changed. The cache holds what does not depend on the label
settings (sizes, pixel sums, each mask's values and their pixels), so other classes
(``datamodule/classes``) re-read nothing either, and ``datamodule/classes=auto`` finds
the training masks' values there (``scan_mask_values``). Asked for (class-balanced
sampling), the pass also keeps a few pixel locations of each class in each tile
(``segscale.data.class_locations``), cached with the rest for the label settings that
found them.

Mask values that no class claims are reported in one table (value, pixels, files, a
few file names; ``MaskValueCensus``) after the list of the other problems, with what
to do about them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from segscale.atomic_files import write_csv_atomically, write_text_atomically
from segscale.data.class_locations import LocationSampler, TileClassLocations
from segscale.data.labels import LabelId, LabelMap, code_of, mask_codes, shown_value
from segscale.data.mask_values import MaskValueCensus
from segscale.data.sources import (
    DEFAULT_MAX_IMAGE_PIXELS,
    READ_ERRORS,
    FileProblem,
    ImageMaskPair,
    TileSource,
    describe_read_error,
    read_image,
    read_image_header,
    read_mask_values,
)
from segscale.data.user_cache import cache_file
from segscale.errors import ConfigError

log = logging.getLogger(__name__)

_CACHE_VERSION = 2  # 2: facts independent of the labels, with each mask's value counts
_ROWS_PER_CHUNK = 1024  # rows read at a time, so a memory-mapped tile is never loaded whole
MAX_MASK_VALUES = 1024
"""Distinct values of one mask kept in the cache (those with the most pixels). A mask of
classes holds a few; one with more is reported (an image in the mask folder?)."""
MAX_LINES_PER_KIND = 5
"""Problems of one kind listed one per line; more are summarised (see ``_message``)."""
EXAMPLES_PER_KIND = 3
"""Problems shown of a summarised kind."""
MAX_VALUES = {"uint8": 255.0, "uint16": 65535.0, "float32": 1.0}
"""The value of full intensity for each pixel type (images are scaled by it)."""


def pixel_type_mismatch(dtype: str, max_value: float, expected_by: str) -> str | None:
    """Why pixels of ``dtype`` do not suit what ``expected_by`` takes; ``None`` if they do.

    ``max_value`` is the full intensity that ``expected_by`` scales pixels by (a
    checkpoint's): 255 means 8-bit images, 65535 16-bit, 1.0 float. Another pixel type
    would be normalized on the wrong scale (16-bit pixels into an 8-bit network read as
    up to 257 times full intensity).
    """
    if MAX_VALUES.get(dtype) == max_value:
        return None
    known = [name for name, value in MAX_VALUES.items() if value == max_value]
    wanted = f"{known[0]} pixels" if known else "pixels"
    return (
        f"its pixels are {dtype}, {expected_by} takes {wanted} (full intensity "
        f"{max_value:g}); convert the image to {known[0] if known else 'that type'}"
    )


SPLIT_WORDS = {"train": "training", "val": "validation"}
"""How messages name a split's images and masks."""
IGNORED_ROW = "(ignored)"
"""The row of ignored pixels in ``class_frequencies.csv`` (parenthesized: not a class)."""


class InvalidDatasetError(ConfigError):
    """The dataset has files that cannot be used; the message lists every one."""


@dataclass(frozen=True)
class DatasetReport:
    """What the validation pass found: usable pairs, pixel statistics, class counts."""

    pairs: dict[str, list[ImageMaskPair]]
    """Per split, the pairs large enough for the patch size."""
    class_counts: dict[str, np.ndarray]
    """Per split, labelled pixels per class (int64, one entry per class)."""
    class_names: tuple[str, ...]
    channels: int
    dtype: str
    channel_mean: tuple[float, ...]
    """Training images' mean per channel, as a fraction of ``max_value``."""
    channel_std: tuple[float, ...]
    class_locations: dict[str, list[TileClassLocations]] = field(default_factory=dict)
    """Per split, parallel to ``pairs``: each tile's kept pixels per class. Empty unless
    the pass was asked for them (``locations_per_class``)."""
    ignored: dict[str, MaskValueCensus] = field(default_factory=dict)
    """Per split, the mask values that are ignored (``ignore_ids``, and in grey masks the
    ignore index itself): pixels and files of each."""
    ignore_ids: tuple[LabelId, ...] = ()
    """The mask values ``datamodule.ignore_ids`` names."""
    ignore_index: int = 255

    @property
    def max_value(self) -> float:
        """Full intensity of the images' pixel type (255 for uint8, 65535 for uint16)."""
        return MAX_VALUES[self.dtype]

    def frequencies(self, split: str = "train") -> np.ndarray:
        """Share of the labelled pixels of ``split`` that each class has."""
        counts = self.class_counts[split].astype(np.float64)
        return counts / max(counts.sum(), 1.0)

    def ignored_pixels(self, split: str = "train") -> int:
        """Pixels of ``split``'s masks that are ignored (not in any class's count)."""
        census = self.ignored.get(split)
        return sum(census.pixels.values()) if census else 0

    def ignored_share(self, split: str = "train") -> float:
        """Share of all pixels of ``split``'s masks that are ignored."""
        ignored = self.ignored_pixels(split)
        return ignored / max(int(self.class_counts[split].sum()) + ignored, 1)

    def ignored_lines(self, split: str = "train") -> list[str]:
        """What is ignored in ``split``'s masks, and how much, one line per setting.

        ``datamodule.ignore_ids`` always gets its line (0 px says no mask holds them); the
        ignore index of grey masks only where masks hold it.
        """
        census = self.ignored.get(split) or MaskValueCensus(colour=False)
        total = int(self.class_counts[split].sum()) + self.ignored_pixels(split)
        listed = {code_of(v) for v in self.ignore_ids}
        groups = []
        if self.ignore_ids:
            shown = ", ".join(shown_value(v) for v in self.ignore_ids)
            groups.append((f"ignore_ids [{shown}]", listed))
        index = {self.ignore_index} - listed if not census.colour else set()
        if sum(census.pixels.get(c, 0) for c in index):
            groups.append((f"ignore_index {self.ignore_index}", index))
        lines = []
        for what, codes in groups:
            pixels = sum(census.pixels.get(c, 0) for c in codes)
            share = pixels / max(total, 1)
            whose = SPLIT_WORDS.get(split, split)
            lines.append(f"{what}: {pixels:,} px, {share:.1%} of {whose} pixels, ignored")
        return lines

    def table(self, split: str = "train") -> str:
        """The class frequencies of ``split`` as a printable table, then what is ignored."""
        width = max(len(name) for name in self.class_names)
        lines = [f"class frequencies ({split}):", f"  {'class':<{width}}  {'pixels':>12}  share"]
        for name, count, share in zip(
            self.class_names, self.class_counts[split], self.frequencies(split), strict=True
        ):
            lines.append(f"  {name:<{width}}  {int(count):>12}  {share:6.2%}")
        lines += [f"  {line}" for line in self.ignored_lines(split)]
        return "\n".join(lines)

    def write(self, folder: Path) -> None:
        """Save ``class_frequencies.csv`` and ``.json`` (pixels and share per class, split).

        Each class's share is of the labelled pixels. The ignored pixels come last: the
        CSV's row ``IGNORED_ROW`` and the JSON's top-level key ``ignored`` (per split), their
        share of all the masks' pixels.
        """
        folder.mkdir(parents=True, exist_ok=True)
        splits = list(self.class_counts)
        rows = []
        for c, name in enumerate(self.class_names):
            counts = [int(self.class_counts[s][c]) for s in splits]
            shares = [round(float(self.frequencies(s)[c]), 6) for s in splits]
            rows.append([name, *counts, *shares])
        ignored = {
            s: {"pixels": self.ignored_pixels(s), "share": round(self.ignored_share(s), 6)}
            for s in splits
        }
        rows.append(
            [IGNORED_ROW, *(ignored[s]["pixels"] for s in splits)]
            + [ignored[s]["share"] for s in splits]
        )
        header = ["class", *(f"{s}_pixels" for s in splits), *splits]
        write_csv_atomically(folder / "class_frequencies.csv", header, rows)
        data = {
            s: {
                name: {"pixels": int(n), "share": round(float(f), 6)}
                for name, n, f in zip(
                    self.class_names, self.class_counts[s], self.frequencies(s), strict=True
                )
            }
            for s in splits
        }
        data["ignored"] = ignored  # no split has this name
        write_text_atomically(folder / "class_frequencies.json", json.dumps(data, indent=2))


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
) -> DatasetReport:
    """Check every file of ``splits``; raise ``InvalidDatasetError`` listing all problems.

    Checks: every image has a mask and every mask an image; files are readable and
    their headers declare at most ``max_image_pixels`` (see ``read_image``); image
    and mask sizes match; masks hold only values of ``labels`` (classes, ignored values);
    all images have the same channel count (``in_channels`` when given) and pixel type;
    at least one image of each split is at least ``patch_size`` on each side (smaller
    ones are left out, with a warning). The message lists each file's problems, then
    the unknown mask values of all files in one table, with what to do about them.
    ``channels_from`` says whose number ``in_channels`` is, for the message (a
    checkpoint's network, when evaluating).

    ``locations_per_class > 0`` also keeps up to that many pixels of each class in
    each tile (``DatasetReport.class_locations``); cached files read before without
    them (or with another number, or other labels) are read again once.
    """
    cache = _Cache(source, max_image_pixels)
    problems: list[FileProblem] = []
    unknown = MaskValueCensus(colour=labels.colour)
    facts: dict[str, list[tuple[ImageMaskPair, dict[str, Any]]]] = {}
    for split in splits:
        pairs, unpaired = source.scan(split)
        problems += unpaired
        read = [(pair, cache.facts(pair, labels, locations_per_class)) for pair in pairs]
        facts[split] = [(pair, _with_labels(pair, f, labels, unknown)) for pair, f in read]
        problems += [FileProblem(p.mask, r) for p, f in facts[split] for r in f["mask_problems"]]
        problems += [FileProblem(p.image, r) for p, f in facts[split] for r in f["image_problems"]]
    cache.save()
    readable = [(p, f) for split in splits for p, f in facts[split] if f["channels"] is not None]
    problems += _kind_problems(readable, in_channels, channels_from)
    usable = {split: _large_enough(facts[split], patch_size, split) for split in splits}
    for split in splits:
        if not usable[split] and not problems and not unknown:
            problems.append(_too_small(split, facts[split], patch_size))
    if problems or unknown:
        raise InvalidDatasetError(_message(problems, unknown, labels))
    train = [f for _, f in facts[splits[0]]]
    mean, std = _channel_moments(train)
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
    )


def inspect_pair(
    pair: ImageMaskPair,
    labels: LabelMap | None = None,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    locations_per_class: int = 0,
) -> dict[str, Any]:
    """Read one image and mask in row chunks; return sizes, statistics and problems.

    What it returns does not depend on ``labels``: the mask's channels and its distinct
    values (``mask_codes``) with their pixels (``mask_values``, at most
    ``MAX_MASK_VALUES`` of them, ``mask_distinct`` counts all). A file whose header
    declares more than ``max_image_pixels`` is a problem like any unreadable one, found
    before it is decoded. ``locations_per_class > 0`` with ``labels`` also keeps that
    many pixels of each class (``class_locations``, see ``LocationSampler``), marked
    with the labels they were found with.
    """
    facts: dict[str, Any] = {"image_problems": [], "mask_problems": [], "channels": None}
    try:
        image = read_image(pair.image, max_image_pixels)
        facts |= {"shape": list(image.shape[:2]), "channels": image.shape[2]}
        facts |= {"dtype": str(image.dtype), **_pixel_sums(image)}
    except READ_ERRORS as error:
        reason = describe_read_error(pair.image, error)
        facts["image_problems"].append(f"image cannot be read: {reason}")
    try:
        raw = read_mask_values(pair.mask, max_image_pixels)
    except READ_ERRORS as error:
        reason = describe_read_error(pair.mask, error)
        facts["mask_problems"].append(f"mask cannot be read: {reason}")
        return facts
    mask_channels = 1 if raw.ndim == 2 else raw.shape[2]
    facts["mask_channels"] = mask_channels
    if mask_channels not in (1, 3):
        facts["mask_problems"].append(
            f"mask has {mask_channels} channels; expected 1 (class indices or grey levels) "
            "or 3 (RGB colours)"
        )
        return facts
    if "shape" in facts and list(raw.shape[:2]) != facts["shape"]:
        facts["mask_problems"].append(
            f"mask is {raw.shape[1]}x{raw.shape[0]} but its image {pair.image.name} is "
            f"{facts['shape'][1]}x{facts['shape'][0]}; they must match"
        )
    sampler = None
    if labels is not None and locations_per_class and mask_channels == labels.channels:
        sampler = LocationSampler(labels.num_classes, locations_per_class, raw.shape[1])
    values, counts = _value_counts(raw, labels, sampler)
    kept = np.argsort(-counts, kind="stable")[:MAX_MASK_VALUES]
    kept.sort()
    facts["mask_values"] = np.stack([values[kept], counts[kept]], axis=1).tolist()
    facts["mask_distinct"] = len(values)
    if sampler is not None and labels is not None:
        facts["class_locations"] = {**sampler.facts(), "labels": _labels_key(labels)}
    return facts


def scan_mask_values(
    source: TileSource,
    split: str = "train",
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
) -> MaskValueCensus:
    """The values of ``split``'s masks: pixels and files per grey level or RGB colour.

    Read through the validation cache (a dataset validated before is not read again).
    The masks' kind is that of most of them (grey on a tie); masks of the other kind,
    and masks that cannot be read, are left out here and reported by
    ``validate_dataset``. Raises ``InvalidDatasetError`` when no mask of ``split`` can
    be read at all, listing why.
    """
    cache = _Cache(source, max_image_pixels)
    pairs, problems = source.scan(split)
    facts = [(pair, cache.facts(pair)) for pair in pairs]
    cache.save()
    problems = problems + [FileProblem(p.mask, r) for p, f in facts for r in f["mask_problems"]]
    readable = [(p, f) for p, f in facts if "mask_values" in f]
    problems += [FileProblem(p.mask, _too_many_values(f)) for p, f in readable if _is_image(f)]
    readable = [(p, f) for p, f in readable if not _is_image(f)]
    if not readable:
        missing = FileProblem(Path(f"datamodule.source.splits.{split}"), "no readable mask")
        raise InvalidDatasetError(_message(problems or [missing]))
    kinds = Counter(f["mask_channels"] for _, f in readable)
    channels = 3 if kinds[3] > kinds[1] else 1
    census = MaskValueCensus(colour=channels == 3)
    for pair, f in readable:
        if f["mask_channels"] == channels:
            values = np.asarray(f["mask_values"], np.int64).reshape(-1, 2)
            census.add(pair.mask, values[:, 0], values[:, 1])
    return census


def check_image_headers(
    paths: Sequence[Path],
    in_channels: int,
    channels_from: str,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    max_value: float | None = None,
) -> list[FileProblem]:
    """Every image of ``paths`` that cannot be used, judged by its header alone.

    Nothing is decoded (see ``read_image_header``): each file is opened, its declared
    size checked against ``max_image_pixels``, its channels against ``in_channels``
    (``channels_from`` says whose number that is, for the message), its pixel type
    against ``max_value`` if given (``pixel_type_mismatch``), and a PNG's chunk
    checksums are verified. A file that passes may still fail while being decoded (a
    truncated JPEG body).
    """
    problems: list[FileProblem] = []
    for path in paths:
        try:
            header = read_image_header(path, max_image_pixels)
        except READ_ERRORS as error:
            problems.append(
                FileProblem(path, f"cannot be read: {describe_read_error(path, error)}")
            )
            continue
        if header.channels != in_channels:
            problems.append(
                FileProblem(
                    path, f"has {header.channels} channels, {channels_from} takes {in_channels}"
                )
            )
            continue
        mismatch = (
            None
            if max_value is None
            else pixel_type_mismatch(header.dtype, max_value, channels_from)
        )
        if mismatch:
            problems.append(FileProblem(path, mismatch))
    return problems


def _pixel_sums(image: np.ndarray) -> dict[str, Any]:
    """Per-channel sum and sum of squares (float64), for the dataset's mean and std."""
    total = np.zeros(image.shape[2])
    squares = np.zeros(image.shape[2])
    for start in range(0, image.shape[0], _ROWS_PER_CHUNK):
        chunk = np.asarray(image[start : start + _ROWS_PER_CHUNK], np.float64)
        total += chunk.sum((0, 1))
        squares += (chunk**2).sum((0, 1))
    pixels = image.shape[0] * image.shape[1]
    return {"pixels": pixels, "sum": total.tolist(), "squares": squares.tolist()}


def _value_counts(
    raw: np.ndarray, labels: LabelMap | None = None, sampler: LocationSampler | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct mask values (as ``mask_codes``) and how many pixels have each.

    ``sampler`` is offered each chunk's class indices (decoded by ``labels``) on the way.
    """
    totals: dict[int, int] = {}
    for start in range(0, raw.shape[0], _ROWS_PER_CHUNK):
        chunk = np.asarray(raw[start : start + _ROWS_PER_CHUNK])
        codes = mask_codes(chunk)
        if sampler is not None and labels is not None:
            classes = chunk if labels.is_identity(chunk) else labels.decode_codes(codes)
            sampler.add(classes, start)
        values, counts = np.unique(codes, return_counts=True)
        for value, count in zip(values.tolist(), counts.tolist(), strict=True):
            totals[value] = totals.get(value, 0) + count
    values = np.array(sorted(totals), np.int64)
    return values, np.array([totals[v] for v in values.tolist()], np.int64)


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
        values = np.asarray(f["mask_values"], np.int64).reshape(-1, 2)
        codes = values[:, 0]
        ignored = labels.known(codes) & (labels.decode_codes(codes) == labels.ignore_index)
        if ignored.any():
            census.add(pair.mask, codes[ignored], values[ignored, 1])
    return census


def _channel_moments(facts: list[dict[str, Any]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Mean and standard deviation per channel over all pixels, scaled to 0-1."""
    pixels = sum(f["pixels"] for f in facts)
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
    channels = facts["mask_channels"]
    if channels != labels.channels:
        kind = "RGB colours" if labels.colour else "class indices or grey levels"
        facts["mask_problems"].append(
            f"mask has {channels} channel(s), but datamodule.label_ids expects "
            f"{labels.channels} ({kind})"
        )
        return facts
    values = np.asarray(facts["mask_values"], np.int64).reshape(-1, 2)
    codes, counts = values[:, 0], values[:, 1]
    if _is_image(facts):
        facts["mask_problems"].append(_too_many_values(facts))
    else:
        known = labels.known(codes)
        if not known.all():
            unknown.add(pair.mask, codes[~known], counts[~known])
    decoded = labels.decode_codes(codes)
    facts["class_counts"] = (
        np.bincount(decoded, weights=counts, minlength=256)[: labels.num_classes]
        .astype(np.int64)
        .tolist()
    )
    return facts


def _is_image(facts: dict[str, Any]) -> bool:
    """Whether a mask holds more distinct values than masks of classes do (``facts``)."""
    return bool(facts["mask_distinct"] > MAX_MASK_VALUES)


def _too_many_values(facts: dict[str, Any]) -> str:
    return (
        f"mask holds {facts['mask_distinct']} distinct values; a mask of classes holds a "
        "few (is it an image rather than a mask?)"
    )


def _message(
    problems: list[FileProblem],
    unknown: MaskValueCensus | None = None,
    labels: LabelMap | None = None,
) -> str:
    """Every problem: those of single files one per line, then unknown mask values.

    More than ``MAX_LINES_PER_KIND`` problems of one ``kind`` (images without a mask,
    ...) are one line with their count, then the first ``EXAMPLES_PER_KIND``.
    """
    files = len(unknown.all_files) if unknown else 0
    lines = [f"{len(problems) + files} problem(s) in the dataset (datamodule.source):"]
    lines += _problem_lines(problems)
    if unknown and labels is not None:
        lines += _unknown_values(unknown, labels, files)
    return "\n".join(lines)


def _problem_lines(problems: list[FileProblem]) -> list[str]:
    """One line per problem; a kind with many problems summarised where it first occurs."""
    of_kind: dict[str, list[FileProblem]] = {}
    for problem in problems:
        of_kind.setdefault(problem.kind, []).append(problem)
    lines: list[str] = []
    for problem in problems:
        same = of_kind[problem.kind]
        if not problem.kind or len(same) <= MAX_LINES_PER_KIND:
            lines.append(f"  {problem.path}: {problem.reason}")
        elif problem is same[0]:
            lines.append(f"  {len(same)} {problem.kind}, for example:")
            lines += [f"    {p.path}: {p.reason}" for p in same[:EXAMPLES_PER_KIND]]
            lines.append(f"    ... and {len(same) - EXAMPLES_PER_KIND} more")
    return lines


def _unknown_values(unknown: MaskValueCensus, labels: LabelMap, files: int) -> list[str]:
    """The table of mask values that no class claims, and what to do about them."""
    option = _classes_option()
    named = f"datamodule/classes={option}" if option else "datamodule/classes"
    ignore = f"datamodule.ignore_ids={unknown.override_list()}"
    what = "a value" if len(unknown) == 1 else f"{len(unknown)} values"
    lines = [
        f"  {files} mask(s) hold {what} that {named} does not know "
        f"(it knows {labels.describe_known()}):",
        unknown.table(indent=4),
    ]
    if option == "auto":
        lines.append(
            "  What to do: datamodule/classes=auto took the classes from the training masks, "
            "and no training mask holds these values: add training masks that do, or set "
            f"{ignore} to ignore them."
        )
    else:
        lines.append(
            "  What to do: datamodule/classes=auto takes the classes from the training "
            "masks; or write a classes file of your own (docs/own-data.md); or "
            f"set {ignore} to ignore these values."
        )
    return lines


def _classes_option() -> str | None:
    """The ``datamodule/classes`` option of the running Hydra job, if any (for messages)."""
    # Imported here: the data layer needs Hydra only to name the option in a message.
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    choice = HydraConfig.get().runtime.choices.get("datamodule/classes")
    return str(choice) if choice else None


def _labels_key(labels: LabelMap) -> str:
    """A short key for the label settings that class locations were found with."""
    settings = {"num_classes": labels.num_classes, **labels.describe()}
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


class _Cache:
    """Per-pair facts kept on disk, valid while the files' size and mtime are unchanged.

    The file is the user's (``cache_file``), named for the dataset (``TileSource.cache_key``),
    not the dataset's: a shared dataset folder stays as it is, a read-only one is cached.
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
        if self.path.is_file():
            try:
                stored = json.loads(self.path.read_text())
            except (OSError, ValueError):
                stored = {}
            if stored.get("settings") == self.settings and stored.get("dataset") == self.dataset:
                self.entries = stored.get("pairs", {})

    def facts(
        self, pair: ImageMaskPair, labels: LabelMap | None = None, locations_per_class: int = 0
    ) -> dict[str, Any]:
        """The pair's facts: from the cache if both files are unchanged, else read afresh.

        Class locations (``locations_per_class > 0``) are found with ``labels``: facts
        with none, another number or other labels are read again (the labels are not
        part of the settings key, since nothing else depends on them).
        """
        key = f"{pair.image.resolve()}|{pair.mask.resolve()}"
        stamp = [_stamp(pair.image), _stamp(pair.mask)]
        entry = self.entries.get(key)
        wanted = locations_per_class if labels is not None else 0
        if entry and entry["stamp"] == stamp and _has_locations(entry["facts"], labels, wanted):
            return entry["facts"]
        facts = inspect_pair(pair, labels, self.max_image_pixels, wanted)
        self.entries[key] = {"stamp": stamp, "facts": facts}
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


def _has_locations(facts: dict[str, Any], labels: LabelMap | None, per_class: int) -> bool:
    """Whether ``facts`` hold the class locations asked for (or none are asked for)."""
    if not per_class or labels is None or "mask_values" not in facts:
        return True  # a mask that could not be read has none to keep
    if facts["mask_channels"] != labels.channels:
        return True  # nor has one of the wrong kind (a problem the pass reports)
    kept = facts.get("class_locations") or {}
    return kept.get("per_class") == per_class and kept.get("labels") == _labels_key(labels)


def _stamp(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]
