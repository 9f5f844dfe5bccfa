"""Table and plot of the linear-scaling study: ``python plot.py <runs folder> <out folder>``."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

RUNS = {
    "B8": "global batch 8, lr 0.03 (reference)",
    "B32-same-lr": "global batch 32, lr 0.03 (no scaling)",
    "B32-linear-warmup": "global batch 32, lr 0.12 (linear) + 1 epoch warmup",
}


def validation_curve(run: Path) -> list[tuple[int, float, float]]:
    """(epoch, val/loss, val/mIoU) rows of a run's metrics.csv."""
    with open(run / "metrics.csv") as stream:
        rows = [r for r in csv.DictReader(stream) if r.get("val/mIoU")]
    return [(int(r["epoch"]) + 1, float(r["val/loss"]), float(r["val/mIoU"])) for r in rows]


def main(runs: Path, out: Path) -> None:
    """Write results.md and curves.png into ``out``."""
    figure, (loss_axis, miou_axis) = plt.subplots(1, 2, figsize=(11, 4))
    lines = [
        "| run | global batch | learning rate | warmup (epochs) | steps | final val mIoU "
        "| final val loss | wall time (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    per_epoch: list[str] = []
    for name, label in RUNS.items():
        curve = validation_curve(runs / name)
        summary = json.loads((runs / name / "summary.json").read_text())
        epochs, loss, miou = zip(*curve, strict=True)
        loss_axis.plot(epochs, loss, marker="o", label=label)
        miou_axis.plot(epochs, miou, marker="o", label=label)
        lines.append(
            f"| {name} | {summary['global_batch_size']} | {summary['learning_rate']:.3g} "
            f"| {summary['scaling']['warmup_epochs']:g} | {summary['steps']} | {miou[-1]:.3f} "
            f"| {loss[-1]:.3f} | {summary['wall_time_s']:.0f} |"
        )
        if not per_epoch:
            per_epoch = [
                "| run | " + " | ".join(map(str, epochs)) + " |",
                "|---" * (1 + len(epochs)) + "|",
            ]
        per_epoch.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in miou) + " |")
    lines += ["", "Validation mIoU after each epoch:", "", *per_epoch]
    loss_axis.set(title="Validation loss", xlabel="Epoch")
    miou_axis.set(title="Validation mean IoU", xlabel="Epoch")
    for axis in (loss_axis, miou_axis):
        axis.grid(alpha=0.3)
    miou_axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "curves.png", dpi=100)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
