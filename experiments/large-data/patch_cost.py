"""Where a 512² patch's time goes: the tiles as stored against decoded, in one process.

    python experiments/large-data/patch_cost.py /tmp/large-data/tif-8

Cuts patches of the training set as training does (``RandomPatchDataset``) from the
tiles as stored and from the same tiles decoded into memory (``bench``'s copy), 3
alternating rounds of 120 patches, then profiles 150 of each (cProfile, by own time):
the windows' reads against the warps. Prints only; the README quotes its figures.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

from segscale.bench.measure.storage import decoded_copy
from segscale.configs import compose_config
from segscale.data.sampling.patches import RandomPatchDataset
from segscale.runs.builders import build, build_datamodule


def ms_per_patch(dataset: RandomPatchDataset, count: int, start: int) -> float:
    """Milliseconds a patch of ``dataset``, over ``count`` patches from index ``start``."""
    started = time.perf_counter()
    for index in range(start, start + count):
        dataset[(0, index)]
    return (time.perf_counter() - started) / count * 1e3


def main() -> None:
    """Time and profile the patches of the dataset folder given."""
    root = sys.argv[1]
    cfg = compose_config(
        "train",
        [
            "datamodule=folder",
            f"datamodule.source.root={root}",
            "datamodule.patch_size=512",
            "datamodule.decode_cache.folder=/tmp/large-data/decoded",
            "output_dir=/tmp/large-data/unused",
        ],
    )
    effective = build(cfg.scaling).resolve(cfg.datamodule.batch_size, cfg.optimizer.lr, 1)
    datamodule = build_datamodule(cfg, effective)
    datamodule.setup("fit")
    stored = datamodule.train_set
    assert stored is not None
    decoded = decoded_copy(stored, 2 * 10**9)
    assert decoded is not None
    for r in range(3):
        print(
            f"ms a patch: as stored {ms_per_patch(stored, 120, 1000 + r * 500):.2f}, "
            f"in memory {ms_per_patch(decoded, 120, 1000 + r * 500):.2f}",
            flush=True,
        )
    for name, dataset in (("as stored", stored), ("in memory", decoded)):
        print(f"\n{name}:")
        profile = cProfile.Profile()
        profile.enable()
        ms_per_patch(dataset, 150, 5000)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(8)


if __name__ == "__main__":
    main()
