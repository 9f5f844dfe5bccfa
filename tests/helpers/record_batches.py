"""A callback that records what a real run trains: each batch's patch keys, and validations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L


class RecordBatches(L.Callback):
    """Append one JSON line per trained batch and per validation to ``<folder>/rank<r>.jsonl``.

    A batch line holds its epoch, ``batch_idx``, the global step after it, its patch
    keys ``[epoch, index]`` (as the sampler addressed them) and the learning rate of that
    step as a fraction of the initial one (``lr_factor``: the schedule's factor); a
    validation line holds the epoch and step it ran at. Lines are appended, so a resumed
    run adds to the same file.
    """

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def _write(self, trainer: L.Trainer, record: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / f"rank{trainer.global_rank}.jsonl").open("a") as file:
            file.write(json.dumps(record) + "\n")

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        epoch, step, keys = trainer.current_epoch, trainer.global_step, batch["key"].tolist()
        group = trainer.optimizers[0].param_groups[0]  # the schedule has stepped to `step`
        factor = group["lr"] / group.get("initial_lr", group["lr"])
        record = {"epoch": epoch, "batch": idx, "step": step, "keys": keys, "lr_factor": factor}
        self._write(trainer, record)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._write(trainer, {"validated": trainer.current_epoch, "step": trainer.global_step})


def recorded(folder: Path, rank: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(batches, validations)`` as ``RecordBatches`` wrote them for ``rank``."""
    lines = (folder / f"rank{rank}.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [r for r in records if "keys" in r], [r for r in records if "validated" in r]
