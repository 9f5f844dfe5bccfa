"""The values of a split's masks, for ``datamodule/classes=auto``.

Read through the validation cache: a dataset validated before is not read again (and
one that is not, on every core: ``segscale.data.checks.pass_reading``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from segscale.data.checks.dataset_problems import InvalidDatasetError, problem_message
from segscale.data.checks.pair_inspection import mask_holds_an_image, too_many_values
from segscale.data.checks.pass_reading import PairRequest, read_pairs
from segscale.data.checks.validation_cache import ValidationCache
from segscale.data.classes.mask_values import MaskValueCensus
from segscale.data.classes.palette import (
    channels_as_read,
    is_palette,
    one_palette,
    values_as_read,
)
from segscale.data.storage.sources import DEFAULT_MAX_IMAGE_PIXELS, FileProblem, TileSource
from segscale.errors import ConfigError


def scan_mask_values(
    source: TileSource,
    split: str = "train",
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    colour: bool | None = None,
    also: Sequence[str] = (),
    nodata: float | None = None,
) -> MaskValueCensus:
    """The values of ``split``'s masks: pixels and files per grey level or RGB colour.

    Read through the validation cache (a dataset validated before is not read again).
    ``colour``: whether the classes are colours, which read palette masks by their
    colours (else by index); ``None`` (``datamodule/classes=auto``) decides it from the
    masks (``colour_masks``). Masks of the other kind, and masks that cannot be read,
    are left out here and reported by ``validate_dataset``. Raises
    ``InvalidDatasetError`` when no mask of ``split`` can be read at all, listing why,
    and the files that the splits of ``also`` cannot pair (a val list's bad lines with
    the train list's: every list's problems at once). ``nodata``:
    ``datamodule.sampling.nodata``, which the files read are cached with (the pass after
    this one reads them with it: not again).
    """
    pairs, problems = source.scan(split)
    requests = [PairRequest(pair, nodata=nodata) for pair in pairs]
    read = read_pairs(lambda: ValidationCache(source, max_image_pixels), requests)
    facts = list(zip(pairs, read, strict=True))
    problems = problems + [FileProblem(p.mask, r) for p, f in facts for r in f["mask_problems"]]
    readable = [(p, f) for p, f in facts if "mask_values" in f]
    problems += [
        FileProblem(p.mask, too_many_values(f)) for p, f in readable if mask_holds_an_image(f)
    ]
    readable = [(p, f) for p, f in readable if not mask_holds_an_image(f)]
    if not readable:
        missing = FileProblem(Path(f"datamodule.source.splits.{split}"), "no readable mask")
        problems = problems or [missing]
        for other in also:
            problems += _pairing_problems(source, other)
        raise InvalidDatasetError(problem_message(problems))
    if colour is None:
        colour = colour_masks([f for _, f in readable])
    census = MaskValueCensus(colour=colour)
    for pair, f in readable:
        if channels_as_read(f, colour) == (3 if colour else 1):
            codes, counts = values_as_read(f, colour)
            census.add(pair.mask, codes, counts, is_palette(f))
    return census


def _pairing_problems(source: TileSource, split: str) -> list[FileProblem]:
    """The files of ``split`` that cannot be paired; a split not there is one problem."""
    if not source.has_split(split):
        return []
    try:
        return source.scan(split)[1]
    except ConfigError as error:
        return [FileProblem(Path("datamodule.source"), str(error))]


def colour_masks(facts: list[dict[str, Any]]) -> bool:
    """Whether masks of these ``facts`` are colour masks, as ``classes=auto`` decides it.

    Palette masks are read by their colours when any mask is an RGB mask (the classes
    are then one set of colours, whichever way a file stores them) or when their
    palettes do not pair indices and colours one to one (``one_palette``: files that
    order their palettes each their own way); otherwise by index (Pascal VOC's one
    palette, whose indices are the class ids). Then the kind of most masks wins, grey
    on a tie; the masks of the other kind are the validation pass's to report.
    """
    rgb = sum(f["mask_channels"] == 3 for f in facts)
    palettes = [f for f in facts if is_palette(f)]
    palette_colours = rgb > 0 or not one_palette(palettes)
    grey = len(facts) - rgb - (len(palettes) if palette_colours else 0)
    return len(facts) - grey > grey
