"""Training throughput of the default run by ``training.threads``, alone and beside a busy core.

    python experiments/threads/measure.py OUT.json [--threads 1 2 auto] [--repeats N] [--steps S]

Each run is ``python train.py`` (the default config: DeepLabV3+ on the embedded
synthetic tiles, batch 8 of 128 px patches, ``num_workers: auto``) cut to ``S``
training steps, without validation, callbacks or loggers, with one
``training.threads`` setting. Its throughput is ``summary.json``'s
``throughput_patches_per_s`` (training patches over the time of the training loop,
so start-up is not counted); for ``auto`` the threads it chose (the run's log line) are
recorded too. The settings alternate, ``N`` times each, first on the
machine as it is ("alone"), then with one extra process spinning on one core
("beside a busy core": another user's job on a shared machine). The machine's load
average is recorded before each run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from segscale.atomic_files import write_text_atomically

REPO = Path(__file__).resolve().parents[2]


def spin() -> None:
    """Keep one core busy until terminated."""
    while True:
        pass


def throughput(threads: str, steps: int, folder: Path) -> tuple[float, int]:
    """Training patches/s of one default run cut to ``steps`` steps, and its threads."""
    command = [
        sys.executable,
        str(REPO / "train.py"),
        f"training.threads={threads}",
        f"trainer.max_steps={steps}",
        "trainer.limit_val_batches=0",
        "callbacks=none",
        "logger=none",
        f"hydra.run.dir={folder}",
    ]
    done = subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True)
    chosen = re.search(r"threads: (\d+) per training process", done.stdout + done.stderr)
    if chosen is None:
        raise RuntimeError(f"no 'threads:' line in the log of {' '.join(command)}")
    summary = json.loads((folder / "summary.json").read_text())
    return float(summary["throughput_patches_per_s"]), int(chosen.group(1))


def measure(settings: list[str], repeats: int, steps: int, busy: bool) -> dict[str, Any]:
    """Each setting ``repeats`` times, alternating; with one spinning process if ``busy``."""
    spinner = multiprocessing.Process(target=spin, daemon=True) if busy else None
    if spinner:
        spinner.start()
    runs: dict[str, list[float]] = {s: [] for s in settings}
    chosen: dict[str, list[int]] = {s: [] for s in settings}
    loads: list[float] = []
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for repeat in range(repeats):
                for setting in settings:
                    loads.append(os.getloadavg()[0])
                    folder = Path(scratch) / f"{setting}-{repeat}"
                    rate, threads = throughput(setting, steps, folder)
                    runs[setting].append(rate)
                    chosen[setting].append(threads)
                    print(f"busy={busy} threads={setting} ({threads}) run {repeat}: {rate:.1f}")
    finally:
        if spinner:
            spinner.terminate()
    return {
        "patches_per_s": runs,
        "median": {s: statistics.median(v) for s, v in runs.items()},
        "threads_chosen": chosen,
        "load_average_1min": loads,
    }


def main() -> None:
    """Parse the arguments, measure, write ``OUT.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--threads", nargs="+", default=["1", "2", "auto"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    results = {
        "command": " ".join(sys.argv),
        "cpus": len(os.sched_getaffinity(0)),
        "steps": args.steps,
        "alone": measure(args.threads, args.repeats, args.steps, busy=False),
        "beside_a_busy_core": measure(args.threads, args.repeats, args.steps, busy=True),
    }
    write_text_atomically(args.out, json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
