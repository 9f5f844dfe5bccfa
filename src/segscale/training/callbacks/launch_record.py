"""A relaunch (a resume, a requeue) records itself in its run folder once it trains."""

from __future__ import annotations

from pathlib import Path

import lightning as L

from segscale.runs.folder import write_launch_record


class LaunchRecord(L.Callback):
    """Writes a relaunch's record (a resume, a requeue) when it starts training.

    Only then is the run known to continue: a launch refused before (by Lightning's
    restore, say) leaves the run folder as it was. Rank 0 writes it.
    """

    def __init__(self, folder: str | Path, record: dict[str, str]) -> None:
        self.folder = Path(folder)
        self.record = record

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write the record."""
        if trainer.is_global_zero:
            write_launch_record(self.folder, self.record)
