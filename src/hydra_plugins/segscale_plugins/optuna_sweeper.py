"""``python train.py -m hparams_search=optuna``: Bayesian search with Optuna.

The search space is Hydra's sweep syntax, in ``hydra.sweeper.params`` (see
``conf/hparams_search/optuna.yaml``) or on the command line: ``choice(a, b)`` (a
category), ``range(lo, hi[, step])`` (integers, ``hi`` excluded as in Python),
``interval(lo, hi)`` (a float, or an integer when both ends are), and
``tag(log, interval(lo, hi))`` (sampled on a log scale). Every trial is one job of the
sweep, in the folder numbered after the trial, and returns its ``optimized_metric``.

The study lives in an SQLite file in the sweep folder, so a stopped search resumes
where it stopped: run the same command with ``hydra.sweep.dir=<that folder>``.
``n_trials`` counts the study's trials, old and new; a trial that was running when the
search stopped is run again under its own number, its unfinished folder kept beside
it. A trial whose job fails (or returns no number) is recorded as failed and the search
goes on. One search process per study: a second search into a sweep folder that a live
one holds is refused.

With ``hydra/launcher=parallel`` the trials run asynchronously: ``n_jobs`` of them run
at once, and whenever one ends the study is told its result and the next trial is
asked for and started in its place. Other launchers run batches of ``n_jobs`` trials,
each batch waiting for its slowest.

``pruner`` (``none``, ``median``, ``percentile``, ``hyperband``, ``successive_halving``,
``threshold``) with ``pruner_options`` (the Optuna pruner's arguments) stops trials
that go badly: each job reports its ``optimized_metric`` to the study after every
validation (``search_trial.*``, ``segscale.training.callbacks.trial_pruning``) and
stops when the pruner says so. Such a trial is recorded PRUNED, not failed; its folder's
``summary.json`` says ``pruned``.
"""

import logging
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, cast, runtime_checkable

import optuna
import sqlalchemy.exc
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    IntervalSweep,
    Override,
    RangeSweep,
)
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState
from sqlalchemy.engine import make_url

from hydra_plugins.segscale_plugins.grid_sweeper import summarize
from hydra_plugins.segscale_plugins.sweep_folder import sweep_folder_held
from segscale.atomic_files import write_text_atomically
from segscale.command_line import quoted_override
from segscale.errors import EXIT_BAD_INPUT, ConfigError
from segscale.sweeps.objective import optimized_metric
from segscale.training.callbacks.trial_pruning import (
    PRUNER_ATTR,
    TrialPruned,
    build_pruner,
    held_database_error,
    open_storage,
)
from segscale.training.run_folder.summary_file import read_summary

log = logging.getLogger(__name__)

Direction = Literal["minimize", "maximize"]
DIRECTIONS = ("minimize", "maximize")


def distribution(override: Override) -> BaseDistribution:
    """The Optuna distribution that a Hydra sweep override describes."""
    sweep = override.value()
    key = override.get_key_element()
    log_scale = "log" in getattr(sweep, "tags", set())
    if isinstance(sweep, ChoiceSweep):
        return CategoricalDistribution([_plain(v) for v in sweep.list])
    if isinstance(sweep, RangeSweep):
        if sweep.start is None or sweep.stop is None:  # what int(None) would raise
            raise TypeError(f"hydra.sweeper.params.{key}: range without a start or a stop")
        values = list(range(int(sweep.start), int(sweep.stop), int(sweep.step or 1)))
        if not values:
            raise ConfigError(
                f"hydra.sweeper.params.{key}: range({sweep.start}, {sweep.stop}) is empty"
            )
        return IntDistribution(values[0], values[-1], step=int(sweep.step or 1))
    if isinstance(sweep, IntervalSweep):
        low, high = sweep.start, sweep.end
        if low is None or high is None:  # what float(None) would raise
            raise TypeError(f"hydra.sweeper.params.{key}: interval without a start or an end")
        if isinstance(low, int) and isinstance(high, int):
            return IntDistribution(low, high, log=log_scale)
        return FloatDistribution(float(low), float(high), log=log_scale)
    raise ConfigError(
        f"hydra.sweeper.params.{key}={override.get_value_element_as_str()!r} is not a search "
        "space: expected choice(...), range(...), interval(...) or tag(log, interval(...))"
    )


def _plain(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


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


class OptunaSweeper(Sweeper):
    """Asks Optuna for trials, runs them as jobs of the sweep, tells it the results."""

    def __init__(
        self,
        params: dict[str, str] | None = None,
        direction: str = "maximize",
        n_trials: int = 20,
        n_jobs: int = 1,
        study_name: str = "search",
        storage: str | None = None,
        sampler: optuna.samplers.BaseSampler | None = None,
        pruner: str | None = "none",
        pruner_options: Any = None,
    ) -> None:
        if direction not in DIRECTIONS:
            raise ConfigError(
                f"hydra.sweeper.direction={direction!r} is unknown: expected one of "
                f"{list(DIRECTIONS)}"
            )
        for key, value in (("n_trials", n_trials), ("n_jobs", n_jobs)):
            if not (isinstance(value, int) and value >= 1):
                raise ConfigError(f"hydra.sweeper.{key}={value!r} is not allowed: expected >= 1")
        self.params = dict(params or {})
        self.direction = cast(Direction, direction)  # one of DIRECTIONS, checked above
        self.n_trials = n_trials
        self.n_jobs = n_jobs
        self.study_name = study_name
        self.storage = storage
        self.sampler = sampler
        options = pruner_options or {}
        if isinstance(options, DictConfig):
            options = OmegaConf.to_container(options, resolve=True)
        if not isinstance(options, dict):
            raise ConfigError(
                f"hydra.sweeper.pruner_options={pruner_options!r} is not allowed: expected "
                "the pruner's arguments as a mapping, e.g. {n_warmup_steps: 1}"
            )
        self.pruner_name = "none" if pruner is None else str(pruner)
        self.pruner_options = options
        self.pruner = build_pruner(self.pruner_name, self.pruner_options)
        self._exhausted = False

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        """Keep the config and build the launcher that runs the trials."""
        from hydra.core.plugins import Plugins

        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        """Run trials until the study holds ``n_trials`` finished ones; return the best."""
        # Hydra's Sweeper declares config, hydra_context and launcher Optional; only setup
        # sets them (from arguments that are not None), so before it they are unset.
        assert self.config is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        space, fixed = self._search_space(arguments)
        self._check_composes(space, fixed)
        with sweep_folder_held(sweep_dir):
            return self._search(sweep_dir, space, fixed)

    def _search(
        self, sweep_dir: Path, space: dict[str, BaseDistribution], fixed: list[str]
    ) -> dict[str, Any]:
        """``sweep`` once the sweep folder is this search's."""
        write_text_atomically(sweep_dir / "multirun.yaml", OmegaConf.to_yaml(self.config))
        self.storage_url = self.storage or f"sqlite:///{sweep_dir.resolve() / 'optuna.db'}"
        try:
            study = self._open_study()
        except ConfigError as error:
            # SystemExit, unlike an exception, passes Hydra's error report (a traceback).
            log.error("%s", error)
            sys.exit(EXIT_BAD_INPUT)
        log.info("Optuna study %r in %s: %s", self.study_name, self.storage_url, space)
        log.info("pruner: %s %s", self.pruner_name, self.pruner_options or "")
        try:
            # Trials a stopped search left running are run again under their numbers.
            interrupted = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            for trial in interrupted:
                log.info("re-running trial %d, interrupted earlier", trial.number)
                _set_aside(sweep_dir / str(trial.number))
            if isinstance(self.launcher, StreamingLauncher):
                self._run_async(self.launcher, study, space, fixed, interrupted)
            else:
                for trial in interrupted:
                    self._run(study, [trial], fixed)
                while (left := self.n_trials - _finished(study)) > 0 and not self._exhausted:
                    batch = [study.ask(space) for _ in range(min(self.n_jobs, left))]
                    self._run(study, batch, fixed)
        finally:
            summarize(sweep_dir)
        return self._report(study, sweep_dir)

    def _open_study(self) -> optuna.Study:
        """The study in ``storage_url``, created if new, with the pruner the jobs rebuild."""
        try:
            study = optuna.create_study(
                study_name=self.study_name,
                storage=open_storage(self.storage_url),
                direction=self.direction,
                sampler=self.sampler,
                pruner=self.pruner,
                load_if_exists=True,
            )
            # The jobs rebuild the pruner from this to ask it whether to go on.
            options = self.pruner_options
            study.set_user_attr(PRUNER_ATTR, {"name": self.pruner_name, "options": options})
        except sqlalchemy.exc.OperationalError as error:
            # Taken by another process between open_storage's check and these writes.
            database = make_url(self.storage_url).database
            if "database is locked" not in str(error) or not database:
                raise
            raise held_database_error(Path(database).resolve()) from error
        return study

    def _search_space(self, arguments: list[str]) -> tuple[dict[str, BaseDistribution], list[str]]:
        assert self.hydra_context is not None  # set by setup (see sweep)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        configured = [f"{key}={value}" for key, value in self.params.items()]
        space: dict[str, BaseDistribution] = {}
        fixed: list[str] = []
        for override in parser.parse_overrides([*configured, *arguments]):
            if override.is_sweep_override():
                space[override.get_key_element()] = distribution(override)
            else:
                assert override.input_line is not None  # parse_overrides sets it
                fixed.append(override.input_line)
        if not space:
            raise ConfigError(
                "hparams_search: the search space is empty; expected hydra.sweeper.params "
                "(conf/hparams_search/optuna.yaml) or a swept override such as "
                "'optimizer.lr=tag(log, interval(0.001, 0.1))'"
            )
        return space, fixed

    def _check_composes(self, space: dict[str, BaseDistribution], fixed: list[str]) -> None:
        """Compose one trial's config now, so that a key that does not exist stops the search."""
        assert self.config is not None and self.hydra_context is not None  # set by setup
        sample = [f"{key}={_first(dist)}" for key, dist in space.items()]
        self.hydra_context.config_loader.load_sweep_config(self.config, [*fixed, *sample])

    def _run_async(
        self,
        launcher: StreamingLauncher,
        study: optuna.Study,
        space: dict[str, BaseDistribution],
        fixed: list[str],
        interrupted: Sequence[optuna.trial.FrozenTrial],
    ) -> None:
        """Keep ``n_jobs`` trials running: ask for the next one as soon as one ends."""
        waiting = list(interrupted)
        running: set[int] = set()
        while True:
            while len(running) < self.n_jobs:
                if waiting:
                    trial: optuna.Trial | optuna.trial.FrozenTrial = waiting.pop(0)
                elif not self._exhausted and _finished(study) + len(running) < self.n_trials:
                    trial = study.ask(space)
                else:
                    break
                launcher.start(self._job_overrides(trial, fixed), trial.number)
                running.add(trial.number)
            if not running:
                return
            number, result = launcher.next_finished()
            running.remove(number)
            self._record(study, number, result)

    def _job_overrides(
        self, trial: optuna.Trial | optuna.trial.FrozenTrial, fixed: list[str]
    ) -> list[str]:
        """The trial's job: the fixed overrides, its parameters, and its study if pruning."""
        params = [f"{k}={_override_value(v)}" for k, v in trial.params.items()]
        if self.pruner_name == "none":
            return [*fixed, *params]
        study = [
            f"search_trial.storage={quoted_override(self.storage_url)}",
            f"search_trial.study_name={quoted_override(self.study_name)}",
            f"search_trial.number={trial.number}",
        ]
        return [*fixed, *params, *study]

    def _run(
        self,
        study: optuna.Study,
        trials: Sequence[optuna.Trial | optuna.trial.FrozenTrial],
        fixed: list[str],
    ) -> None:
        """Run ``trials`` as one batch of jobs and tell the study their results."""
        assert self.config is not None and self.launcher is not None  # set by setup
        numbers = [trial.number for trial in trials]
        batch = [self._job_overrides(trial, fixed) for trial in trials]
        # The launcher numbers the jobs from the first trial's number.
        for offset, number in enumerate(numbers):
            assert number == numbers[0] + offset, "trials of one batch are numbered in a row"
        results: Sequence[JobReturn] = self.launcher.launch(batch, initial_job_idx=numbers[0])
        for number, result in zip(numbers, results, strict=True):
            self._record(study, number, result)

    def _record(self, study: optuna.Study, number: int, result: JobReturn) -> None:
        """Tell the study how trial ``number``'s job ended: a value, pruned or failed."""
        assert self.config is not None  # set by setup (see sweep)
        folder = Path(str(self.config.hydra.sweep.dir)) / str(number)
        if was_pruned(result, folder):
            # Not a failure: the pruner stopped it, and the search goes on as planned.
            self._tell(study, number, state=TrialState.PRUNED)
            log.info("trial %d pruned", number)
            return
        value = result._return_value if result.status == JobStatus.COMPLETED else None
        if isinstance(value, (int, float)) and math.isfinite(value):
            self._tell(study, number, values=float(value))
            log.info("trial %d: %s = %.6g", number, optimized_metric(self.config), value)
        else:
            self._tell(study, number, state=TrialState.FAIL)
            reason = result._return_value if result.status == JobStatus.FAILED else value
            log.warning("trial %d failed (%s); the search goes on", number, reason)

    def _tell(self, study: optuna.Study, number: int, **result: Any) -> None:
        """Record a trial's result (Optuna stores it even when the sampler then stops)."""
        try:
            study.tell(number, **result)
        except RuntimeError as error:
            # Grid and brute-force samplers stop the study once every point was tried.
            if "Study.stop" not in str(error):
                raise
            log.info("the sampler has tried every point of the search space")
            self._exhausted = True

    def _report(self, study: optuna.Study, sweep_dir: Path) -> dict[str, Any]:
        assert self.config is not None  # set by setup (see sweep)
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if not complete:
            log.error("no trial of the study completed")
            return {}
        best = study.best_trial
        result = {
            "name": "optuna",
            "metric": optimized_metric(self.config),
            "direction": self.direction,
            "best_trial": best.number,
            "best_value": best.value,
            "best_params": best.params,
            "trials": {s.name.lower(): len(study.get_trials(states=(s,))) for s in TrialState},
        }
        write_text_atomically(
            sweep_dir / "optimization_results.yaml", OmegaConf.to_yaml(OmegaConf.create(result))
        )
        log.info("best trial %d: %s = %.6g", best.number, result["metric"], best.value)
        log.info("best parameters: %s", best.params)
        return result


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


def _first(dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return _override_value(dist.choices[0])
    # ``distribution`` makes only these three kinds.
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    return dist.low


def _override_value(value: Any) -> str:
    """A sampled value as a Hydra override value (strings quoted when they need it)."""
    if isinstance(value, str) and not value.replace("_", "").replace("-", "").isalnum():
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


def _set_aside(folder: Path) -> None:
    """Keep an interrupted trial's folder beside the re-run's, rather than mixing them."""
    if folder.is_dir():
        folder.rename(
            folder.with_name(f"{folder.name}-interrupted-{time.strftime('%Y%m%d-%H%M%S')}")
        )
