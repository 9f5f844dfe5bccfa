"""A callback that records, per rank, how a real run's DataLoader workers were started."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L


class RecordStartMethod(L.Callback):
    """Write the training loader's workers, as started, to ``<folder>/rank<r>.json``.

    At the first batch's end (the workers are running then): the loader's start method
    and the class of each worker process (``SpawnProcess``, ``ForkProcess``, ...).
    """

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        path = self.folder / f"rank{trainer.global_rank}.json"
        if path.exists():
            return
        loader = trainer.train_dataloader
        iterator = getattr(loader, "_iterator", None)  # persistent workers: kept by the loader
        workers = getattr(iterator, "_workers", [])
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {
            "method": loader.multiprocessing_context.get_start_method(),
            "workers": [type(worker).__name__ for worker in workers],
        }
        path.write_text(json.dumps(record), encoding="utf-8")


def record_start_method(folder: Path) -> list[str]:
    """Overrides that add ``RecordStartMethod`` to a run's callbacks."""
    target = "tests.helpers.record_start_method.RecordStartMethod"
    return [f"+callbacks.start._target_={target}", f"+callbacks.start.folder={folder}"]


def recorded_start_methods(folder: Path) -> dict[str, dict]:
    """``{"rank0": {"method": ..., "workers": [...]}, ...}`` as ``RecordStartMethod`` wrote."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))}
