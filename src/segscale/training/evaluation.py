"""The evaluation folder: data-set and per-class metrics and the confusion matrix."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from segscale.atomic_files import write_text_atomically
from segscale.models.metrics import evaluation_report
from segscale.training.plots import plot_confusion_matrix


def write_evaluation(folder: Path, confusion: torch.Tensor, class_names: Sequence[str]) -> None:
    """Write ``evaluation_report`` and the confusion matrix into ``folder``.

    ``metrics.json`` (data-set and per-class metrics), ``class_metrics.csv`` (accuracy,
    IoU, Dice per class), ``confusion_matrix.csv`` (rows: true class, columns:
    predicted) and ``confusion_matrix.png``.
    """
    names = list(class_names)
    folder.mkdir(parents=True, exist_ok=True)
    report = evaluation_report(confusion, names)
    write_text_atomically(folder / "metrics.json", json.dumps(report, indent=2))
    classes = [
        [name, values["Accuracy"], values["IoU"], values["Dice"]]
        for name, values in report["classes"].items()
    ]
    write_csv(folder / "class_metrics.csv", ["class", "Accuracy", "IoU", "Dice"], classes)
    rows = [[name, *row] for name, row in zip(names, confusion.tolist(), strict=True)]
    write_csv(folder / "confusion_matrix.csv", ["true \\ predicted", *names], rows)
    plot_confusion_matrix(confusion.cpu().numpy(), names, folder / "confusion_matrix.png")


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A CSV file of ``header`` and ``rows``, written atomically."""
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(header)
    writer.writerows(rows)
    write_text_atomically(path, text.getvalue())
