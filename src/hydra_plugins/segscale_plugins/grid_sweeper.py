"""``-m`` grid sweeps (the default sweeper): Hydra's basic sweeper plus a summary.

Hydra's ``BasicSweeper`` composes every job's config before the first job starts (so a
key that does not exist stops the sweep at once), runs the grid, and raises the first
failed job's error, with its traceback, after its batch ran. This one runs every batch
whatever its jobs' expected failures (a refused value, a non-finite loss: see
``failed_jobs``), writes the sweep's table and curves (``segscale.sweeps.sweep_summary``)
at the end, whether or not a job failed, then names the failed jobs in a few lines and
exits with the first one's status; a job that crashed still stops the sweep after its
batch with its traceback. It holds the sweep folder meanwhile (``sweep_folder``): one
sweep per folder.
"""

import logging
from collections.abc import Sequence
from pathlib import Path

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn
from omegaconf import OmegaConf

from hydra_plugins.segscale_plugins.sweep_folder import sweep_folder_held
from segscale.errors import disk_full_error
from segscale.sweeps.failed_jobs import FailedJob, end_with_failures, failed_jobs
from segscale.sweeps.sweep_summary import write_sweep_summary

log = logging.getLogger(__name__)


class GridSweeper(BasicSweeper):
    """Every combination of the swept values, then ``sweep_summary.{csv,md,png}``."""

    def sweep(self, arguments: list[str]) -> list[Sequence[JobReturn]]:
        """Run the grid, holding the sweep folder; write the summary even when a job failed.

        Returns each batch's results; exits (``failed_jobs``) when a job failed.
        """
        if self.config is None:  # not set up: what reading None's ``hydra`` would raise
            raise AttributeError("the sweeper has no config: setup was not called")
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        with sweep_folder_held(sweep_dir):
            try:
                batches, failed = self._run_batches(arguments, sweep_dir)
            finally:
                summarize(sweep_dir)
        end_with_failures(failed, sum(len(results) for results in batches))
        return batches

    def _run_batches(
        self, arguments: list[str], sweep_dir: Path
    ) -> tuple[list[Sequence[JobReturn]], list[FailedJob]]:
        """``BasicSweeper.sweep`` without its check of each result: every batch runs.

        Returns each batch's results and the jobs that failed as expected; a job that
        crashed (``failed_jobs``) stops the sweep after its batch, as in ``BasicSweeper``.
        """
        # set by setup, as BasicSweeper.sweep asserts
        assert self.launcher is not None and self.hydra_context is not None
        params = [*self._parse_config(), *arguments]
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        self.overrides = self.split_arguments(parser.parse_overrides(params), self.max_batch_size)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        batches: list[Sequence[JobReturn]] = []
        failed: list[FailedJob] = []
        first = 0
        while not self.is_done():
            batch = self.get_job_batch()
            self.validate_batch_is_legal(batch)  # a key that does not exist stops it here
            results = self.launcher.launch(batch, initial_job_idx=first)
            failed += failed_jobs(results, first)  # raises a crash's error
            batches.append(results)
            first += len(batch)
        return batches, failed


def summarize(sweep_dir: Path) -> None:
    """Write the sweep's summary and say where it is (nothing if no job started).

    On a full disk it says so in a line: the sweep ends for the reason that stopped it
    (a job's full disk itself, exit 74), not for its summary.
    """
    if not sweep_dir.is_dir():
        return
    try:
        rows = write_sweep_summary(sweep_dir)
    except OSError as error:
        full = disk_full_error(error)
        if full is None:
            raise
        log.error("the sweep summary was not written: %s", full)
        return
    if rows:
        failed = [row["job"] for row in rows if row["status"] == "failed"]
        log.info(
            "sweep summary: %s (%d jobs, %d failed%s)",
            sweep_dir / "sweep_summary.md",
            len(rows),
            len(failed),
            f": {failed}" if failed else "",
        )
