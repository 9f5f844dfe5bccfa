"""Large images: patch throughput of the folder datamodule, and predict.py's peak memory.

    python experiments/large-images/measure.py [--work DIR] [--skip-predict]

Writes ``results.json`` beside this file and prints two tables:

1. A 4096×4096 RGB tile (an uncompressed TIFF, so memory-mapped; and the same tile as a
   PNG, decoded) cut into 512×512 patches with the default augmentation (rotation
   ±20°, translation ±10 px): patches/s of one worker (``RandomPatchDataset`` in this
   process), next to the crop alone (slicing + tensors) and crop + one affine warp, and
   through a DataLoader with 1 and 2 workers; the resident memory of a worker.
2. ``predict.py`` (the default DeepLabV3+ ResNet-18, CPU) on 2048×8192 and 8192×8192
   images, PNG and TIFF output: wall time and peak resident memory of the process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import tifffile
import torch
from PIL import Image

from segscale.data.augment import Augmentation, PatchPose, cut_patch
from segscale.data.classes.labels import LabelMap
from segscale.data.datasets.folder import FolderTiles
from segscale.data.sampling.patches import RandomPatchDataset
from segscale.data.storage.tiles import open_tiles

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SIZE, PATCH = 4096, 512


def rss_mb() -> float:
    """Resident memory of this process now (MB)."""
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def make_tile(folder: Path, suffix: str) -> None:
    """A 4096² RGB tile of smooth noise and its 6-class mask."""
    rng = np.random.default_rng(0)
    small = rng.integers(0, 256, (SIZE // 16, SIZE // 16, 3), dtype=np.uint8)
    image = np.asarray(Image.fromarray(small).resize((SIZE, SIZE), Image.BILINEAR))
    mask = (image[:, :, 0] // 43).astype(np.uint8)
    for sub, array in (("images", image), ("masks", mask)):
        (folder / "train" / sub).mkdir(parents=True, exist_ok=True)
        path = folder / "train" / sub / f"tile{suffix}"
        if suffix == ".tif":
            tifffile.imwrite(path, array)  # uncompressed, one strip layout: memory-mappable
        else:
            Image.fromarray(array).save(path)


def rate(function, count: int) -> float:
    """Calls of ``function(i)`` per second over ``count`` calls, after 5 warm-up calls."""
    for i in range(5):
        function(i)
    start = time.perf_counter()
    for i in range(count):
        function(i)
    return count / (time.perf_counter() - start)


def patch_throughput(folder: Path, label: str) -> dict:
    """Patches/s of one worker and of DataLoaders, for the tile under ``folder``."""
    before = rss_mb()
    source = FolderTiles(str(folder), splits={"train": "train"})
    tiles = open_tiles(source.pairs("train"), LabelMap(6))  # no decode cache: PNGs in memory
    after = rss_mb()
    dataset = RandomPatchDataset(tiles, PATCH, 256, Augmentation(), seed=0)
    tile = tiles[0]
    rng = np.random.default_rng(1)
    corners = rng.integers(0, SIZE - PATCH, (10_000, 2))

    def crop(i: int) -> None:
        y, x = corners[i]
        torch.from_numpy(np.ascontiguousarray(tile.image[y : y + PATCH, x : x + PATCH]))
        torch.from_numpy(np.ascontiguousarray(tile.mask[y : y + PATCH, x : x + PATCH]))

    def warp(i: int) -> None:
        y, x = corners[i]
        pose = PatchPose(x + PATCH / 2, y + PATCH / 2, 0.0)
        cut_patch(tile.image, tile.mask, pose, PATCH, 255)

    row = {
        "tile": label,
        "decoded_mb": round(after - before, 1),
        "crop_only": rate(crop, 400),
        "crop_plus_warp": rate(warp, 300),
        "augmented_1_process": rate(lambda i: dataset[(0, i)], 300),
    }
    for workers in (1, 2):
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=8, num_workers=workers, persistent_workers=False
        )
        batches = iter(loader)
        next(batches)  # start the workers
        start, count = time.perf_counter(), 0
        for batch in batches:
            count += len(batch["image"])
        row[f"dataloader_{workers}_workers"] = count / (time.perf_counter() - start)
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}


def predict_memory(work: Path, ckpt: Path, height: int, width: int, fmt: str) -> dict:
    """Wall time and peak RSS of ``predict.py`` on one ``height×width`` TIFF image."""
    image_path = work / f"predict_{height}x{width}.tif"
    if not image_path.exists():
        rng = np.random.default_rng(2)
        small = rng.integers(0, 256, (height // 16, width // 16, 3), dtype=np.uint8)
        tifffile.imwrite(image_path, np.asarray(Image.fromarray(small).resize((width, height))))
    command = [
        sys.executable,
        str(REPO / "predict.py"),
        f"ckpt={ckpt}",
        f"input={image_path}",
        f"output_dir={work / f'predicted_{height}_{fmt}'}",
        f"format={fmt}",
        "accelerator=cpu",
        "inference.tile_size=512",
        "inference.batch_size=4",
    ]
    script = (
        "import resource, subprocess, sys, time; t = time.perf_counter(); "
        "subprocess.run(sys.argv[1:], check=True, capture_output=True); "
        "print(time.perf_counter() - t, "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", script, *command], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    seconds, peak_kb = out.stdout.split()
    return {
        "image": f"{height}x{width}",
        "format": fmt,
        "wall_s": round(float(seconds), 1),
        "peak_rss_mb": round(int(peak_kb) / 1024, 1),
    }


def tiny_checkpoint(work: Path) -> Path:
    """Train the default model for a few steps to get a real checkpoint."""
    run = work / "train"
    if not (run / "checkpoints/last.ckpt").exists():
        subprocess.run(
            [
                sys.executable,
                str(REPO / "train.py"),
                f"datamodule.source.root={work / 'synthetic'}",
                "datamodule.source.num_train=1",
                "datamodule.source.num_val=1",
                "datamodule.source.image_size=256",
                "datamodule.patches_per_image=8",
                "trainer.max_epochs=1",
                "trainer.accelerator=cpu",
                f"output_dir={run}",
                f"hydra.run.dir={run}",
            ],
            check=True,
            capture_output=True,
        )
    return run / "checkpoints/last.ckpt"


def table(rows: list[dict]) -> str:
    """Rows of dicts as a Markdown table."""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    """Measure and print both tables; write results.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", type=Path, default=None, help="scratch folder (default: a temp dir)"
    )
    parser.add_argument("--skip-predict", action="store_true")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="large-images-"))
    torch.set_num_threads(1)
    cv2.setNumThreads(1)  # as SegmentationDataModule.setup does: one thread per worker
    results: dict = {"cpu_count": os.cpu_count(), "patch_rows": [], "predict_rows": []}
    for suffix, label in ((".tif", "TIFF, memory-mapped"), (".png", "PNG, decoded")):
        folder = work / f"tile{suffix}"
        make_tile(folder, suffix)
        results["patch_rows"].append(patch_throughput(folder, label))
    print(table(results["patch_rows"]))
    if not args.skip_predict:
        torch.set_num_threads(os.cpu_count() or 1)
        ckpt = tiny_checkpoint(work)
        for height, fmt in ((2048, "tif"), (8192, "tif"), (8192, "png")):
            results["predict_rows"].append(predict_memory(work, ckpt, height, 8192, fmt))
            print(table(results["predict_rows"][-1:]))
        print(table(results["predict_rows"]))
    results["max_rss_mb_this_process"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (HERE / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
