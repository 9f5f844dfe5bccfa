"""One image and its mask read in row chunks: sizes, pixel sums and range, the mask's values.

What it finds does not depend on the label settings, so the validation cache keeps it
for any classes; asked for, it also keeps a few pixel locations of each class
(``segscale.data.class_locations``) and the valid pixels per cell
(``segscale.data.valid_cells``), marked with the settings they were found with.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from segscale.data.class_locations import LocationSampler
from segscale.data.labels import LabelMap, mask_codes, palette_codes
from segscale.data.palette_masks import PALETTE, channels_as_read
from segscale.data.rasters import Pixels
from segscale.data.sources import (
    DEFAULT_MAX_IMAGE_PIXELS,
    READ_ERRORS,
    ImageMaskPair,
    describe_read_error,
    read_image,
    read_mask,
)
from segscale.data.valid_cells import CELL, Validity, ValidPixels
from segscale.data.value_range import ValueHistogram

ROWS_PER_CHUNK = 1024
"""Rows read at a time, so a memory-mapped tile is never loaded whole."""

MAX_MASK_VALUES = 1024
"""Distinct values of one mask kept in the cache (those with the most pixels). A mask of
classes holds a few; one with more is reported (an image in the mask folder?)."""


def inspect_pair(
    pair: ImageMaskPair,
    labels: LabelMap | None = None,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    locations_per_class: int = 0,
    validity: Validity | None = None,
) -> dict[str, Any]:
    """Read one image and mask in row chunks; return sizes, statistics and problems.

    What it returns does not depend on ``labels``: the mask's channels and its distinct
    values (``mask_codes``) with their pixels (``mask_values``, at most
    ``MAX_MASK_VALUES`` of them, ``mask_distinct`` counts all), a palette mask's values
    being its indices, its palette beside them (``palette_masks.PALETTE``); the image's
    pixel sums and its range per channel (``value_range``, see ``ValueHistogram``). A file whose
    header declares more than ``max_image_pixels``, and an image with NaN or infinite
    pixels, are problems like an unreadable one (the first found before it is decoded).
    ``locations_per_class > 0`` with ``labels`` also keeps that many pixels of each
    class (``class_locations``, see ``LocationSampler``), marked with the labels they
    were found with. ``validity`` with ``labels`` also counts the valid pixels per cell
    (``valid_cells``, see ``ValidPixels``; ``problem`` there: a no-data tag that is no
    number), marked with the labels and the no-data setting.
    """
    facts: dict[str, Any] = {"image_problems": [], "mask_problems": [], "channels": None}
    image = None
    try:
        image = read_image(pair.image, max_image_pixels)
        facts |= {"shape": list(image.shape[:2]), "channels": image.shape[2]}
        facts |= {"dtype": str(image.dtype), **_pixel_statistics(image)}
        if facts["nonfinite"]:
            facts["image_problems"].append(_nonfinite_problem(facts["nonfinite"]))
    except READ_ERRORS as error:
        reason = describe_read_error(pair.image, error)
        facts["image_problems"].append(f"image cannot be read: {reason}")
    try:
        mask = read_mask(pair.mask, max_image_pixels)
    except READ_ERRORS as error:
        reason = describe_read_error(pair.mask, error)
        facts["mask_problems"].append(f"mask cannot be read: {reason}")
        return facts
    raw = mask.values
    mask_channels = 1 if raw.ndim == 2 else raw.shape[2]
    facts["mask_channels"] = mask_channels
    if mask.palette is not None:  # its values are indices: their colours go beside them
        facts[PALETTE] = palette_codes(mask.palette).tolist()
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
    fits = labels is not None and channels_as_read(facts, labels.colour) == labels.channels
    if labels is not None and locations_per_class and fits:
        sampler = LocationSampler(labels.num_classes, locations_per_class, raw.shape[1])
    cells = None
    if validity is not None and labels is not None and image is not None:
        cells = _valid_pixels(pair, facts, image, labels, validity)
    table = labels.palette_table(mask.palette) if labels is not None else None
    values, counts = _value_counts(raw, labels, sampler, cells, table)
    kept = np.argsort(-counts, kind="stable")[:MAX_MASK_VALUES]
    kept.sort()
    facts["mask_values"] = np.stack([values[kept], counts[kept]], axis=1).tolist()
    facts["mask_distinct"] = len(values)
    if sampler is not None and labels is not None:
        facts["class_locations"] = {**sampler.facts(), "labels": labels_key(labels)}
    if cells is not None:
        facts["valid_cells"] |= cells.counter.facts()
    return facts


def _valid_pixels(
    pair: ImageMaskPair, facts: dict[str, Any], image: Pixels, labels: LabelMap, validity: Validity
) -> ValidPixels | None:
    """The counter of the pair's valid pixels; ``None`` where its no-data tag is no number.

    Starts ``facts["valid_cells"]`` with what it is found with (and the image's no-data
    value, or the problem of its tag). Nothing is counted in a mask of another size or
    kind (a problem the pass reports).
    """
    if facts["mask_problems"] or channels_as_read(facts, labels.colour) != labels.channels:
        return None
    entry: dict[str, Any] = {"cell": CELL, **validity_key(labels, validity)}
    facts["valid_cells"] = entry
    try:
        nodata = validity.nodata_of(pair.image)
    except ValueError as error:
        entry["problem"] = str(error)
        return None
    entry["nodata"] = nodata
    return ValidPixels(image, labels.num_classes, nodata)


def _pixel_statistics(image: Pixels) -> dict[str, Any]:
    """Per channel: sum and sum of squares (float64), for the dataset's mean and std; range.

    The range (``value_range``: ``[low, high]`` per channel, ``None`` without a finite
    value) goes into the checkpoint; ``nonfinite`` counts NaN and infinite values.
    """
    total = np.zeros(image.shape[2])
    squares = np.zeros(image.shape[2])
    histogram = ValueHistogram(image.shape[2], image.dtype)
    for start in range(0, image.shape[0], ROWS_PER_CHUNK):
        rows = np.asarray(image[start : start + ROWS_PER_CHUNK])
        histogram.add(rows)
        chunk = rows.astype(np.float64)
        total += chunk.sum((0, 1))
        squares += (chunk**2).sum((0, 1))
    pixels = image.shape[0] * image.shape[1]
    return {
        "pixels": pixels,
        "sum": total.tolist(),
        "squares": squares.tolist(),
        "value_range": histogram.percentiles(),
        "nonfinite": histogram.nonfinite(),
    }


def _nonfinite_problem(count: int) -> str:
    """The problem of an image with ``count`` NaN or infinite values."""
    return (
        f"has {count} NaN or infinite pixel value(s); expected finite values (a NaN "
        "makes every patch and the mean NaN): give no-data pixels a value, and their "
        "mask the ignore index"
    )


def _value_counts(
    raw: Pixels,
    labels: LabelMap | None = None,
    sampler: LocationSampler | None = None,
    cells: ValidPixels | None = None,
    palette_table: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct mask values (as ``mask_codes``) and how many pixels have each.

    ``sampler`` and ``cells`` are offered each chunk's class indices (decoded by
    ``labels``, a palette mask's through its ``palette_table``) on the way.
    """
    totals: dict[int, int] = {}
    listeners = [each for each in (sampler, cells) if each is not None]
    for start in range(0, raw.shape[0], ROWS_PER_CHUNK):
        chunk = np.asarray(raw[start : start + ROWS_PER_CHUNK])
        codes = mask_codes(chunk)
        if listeners and labels is not None:
            if palette_table is not None:
                classes = palette_table[chunk]
            else:
                classes = chunk if labels.is_identity(chunk) else labels.decode_codes(codes)
            for listener in listeners:
                listener.add(classes, start)
        values, counts = np.unique(codes, return_counts=True)
        for value, count in zip(values.tolist(), counts.tolist(), strict=True):
            totals[value] = totals.get(value, 0) + count
    values = np.array(sorted(totals), np.int64)
    return values, np.array([totals[v] for v in values.tolist()], np.int64)


def mask_holds_an_image(facts: dict[str, Any]) -> bool:
    """Whether a mask holds more distinct values than masks of classes do (``facts``)."""
    return bool(facts["mask_distinct"] > MAX_MASK_VALUES)


def too_many_values(facts: dict[str, Any]) -> str:
    """The problem of a mask that holds too many values to be one of classes."""
    return (
        f"mask holds {facts['mask_distinct']} distinct values; a mask of classes holds a "
        "few (is it an image rather than a mask?)"
    )


def labels_key(labels: LabelMap) -> str:
    """A short key for the label settings that class locations were found with."""
    settings = {"num_classes": labels.num_classes, **labels.describe()}
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def validity_key(labels: LabelMap, validity: Validity) -> dict[str, Any]:
    """What valid cells were counted with: the labels and ``datamodule.sampling.nodata``."""
    return {"labels": labels_key(labels), "nodata_setting": validity.nodata}
