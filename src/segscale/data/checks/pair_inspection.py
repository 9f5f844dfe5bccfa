"""One image and its mask read in row chunks: sizes, pixel sums and range, the mask's values.

What it finds does not depend on the label settings, so the validation cache keeps it
for any classes; asked for, it also keeps a few pixel locations of each class
(``segscale.data.sampling.class_locations``) and the valid pixels per cell
(``segscale.data.sampling.valid_windows``), marked with the settings they were found with. The
image's no-data pixels (``segscale.data.storage.nodata``: its GeoTIFF tag's value, or
``datamodule.sampling.nodata``, in every band) are counted, and left out of its sums
and value range: they depend on that setting, which the facts are marked with.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from segscale.data.checks.pixel_counts import MaskCounts
from segscale.data.checks.value_range import ValueHistogram
from segscale.data.classes.labels import LabelMap, palette_codes
from segscale.data.classes.palette import PALETTE, channels_as_read
from segscale.data.sampling.class_locations import LocationSampler
from segscale.data.sampling.valid_windows import CELL, Validity, ValidPixels
from segscale.data.storage.grids import Grid, pair_grids, warped_mask
from segscale.data.storage.nodata import NODATA_KEY, nodata_pixels
from segscale.data.storage.rasters import Pixels, WindowedRaster
from segscale.data.storage.sources import (
    DEFAULT_MAX_IMAGE_PIXELS,
    READ_ERRORS,
    ImageMaskPair,
    MaskFile,
    describe_read_error,
    read_image,
    read_mask,
)

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
    warp_masks: bool = False,
    nodata: float | None = None,
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
    number), marked with the labels and the no-data setting. Class locations and valid
    cells of a palette mask are its pixels' classes as ``labels`` read it: by its
    colours for colour classes (``LabelMap.palette_table``), else by index.

    The image and the mask are read side by side, chunk by chunk, once: every statistic
    is taken from the same chunks. Both files' grids on the ground are kept
    (``segscale.data.storage.grids.pair_grids``); with ``warp_masks`` a mask on another grid than
    its image's is read on the image's (``mask_warped``; ``mask_uncovered``: the image's
    pixels it does not cover, counted in no value).

    ``nodata``: ``datamodule.sampling.nodata`` (``None``: each GeoTIFF's tag). The
    image's no-data pixels, those that hold its no-data value in every band, are left
    out of its sums (``sum``, ``squares``: of its ``pixels`` less them) and of its
    ``value_range``; ``nodata`` in the facts holds the ``setting``, the ``value`` found
    and where from (``from``: the tag or the setting), the ``pixels`` it covers, or the
    ``problem`` of a tag that is no number. ``validity``'s no-data setting, where
    given, must be ``nodata`` (its cells are counted with the same pixels).
    """
    if validity is not None and validity.nodata != nodata:
        raise ValueError(f"valid cells counted with nodata={validity.nodata}, the pass's {nodata}")
    facts: dict[str, Any] = {"image_problems": [], "mask_problems": [], "channels": None}
    facts["nodata"] = {"setting": nodata}
    image = _opened_image(pair, facts, max_image_pixels)
    facts |= pair_grids(pair.image, pair.mask)
    onto = Grid.from_facts(facts["image_grid"]) if warp_masks and facts["grids_differ"] else None
    opened, coverage = _opened_mask(pair, facts, max_image_pixels, onto)
    statistics = None
    if image is not None:
        statistics = _ImageStatistics(image, _nodata_value(pair, facts["nodata"]))
    mask = None
    if opened is not None:
        mask = _MaskReading(pair, facts, opened, coverage, labels, locations_per_class)
        if validity is not None and labels is not None and image is not None:
            mask.cells = _valid_pixels(pair, facts, image, labels, validity)
    rows = max(image.shape[0] if image is not None else 0, mask.height if mask is not None else 0)
    for start in range(0, rows, ROWS_PER_CHUNK):
        image_rows = empty = None
        if statistics is not None and start < statistics.height:
            image_rows = _chunk(statistics.image, start, pair.image, facts["image_problems"])
            if image_rows is None:
                statistics = None  # unreadable: its problem is listed
            else:
                empty = statistics.add(image_rows)
        if mask is not None and start < mask.height and not mask.read(start, image_rows, empty):
            mask = None  # unreadable: its problem is listed
    if statistics is not None:
        facts |= statistics.facts()
        facts["nodata"]["pixels"] = statistics.nodata_pixels
        if facts["nonfinite"]:
            facts["image_problems"].append(_nonfinite_problem(facts["nonfinite"]))
    elif image is not None:
        facts["channels"] = None  # an image whose pixels could not all be read
    if mask is not None:
        facts |= mask.facts()
        if mask.cells is not None:
            facts["valid_cells"] |= mask.cells.counter.facts()
    return facts


def _opened_image(
    pair: ImageMaskPair, facts: dict[str, Any], max_image_pixels: int | None
) -> Pixels | None:
    """The image, its shape, channels and pixel type in ``facts``; ``None`` if unreadable."""
    try:
        image = read_image(pair.image, max_image_pixels)
    except READ_ERRORS as error:
        reason = describe_read_error(pair.image, error)
        facts["image_problems"].append(f"image cannot be read: {reason}")
        return None
    facts |= {"shape": list(image.shape[:2]), "channels": image.shape[2]}
    facts["dtype"] = str(image.dtype)
    return image


def _opened_mask(
    pair: ImageMaskPair, facts: dict[str, Any], max_image_pixels: int | None, onto: Grid | None
) -> tuple[MaskFile | None, Pixels | None]:
    """The mask's raw values, channels and palette (in ``facts``); ``None`` if not counted.

    Not counted: a mask that cannot be read, or of neither 1 nor 3 channels (a problem
    in ``facts``). A mask of another size than its image is counted (and a problem).
    ``onto``: the mask read on this grid (its image's: ``mask_warped``), with its
    coverage (else ``None``); a palette mask's indices are warped, its palette kept.
    """
    facts["mask_warped"] = onto is not None
    coverage = None
    try:
        if onto is None:
            mask = read_mask(pair.mask, max_image_pixels)
        else:
            mask, coverage = warped_mask(pair.mask, onto)
    except READ_ERRORS as error:
        reason = describe_read_error(pair.mask, error)
        facts["mask_problems"].append(f"mask cannot be read: {reason}")
        return None, None
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
        return None, None
    if facts["grids_differ"]:  # the pass says how the grids differ, or the mask is warped
        return mask, coverage
    if "shape" in facts and list(raw.shape[:2]) != facts["shape"]:
        facts["mask_problems"].append(
            f"mask is {raw.shape[1]}x{raw.shape[0]} but its image {pair.image.name} is "
            f"{facts['shape'][1]}x{facts['shape'][0]}; they must match"
        )
    return mask, coverage


def _chunk(
    pixels: Pixels, start: int, path: Path, problems: list[str], what: str = "image"
) -> np.ndarray | None:
    """Rows ``start`` on of ``pixels`` (``ROWS_PER_CHUNK``); ``None``, a problem, if unreadable."""
    try:
        if isinstance(pixels, WindowedRaster) and pixels.dtype.kind == "u":
            # Integers are counted channel by channel: GDAL's bands need no interleaving
            # (a float image's sums are taken from interleaved rows, as they always were).
            return pixels.band_rows(start, start + ROWS_PER_CHUNK)
        return np.asarray(pixels[start : start + ROWS_PER_CHUNK])
    except READ_ERRORS as error:
        problems.append(f"{what} cannot be read: {describe_read_error(path, error)}")
        return None


class _ImageStatistics:
    """Per channel: sum and sum of squares, for the dataset's mean and std; the range.

    The range (``value_range``: ``[low, high]`` per channel, ``None`` without a finite
    value) goes into the checkpoint; ``nonfinite`` counts NaN and infinite values. An
    integer image's sums come from its histogram, exactly; a float image's are summed
    in float64, chunk by chunk. Pixels that hold ``nodata`` in every band are counted
    (``nodata_pixels``) and left out of both: taken out of the histogram's bins, where
    each band counted them at that value (exact), and zeroed in a float chunk's float64
    copy before it is summed (no other copy is made).
    """

    def __init__(self, image: Pixels, nodata: float | None) -> None:
        self.image = image
        self.height, self.width, channels = image.shape[0], image.shape[1], image.shape[2]
        self.histogram = ValueHistogram(channels, image.dtype)
        self.total = np.zeros(channels)
        self.squares = np.zeros(channels)
        self.nodata = nodata
        self.nodata_pixels = 0

    def add(self, rows: np.ndarray) -> np.ndarray | None:
        """Count a chunk of the image's rows; return its no-data pixels (``None``: none).

        A chunk in which some band has no value in the no-data value's histogram bin
        holds no no-data pixel: it is not compared (most chunks of an image whose border
        lies in a few of them).
        """
        nodata = self.nodata
        index = self.histogram.bin_of(nodata) if nodata is not None else None
        before = self.histogram.counts[:, index].copy() if index is not None else None
        self.histogram.add(rows)
        empty = None
        held = before is not None and bool((self.histogram.counts[:, index] > before).all())
        if nodata is not None and held:  # every band holds the value somewhere in the chunk
            empty = nodata_pixels(rows, nodata)
            self.nodata_pixels += int(np.count_nonzero(empty))
        if not self.histogram.integer:
            chunk = rows.astype(np.float64)
            if empty is not None:
                chunk[empty] = 0.0
            self.total += chunk.sum((0, 1))
            self.squares += (chunk**2).sum((0, 1))
        return empty

    def facts(self) -> dict[str, Any]:
        """What the pass keeps of the image's pixels (sums and range without no-data)."""
        if self.nodata is not None:
            self.histogram.remove(self.nodata, self.nodata_pixels)
        if self.histogram.integer:
            total, squares = self.histogram.moments()
        else:
            total, squares = self.total.tolist(), self.squares.tolist()
        return {
            "pixels": self.height * self.width,
            "sum": total,
            "squares": squares,
            "value_range": self.histogram.percentiles(),
            "nonfinite": self.histogram.nonfinite(),
        }


class _MaskReading:
    """What the pass counts of a mask's chunks: its values, class locations, valid cells.

    A palette mask's values are its indices; its classes are read through the table
    ``labels`` make of its palette (``LabelMap.palette_table``: its colours' classes for
    colour labels, ``None``, by index, for others).
    """

    def __init__(
        self,
        pair: ImageMaskPair,
        facts: dict[str, Any],
        mask: MaskFile,
        coverage: Pixels | None,
        labels: LabelMap | None,
        locations_per_class: int,
    ) -> None:
        self.path, self.problems = pair.mask, facts["mask_problems"]
        self.raw, self.coverage = mask.values, coverage
        self.height = self.raw.shape[0]
        self.labels = labels
        table = labels.palette_table(mask.palette) if labels is not None else None
        self.counts = MaskCounts(self.raw.dtype, self.raw.ndim, labels, table)
        self.sampler = None
        self.warped = facts["mask_warped"]
        self.uncovered = 0
        counted = labels is not None and channels_as_read(facts, labels.colour) == labels.channels
        if counted and labels is not None and locations_per_class and _on_image_grid(facts):
            width = self.raw.shape[1]
            self.sampler = LocationSampler(labels.num_classes, locations_per_class, width)
        self.cells: ValidPixels | None = None

    def read(
        self, start: int, image_rows: np.ndarray | None, empty: np.ndarray | None = None
    ) -> bool:
        """Read and count the chunk of rows from ``start``; ``False`` (a problem) if unreadable.

        ``image_rows``: the image's same rows; ``empty``: their no-data pixels (``None``:
        none).
        """
        rows = _chunk(self.raw, start, self.path, self.problems, "mask")
        covered = None
        if rows is not None and self.coverage is not None:
            covered = _chunk(self.coverage, start, self.path, self.problems, "mask")
            if covered is None:
                return False
        if rows is None:
            return False
        self.add(rows, start, image_rows, None if covered is None else covered > 0, empty)
        return True

    def add(
        self,
        rows: np.ndarray,
        start: int,
        image_rows: np.ndarray | None,
        covered: np.ndarray | None = None,
        empty: np.ndarray | None = None,
    ) -> None:
        """Count a chunk of the mask's rows (``image_rows``: the image's same rows).

        ``covered``: where a warped mask covers its image (the rest has no label);
        ``empty``: the image's no-data pixels in these rows (``None``: none).
        """
        if covered is not None:
            self.uncovered += int(covered.size - np.count_nonzero(covered))
        wanted = self.sampler is not None or self.cells is not None
        decoded = self.counts.add(rows, classes=wanted, covered=covered)
        if decoded is None:
            return
        classes, per_class = decoded
        if self.sampler is not None:
            self.sampler.add(classes, start, per_class)
        if self.cells is not None and image_rows is not None:
            self.cells.add(classes, start, empty)

    def facts(self) -> dict[str, Any]:
        """The mask's values (the ``MAX_MASK_VALUES`` with most pixels), locations, cells."""
        values, counts = self.counts.values()
        kept = np.argsort(-counts, kind="stable")[:MAX_MASK_VALUES]
        kept.sort()
        facts: dict[str, Any] = {
            "mask_values": np.stack([values[kept], counts[kept]], axis=1).tolist(),
            "mask_distinct": len(values),
        }
        if self.warped:
            facts["mask_uncovered"] = self.uncovered
        if self.sampler is not None and self.labels is not None:
            facts["class_locations"] = {**self.sampler.facts(), "labels": labels_key(self.labels)}
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
    if not _on_image_grid(facts):  # a problem the pass reports
        return None
    entry: dict[str, Any] = {"cell": CELL, **validity_key(labels, validity)}
    facts["valid_cells"] = entry
    if "problem" in facts["nodata"]:
        entry["problem"] = facts["nodata"]["problem"]
        return None
    entry["nodata"] = facts["nodata"]["value"]
    return ValidPixels(image.shape[0], image.shape[1], labels.num_classes)


def _nodata_value(pair: ImageMaskPair, entry: dict[str, Any]) -> float | None:
    """The image's no-data value (``entry``'s ``setting``, else its tag's), noted in ``entry``.

    ``entry`` gets the ``value`` and where it is ``from`` (``NODATA_KEY`` or
    ``GDAL_NODATA``; ``None`` without one), or the ``problem`` of a tag that is no
    number (then ``None``: nothing is no-data).
    """
    try:
        value = Validity(entry["setting"]).nodata_of(pair.image)
    except ValueError as error:
        entry |= {"value": None, "from": None, "problem": str(error)}
        return None
    source = NODATA_KEY if entry["setting"] is not None else "GDAL_NODATA"
    entry |= {"value": value, "from": source if value is not None else None}
    return value


def _on_image_grid(facts: dict[str, Any]) -> bool:
    """Whether the mask is read on its image's grid: the same grid, or warped onto it."""
    return bool(facts["mask_warped"] or not facts["grids_differ"])


def _nonfinite_problem(count: int) -> str:
    """The problem of an image with ``count`` NaN or infinite values."""
    return (
        f"has {count} NaN or infinite pixel value(s); expected finite values (a NaN "
        "makes every patch and the mean NaN): give no-data pixels a value, and their "
        "mask the ignore index"
    )


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
