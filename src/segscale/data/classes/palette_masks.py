"""Palette masks (PNG in palette mode, TIFF with a colour map): read by colour or by index.

A palette mask stores an index per pixel and a palette that gives each index a colour.
Which of the two is its value depends on the classes: colour classes (RGB triplets in
``datamodule.label_ids``) read it by its colours, since the masks of one dataset may
order their palettes differently (index 3 a road in one file, a roof in the next);
other classes (class indices, grey levels) read it by index, as Pascal VOC's are meant,
whose indices are the class ids and whose palette only shows them.

The validation pass keeps what a mask file holds whatever the classes
(``segscale.data.checks.pair_inspection``): a palette mask's values as its indices, with its
palette (``PALETTE``, the code of each index's colour). The functions here read those
facts as labels of either kind read the file (``LabelMap.palette_table`` decodes it so).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

PALETTE = "mask_palette"
"""The facts' key of a palette mask's palette: per index, its colour's code (0xRRGGBB)."""


def is_palette(facts: dict[str, Any]) -> bool:
    """Whether the mask of ``facts`` is a palette mask."""
    return facts.get(PALETTE) is not None


def reads_colours(facts: dict[str, Any], colour: bool) -> bool:
    """Whether labels of colours (``colour``) or not read this mask by its palette's colours."""
    return colour and is_palette(facts)


def channels_as_read(facts: dict[str, Any], colour: bool) -> int:
    """The mask's channels as labels of ``colour`` read it: a palette mask's 3 for colours."""
    return 3 if reads_colours(facts, colour) else int(facts["mask_channels"])


def values_as_read(facts: dict[str, Any], colour: bool) -> tuple[np.ndarray, np.ndarray]:
    """The mask's distinct values (``mask_codes``' codes) and their pixels, as read.

    A palette mask read by colour gives its palette's colours (two indices of one colour
    are one value); its indices beyond the palette have no colour and are left out here
    (``beyond_palette`` is their problem). Any other mask gives its values as found.
    """
    values = np.asarray(facts["mask_values"], np.int64).reshape(-1, 2)
    codes, counts = values[:, 0], values[:, 1]
    if not reads_colours(facts, colour):
        return codes, counts
    palette = np.asarray(facts[PALETTE], np.int64)
    inside = codes < len(palette)
    colours, which = np.unique(palette[codes[inside]], return_inverse=True)
    pixels = np.bincount(which, weights=counts[inside], minlength=len(colours))
    return colours, pixels.astype(np.int64)


def beyond_palette(facts: dict[str, Any], colour: bool, path: Path) -> str | None:
    """The problem of a palette mask read by colour whose indices have no colour, if any."""
    if not reads_colours(facts, colour):
        return None  # read by index, its palette means nothing
    palette = facts[PALETTE]
    values = np.asarray(facts["mask_values"], np.int64).reshape(-1, 2)
    beyond = values[values[:, 0] >= len(palette)]
    if not len(beyond):
        return None
    shown = ", ".join(str(i) for i in beyond[:5, 0].tolist()) + (", ..." if len(beyond) > 5 else "")
    pixels = f"({int(beyond[:, 1].sum()):,} pixels)"
    which = f"index {shown} {pixels} lies" if len(beyond) == 1 else f"indices {shown} {pixels} lie"
    return (
        f"{kind_of(path)} whose {which} beyond its palette of {len(palette)} colours; expected "
        "a colour for each index, as the classes are colours (datamodule.label_ids): save "
        "the mask again"
    )


def kind_of(path: Path) -> str:
    """A palette mask's kind, as messages name it: ``palette PNG``, ``palette TIFF``."""
    return f"palette {'PNG' if path.suffix.lower() == '.png' else 'TIFF'}"


def one_palette(facts: Iterable[dict[str, Any]]) -> bool:
    """Whether palette masks use their indices and colours one to one across all files.

    True when no index that two masks use has two colours, and no colour two indices:
    reading the masks by index then parts their pixels into the classes that reading
    them by colour would (Pascal VOC's one palette). An index beyond its palette counts
    as a colour of its own.
    """
    colour_of: dict[int, int] = {}
    index_of: dict[int, int] = {}
    for each in facts:
        palette = each[PALETTE]
        for index in np.asarray(each["mask_values"], np.int64).reshape(-1, 2)[:, 0].tolist():
            colour = palette[index] if index < len(palette) else -1 - index
            if colour_of.setdefault(index, colour) != colour:
                return False
            if index_of.setdefault(colour, index) != index:
                return False
    return True
