"""What the validation pass found about a dataset: its class-frequency files, its no-data.

``DatasetReport`` holds the usable pairs, pixel statistics and class counts; it prints
the class frequencies and writes ``class_frequencies.csv`` and ``.json``.

What the validation pass found of the images' no-data: values, pixels, qualifying windows.

A GeoTIFF's ``GDAL_NODATA`` tag (or ``datamodule.sampling.nodata``) marks pixels that
hold no data (``segscale.data.storage.nodata``). The pass counts them in each image as it reads
it (``segscale.data.checks.pair_inspection``); they are left out of the training images' mean,
standard deviation and value range. ``NodataReport`` says what was found, per split: how
many images have a no-data value, the pixels it covers (count and share), and, under
``datamodule.sampling.min_valid``, how many of the training tiles' candidate windows
qualify; per image, each image whose no-data covers any pixel. It is printed in the
dataset check's table (``lines``: ``data.py``, ``train.log``) and kept in the run's
``summary.json`` (``summary``: its ``nodata`` entry).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from segscale.atomic_files import write_csv_atomically, write_text_atomically
from segscale.data.checks.value_range import ValueRange
from segscale.data.classes.labels import LabelId, code_of, shown_value
from segscale.data.classes.mask_values import MaskValueCensus
from segscale.data.sampling.class_locations import TileClassLocations
from segscale.data.sampling.valid_windows import MIN_VALID_KEY, TileWindows
from segscale.data.storage.grids import Grid
from segscale.data.storage.nodata import NODATA_KEY
from segscale.data.storage.pixel_types import MAX_VALUES
from segscale.data.storage.sources import ImageMaskPair

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


WINDOW_WORDS = "candidate windows"


@dataclass(frozen=True)
class ImageNodata:
    """One image's no-data: its value, where it came from, the pixels it covers."""

    image: Path
    value: float
    source: str
    """``GDAL_NODATA`` (the image's tag) or ``datamodule.sampling.nodata``."""
    pixels: int
    """The image's pixels that hold ``value`` in every band."""
    total: int
    """All the image's pixels."""
    windows: tuple[int, int] | None = None
    """Under ``min_valid`` (training tiles): qualifying windows, and candidate windows."""

    @property
    def share(self) -> float:
        """The share of the image's pixels that are no-data."""
        return self.pixels / max(self.total, 1)

    def record(self) -> dict[str, Any]:
        """Plain values for ``summary.json``."""
        return {
            "image": str(self.image),
            "value": self.value,
            "from": self.source,
            "pixels": self.pixels,
            "share": round(self.share, 6),
            "windows": _windows_record(self.windows),
        }


@dataclass(frozen=True)
class SplitNodata:
    """One split's no-data: totals over its images, and the images that hold any."""

    images: int
    """The split's images whose pixels were read."""
    with_value: int
    """Those with a no-data value (a tag, or the setting)."""
    pixels: int
    nodata_pixels: int
    windows: tuple[int, int] | None
    """Under ``min_valid`` (training split): qualifying and candidate windows, all tiles."""
    per_image: tuple[ImageNodata, ...]
    """The images whose no-data covers at least one pixel, in the split's order."""

    @property
    def share(self) -> float:
        """The share of the split's pixels that are no-data."""
        return self.nodata_pixels / max(self.pixels, 1)

    def record(self) -> dict[str, Any]:
        """Plain values for ``summary.json``."""
        return {
            "images": self.images,
            "images_with_value": self.with_value,
            "images_with_nodata": len(self.per_image),
            "pixels": self.pixels,
            "nodata_pixels": self.nodata_pixels,
            "nodata_share": round(self.share, 6),
            "windows": _windows_record(self.windows),
            "per_image": [image.record() for image in self.per_image],
        }


@dataclass(frozen=True)
class NodataReport:
    """The no-data of every split checked, and the settings it was found with."""

    setting: float | None
    """``datamodule.sampling.nodata`` (``None``: each GeoTIFF's tag)."""
    min_valid: float
    patch_size: int
    splits: dict[str, SplitNodata]

    @classmethod
    def from_facts(
        cls,
        facts: Mapping[str, Sequence[tuple[ImageMaskPair, dict[str, Any]]]],
        setting: float | None,
        min_valid: float,
        patch_size: int,
        windows: Mapping[Path, tuple[int, int]] | None = None,
    ) -> NodataReport:
        """The report of what the pass found (``facts`` per split, ``inspect_pair``'s).

        ``windows``: per training image, its qualifying and candidate windows under
        ``min_valid`` (``None``: not counted).
        """
        splits = {}
        for split, pairs in facts.items():
            read = [(p, f) for p, f in pairs if "pixels" in f.get("nodata", {})]
            per_image = []
            for pair, f in read:
                entry = f["nodata"]
                if entry["pixels"]:
                    per_image.append(
                        ImageNodata(
                            pair.image,
                            float(entry["value"]),
                            str(entry["from"]),
                            int(entry["pixels"]),
                            int(f["pixels"]),
                            (windows or {}).get(pair.image),
                        )
                    )
            known = [w for p, _ in read if (w := (windows or {}).get(p.image)) is not None]
            splits[split] = SplitNodata(
                images=len(read),
                with_value=sum(f["nodata"]["value"] is not None for _, f in read),
                pixels=sum(int(f["pixels"]) for _, f in read),
                nodata_pixels=sum(int(f["nodata"]["pixels"]) for _, f in read),
                windows=((sum(q for q, _ in known), sum(c for _, c in known)) if known else None),
                per_image=tuple(per_image),
            )
        return cls(setting, min_valid, patch_size, splits)

    def _how(self) -> str:
        """Where the no-data values come from, in words."""
        if self.setting is not None:
            return f"{NODATA_KEY}={self.setting:g}, every image's"
        return f"each GeoTIFF's GDAL_NODATA tag; {NODATA_KEY}=null"

    def lines(self) -> list[str]:
        """The report as printable lines: per split its totals, then a row per image."""
        lines = [f"no-data ({self._how()}):"]
        for split, found in self.splits.items():
            words = SPLIT_WORDS.get(split, split)
            if not found.with_value:
                lines.append(f"  {words} images: none of {found.images} has a no-data value")
                continue
            lines.append(
                f"  {words} images: {found.with_value} of {found.images} with a no-data value, "
                f"{len(found.per_image)} holding no-data pixels: {found.nodata_pixels:,} px "
                f"({found.share:.2%} of {found.pixels:,})"
                + ("; left out of the mean, std and value range" if split == "train" else "")
            )
            if found.windows is not None:
                lines.append(f"  {self._windows_line(found.windows)}")
            lines += [f"    {row}" for row in self._rows(found)]
        return lines

    def _windows_line(self, windows: tuple[int, int]) -> str:
        qualifying, candidates = windows
        share = qualifying / max(candidates, 1)
        return (
            f"{WINDOW_WORDS} of {self.patch_size} px with {MIN_VALID_KEY}="
            f"{self.min_valid:g}: {qualifying:,} of {candidates:,} qualify ({share:.1%})"
        )

    def _rows(self, found: SplitNodata) -> list[str]:
        """A table of the images that hold no-data pixels (paths below their common folder)."""
        if not found.per_image:
            return []
        names = _shown_names([image.image for image in found.per_image])
        with_windows = any(image.windows is not None for image in found.per_image)
        header = ["image", "no-data", "from", "pixels", "share"]
        header += [f"windows (min_valid {self.min_valid:g})"] if with_windows else []
        rows = [header]
        for name, image in zip(names, found.per_image, strict=True):
            row = [name, f"{image.value:g}", image.source, f"{image.pixels:,}"]
            row.append(f"{image.share:.2%}")
            if with_windows:
                q, c = image.windows or (0, 0)
                row.append(f"{q:,} of {c:,}" if image.windows is not None else "-")
            rows.append(row)
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        left = {0, 2}  # names and sources to the left, numbers to the right
        return [
            "  ".join(
                cell.ljust(widths[i]) if i in left else cell.rjust(widths[i])
                for i, cell in enumerate(row)
            ).rstrip()
            for row in rows
        ]

    def summary(self) -> dict[str, Any]:
        """Plain values for ``summary.json``'s ``nodata`` entry."""
        return {
            "setting": self.setting,
            "min_valid": self.min_valid,
            "patch_size": self.patch_size,
            "splits": {split: found.record() for split, found in self.splits.items()},
        }


def _windows_record(windows: tuple[int, int] | None) -> dict[str, int] | None:
    if windows is None:
        return None
    return {"qualifying": windows[0], "candidates": windows[1]}


def _shown_names(paths: Sequence[Path]) -> list[str]:
    """The paths below their common folder (their names, where they share one folder)."""
    parents = [str(path.parent) for path in paths]
    try:
        common = os.path.commonpath(parents)
    except ValueError:  # paths on different drives (Windows)
        return [str(path) for path in paths]
    return [os.path.relpath(path, common) for path in paths]
