"""Wall time, throughput and validation mIoU of the default run, as a fresh clone runs it.

    python experiments/default-run/measure.py OUT.json [--repeats 3] [-- OVERRIDES...]

Each repeat is ``python train.py`` (plus any overrides after ``--``) from the repository
root in a fresh output folder, timed from the command's start to its exit, as a user's
stopwatch would. ``OUT.json`` gets every run's wall time, ``summary.json``'s training
throughput and time split, its last validation mIoU and the threads the run chose, and
the median and spread (max − min) of the wall times: the timing's own run-to-run spread,
which ``check.py`` allows between the README and a new measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from segscale.atomic_files import write_text_atomically

REPO = Path(__file__).resolve().parents[2]


def one_run(overrides: list[str], folder: Path) -> dict[str, Any]:
    """One run of ``train.py`` into ``folder``: what the stopwatch and the summary say."""
    command = [sys.executable, "train.py", *overrides, f"hydra.run.dir={folder}"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    summary = json.loads((folder / "summary.json").read_text())
    chosen = re.search(r"threads: (\d+) per training process", done.stdout + done.stderr)
    return {
        "wall_s": round(wall, 1),
        "throughput_patches_per_s": summary.get("throughput_patches_per_s"),
        "steady_patches_per_s": summary.get("steady_patches_per_s"),
        "time_split_s": summary.get("time_split_s"),
        "val_mIoU": (summary.get("metrics") or {}).get("val/mIoU"),
        "threads": int(chosen.group(1)) if chosen else None,
        "load_average_1min_before": None,
    }


def measure(overrides: list[str], repeats: int) -> dict[str, Any]:
    """``repeats`` runs, one after the other, and their medians and spread."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="segscale-default-run-") as scratch:
        for repeat in range(repeats):
            load = os.getloadavg()[0]
            run = one_run(overrides, Path(scratch) / str(repeat))
            run["load_average_1min_before"] = round(load, 2)
            runs.append(run)
            print(f"run {repeat}: {json.dumps(run)}", flush=True)
    walls = [r["wall_s"] for r in runs]
    return {
        "command": " ".join(["python train.py", *overrides]),
        "cpus": len(os.sched_getaffinity(0)),
        "runs": runs,
        "wall_s_median": statistics.median(walls),
        "wall_s_spread": round(max(walls) - min(walls), 1),
    }


def main() -> None:
    """Parse the arguments, measure, write ``OUT.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="train.py overrides (after --)")
    args = parser.parse_args()
    results = measure(args.overrides, args.repeats)
    write_text_atomically(args.out, json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
