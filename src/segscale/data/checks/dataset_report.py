"""What the validation pass found about a dataset, and its class-frequency files.

``DatasetReport`` holds the usable pairs, pixel statistics and class counts; it prints
the class frequencies and writes ``class_frequencies.csv`` and ``.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from segscale.atomic_files import write_csv_atomically, write_text_atomically
from segscale.data.checks.value_range import ValueRange
from segscale.data.classes.labels import LabelId, code_of, shown_value
from segscale.data.classes.mask_values import MaskValueCensus
from segscale.data.sampling.class_locations import TileClassLocations
from segscale.data.sampling.valid_windows import TileWindows
from segscale.data.storage.grids import Grid
from segscale.data.storage.pixel_types import MAX_VALUES
from segscale.data.storage.sources import ImageMaskPair

if TYPE_CHECKING:  # it prints split names with SPLIT_WORDS, from here
    from segscale.data.checks.nodata_report import NodataReport

SPLIT_WORDS = {"train": "training", "val": "validation"}
"""How messages name a split's images and masks."""


IGNORED_ROW = "(ignored)"
"""The row of ignored pixels in ``class_frequencies.csv`` (parenthesized: not a class)."""


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
    """Training images' mean per channel, as a fraction of ``max_value``, over their
    pixels that are not no-data (``nodata``)."""
    channel_std: tuple[float, ...]
    """Their standard deviation per channel, over the same pixels."""
    class_locations: dict[str, list[TileClassLocations]] = field(default_factory=dict)
    """Per split, parallel to ``pairs``: each tile's kept pixels per class. Empty unless
    the pass was asked for them (``locations_per_class``)."""
    ignored: dict[str, MaskValueCensus] = field(default_factory=dict)
    """Per split, the mask values that are ignored (``ignore_ids``, and in grey masks the
    ignore index itself): pixels and files of each."""
    ignore_ids: tuple[LabelId, ...] = ()
    """The mask values ``datamodule.ignore_ids`` names."""
    ignore_index: int = 255
    value_range: ValueRange | None = None
    """The training images' values per channel (raw): the lowest and highest of their
    robust ranges (``segscale.data.checks.value_range``). Checkpoints record it."""
    valid_windows: dict[str, list[TileWindows]] = field(default_factory=dict)
    """For the training split, parallel to ``pairs``: each tile's windows that hold
    ``datamodule.sampling.min_valid`` of valid pixels. Empty unless asked for."""
    warped_masks: dict[Path, Grid] = field(default_factory=dict)
    """The masks read on their image's grid (``datamodule.mask_alignment=warp``), each
    with that grid: those of pairs whose grids differ (``segscale.data.storage.grids``)."""
    nodata: NodataReport | None = None
    """The images' no-data per split: values, pixels, qualifying windows."""

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
        """What is ignored in ``split``'s masks, and how much, one line per value.

        Each value of ``datamodule.ignore_ids`` always gets its line, counted on its own
        (0 px says no mask holds it); the ignore index of grey masks only where masks
        hold it.
        """
        census = self.ignored.get(split) or MaskValueCensus(colour=False)
        total = int(self.class_counts[split].sum()) + self.ignored_pixels(split)
        listed = {code_of(v) for v in self.ignore_ids}
        groups = [(f"ignore_ids [{shown_value(v)}]", {code_of(v)}) for v in self.ignore_ids]
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
