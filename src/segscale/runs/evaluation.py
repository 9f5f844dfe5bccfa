"""The evaluation folder: data-set and per-class metrics and the confusion matrix."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch

from segscale.atomic_files import write_csv_atomically, write_text_atomically
from segscale.models.metrics import evaluation_report
from segscale.training.reporting.background_figures import BackgroundFigures
from segscale.training.reporting.plots import plot_confusion_matrix


def write_evaluation(
    folder: Path,
    confusion: torch.Tensor,
    class_names: Sequence[str],
    title: str = "Confusion matrix",
    figures: BackgroundFigures | None = None,
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
