"""Palettes: class colours (automatic ones told apart in CIELAB), palette masks read by colour.

Automatic class colours that a viewer can tell apart: farthest points in CIELAB.

Distances are CIE76 ΔE (Euclidean distance in CIELAB, D65 white). A ΔE of about 2.3 is
a just-noticeable difference; colours on a figure must be told apart at a glance, next
to other colours, so the automatic ones keep ``MIN_DELTA_E`` (20, ~10 JNDs) between
each other and from every given colour, for up to ``GUARANTEED_CLASSES`` automatic
colours. Beyond that the greedy choice still takes the farthest colour left, so the
least distance falls slowly instead of repeating colours.

Palette masks (PNG in palette mode, TIFF with a colour map): read by colour or by index.

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

import warnings
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

MIN_DELTA_E = 20.0
"""The least CIELAB ΔE between automatic colours, and from given ones (guaranteed)."""

GUARANTEED_CLASSES = 64
"""Up to this many automatic colours keep ``MIN_DELTA_E`` (tested)."""

MIN_COLOURFULNESS = 60
"""The least spread between an automatic colour's channels (0-255): white, black and the
greys (ignored pixels are drawn light grey, figures have a white background) have none."""

RESERVED = ((255, 255, 255), (0, 0, 0), (200, 200, 200))
"""Colours no class should resemble: the figures' white, black, the ignored pixels' grey."""

_STEP = 17  # candidate grid: 0, 17, …, 255 per channel (16³ colours)

_D65 = np.array([0.95047, 1.0, 1.08883])
_SRGB_TO_XYZ = np.array(
    [[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]
)


def srgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    """CIELAB (D65) of ``…×3`` sRGB colours 0-255.

    The formulas of IEC 61966-2-1 (sRGB → linear → XYZ) and CIE 15 (XYZ → L*a*b*), as
    e.g. Wikipedia's "SRGB" and "CIELAB color space" pages give them.
    """
    c = np.asarray(rgb, dtype=float) / 255.0
    linear = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    xyz = linear @ _SRGB_TO_XYZ.T / _D65
    delta = 6 / 29
    f = np.where(xyz > delta**3, np.cbrt(xyz), xyz / (3 * delta**2) + 4 / 29)
    return np.stack(
        [116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])],
        axis=-1,
    )


def delta_e(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Pairwise CIE76 ΔE between two lists of sRGB colours (``len(first)×len(second)``)."""
    a, b = srgb_to_lab(np.reshape(first, (-1, 3))), srgb_to_lab(np.reshape(second, (-1, 3)))
    return np.linalg.norm(a[:, None, :] - b[None, :, :], axis=-1)


@cache
def _candidates() -> np.ndarray:
    levels = np.arange(0, 256, _STEP)
    grid = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), -1).reshape(-1, 3)
    colourful = grid.max(axis=1) - grid.min(axis=1) >= MIN_COLOURFULNESS
    return grid[colourful].astype(np.uint8)


def distinct_colours(count: int, given: Sequence[Sequence[int]] = ()) -> np.ndarray:
    """``count`` new colours (``count×3`` uint8), farthest-point in CIELAB.

    Each is the candidate farthest from the ``given`` colours, the reserved ones and
    those chosen before it; ties go to the first candidate: deterministic.
    """
    candidates = _candidates()
    lab = srgb_to_lab(candidates)
    taken = np.concatenate([np.reshape(np.asarray(given, float), (-1, 3)), RESERVED])
    nearest = delta_e(candidates, taken).min(axis=1)
    chosen = []
    for _ in range(count):
        best = int(np.argmax(nearest))  # the first of equals: deterministic
        chosen.append(candidates[best])
        nearest = np.minimum(nearest, np.linalg.norm(lab - lab[best], axis=1))
    return np.asarray(chosen, np.uint8).reshape(-1, 3)


def warn_indistinct(colours: Sequence[Sequence[int]], names: Sequence[str] = ()) -> None:
    """Warn when two given colours are closer than ``MIN_DELTA_E``: kept as given."""
    distances = delta_e(np.asarray(colours), np.asarray(colours))
    np.fill_diagonal(distances, np.inf)
    for i, j in zip(*np.nonzero(np.triu(distances < MIN_DELTA_E)), strict=True):
        first = names[i] if i < len(names) else f"class {i}"
        second = names[j] if j < len(names) else f"class {j}"
        warnings.warn(
            f"the given colours of {first} {list(colours[i])} and {second} "
            f"{list(colours[j])} are hard to tell apart (ΔE {distances[i, j]:.0f} < "
            f"{MIN_DELTA_E:.0f}); they are kept as given",
            stacklevel=2,
        )


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
