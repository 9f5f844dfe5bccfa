"""No rank holds the decoded dataset: its private memory does not grow with the images."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

# In a process of its own: a training rank's data path on tiled, deflate-compressed
# TIFFs (its dataset check, its tiles opened, patches cut, the validation grid read),
# then the anonymous (private, not file-backed) memory it grew by. Before, every
# compressed tile was decoded into the rank's memory when it set up.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np, tifffile
    from segscale.data.datamodule import segmentation_datamodule
    from segscale.data.datasets.folder import FolderTiles

    root, count = Path(sys.argv[1]), int(sys.argv[2])
    y, x = np.mgrid[0:2048, 0:2048]
    base = np.stack([x % 251, y % 241, (x + y) % 239], -1).astype(np.uint8)
    for split, n in (("train", count), ("val", 1)):
        for folder in ("images", "masks"):
            (root / split / folder).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            name = f"{split}{i}.tif"
            tiled = {"tile": (256, 256), "compression": "zlib"}
            tifffile.imwrite(root / split / "images" / name, base + i, **tiled)
            tifffile.imwrite(root / split / "masks" / name, (base[..., 0] + i) % 6, **tiled)

    def anonymous_kb():
        rollup = Path("/proc/self/smaps_rollup").read_text().splitlines()
        return sum(int(line.split()[1]) for line in rollup if line.startswith("Anonymous:"))

    datamodule = segmentation_datamodule(
        FolderTiles(str(root)), 6, [str(c) for c in range(6)], patch_size=256,
        patches_per_image=8, batch_size=4, num_workers=0, mean=None, std=None, in_channels=None,
    )
    datamodule.check()  # the validation pass reads every file once, chunk by chunk
    before = anonymous_kb()
    datamodule.setup("fit")
    for key in range(len(datamodule.train_set)):
        datamodule.train_set[(0, key)]
    for index in range(len(datamodule.val_set)):
        datamodule.val_set[index]
    print(json.dumps({"grown_kb": anonymous_kb() - before}))
    """
)


def grown_mb(tmp_path, count: int) -> float:
    # GDAL's block cache is bounded (64 MB a process by default): made small here, so
    # that it is full with either dataset and what is left to see is what grows.
    env = {**os.environ, "GDAL_CACHEMAX": "8"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / f"data{count}"), str(count)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["grown_kb"] / 1024


@pytest.mark.slow
def test_a_ranks_memory_does_not_grow_with_the_number_of_images(tmp_path):
    # 2 and 8 training images of 2048² RGB (12 MB decoded each, 4 MB more per mask): the
    # in-memory path grew by ~100 MB more for the 8.
    few, many = grown_mb(tmp_path, 2), grown_mb(tmp_path, 8)
    assert many - few < 8, (few, many)
    assert many < 32, many  # a patch, the block cache and Python, not images
