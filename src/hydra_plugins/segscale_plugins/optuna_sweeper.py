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
import sys
from pathlib import Path
from typing import Any, cast

import optuna
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import BaseDistribution

from hydra_plugins.segscale_plugins.grid_sweeper import summarize
from hydra_plugins.segscale_plugins.optuna_study import DIRECTIONS, Direction, open_study, report
from hydra_plugins.segscale_plugins.search_space import first_point, search_space
from hydra_plugins.segscale_plugins.sweep_folder import sweep_folder_held
from hydra_plugins.segscale_plugins.trial_loop import TrialLoop
from segscale.atomic_files import write_text_atomically
from segscale.errors import EXIT_BAD_INPUT, ConfigError
from segscale.sweeps.sweep_summary import optimized_metric
from segscale.training.callbacks.trial_pruning import build_pruner

log = logging.getLogger(__name__)


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
        assert self.config is not None and self.launcher is not None  # set by setup
        write_text_atomically(sweep_dir / "multirun.yaml", OmegaConf.to_yaml(self.config))
        self.storage_url = self.storage or f"sqlite:///{sweep_dir.resolve() / 'optuna.db'}"
        try:
            study = open_study(
                self.storage_url,
                self.study_name,
                self.direction,
                self.sampler,
                self.pruner,
                self.pruner_name,
                self.pruner_options,
            )
        except ConfigError as error:
            # SystemExit, unlike an exception, passes Hydra's error report (a traceback).
            log.error("%s", error)
            sys.exit(EXIT_BAD_INPUT)
        log.info("Optuna study %r in %s: %s", self.study_name, self.storage_url, space)
        log.info("pruner: %s %s", self.pruner_name, self.pruner_options or "")
        pruning = None if self.pruner_name == "none" else (self.storage_url, self.study_name)
        metric = optimized_metric(self.config)
        loop = TrialLoop(
            study, self.launcher, sweep_dir, fixed, self.n_trials, self.n_jobs, metric, pruning
        )
        try:
            loop.run(space)
        finally:
            summarize(sweep_dir)
        return report(study, metric, self.direction, sweep_dir)

    def _search_space(self, arguments: list[str]) -> tuple[dict[str, BaseDistribution], list[str]]:
        assert self.hydra_context is not None  # set by setup (see sweep)
        return search_space(self.hydra_context.config_loader, self.params, arguments)

    def _check_composes(self, space: dict[str, BaseDistribution], fixed: list[str]) -> None:
        """Compose one trial's config now, so that a key that does not exist stops the search."""
        assert self.config is not None and self.hydra_context is not None  # set by setup
        self.hydra_context.config_loader.load_sweep_config(
            self.config, [*fixed, *first_point(space)]
        )
