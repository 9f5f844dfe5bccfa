"""The class-balance study's tables, in markdown, from its run folders and measure.json.

python experiments/class-balance/tables.py outputs/class-balance > results.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RUNS = ("uniform", "class-balanced")


def load(path: Path) -> Any:
    """A JSON file's content."""
    return json.loads(path.read_text())


def accuracy_tables(out: Path) -> list[str]:
    """Per-class IoU and accuracy (recall) of each run's final network, and the totals."""
    reports = {run: load(out / run / "evaluation" / "metrics.json") for run in RUNS}
    summaries = {run: load(out / run / "summary.json") for run in RUNS}
    classes = list(reports[RUNS[0]]["classes"])
    lines = [
        "| class | "
        + " | ".join(f"IoU {r}" for r in RUNS)
        + " | "
        + " | ".join(f"recall {r}" for r in RUNS)
        + " |",
        "|---" * (1 + 2 * len(RUNS)) + "|",
    ]
    for name in classes:
        iou = [reports[r]["classes"][name]["IoU"] for r in RUNS]
        recall = [reports[r]["classes"][name]["Accuracy"] for r in RUNS]
        lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in iou + recall) + " |")
    lines += [
        "",
        "| run | mIoU | global accuracy | mean accuracy | steps | train time (s) "
        "| patches/s (training) |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in RUNS:
        r, s = reports[run], summaries[run]
        lines.append(
            f"| {run} | {r['MeanIoU']:.3f} | {r['GlobalAccuracy']:.3f} | "
            f"{r['MeanAccuracy']:.3f} | {s['steps']} | {s['train_time_s']:.0f} | "
            f"{s['throughput_patches_per_s']:.1f} |"
        )
    return lines


def rate_tables(measured: dict[str, Any]) -> list[str]:
    """Patches/s of both modes (median, min-max of the repeats) and their ratio."""
    rates = measured["rates_patches_per_s"]
    lines = [
        "| measurement | uniform | class-balanced | class-balanced / uniform |",
        "|---|---|---|---|",
    ]
    for key, label in (
        ("one_core", "one core, in process"),
        ("loader_1_worker", "DataLoader, 1 worker"),
    ):
        cells = [_spread(rates[key][mode]) for mode in ("uniform", "class_balanced")]
        ratio = rates["class_balanced_over_uniform"][key]
        cells.append(_spread(ratio, "{:.3f}"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    validation = measured["validation_pass"]
    lines += [
        "",
        "| validation pass (7 tiles, fresh cache) | uniform | class-balanced |",
        "|---|---|---|",
        "| seconds | "
        + " | ".join(f"{validation[m]['seconds']:.2f}" for m in ("uniform", "class_balanced"))
        + " |",
        "| cache size (bytes) | "
        + " | ".join(str(validation[m]["cache_bytes"]) for m in ("uniform", "class_balanced"))
        + " |",
    ]
    shares = measured["labelled_pixel_shares"]
    names = list(shares["training_tiles"])
    modes = [m for m in shares if m != "training_tiles"]
    lines += [
        "",
        "Epoch 0's 640 training patches: share of labelled pixels / of patches holding the "
        "class / of patches centred on it by the class draw.",
        "",
        "| class | training tiles (pixels) | " + " | ".join(modes) + " |",
        "|---" * (2 + len(modes)) + "|",
    ]
    for name in names:
        cells = [f"{shares['training_tiles'][name]:.2%}"]
        for mode in modes:
            v = shares[mode][name]
            cells.append(
                f"{v['pixels']:.2%} / {v['patches_holding']:.1%} / {v['patches_centred']:.1%}"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _spread(entry: dict[str, Any], form: str = "{:.1f}") -> str:
    return (
        f"{form.format(entry['median'])} ({form.format(entry['min'])}–{form.format(entry['max'])})"
    )


def main() -> None:
    """Print the tables of the study in ``sys.argv[1]``."""
    out = Path(sys.argv[1])
    measured = load(out / "measure.json")
    print(f"Measured {measured['started_at']} on {measured['cpus']} CPU cores.\n")
    print("\n".join(accuracy_tables(out)))
    print()
    print("\n".join(rate_tables(measured)))


if __name__ == "__main__":
    main()
