"""Each new preset's default config run end to end on CPU once, with its patches/s.

    python experiments/presets/measure.py [--only NAME,NAME] OUT.json [-- OVERRIDES...]
    python experiments/presets/measure.py --table RESULTS.json   # the README's table rows

For each preset (``PRESETS``: ``model=segformer``, ``model=upernet``,
``experiment=aerial``), ``python train.py PRESET OVERRIDES`` runs from the repository
root into a fresh folder, timed from the command's start to its exit. ``OUT.json`` gets,
per preset, the command, the wall time and ``summary.json``'s throughput, steady rate,
steps, time split and final validation mIoU; it is rewritten after each run, so a run
cut short keeps the presets measured before it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from segscale.atomic_files import write_text_atomically

REPO = Path(__file__).resolve().parents[2]
PRESETS = {
    "segformer": ["model=segformer"],
    "upernet": ["model=upernet"],
    "aerial": ["experiment=aerial"],
}


def one_run(overrides: list[str], folder: Path) -> dict[str, Any]:
    """One run of ``train.py`` into ``folder``: what the stopwatch and the summary say."""
    command = [sys.executable, "train.py", *overrides, f"hydra.run.dir={folder}"]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    summary = json.loads((folder / "summary.json").read_text())
    return {
        "command": " ".join(["python train.py", *overrides]),
        "wall_s": round(wall, 1),
        "throughput_patches_per_s": summary.get("throughput_patches_per_s"),
        "steady_patches_per_s": summary.get("steady_patches_per_s"),
        "steps": summary.get("steps"),
        "train_patches": summary.get("train_patches"),
        "time_split_s": summary.get("time_split_s"),
        "val_mIoU": (summary.get("metrics") or {}).get("val/mIoU"),
        "load_average_1min_before": round(load, 2),
    }


NETWORKS = {
    "segformer": "SegFormer, mit_b0 (3.7 M parameters)",
    "upernet": "UPerNet, resnet18 (19.5 M parameters)",
    "aerial": "DeepLabV3+, resnet18 (the default)",
}
COMMANDS = {
    "segformer": "model=segformer",
    "upernet": "model=upernet",
    "aerial": "experiment=aerial",
}


def table_rows(results: dict[str, Any]) -> list[str]:
    """The README's table rows, one per preset measured in ``results``."""
    rows = []
    for name, run in results["runs"].items():
        split = run["time_split_s"]
        rows.append(
            f"| `{COMMANDS[name]}` | {NETWORKS[name]} | {run['wall_s']:.1f} s | "
            f"{run['throughput_patches_per_s']:.2f} patches/s | "
            f"{run['steady_patches_per_s']:.2f} patches/s | {split['startup']:.1f} s | "
            f"{split['validation']:.1f} s | {run['val_mIoU']:.3f} |"
        )
    return rows


def main() -> None:
    """Parse the arguments, run each preset, write ``OUT.json`` after each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", default=",".join(PRESETS), help="presets, comma-separated")
    parser.add_argument("overrides", nargs="*", help="train.py overrides (after --)")
    parser.add_argument("--table", action="store_true", help="print OUT.json's table rows")
    args = parser.parse_args()
    if args.table:
        print("\n".join(table_rows(json.loads(args.out.read_text()))))
        return
    results: dict[str, Any] = {"cpus": len(os.sched_getaffinity(0)), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="segscale-presets-") as scratch:
        for name in args.only.split(","):
            run = one_run([*PRESETS[name], *args.overrides], Path(scratch) / name)
            results["runs"][name] = run
            print(f"{name}: {json.dumps(run)}", flush=True)
            write_text_atomically(args.out, json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
