"""Datasets larger than memory (issue 37): memory, start-up and patches/s, before and after.

    python experiments/large-data/measure.py --work DIR STEP [STEP ...]
    python experiments/large-data/measure.py --table experiments/large-data/results.json

Steps (each adds its part to ``results.json`` beside this file):

- ``memory``: 2 CPU ranks train one epoch (``datamodule.patches_per_image=2``,
  ``datamodule.batch_size=2``) on 2 and on 8 compressed tiled GeoTIFFs of 4096², with
  the code before this change (``--before``, a worktree of b0f8237: every rank decodes
  every tile) and after it (this tree: read by window); peak PSS and private memory
  summed over the run's processes, sampled every 0.5 s (``runs.py``).
- ``startup``: time to the first step at 2 and at 8 tiles (4×), each after
  a first run that caches the dataset check; before and after.
- ``rates``: patches/s of the training DataLoader at 512² with the default workers,
  the tiles as stored against the same tiles decoded into memory (``bench.py``'s
  ``segscale.bench.measure.storage``): 8 compressed tiled GeoTIFFs, and the same 8 tiles as PNGs
  (read through the decode cache); each measured ``--repeats`` times.
- ``large``: one epoch with 2 ranks on a dataset whose decoded size is ``--ram-factor``
  × this machine's memory: before (stopped once its memory passes ``--cap-gb``) side by
  side with the first run after (whose dataset check reads every pixel), then a second
  run after, alone, with the check cached.

The data, runs and caches stay under ``--work``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from tiles import SIDE, write_dataset  # noqa: E402

from runs import load_average, train  # noqa: E402

RESULTS = HERE / "results.json"
IMAGE_BYTES = SIDE * SIDE * 3  # an RGB image, decoded (its mask adds a third)


def memory_bytes() -> int:
    """The memory of this machine (``MemTotal``), in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def dataset(work: Path, tiles: int, kind: str = "tif") -> Path:
    """The generated dataset of ``tiles`` training tiles (written once)."""
    root = work / f"{kind}-{tiles}"
    write_dataset(root, tiles, kind)
    return root


class Runner:
    """Runs ``train.py`` of either tree into fresh run folders under ``work``."""

    def __init__(self, work: Path, before: Path) -> None:
        self.work, self.trees = work, {"before": before, "after": REPO}
        self.count = 0

    def __call__(
        self, code: str, data: Path, overrides: list[str], cap: int | None = None
    ) -> dict[str, Any]:
        """One run of ``code``'s tree on ``data``: its row (see ``runs.train``)."""
        self.count += 1
        out = self.work / "runs" / f"{time.strftime('%H%M%S')}-{self.count}-{code}-{data.name}"
        row = train(self.trees[code], data, out, overrides, self.work / f"cache-{code}", cap)
        row |= {"code": code, "data": data.name, "load_before": load_average()}
        print(
            json.dumps(
                {
                    k: row[k]
                    for k in (
                        "code",
                        "data",
                        "exit",
                        "wall_s",
                        "peak_pss_gb",
                        "peak_private_gb",
                        "time_to_first_step_s",
                    )
                }
            ),
            flush=True,
        )
        return row


SMALL = ["datamodule.patches_per_image=2", "datamodule.batch_size=2"]


def memory_step(work: Path, run: Runner, codes: list[str]) -> dict[str, Any]:
    """The issue's table: peak memory at 2 and 8 tiles, before and after (2 runs each)."""
    rows = []
    for tiles in (2, 8):
        data = dataset(work, tiles)
        for code in codes:
            for _ in range(2):
                rows.append(run(code, data, SMALL) | {"tiles": tiles})
    return {"rows": rows}


def startup_step(work: Path, run: Runner, repeats: int, codes: list[str]) -> dict[str, Any]:
    """Time to the first step at 1× and 4× the tiles, the dataset check cached."""
    rows = []
    for tiles in (2, 8):
        data = dataset(work, tiles)
        for code in codes:
            run(code, data, SMALL)  # caches the dataset check
            for _ in range(repeats):
                rows.append(run(code, data, SMALL) | {"tiles": tiles})
    return {"rows": rows}


def rates_step(work: Path, repeats: int, seconds: float) -> dict[str, Any]:
    """bench.py's comparison (tiles as stored against in memory) for TIFFs and PNGs at 512².

    The TIFFs are measured a second time with a window's bands interleaved as before the
    fix in ``segscale.data.storage.rasters`` (NumPy's strided ``moveaxis`` copy), in this process
    only: what the ratio was, and what the fix changed.
    """
    from segscale.bench.measure.storage import measure_storage
    from segscale.configs import compose_config
    from segscale.runs.builders import build, build_datamodule

    rows = []
    for kind, variant in (("tif", ""), ("png", ""), ("tif", MOVEAXIS)):
        data = dataset(work, 8, kind)
        overrides = [
            "datamodule=folder",
            f"datamodule.source.root={data}",
            "datamodule.patch_size=512",
            f"datamodule.decode_cache.folder={work / 'decoded'}",
            f"output_dir={work / 'unused'}",
        ]
        cfg = compose_config("train", overrides)
        effective = build(cfg.scaling).resolve(cfg.datamodule.batch_size, cfg.optimizer.lr, 1)
        datamodule = build_datamodule(cfg, effective)
        datamodule.check()
        datamodule.setup("fit")
        workers = datamodule.workers_per_rank()
        with strided_interleave(bool(variant)):
            for repeat in range(repeats):
                load = load_average()
                rates = measure_storage(datamodule, workers, seconds, 2 * 10**9).as_dict()
                rows.append(
                    rates
                    | {"kind": kind, "variant": variant, "repeat": repeat, "load_before": load}
                )
                print(kind, variant, repeat, round(rates["ratio"], 3), flush=True)
    return {"rows": rows, "seconds": seconds}


MOVEAXIS = "bands interleaved by np.moveaxis (before the fix)"


@contextmanager
def strided_interleave(active: bool) -> Iterator[None]:
    """A window's bands interleaved as before the fix: ``np.moveaxis``, a strided copy."""
    from segscale.data.storage import rasters

    fixed = rasters.interleaved

    def strided(bands: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(bands, 0, -1))

    if active:
        rasters.interleaved = strided
    try:
        yield
    finally:
        rasters.interleaved = fixed


def large_step(work: Path, run: Runner, factor: float, cap_gb: float) -> dict[str, Any]:
    """One epoch on a dataset of ``factor`` × this machine's memory, decoded."""
    ram = memory_bytes()
    tiles = math.ceil(factor * ram / IMAGE_BYTES)  # the images alone, masks on top
    started = time.perf_counter()
    root = work / f"tif-{tiles}"
    info = write_dataset(root, tiles)
    generated_s = time.perf_counter() - started
    overrides = ["datamodule.patches_per_image=1"]
    # The first run of each tree spends most of its time in the dataset check (every
    # pixel read); the two run side by side. The measured run of this tree comes after,
    # alone, with the check cached.
    with ThreadPoolExecutor(2) as pool:
        before_run = pool.submit(run, "before", root, overrides, int(cap_gb * 1e9))
        first = run("after", root, overrides)
        before = before_run.result()
    second = run("after", root, overrides)
    return {
        "ram_bytes": ram,
        "tiles": tiles,
        "decoded_bytes": info["decoded_bytes"],
        "decoded_image_bytes": tiles * IMAGE_BYTES,
        "disk_bytes": info["disk_bytes"],
        "generated_s": round(generated_s, 1),
        "cap_gb": cap_gb,
        "runs": [first, second, before],
    }


def kept_rows(results: dict[str, Any], step: str, codes: list[str]) -> dict[str, Any]:
    """A step's earlier rows of the trees not run again, under ``kept``."""
    earlier = results.get(step, {})
    kept = [r for r in earlier.get("rows", []) if r["code"] not in codes]
    return {"kept": kept, "kept_started": earlier.get("started")} if kept else {}


def main() -> None:
    """Run the steps asked for, or print the tables of a results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="*", help="memory, startup, rates, large")
    parser.add_argument("--work", type=Path, default=Path("/tmp/large-data"))
    # The code before issue 37: a worktree beside this checkout (see the README).
    before = Path(__file__).resolve().parents[2].parent / "segscale-before"
    parser.add_argument("--before", type=Path, default=before)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--ram-factor", type=float, default=1.55)
    parser.add_argument("--cap-gb", type=float, default=10.0)
    parser.add_argument(
        "--codes",
        default="before,after",
        help="memory, startup: the trees to run (the other's rows are kept)",
    )
    parser.add_argument("--table", type=Path, help="print the tables of this results file")
    args = parser.parse_args()
    if args.table:
        from tables import print_tables

        print_tables(json.loads(args.table.read_text()))
        return
    unknown = set(args.steps) - {"memory", "startup", "rates", "large"}
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}: expected memory, startup, rates, large")
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results["machine"] = {"cpus": os.cpu_count(), "memory_bytes": memory_bytes()}
    run = Runner(args.work, args.before)
    for step in args.steps:
        started = time.strftime("%Y-%m-%d %H:%M")
        codes = args.codes.split(",")
        if step == "memory":
            part = kept_rows(results, step, codes) | memory_step(args.work, run, codes)
        elif step == "startup":
            part = kept_rows(results, step, codes) | startup_step(
                args.work, run, args.repeats, codes
            )
        elif step == "rates":
            part = rates_step(args.work, args.repeats, args.seconds)
        else:
            part = large_step(args.work, run, args.ram_factor, args.cap_gb)
        results[step] = part | {"started": started, "load_after": load_average()}
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
