"""Metric loggers that keep a resumed run's history."""

from __future__ import annotations

import csv

from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, except that an existing ``metrics.csv`` is continued.

    Lightning deletes the file when its folder is reused; a resumed run writes into its
    own run folder, so the rows before the interruption would be lost.
    """

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = list(csv.DictReader(file).fieldnames or [])


class CSVLogger(LightningCSVLogger):
    """Metrics as ``metrics.csv``; a resumed run appends to the file it left."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        """The writer, created on first use."""
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment
