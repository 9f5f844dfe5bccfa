"""The values of a split's masks, for ``datamodule/classes=auto``.

Read through the validation cache: a dataset validated before is not read again (and
one that is not, on every core: ``segscale.data.pass_reading``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from segscale.data.dataset_problems import InvalidDatasetError, problem_message
from segscale.data.mask_values import MaskValueCensus
from segscale.data.pair_inspection import mask_holds_an_image, too_many_values
from segscale.data.pass_reading import PairRequest, read_pairs
from segscale.data.sources import DEFAULT_MAX_IMAGE_PIXELS, FileProblem, TileSource
from segscale.data.validation_cache import ValidationCache


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
    pairs, problems = source.scan(split)
    requests = [PairRequest(pair) for pair in pairs]
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
        raise InvalidDatasetError(problem_message(problems or [missing]))
    kinds = Counter(f["mask_channels"] for _, f in readable)
    channels = 3 if kinds[3] > kinds[1] else 1
    census = MaskValueCensus(colour=channels == 3)
    for pair, f in readable:
        if f["mask_channels"] == channels:
            values = np.asarray(f["mask_values"], np.int64).reshape(-1, 2)
            census.add(pair.mask, values[:, 0], values[:, 1])
    return census
