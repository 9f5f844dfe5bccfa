"""The table and figure that compare the jobs of one sweep (``-m``).

Each job folder of a sweep holds its overrides (``.hydra/overrides.yaml``), its
``summary.json`` when it finished, and its ``metrics.csv``. ``write_sweep_summary``
reads them back into ``sweep_summary.csv``, ``sweep_summary.md`` and
``sweep_curves.png`` in the sweep folder. It runs at the end of every multirun and as
``python -m segscale.cli.summarize <sweep folder>``. What a sweeper optimizes is one
number of a finished job's summary (``objective``).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig

from segscale.atomic_files import write_csv_atomically, write_text_atomically
from segscale.figure_files import plt, save_figure
from segscale.runs.folder import read_summary

BOOKKEEPING = ("search_trial.",)
"""Overrides a sweeper gives its jobs for its own use, left out of the table."""

COLUMNS = (
    "job",
    "overrides",
    "status",
    "val/mIoU",
    "val/loss",
    "val/acc",
    "best_epoch",
    "best_val/mIoU",
    "epochs",
    "wall_time_s",
    "throughput_patches_per_s",
    "started_at",
    "finished_at",
)


@dataclass
class JobRecord:
    """What one job of a sweep left in its folder."""

    number: int
    folder: Path
    overrides: list[str]
    summary: dict[str, Any] | None
    curve: list[tuple[int, float, float]] = field(default_factory=list)
    """``(epoch, val/loss, val/mIoU)`` after each validation."""

    @property
    def status(self) -> str:
        """How the job ended: ``completed``, ``pruned`` (by a search), ``preempted``, ``failed``.

        A job without a summary failed before training; a summary says how it ended.
        """
        if self.summary is None:
            return "failed"
        status = str(self.summary.get("status") or "finished")
        return "completed" if status == "finished" else status

    def row(self, common: Sequence[str] = ()) -> dict[str, Any]:
        """One row of the sweep table; ``common`` overrides (shared by all jobs) left out."""
        summary = self.summary or {}
        metrics = summary.get("metrics", {})
        best = max(self.curve, key=lambda point: point[2], default=None)
        return {
            "job": self.number,
            "overrides": " ".join(o for o in self.overrides if o not in common),
            "status": self.status,
            "val/mIoU": metrics.get("val/mIoU"),
            "val/loss": metrics.get("val/loss"),
            "val/acc": metrics.get("val/acc"),
            "best_epoch": best[0] if best else None,
            "best_val/mIoU": best[2] if best else None,
            "epochs": summary.get("epochs"),
            "wall_time_s": summary.get("wall_time_s"),
            "throughput_patches_per_s": summary.get("throughput_patches_per_s"),
            "started_at": summary.get("started_at"),
            "finished_at": summary.get("finished_at"),
        }


def read_job(folder: Path) -> JobRecord:
    """The record of the job in ``folder`` (a numbered subfolder of a sweep)."""
    overrides_file = folder / ".hydra" / "overrides.yaml"
    recorded = overrides_file.read_text(encoding="utf-8") if overrides_file.is_file() else ""
    overrides = yaml.safe_load(recorded)
    summary = read_summary(folder)
    # search_trial.* only tell a search's job where to report; they are not its settings.
    own = [o for o in overrides or [] if not str(o).startswith(BOOKKEEPING)]
    return JobRecord(int(folder.name), folder, own, summary, read_curve(folder))


def read_curve(folder: Path) -> list[tuple[int, float, float]]:
    """``(epoch, val/loss, val/mIoU)`` rows of the job's ``metrics.csv``."""
    path = folder / "metrics.csv"
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as file:
        return [
            (int(row["epoch"]), float(row["val/loss"]), float(row["val/mIoU"]))
            for row in csv.DictReader(file)
            if row.get("val/mIoU") and row.get("epoch")
        ]


def read_sweep(sweep_dir: str | Path) -> list[JobRecord]:
    """Every job of the sweep in ``sweep_dir``, by job number."""
    folders = [p for p in Path(sweep_dir).iterdir() if p.is_dir() and p.name.isdigit()]
    return [read_job(p) for p in sorted(folders, key=lambda p: int(p.name))]


def write_sweep_summary(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """Write the sweep's table (CSV, Markdown) and curves (PNG); return the table's rows."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep folder {sweep_dir} does not exist")
    jobs = read_sweep(sweep_dir)
    common = shared_overrides(jobs)
    rows = [job.row(common) for job in jobs]
    table = [[row.get(column, "") for column in COLUMNS] for row in rows]
    write_csv_atomically(sweep_dir / "sweep_summary.csv", COLUMNS, table)
    shared = f"Overrides of every job: `{' '.join(common)}`\n\n" if common else ""
    write_text_atomically(sweep_dir / "sweep_summary.md", shared + markdown_table(rows))
    plot_sweep_curves(jobs, common, sweep_dir / "sweep_curves.png")
    return rows


def shared_overrides(jobs: Sequence[JobRecord]) -> list[str]:
    """The overrides that every job has (when there are two jobs or more)."""
    if len(jobs) < 2:
        return []
    return [o for o in jobs[0].overrides if all(o in job.overrides for job in jobs[1:])]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (numbers to 4 significant digits)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = [_cell(row[column]) for column in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_sweep_curves(jobs: list[JobRecord], common: Sequence[str], path: Path) -> None:
    """Validation mIoU and loss per epoch, one line per job (named by what differs)."""
    figure, (miou_axis, loss_axis) = plt.subplots(1, 2, figsize=(12, 4.5))
    for job in jobs:
        if not job.curve:
            continue
        epochs, losses, mious = zip(*job.curve, strict=True)
        own = [o for o in job.overrides if o not in common]
        label = f"{job.number}: {' '.join(own) or '(defaults)'}"[:60]
        if job.status != "completed":
            label += f" ({job.status})"
        miou_axis.plot(epochs, mious, marker="o", label=label)
        loss_axis.plot(epochs, losses, marker="o", label=label)
    miou_axis.set(xlabel="epoch", ylabel="validation mIoU", title="validation mIoU")
    loss_axis.set(xlabel="epoch", ylabel="validation loss", title="validation loss")
    for axis in (miou_axis, loss_axis):
        axis.grid(alpha=0.3)
    if any(job.curve for job in jobs):
        miou_axis.legend(fontsize=7)
    save_figure(figure, path)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value).replace("|", "\\|")


def optimized_metric(cfg: DictConfig) -> str:
    """The metric a sweeper optimizes: ``optimized_metric``, by default ``val/mIoU``."""
    return str(cfg.get("optimized_metric") or "val/mIoU")


def objective(cfg: DictConfig, summary: dict[str, Any]) -> float | None:
    """The value a sweeper optimizes: the final ``optimized_metric`` of the run."""
    return summary.get("metrics", {}).get(optimized_metric(cfg))
