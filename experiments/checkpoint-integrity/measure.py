"""How long reading a checkpoint takes with and without verifying its digest.

Writes a 100 MB checkpoint (float32 tensors shaped like a network's, plus the plain
entries Lightning adds) with ``save_checkpoint_file``, then reads it ``--repeats`` times
each way, alternating, and prints the medians and spreads (and writes them as JSON).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from segscale.models.checkpoint_io import (
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


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.ckpt"
        start = time.perf_counter()
        save_checkpoint_file(checkpoint_of(args.megabytes), path)
        save_s = time.perf_counter() - start
        times: dict[str, list[float]] = {
            "torch.load(weights_only=True)": [],
            "digest alone": [],
            "verified load": [],
        }
        for _ in range(args.repeats):
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
    results = {
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
    }
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
