"""The default run with several seeds: how far apart its final val mIoU lands.

    python experiments/seed-spread/measure.py OUT_DIR [--seeds 42 43 44] [overrides ...]

Runs ``python train.py seed=S [overrides]`` once per seed, each into
``OUT_DIR/seed-S``, then writes ``OUT_DIR/results.json``: per seed the val mIoU of
every epoch (from ``metrics.csv``), the final one (``summary.json``), wall time and
throughput; and over the seeds the mean, the sample standard deviation and the range
of the final val mIoU. The seed sets the network's initialization and the patches
drawn (where, rotation, translation); the embedded dataset is the same in every run
(``datamodule.source.seed``).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from segscale.atomic_files import write_text_atomically

REPO = Path(__file__).resolve().parents[2]


def run(seed: int, folder: Path, overrides: list[str]) -> dict[str, Any]:
    """Train with ``seed`` into ``folder``; its per-epoch and final val mIoU."""
    command = [sys.executable, str(REPO / "train.py"), f"seed={seed}", *overrides]
    subprocess.run([*command, f"hydra.run.dir={folder}"], cwd=REPO, check=True, capture_output=True)
    summary = json.loads((folder / "summary.json").read_text())
    with (folder / "metrics.csv").open() as rows:
        epochs = [float(r["val/mIoU"]) for r in csv.DictReader(rows) if r.get("val/mIoU")]
    return {
        "seed": seed,
        "val_mIoU_by_epoch": epochs,
        "final_val_mIoU": summary["metrics"]["val/mIoU"],
        "wall_time_s": summary["wall_time_s"],
        "throughput_patches_per_s": summary["throughput_patches_per_s"],
    }


def main() -> None:
    """Run every seed, then write the spread."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        runs.append(run(seed, args.out / f"seed-{seed}", args.overrides))
        print(json.dumps(runs[-1]))
    finals = [r["final_val_mIoU"] for r in runs]
    results = {
        "command": " ".join(sys.argv),
        "runs": runs,
        "final_val_mIoU": {
            "mean": statistics.mean(finals),
            "stdev": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "min": min(finals),
            "max": max(finals),
        },
    }
    write_text_atomically(args.out / "results.json", json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
