"""The trials of an Optuna search, run as jobs of the sweep, each result told to the study.

With a launcher that hands back each job as it ends (``StreamingLauncher``, such as
``hydra/launcher=parallel``) ``n_jobs`` trials run at once, and whenever one ends the
study is told its result and the next trial is asked for and started in its place.
Other launchers run batches of ``n_jobs`` trials, each batch waiting for its slowest.
A trial whose job fails (or returns no number) is recorded as failed, one the pruner
stopped as pruned, and the search goes on.
"""

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import optuna
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState

from hydra_plugins.segscale_plugins.search_space import parameter_overrides
from segscale.command_line import quoted_override
from segscale.runs.folder import read_summary
from segscale.training.callbacks.trial_pruning import TrialPruned

log = logging.getLogger(__name__)

AnyTrial = optuna.Trial | optuna.trial.FrozenTrial
"""A trial asked for now, or one a stopped search left running."""


@runtime_checkable
class StreamingLauncher(Protocol):
    """A launcher that starts jobs one by one and hands back each as it ends.

    ``ParallelLauncher`` is one. Checked by its methods, not its class: Hydra's plugin
    scan loads the launcher's module anew, so an imported class would be another object.
    """

    def start(self, overrides: Sequence[str], number: int) -> None:
        """Start job ``number`` (in folder ``number``) when devices free."""

    def next_finished(self) -> tuple[int, JobReturn]:
        """Wait for a started job to end; its number and result."""


@dataclass
class TrialLoop:
    """Runs the trials of ``study`` with ``launcher`` until it holds ``n_trials`` finished."""

    study: optuna.Study
    launcher: Launcher
    sweep_dir: Path
    fixed: list[str]
    """The overrides every trial's job is given."""
    n_trials: int
    n_jobs: int
    metric: str
    """The optimized metric, as the log names it."""
    pruning_study: tuple[str, str] | None = None
    """(storage URL, study name) each job reports to when a pruner runs; None: no pruner."""
    exhausted: bool = False
    """Whether the sampler has tried every point of the search space."""

    def run(self, space: dict[str, BaseDistribution]) -> None:
        """Run trials interrupted earlier again, then new ones asked for in ``space``."""
        # Trials a stopped search left running are run again under their numbers.
        interrupted = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        for trial in interrupted:
            log.info("re-running trial %d, interrupted earlier", trial.number)
            _set_aside(self.sweep_dir / str(trial.number))
        if isinstance(self.launcher, StreamingLauncher):
            self._run_async(self.launcher, space, interrupted)
            return
        for trial in interrupted:
            self._run([trial])
        while (left := self.n_trials - _finished(self.study)) > 0 and not self.exhausted:
            self._run([self.study.ask(space) for _ in range(min(self.n_jobs, left))])

    def _run_async(
        self,
        launcher: StreamingLauncher,
        space: dict[str, BaseDistribution],
        interrupted: Sequence[optuna.trial.FrozenTrial],
    ) -> None:
        """Keep ``n_jobs`` trials running: ask for the next one as soon as one ends."""
        waiting = list(interrupted)
        running: set[int] = set()
        while True:
            while len(running) < self.n_jobs:
                if waiting:
                    trial: AnyTrial = waiting.pop(0)
                elif not self.exhausted and _finished(self.study) + len(running) < self.n_trials:
                    trial = self.study.ask(space)
                else:
                    break
                launcher.start(self._job_overrides(trial), trial.number)
                running.add(trial.number)
            if not running:
                return
            number, result = launcher.next_finished()
            running.remove(number)
            self._record(number, result)

    def _job_overrides(self, trial: AnyTrial) -> list[str]:
        """The trial's job: the fixed overrides, its parameters, and its study if pruning."""
        params = parameter_overrides(trial.params)
        if self.pruning_study is None:
            return [*self.fixed, *params]
        storage_url, study_name = self.pruning_study
        study = [
            f"search_trial.storage={quoted_override(storage_url)}",
            f"search_trial.study_name={quoted_override(study_name)}",
            f"search_trial.number={trial.number}",
        ]
        return [*self.fixed, *params, *study]

    def _run(self, trials: Sequence[AnyTrial]) -> None:
        """Run ``trials`` as one batch of jobs and tell the study their results."""
        numbers = [trial.number for trial in trials]
        batch = [self._job_overrides(trial) for trial in trials]
        # The launcher numbers the jobs from the first trial's number.
        for offset, number in enumerate(numbers):
            assert number == numbers[0] + offset, "trials of one batch are numbered in a row"
        results: Sequence[JobReturn] = self.launcher.launch(batch, initial_job_idx=numbers[0])
        for number, result in zip(numbers, results, strict=True):
            self._record(number, result)

    def _record(self, number: int, result: JobReturn) -> None:
        """Tell the study how trial ``number``'s job ended: a value, pruned or failed."""
        if was_pruned(result, self.sweep_dir / str(number)):
            # Not a failure: the pruner stopped it, and the search goes on as planned.
            self._tell(number, state=TrialState.PRUNED)
            log.info("trial %d pruned", number)
            return
        value = result._return_value if result.status == JobStatus.COMPLETED else None
        if isinstance(value, (int, float)) and math.isfinite(value):
            self._tell(number, values=float(value))
            log.info("trial %d: %s = %.6g", number, self.metric, value)
        else:
            self._tell(number, state=TrialState.FAIL)
            reason = result._return_value if result.status == JobStatus.FAILED else value
            log.warning("trial %d failed (%s); the search goes on", number, reason)

    def _tell(self, number: int, **result: Any) -> None:
        """Record a trial's result (Optuna stores it even when the sampler then stops)."""
        try:
            self.study.tell(number, **result)
        except RuntimeError as error:
            # Grid and brute-force samplers stop the study once every point was tried.
            if "Study.stop" not in str(error):
                raise
            log.info("the sampler has tried every point of the search space")
            self.exhausted = True


def was_pruned(result: JobReturn, folder: Path) -> bool:
    """Whether the job (its result, its folder's summary) was stopped by the pruner."""
    # In the sweep's process (basic launcher) the job raised TrialPruned; in a process
    # of its own (parallel launcher) its summary says so.
    if isinstance(result._return_value, TrialPruned):
        return True
    return (read_summary(folder) or {}).get("status") == TrialPruned.status


def _finished(study: optuna.Study) -> int:
    done = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=done))


def _set_aside(folder: Path) -> None:
    """Keep an interrupted trial's folder beside the re-run's, rather than mixing them."""
    if folder.is_dir():
        folder.rename(
            folder.with_name(f"{folder.name}-interrupted-{time.strftime('%Y%m%d-%H%M%S')}")
        )
