"""The dataset check against one plain decode of the same files, in one run (issue 46, item 20).

    python experiments/dataset-check/measure.py --work /tmp/dataset-check [--tiles 11]
        [--side 2048] [--repeats 3] [--kinds png tif palette] [--label after] [--out results.json]
    python experiments/dataset-check/measure.py --table experiments/dataset-check/results.json

Writes ``--tiles`` RGB tiles of ``--side``² and their masks of 6 classes (smooth noise,
so that they compress as photographs and class maps do) under ``--work``, once per kind:
``png`` (PNG images and masks), ``tif`` (deflate-compressed, 256×256-tiled GeoTIFFs) and
``palette`` (PNG images, palette PNG masks, each ordering its palette its own way, read
by their colours: the classes are given as colours).
Then, per kind, ``--repeats`` times and alternating in that order:

- ``decode``: every image and mask decoded whole once (Pillow for PNG, rasterio for
  TIFF), one file after another: one plain decode of the files;
- ``check``: ``validate_dataset`` as a run calls it (value ranges, pixel sums, mask
  values), in a fresh cache folder, so every file is read;
- ``check+``: the same with class locations (class-balanced sampling's 256 per class)
  and valid cells (``min_valid=0.5``, a no-data value) on;
- ``check 1 core``: ``check+`` on one thread (``validate_dataset(workers=1)``; the code
  before had no threads, and no such argument): the check's cost on one core.

Each row gives the median seconds, MB/s of decoded pixels (images and masks) and the
ratio to the decode's median of the same run. ``--label`` names the code measured
(``before``, ``after``); the rows are added to ``--out`` under it.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

CLASSES = 6
CLASS_NAMES = [f"class_{c}" for c in range(CLASSES)]
COLOURS = [(60, 16, 152), (132, 41, 246), (110, 193, 228), (254, 221, 58), (226, 169, 41)]
COLOURS += [(155, 155, 155)]
"""The ``palette`` kind's class colours (the Dubai set's five and its "unlabelled")."""
PATCH = 256
MEASURES = ("decode", "check", "check+", "check 1 core")


def smooth(rng: np.random.Generator, side: int, channels: int, scale: int) -> np.ndarray:
    """Noise on a coarse grid, resized to ``side``²: areas of similar values, as in a photo."""
    import cv2

    coarse = rng.integers(0, 256, (side // scale, side // scale, channels), dtype=np.uint8)
    fine = cv2.resize(coarse, (side, side), interpolation=cv2.INTER_CUBIC)
    return fine.reshape(side, side, channels)


def write_dataset(root: Path, kind: str, tiles: int, side: int) -> int:
    """``tiles`` pairs under ``root`` (the last two in ``val``); their decoded bytes."""
    import rasterio
    from PIL import Image
    from rasterio.transform import from_origin

    done = root / "complete"
    total = tiles * side * side * 4
    if done.is_file():
        return total
    for index in range(tiles):
        split = "val" if index >= tiles - 2 else "train"
        rng = np.random.default_rng(index)
        image = smooth(rng, side, 3, 16)
        noise = rng.integers(-6, 7, image.shape)
        image = np.clip(image.astype(np.int16) + noise, 0, 255).astype(np.uint8)
        mask = (smooth(rng, side, 1, 64)[:, :, 0] // 43).astype(np.uint8)
        for sub in ("images", "masks"):
            (root / split / sub).mkdir(parents=True, exist_ok=True)
        name = f"tile{index:03d}.{'tif' if kind == 'tif' else 'png'}"
        if kind == "png":
            Image.fromarray(image).save(root / split / "images" / name)
            Image.fromarray(mask, mode="L").save(root / split / "masks" / name)
            continue
        if kind == "palette":  # entry i: the colour of class order[i], an order per file
            order = rng.permutation(CLASSES)
            picture = Image.fromarray(np.argsort(order).astype(np.uint8)[mask], mode="L")
            picture.putpalette([v for c in order for v in COLOURS[c]])
            Image.fromarray(image).save(root / split / "images" / name)
            picture.save(root / split / "masks" / name)
            continue
        profile = {
            "driver": "GTiff",
            "width": side,
            "height": side,
            "dtype": "uint8",
            "crs": "EPSG:32632",
            "transform": from_origin(500000.0, 5800000.0, 0.5, 0.5),
            "compress": "deflate",
            "tiled": True,
            "blockxsize": 256,
            "blockysize": 256,
        }
        with rasterio.open(root / split / "images" / name, "w", count=3, **profile) as out:
            out.write(np.moveaxis(image, 2, 0))
        with rasterio.open(root / split / "masks" / name, "w", count=1, **profile) as out:
            out.write(mask[None])
    done.write_text("", encoding="utf-8")
    return total


def plain_decode(root: Path) -> None:
    """Every image and mask under ``root`` decoded whole, one after another."""
    import rasterio
    from PIL import Image

    for path in sorted(root.rglob("*.*")):
        if path.suffix == ".png":
            with Image.open(path) as img:
                np.asarray(img)
        elif path.suffix == ".tif":
            with rasterio.open(path) as dataset:
                dataset.read()


def dataset_check(
    root: Path, extras: bool, workers: int | None = None, colours: bool = False
) -> None:
    """``validate_dataset`` as a run calls it, in a fresh cache folder (``workers`` threads).

    ``colours``: the classes are given as colours (``COLOURS``), as palette masks' are.
    """
    from segscale.data.checks.validation import validate_dataset
    from segscale.data.classes.labels import LabelMap
    from segscale.data.datasets.folder import FolderTiles

    with tempfile.TemporaryDirectory(dir="/tmp") as cache:
        os.environ["XDG_CACHE_HOME"] = cache
        validate_dataset(
            FolderTiles(str(root)),
            LabelMap(CLASSES, 255, COLOURS) if colours else LabelMap(CLASSES),
            CLASS_NAMES,
            PATCH,
            3,
            locations_per_class=256 if extras else 0,
            min_valid=0.5 if extras else 0.0,
            nodata=0 if extras else None,
            **({"workers": workers} if workers and takes_workers(validate_dataset) else {}),
        )


def takes_workers(function: Callable[..., object]) -> bool:
    """Whether ``validate_dataset`` reads on threads (the code before did not)."""
    return "workers" in inspect.signature(function).parameters


def timed(action: Callable[[], None]) -> float:
    """Seconds ``action`` takes."""
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def actions_on(root: Path, colours: bool) -> dict[str, Callable[[], None]]:
    """Each measure's action on the dataset at ``root`` (``colours``: colour classes)."""
    return {
        "decode": lambda: plain_decode(root),
        "check": lambda: dataset_check(root, False, colours=colours),
        "check+": lambda: dataset_check(root, True, colours=colours),
        "check 1 core": lambda: dataset_check(root, True, workers=1, colours=colours),
    }


def measure(work: Path, kinds: list[str], tiles: int, side: int, repeats: int) -> dict:
    """Per kind: each measure's seconds over ``repeats`` alternating rounds."""
    import segscale.data.checks.validation  # noqa: F401 (imported before any timing: a run has it)

    results = {}
    for kind in kinds:
        root = work / f"{kind}-{tiles}x{side}"
        decoded = write_dataset(root, kind, tiles, side)
        actions = actions_on(root, kind == "palette")
        plain_decode(root)  # the files in the page cache for every measure alike
        seconds: dict[str, list[float]] = {name: [] for name in MEASURES}
        for _ in range(repeats):
            for name in MEASURES:
                seconds[name].append(round(timed(actions[name]), 3))
                print(kind, name, seconds[name][-1], flush=True)
        results[kind] = {"decoded_bytes": decoded, "seconds": seconds, "load": os.getloadavg()}
    return results


def table(path: Path) -> str:
    """The tables of ``path``: per label and kind, each measure against the decode."""
    stored = json.loads(path.read_text(encoding="utf-8"))
    lines = []
    for label, run in stored.items():
        setup = run["setup"]
        lines += [
            "",
            f"{label}: {setup['tiles']} tiles of {setup['side']}², {setup['cores']} cores, "
            f"load before {setup['load'][0]:.1f}",
            "",
            "| files | measure | seconds (median; all) | MB/s | × decode |",
            "|---|---|---|---|---|",
        ]
        for kind, result in run["kinds"].items():
            base = statistics.median(result["seconds"]["decode"])
            megabytes = result["decoded_bytes"] / 1e6
            for name, values in result["seconds"].items():
                if not values:
                    continue
                middle = statistics.median(values)
                every = ", ".join(f"{v:.2f}" for v in values)
                lines.append(
                    f"| {kind} | {name} | {middle:.2f}; {every} | {megabytes / middle:.0f} "
                    f"| {middle / base:.2f} |"
                )
    return "\n".join(lines)


def main() -> None:
    """Measure (``--out``) or print the tables (``--table``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/dataset-check"))
    parser.add_argument("--tiles", type=int, default=11)
    parser.add_argument("--side", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", nargs="+", default=["png", "tif"])
    parser.add_argument("--label", default="after")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path, help="print the tables of this result file")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return
    load = os.getloadavg()
    kinds = measure(args.work, args.kinds, args.tiles, args.side, args.repeats)
    setup = {"tiles": args.tiles, "side": args.side, "cores": os.cpu_count(), "load": load}
    run = {"setup": setup, "kinds": kinds, "command": " ".join(sys.argv)}
    if args.out:
        stored = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {}
        stored[args.label] = run
        args.out.write_text(json.dumps(stored, indent=1) + "\n", encoding="utf-8")
        print(table(args.out))


if __name__ == "__main__":
    main()
