r"""Test-time augmentation on CamVid: evaluate.py's mIoU and wall time for each setting.

    python experiments/tta/measure.py --ckpt RUN/checkpoints/best.ckpt \\
        --root /tmp/camvid/CamVid --work /tmp/tta-eval [--images 101] [--threads 2]
    python experiments/tta/measure.py --table experiments/tta/results.json

Runs ``evaluate.py`` once per setting of ``SETTINGS`` on CamVid's val split (its first
``--images`` lines of val.txt, written as a list file under ``--work``), with the
checkpoint's own inference (``inference=validation``: its patch grid), and adds each run's
mIoU, pixel accuracy, wall time and exit status to ``experiments/tta/results.json``.
``--table`` prints the README's table from that file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RESULTS = HERE / "results.json"

SETTINGS: dict[str, list[str]] = {
    "none": ["inference.tta=none"],
    "flip": ["inference.tta=flip"],
    "hflip": ["inference.tta=hflip"],
    "d4": ["inference.tta=d4"],
    "scales": ["inference.tta=none", "inference.tta_scales=[0.75,1,1.25]"],
    "d4+scales": ["inference.tta=d4", "inference.tta_scales=[0.75,1,1.25]"],
}
"""Setting name → the overrides of evaluate.py that make it."""


def val_list(root: Path, work: Path, images: int) -> Path:
    """A list file of the first ``images`` lines of CamVid's val.txt (pairs as listed)."""
    lines = (root / "val.txt").read_text().splitlines()[:images]
    path = work / f"val_first{images}.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def evaluate(ckpt: Path, root: Path, listed: Path, out: Path, extra: list[str], threads: int):
    """Run evaluate.py with ``extra`` overrides; its metrics, wall time and exit status."""
    command = [
        sys.executable,
        str(REPO / "evaluate.py"),
        f"ckpt={ckpt}",
        "datamodule=folder",
        f"datamodule.source.root={root}",
        f"datamodule.source.splits.val={{list:{listed}}}",
        "datamodule/classes=auto",
        "datamodule.ignore_ids=[11]",
        "split=val",
        "other_data=true",  # the checkpoint's val split, cut to the first --images lines
        "accelerator=cpu",
        f"hydra.run.dir={out}",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO / "src")}
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    metrics = json.loads((out / "metrics.json").read_text()) if done.returncode == 0 else {}
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
    return {
        "overrides": extra,
        "returncode": done.returncode,
        "wall_s": round(seconds, 1),
        "mIoU": metrics.get("MeanIoU"),
        "pixel_accuracy": metrics.get("GlobalAccuracy"),
        "inference": metrics.get("inference"),
        "load_before": os.getloadavg()[0],
    }


def table(results: dict) -> str:
    """The README's table: one row per setting, time relative to ``none``."""
    runs = results["runs"]
    base = runs["none"]["wall_s"]
    rows = [
        "| tta | tta_scales | mIoU | pixel accuracy | wall time (s) | × none |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs.values():
        scales = run["inference"]["tta_scales"]
        # A run measured at another time (its "note" says when) has no ratio to none's.
        ratio = "not comparable" if run.get("note") else f"{run['wall_s'] / base:.1f}"
        rows.append(
            f"| {run['inference']['tta']} | {scales} | {run['mIoU']:.4f} | "
            f"{run['pixel_accuracy']:.4f} | {run['wall_s']:.1f} | {ratio} |"
        )
    return "\n".join(rows)


def main() -> None:
    """Measure (or print the table of) every setting; see the module's docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckpt", type=Path)
    parser.add_argument("--root", type=Path, help="the CamVid folder (val/, valannot/, val.txt)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tta-eval"))
    parser.add_argument("--images", type=int, default=101, help="first N of val.txt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS))
    parser.add_argument("--table", type=Path, help="print the table of this results file")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    listed = val_list(args.root, args.work, args.images)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": {}}
    results.update(images=args.images, split="val", threads=args.threads, cpus=os.cpu_count())
    for name in args.settings:
        run = evaluate(args.ckpt, args.root, listed, args.work / name, SETTINGS[name], args.threads)
        results["runs"][name] = run
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        print(name, run["mIoU"], run["wall_s"], "s", flush=True)


if __name__ == "__main__":
    main()
