"""``-m`` grid sweeps (the default sweeper): Hydra's basic sweeper plus a summary.

Hydra's ``BasicSweeper`` composes every job's config before the first job starts (so a
key that does not exist stops the sweep at once), runs the grid, and raises the first
failed job's error after all jobs ran. This one also writes the sweep's table and
curves (``segscale.sweeps.sweep_summary``) at the end, whether or not a job failed, and
holds the sweep folder meanwhile (``sweep_folder``): one sweep per folder.
"""

import logging
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

from hydra_plugins.segscale_plugins.sweep_folder import sweep_folder_held
from segscale.sweeps.sweep_summary import write_sweep_summary

log = logging.getLogger(__name__)


class GridSweeper(BasicSweeper):
    """Every combination of the swept values, then ``sweep_summary.{csv,md,png}``."""

    def sweep(self, arguments: list[str]) -> Any:
        """Run the grid, holding the sweep folder; write the summary even when a job failed."""
        if self.config is None:  # not set up: what reading None's ``hydra`` would raise
            raise AttributeError("the sweeper has no config: setup was not called")
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        with sweep_folder_held(sweep_dir):
            try:
                return super().sweep(arguments)
            finally:
                summarize(sweep_dir)


def summarize(sweep_dir: Path) -> None:
    """Write the sweep's summary and say where it is (nothing if no job started)."""
    if not sweep_dir.is_dir():
        return
    rows = write_sweep_summary(sweep_dir)
    if rows:
        failed = [row["job"] for row in rows if row["status"] == "failed"]
        log.info(
            "sweep summary: %s (%d jobs, %d failed%s)",
            sweep_dir / "sweep_summary.md",
            len(rows),
            len(failed),
            f": {failed}" if failed else "",
        )
