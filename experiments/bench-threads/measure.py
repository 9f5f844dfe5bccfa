"""bench's one-device patches/s against a ``python train.py`` run's, on the default config.

    python experiments/bench-threads/measure.py RESULTS.json [--repo PATH] [--repeats 2]

``--repo``: the checkout whose ``bench.py`` and ``train.py`` run (default: this one), so
that the code before a change can be measured beside the code after it. Each repeat runs
one short ``bench.py`` (settings in ``BENCH``) and one ``train.py`` cut to ``--steps``
steps without validation, callbacks or loggers, and appends to ``RESULTS.json``: bench's
``step, Lightning`` patches/s (batch / mean step), the threads and workers it timed
with, the run's ``summary.json`` ``throughput_patches_per_s`` and the threads its
``threads:`` log line names.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]

BENCH = [
    "bench.seconds=0.5",
    "bench.workers=[1]",
    "bench.warmup_steps=3",
    "bench.window_steps=8",
    "bench.windows=2",
    "bench.options=[]",
    "bench.overhead_steps=20",
    "bench.overhead_rounds=1",
]
"""Short bench settings; ``bench.devices`` stays the default (1 and 2 on two cores)."""


def run(repo: Path, script: str, args: list[str], scratch: Path) -> str:
    """Run ``repo/script`` with ``args`` from ``scratch``; its output."""
    env = os.environ | {"PYTHONPATH": str(repo / "src"), "SEGSCALE_DATA_DIR": str(scratch)}
    done = subprocess.run(
        [sys.executable, str(repo / script), *args],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
    )
    output = done.stdout + done.stderr
    if done.returncode not in (0, 3):  # 3: a measurement failed, the rest written
        raise RuntimeError(f"{script} exit {done.returncode}:\n{output[-3000:]}")
    return output


def bench_point(repo: Path, scratch: Path, index: int) -> dict:
    """One bench run: its one-device step's patches/s and what it was timed with."""
    folder = scratch / f"bench-{index}"
    start = time.perf_counter()
    run(repo, "bench.py", [*BENCH, f"hydra.run.dir={folder}"], scratch)
    wall = time.perf_counter() - start
    compute = json.loads((folder / "bench.json").read_text(encoding="utf-8"))["compute"]
    return {
        "patches_per_s": compute["batch"] / compute["lightning"]["mean_s"],
        "threads": compute["threads"],
        "loader_workers": compute.get("loader_workers"),
        "wall_s": wall,
    }


def train_point(repo: Path, scratch: Path, index: int, steps: int) -> dict:
    """One short train.py run: its steady patches/s and its threads."""
    folder = scratch / f"train-{index}"
    args = [
        f"trainer.max_steps={steps}",
        "trainer.limit_val_batches=0",
        "callbacks=none",
        "logger=none",
        f"hydra.run.dir={folder}",
    ]
    output = run(repo, "train.py", args, scratch)
    chosen = re.search(r"threads: (\d+) per training process", output)
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    return {
        "patches_per_s": float(summary["throughput_patches_per_s"]),
        "threads": int(chosen.group(1)) if chosen else None,
    }


def table(results: list[dict]) -> str:
    """The README's table: one row per repeat."""
    lines = [
        "| code | repeat | load before | bench: threads, workers | bench one-device patches/s "
        "| bench wall | train.py threads | train.py patches/s | bench / train.py |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        bench, train = row["bench"], row["train"]
        workers = "not said" if bench["loader_workers"] is None else bench["loader_workers"]
        lines.append(
            f"| {row['label']} | {row['repeat'] + 1} | {row['load']:.1f} "
            f"| {bench['threads']}, {workers} | {bench['patches_per_s']:.2f} "
            f"| {bench['wall_s'] / 60:.1f} min | {train['threads']} "
            f"| {train['patches_per_s']:.2f} | {row['ratio']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Measure, appending each repeat to the results file (``--table``: print it instead)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", type=Path)
    parser.add_argument("--table", action="store_true", help="print the table, measure nothing")
    parser.add_argument("--repo", type=Path, default=HERE)
    parser.add_argument("--label", default="after")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    results = json.loads(args.results.read_text(encoding="utf-8")) if args.results.exists() else []
    if args.table:
        print(table(results))
        return
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        for index in range(args.repeats):
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            bench = bench_point(args.repo, scratch, index)
            train = train_point(args.repo, scratch, index, args.steps)
            row = {"label": args.label, "repeat": index, "load": load, "bench": bench}
            row |= {"train": train, "ratio": bench["patches_per_s"] / train["patches_per_s"]}
            results.append(row)
            print(json.dumps(row), flush=True)
            args.results.write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
