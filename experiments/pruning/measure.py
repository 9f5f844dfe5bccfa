"""Wall time of a 12-trial Optuna search on the tiny config, with and without pruning.

    python experiments/pruning/measure.py OUT.json [--repeats N] [--epochs E]

Each search: ``hparams_search=optuna`` (its shipped search space: learning rate,
momentum, batch size), 12 trials, ``hydra/launcher=parallel`` with 2 CPU jobs at once
(asynchronous trials), ``trainer.max_epochs=E`` on the tests' tiny synthetic tiles
(2 training tiles of 192 px, 8 patches of 64 px each). ``pruner=none`` and
``pruner=median`` (``n_startup_trials=2``, ``n_warmup_steps=1``: no trial is pruned
before two trials completed, nor at its first validation) alternate, ``N`` times each,
every search in a fresh sweep folder with the same sampler seed. Recorded per search:
wall time of the whole ``train.py -m`` command, the study's trial states, the epochs
the trials trained in all and the best value.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

from segscale.atomic_files import write_text_atomically
from segscale.data.datasets.synthetic import SyntheticTiles

REPO = Path(__file__).resolve().parents[2]
PRUNERS = {
    "none": ["hydra.sweeper.pruner=none"],
    "median": [
        "hydra.sweeper.pruner=median",
        "hydra.sweeper.pruner_options={n_startup_trials:2,n_warmup_steps:1}",
    ],
}


def search(data: Path, sweep: Path, pruner: str, epochs: int) -> dict[str, Any]:
    """Run one search into ``sweep``; what it took and what it found."""
    command = [
        sys.executable,
        str(REPO / "train.py"),
        "-m",
        f"datamodule.source.root={data}",
        "datamodule.source.num_train=2",
        "datamodule.source.num_val=1",
        "datamodule.source.image_size=192",
        "datamodule.patch_size=64",
        "datamodule.patches_per_image=8",
        "datamodule.num_workers=0",
        "trainer.accelerator=cpu",
        "trainer.log_every_n_steps=1",
        "callbacks.validation_report.num_samples=0",
        f"trainer.max_epochs={epochs}",
        f"hydra.sweep.dir={sweep}",
        "hparams_search=optuna",
        "hydra.sweeper.n_trials=12",
        "hydra.sweeper.n_jobs=2",
        "hydra/launcher=parallel",
        "hydra.launcher.cpu_jobs=2",
        *PRUNERS[pruner],
    ]
    start = time.perf_counter()
    subprocess.run(command, cwd=sweep.parent, check=True, capture_output=True)
    seconds = time.perf_counter() - start
    study = optuna.load_study(study_name="train", storage=f"sqlite:///{sweep / 'optuna.db'}")
    trials = study.get_trials()
    summaries = [json.loads((sweep / str(t.number) / "summary.json").read_text()) for t in trials]
    return {
        "pruner": pruner,
        "wall_s": round(seconds, 1),
        "states": {
            s: sum(t.state.name.lower() == s for t in trials)
            for s in ("complete", "pruned", "fail")
        },
        "epochs_trained": sum(len(t.intermediate_values) or epochs for t in trials),
        "summary_status": sorted(str(s.get("status")) for s in summaries),
        "best_value": study.best_value,
    }


def main() -> None:
    """Alternate the two searches ``--repeats`` times; write every run and the spread."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        tiles = SyntheticTiles(root=str(root / "data"), num_train=2, num_val=1, image_size=192)
        tiles.prepare()
        for repeat in range(args.repeats):
            for pruner in PRUNERS:
                sweep = root / f"{pruner}-{repeat}" / "sweep"
                sweep.parent.mkdir()
                runs.append(search(root / "data", sweep, pruner, args.epochs))
                print(json.dumps(runs[-1]), flush=True)
    walls = {p: [r["wall_s"] for r in runs if r["pruner"] == p] for p in PRUNERS}
    result = {
        "epochs": args.epochs,
        "runs": runs,
        "wall_s": {
            p: {"mean": statistics.mean(w), "min": min(w), "max": max(w)} for p, w in walls.items()
        },
    }
    write_text_atomically(Path(args.out), json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
