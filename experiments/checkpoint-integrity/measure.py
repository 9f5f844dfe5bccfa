"""How long reading a checkpoint takes with and without verifying its digest.

Writes a 100 MB checkpoint (float32 tensors shaped like a network's, plus the plain
entries Lightning adds) with ``save_checkpoint_file``, then reads it ``--repeats`` times
each way, alternating; ``--runs`` such runs, all written into one JSON file (``--out``),
and the README's table printed from it (``--table FILE`` prints it from a stored file).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from segscale.atomic_files import write_text_atomically
from segscale.models.checkpoint.files import (
    content_digest,
    load_checkpoint_file,
    save_checkpoint_file,
)


def checkpoint_of(megabytes: int) -> dict:
    """A checkpoint of about ``megabytes`` MB: 100 tensors, optimizer-like entries."""
    generator = torch.Generator().manual_seed(0)
    per_tensor = megabytes * 1_000_000 // 4 // 100
    weights = {
        f"network.layer{i}.weight": torch.randn(per_tensor, generator=generator) for i in range(100)
    }
    return {
        "epoch": 3,
        "global_step": 1200,
        "state_dict": weights,
        "loops": {"fit_loop": {"epoch_progress": {"total": {"ready": 4, "completed": 3}}}},
        "segscale": {"class_names": [f"class{k}" for k in range(6)], "mean": [0.5] * 3},
    }


READS = {
    "torch.load(weights_only=True)": "`torch.load(weights_only=True)`, no verification",
    "digest alone": "the digest alone (SHA-256 over the loaded content)",
    "verified load": "`load_checkpoint_file`: weights-only read + verification",
}


def measure_once(megabytes: int, repeats: int) -> dict:
    """One run: write the checkpoint once, then read it ``repeats`` times each way."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.ckpt"
        start = time.perf_counter()
        save_checkpoint_file(checkpoint_of(megabytes), path)
        save_s = time.perf_counter() - start
        times: dict[str, list[float]] = {name: [] for name in READS}
        for _ in range(repeats):
            start = time.perf_counter()
            content = torch.load(path, map_location="cpu", weights_only=True)
            times["torch.load(weights_only=True)"].append(time.perf_counter() - start)
            start = time.perf_counter()
            content_digest(content)
            times["digest alone"].append(time.perf_counter() - start)
            start = time.perf_counter()
            load_checkpoint_file(path, "ckpt")
            times["verified load"].append(time.perf_counter() - start)
        size = path.stat().st_size
    return {
        "file_mb": round(size / 1e6, 1),
        "save_with_digest_s": round(save_s, 3),
        **{
            name: {
                "median_ms": round(1000 * statistics.median(values), 1),
                "min_ms": round(1000 * min(values), 1),
                "max_ms": round(1000 * max(values), 1),
            }
            for name, values in times.items()
        },
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def table(results: dict) -> str:
    """The README's table: one column per run, medians (min–max)."""
    runs = results["runs"]
    lines = [
        "| read | " + " | ".join(f"run {k + 1}" for k in range(len(runs))) + " |",
        "|---" * (1 + len(runs)) + "|",
    ]
    for name, label in READS.items():
        cells = [
            f"{run[name]['median_ms']:.0f} ms ({run[name]['min_ms']:.0f}–{run[name]['max_ms']:.0f})"
            for run in runs
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    saves = [f"{run['save_with_digest_s']:.2f} s" for run in runs]
    lines.append(
        "| writing it with its digest (`save_checkpoint_file`, fsync included) | "
        + " | ".join(saves)
        + " |"
    )
    loads = [f"{run['load_average_1min']:.1f}" for run in runs]
    lines.append("| 1-minute load average after the run | " + " | ".join(loads) + " |")
    return "\n".join(lines)


def main() -> None:
    """Measure ``--runs`` times, write every run into ``--out`` and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    parser.add_argument(
        "--table", type=Path, help="print the table of this results file and measure nothing"
    )
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    torch.set_num_threads(1)
    results = {
        "command": " ".join(["python experiments/checkpoint-integrity/measure.py", *sys.argv[1:]]),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "repeats": args.repeats,
        "runs": [measure_once(args.megabytes, args.repeats) for _ in range(args.runs)],
    }
    write_text_atomically(args.out, json.dumps(results, indent=2) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
