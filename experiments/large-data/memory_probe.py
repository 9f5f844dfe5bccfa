"""What one process holds per tile, after training's setup and after reading each tile.

    export XDG_CACHE_HOME=/tmp/large-data/cache-after   # the large runs' cached check
    python experiments/large-data/memory_probe.py /tmp/large-data/tif-779
    GDAL_CACHEMAX=1 python experiments/large-data/memory_probe.py /tmp/large-data/tif-779

Prints this process's private memory (``Pss_Anon``) after the imports, the (cached)
dataset check, ``setup("fit")`` (every tile opened where it lies), one patch cut from
each tile (each tile's GDAL datasets then open in this process, GDAL's block cache
filled), and the handles closed. ``GDAL_CACHEMAX=1`` leaves out the block cache.
"""

from __future__ import annotations

import os
import sys
import time

from segscale.configs import compose_config
from segscale.runs.builders import build, build_datamodule


def private_mb() -> float:
    """The ``Pss_Anon`` of the process running this, in MB."""
    with open(f"/proc/{os.getpid()}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss_Anon:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no Pss_Anon in smaps_rollup")


def main() -> None:
    """Open the dataset folder given as training does and print the memory at each stage."""
    print(f"imports: {private_mb():.0f} MB", flush=True)
    overrides = [
        "datamodule=folder",
        f"datamodule.source.root={sys.argv[1]}",
        "output_dir=/tmp/large-data/unused",
    ]
    cfg = compose_config("train", overrides)
    effective = build(cfg.scaling).resolve(cfg.datamodule.batch_size, cfg.optimizer.lr, 1)
    datamodule = build_datamodule(cfg, effective)
    started = time.perf_counter()
    datamodule.check()
    took = time.perf_counter() - started
    print(f"dataset check ({took:.1f} s): {private_mb():.0f} MB", flush=True)
    datamodule.setup("fit")
    dataset = datamodule.train_set
    assert dataset is not None
    print(f"setup, {len(dataset.tiles)} tiles opened: {private_mb():.0f} MB", flush=True)
    for index in range(len(dataset.tiles)):
        dataset[(0, index)]
    print(f"one patch of each tile: {private_mb():.0f} MB", flush=True)
    for tile in dataset.tiles:
        for pixels in (tile.image, tile.mask):
            getattr(pixels, "close", lambda: None)()
    print(f"their GDAL datasets closed: {private_mb():.0f} MB", flush=True)


if __name__ == "__main__":
    main()
