"""Class-balanced sampling: what it costs in patches/s and what it changes in the patches.

    python experiments/class-balance/measure.py OUT.json [--seconds S] [--repeats N]

On the default synthetic dataset and config, two datamodules side by side in this
process: ``datamodule.sampling.mode=uniform`` (the default) and ``class_balanced``
(``p=0.5``, ``class_weights=present``). Measured, alternating between the two, ``N``
times each:

1. one core's patches/s (``RandomPatchDataset`` called in this process: the patch's
   draw, warp and tensors, no DataLoader);
2. the training DataLoader's patches/s with 1 worker (``bench.pipeline.loader_rate``).

Once: the validation pass over the 7 tiles with and without class locations (a fresh
cache each), the cache's size, and the share of labelled pixels of each class in the
1280 training patches of epoch 0 under each mode.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from segscale.atomic_files import write_text_atomically
from segscale.bench.measure.pipeline import calls_per_second, loader_rate
from segscale.configs import compose_config
from segscale.data.datamodule import SegmentationDataModule
from segscale.runs.builders import build

MODES = {
    "uniform": [],
    "class_balanced": ["datamodule.sampling.mode=class_balanced"],
}
STRONGER = {  # patch composition only: a setting that favours rare classes harder
    "class_balanced_inverse_p0.8": [
        "datamodule.sampling.mode=class_balanced",
        "datamodule.sampling.p=0.8",
        "datamodule.sampling.class_weights=inverse_frequency",
    ]
}


def datamodule(mode: str, data_dir: str | None = None) -> SegmentationDataModule:
    """The default config's datamodule under ``mode`` (data under ``data_dir``)."""
    if data_dir:
        os.environ["SEGSCALE_DATA_DIR"] = data_dir
    cfg = compose_config("train", [*(MODES | STRONGER)[mode], "datamodule.num_workers=1"])
    return build(cfg.datamodule, _convert_="all")


def spread(values: list[float]) -> dict[str, Any]:
    """Median, minimum and maximum of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def rates(seconds: float, repeats: int) -> dict[str, Any]:
    """Patches/s of one core and of a 1-worker DataLoader, modes alternating."""
    modules = {mode: datamodule(mode) for mode in MODES}
    for module in modules.values():
        module.setup("fit")
    one_core: dict[str, list[float]] = {mode: [] for mode in MODES}
    loader: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(repeats):
        for mode, module in modules.items():
            data = module.train_set
            assert data is not None
            one_core[mode].append(calls_per_second(lambda i, d=data: d[(0, i)], seconds))
            loader[mode].append(loader_rate(module, 1, seconds))
    ratios = {
        "one_core": [b / a for a, b in zip(*one_core.values(), strict=True)],
        "loader_1_worker": [b / a for a, b in zip(*loader.values(), strict=True)],
    }
    return {
        "one_core": {mode: {"runs": v, **spread(v)} for mode, v in one_core.items()},
        "loader_1_worker": {mode: {"runs": v, **spread(v)} for mode, v in loader.items()},
        "class_balanced_over_uniform": {k: {"runs": v, **spread(v)} for k, v in ratios.items()},
    }


def validation_cost() -> dict[str, Any]:
    """Seconds of a fresh validation pass without and with class locations; cache sizes."""
    source = Path(os.environ.get("SEGSCALE_DATA_DIR", "data")) / "synthetic"
    result = {}
    for mode in MODES:
        with tempfile.TemporaryDirectory() as scratch:
            shutil.copytree(source, Path(scratch) / "synthetic")
            for cache in Path(scratch).glob("synthetic/*/.segscale"):
                shutil.rmtree(cache)
            module = datamodule(mode, scratch)
            start = time.perf_counter()
            module.check()
            seconds = time.perf_counter() - start
            cache = next(Path(scratch).glob("synthetic/*/.segscale/validation.json"))
            result[mode] = {"seconds": seconds, "cache_bytes": cache.stat().st_size}
    os.environ.pop("SEGSCALE_DATA_DIR", None)
    return result


def class_shares() -> dict[str, Any]:
    """Per class and mode: shares of epoch 0's training patches' pixels and patches.

    Of labelled pixels, of patches holding the class, and of patches centred on it.
    """
    result: dict[str, Any] = {}
    for mode in MODES | STRONGER:
        module = datamodule(mode)
        module.setup("fit")
        data = module.train_set
        assert data is not None
        classes = len(module.class_names)
        pixels, holding, centred = (np.zeros(classes, np.int64) for _ in range(3))
        for index in range(len(data)):
            counts = np.bincount(data[(0, index)]["mask"].numpy().ravel(), minlength=256)
            pixels += counts[:classes]
            holding += counts[:classes] > 0
            centre = data.draw(0, index).centre_class
            if centre is not None:
                centred[centre] += 1
        result[mode] = {
            name: {
                "pixels": round(float(pixels[c] / pixels.sum()), 4),
                "patches_holding": round(float(holding[c] / len(data)), 4),
                "patches_centred": round(float(centred[c] / len(data)), 4),
            }
            for c, name in enumerate(module.class_names)
        }
    report = datamodule("uniform").check()
    shares = report.frequencies("train").round(4).tolist()
    result["training_tiles"] = dict(zip(report.class_names, shares, strict=True))
    return result


def main() -> None:
    """Measure and write the JSON file named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    results = {
        "started_at": started,
        "cpus": os.cpu_count(),
        "rates_patches_per_s": rates(args.seconds, args.repeats),
        "validation_pass": validation_cost(),
        "labelled_pixel_shares": class_shares(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(args.out, json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
