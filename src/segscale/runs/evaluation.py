"""The evaluation folder: data-set and per-class metrics and the confusion matrix."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Protocol

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure

from segscale.atomic_files import write_csv_atomically, write_text_atomically
from segscale.figure_files import save_figure
from segscale.models.metrics import evaluation_report

CONFUSION_UNIT = "% of the true class's pixels"
"""The unit of the confusion matrix's cells, colour bar and title."""


class DrawsFigures(Protocol):
    """What draws a figure in the background (``training.reporting``'s ``BackgroundFigures``)."""

    def draw(self, path: Path, write: Callable[[], None]) -> None:
        """Write the figure at ``path`` by calling ``write``, later."""


def write_evaluation(
    folder: Path,
    confusion: torch.Tensor,
    class_names: Sequence[str],
    title: str = "Confusion matrix",
    figures: DrawsFigures | None = None,
    inference: dict[str, object] | None = None,
    boundary_f1: Sequence[float | None] | None = None,
    mean_boundary_f1: float | None = None,
    bf_tolerance: float | None = None,
    network: dict[str, object] | None = None,
) -> None:
    """Write ``evaluation_report`` and the confusion matrix into ``folder``.

    ``metrics.json`` (data-set and per-class metrics), ``class_metrics.csv`` (accuracy,
    IoU, Dice per class), ``confusion_matrix.csv`` (rows: true class, columns:
    predicted) and ``confusion_matrix.png`` (headed ``title``, in % of each true
    class's pixels), drawn by ``figures`` in the background if given. ``inference``:
    how the predictions were made (tile size, overlap, blend), recorded in
    ``metrics.json`` so that two reports of one checkpoint say why they differ.
    ``boundary_f1`` (per class), ``mean_boundary_f1`` and their ``bf_tolerance``: the BF
    scores, where measured (``evaluation_report``), also a ``MeanBFScore`` column of
    ``class_metrics.csv``.
    ``network``: which weights were scored (``checkpoint``, ``epoch``, ``step``),
    recorded in ``metrics.json`` as ``network``, so that it cannot be mistaken for
    another checkpoint of the run.
    """
    names = list(class_names)
    folder.mkdir(parents=True, exist_ok=True)
    report = evaluation_report(confusion, names, boundary_f1, mean_boundary_f1, bf_tolerance)
    if inference is not None:
        report["inference"] = inference
    if network is not None:
        report["network"] = network
    write_text_atomically(folder / "metrics.json", json.dumps(report, indent=2))
    columns = ["Accuracy", "IoU", "Dice"] + (["MeanBFScore"] if boundary_f1 else [])
    classes = [
        [name, *(values[column] for column in columns)]
        for name, values in report["classes"].items()
    ]
    write_csv_atomically(folder / "class_metrics.csv", ["class", *columns], classes)
    rows = [[name, *row] for name, row in zip(names, confusion.tolist(), strict=True)]
    write_csv_atomically(folder / "confusion_matrix.csv", ["true \\ predicted", *names], rows)
    path = folder / "confusion_matrix.png"
    draw = partial(plot_confusion_matrix, confusion.cpu().numpy(), names, path, title)
    if figures is None:
        draw()
    else:
        figures.draw(path, draw)


def confusion_matrix_figure(
    confusion: np.ndarray, class_names: Sequence[str], title: str = "Confusion matrix"
) -> Figure:
    """A heatmap of the confusion matrix (rows: true class), in % of each row's pixels.

    Cells, colour bar and title share the unit; a class with no true pixels has an
    empty row (its percentages are undefined), and each row names its pixel count.
    """
    counts = confusion.astype(float)
    totals = counts.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        percent = 100 * counts / totals[:, None]  # NaN rows: no pixels of that class
    size = max(5.0, 0.9 * len(class_names) + 2)
    figure = Figure(figsize=(size + 1.5, size))
    axis = figure.subplots()
    cmap = matplotlib.colormaps["Blues"].with_extremes(bad="0.9")  # grey: no pixels
    image = axis.imshow(np.ma.masked_invalid(percent), cmap=cmap, vmin=0, vmax=100)
    for (i, j), value in np.ndenumerate(percent):
        text = "–" if np.isnan(value) else f"{value:.1f}"
        colour = "white" if value > 60 else "black"
        axis.text(j, i, text, ha="center", va="center", color=colour, fontsize=8)
    ticks = range(len(class_names))
    axis.set_xticks(ticks, class_names, rotation=45, ha="right")
    rows = [f"{name} ({_pixels(total)})" for name, total in zip(class_names, totals, strict=True)]
    axis.set_yticks(ticks, rows)
    axis.set_xlabel("Predicted class")
    axis.set_ylabel("True class (its pixels)")
    axis.set_title(f"{title}\n(each row: {CONFUSION_UNIT})")
    bar = figure.colorbar(image, ax=axis, fraction=0.046)
    bar.set_label(CONFUSION_UNIT)
    return figure


def _pixels(count: float) -> str:
    """A pixel count in few characters: ``"812 px"``, ``"12.3k px"``, ``"4.1M px"``."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if count >= scale:
            return f"{count / scale:.1f}{suffix} px"
    return f"{count:.0f} px"


def plot_confusion_matrix(
    confusion: np.ndarray,
    class_names: Sequence[str],
    path: Path,
    title: str = "Confusion matrix",
) -> None:
    """Write ``confusion_matrix_figure`` to ``path``."""
    save_figure(confusion_matrix_figure(confusion, class_names, title), path)
