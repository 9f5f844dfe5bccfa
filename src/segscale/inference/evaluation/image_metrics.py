"""Per-image metrics of an evaluation (MATLAB's ``ImageMetrics``) and the BF scores they give.

Each image of a split gets one ``ImageScores``: its confusion matrix and, where
``bf_tolerance`` is set, its boundary F1 score per class. They are what a rank hands
back; the data set's numbers come from all of them at once (counts summed, BF scores
averaged over the images), so that several processes give what one does.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from segscale.atomic_files import write_csv_atomically
from segscale.models.metrics import evaluation_report

IMAGE_METRICS_FILE = "image_metrics.csv"
"""The per-image table, in the evaluation folder beside ``metrics.json``."""

IMAGE_COLUMNS = ("GlobalAccuracy", "MeanAccuracy", "MeanIoU", "WeightedIoU", "MeanBFScore")
"""MATLAB's ``ImageMetrics`` columns, in its order."""


class ImageScores(NamedTuple):
    """One image's counts: its place in the split, confusion matrix, BF score per class."""

    place: int  # its index in the split's list of images
    confusion: np.ndarray
    boundary_f1: np.ndarray | None  # None: not measured (bf_tolerance null or 0)


def mean_or_none(values: np.ndarray) -> float | None:
    """The mean of the values that are not NaN, rounded as the report rounds; None if none."""
    finite = values[~np.isnan(values)]
    return round(float(finite.mean()), 6) if finite.size else None


def class_boundary_f1(images: Sequence[ImageScores]) -> list[float | None] | None:
    """Each class's BF score averaged over the images that have the class (MATLAB's)."""
    scores = [image.boundary_f1 for image in images if image.boundary_f1 is not None]
    if not scores or len(scores) < len(images):
        return None
    table = np.stack(scores)
    return [mean_or_none(table[:, c]) for c in range(table.shape[1])]


def data_set_boundary_f1(images: Sequence[ImageScores]) -> float | None:
    """The data set's ``MeanBFScore``: the mean of the images' mean BF scores."""
    means = [mean_or_none(image.boundary_f1) for image in images if image.boundary_f1 is not None]
    return mean_or_none(np.array([m for m in means if m is not None], dtype=float))


def image_names(images: Sequence[Path]) -> list[str]:
    """The name of each image in ``image_metrics.csv``: its file name, unless names repeat.

    Where they do (tile folders that each hold ``image_part_001.jpg``), each image is named
    by its path under the images' common folder, with ``/`` on every platform
    (``Tile 3/images/image_part_001.jpg``).
    """
    names = [image.name for image in images]
    if len(set(names)) == len(names):
        return names
    common = Path(os.path.commonpath([image.parent for image in images]))
    return [image.relative_to(common).as_posix() for image in images]


def image_row(image: ImageScores, name: str, class_names: Sequence[str]) -> list[object]:
    """The image's name and MATLAB's ``ImageMetrics`` of it (empty: not defined)."""
    report = evaluation_report(torch.from_numpy(image.confusion), class_names)
    bf = None if image.boundary_f1 is None else mean_or_none(image.boundary_f1)
    values = [report[column] for column in IMAGE_COLUMNS[:-1]] + [bf]
    return [name, *("" if value is None else value for value in values)]


def write_image_metrics(
    folder: Path, images: Sequence[ImageScores], names: Sequence[str], class_names: Sequence[str]
) -> Path:
    """``image_metrics.csv``: one row per image, in the split's order, written atomically.

    ``names`` are the split's images' names (``image_names``), by place in the split.
    """
    ordered = sorted(images, key=_place)
    rows = [image_row(image, names[image.place], class_names) for image in ordered]
    return write_csv_atomically(folder / IMAGE_METRICS_FILE, ["image", *IMAGE_COLUMNS], rows)


def _place(image: ImageScores) -> int:
    return image.place


def read_image_metrics(folder: Path) -> list[dict[str, object]]:
    """``image_metrics.csv`` of ``folder`` as one dict per image (None: not defined)."""
    with (folder / IMAGE_METRICS_FILE).open(newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    return [
        {"image": row["image"]}
        | {column: float(row[column]) if row[column] else None for column in IMAGE_COLUMNS}
        for row in rows
    ]
