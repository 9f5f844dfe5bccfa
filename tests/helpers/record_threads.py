"""A callback that records, per rank, the threads a real run trains with."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch


class RecordThreads(L.Callback):
    """Write ``torch.get_num_threads()`` to ``<folder>/rank<r>.threads`` when training starts."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"rank{trainer.global_rank}.threads"
        path.write_text(str(torch.get_num_threads()))


def recorded_threads(folder: Path) -> dict[str, int]:
    """``{"rank0": threads, ...}`` as ``RecordThreads`` wrote them."""
    return {p.stem: int(p.read_text()) for p in sorted(folder.glob("rank*.threads"))}
