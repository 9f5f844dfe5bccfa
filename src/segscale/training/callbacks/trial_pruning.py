"""A search trial's validation scores, reported to its Optuna study; the trial stops if pruned.

``hparams_search=optuna`` with a ``hydra.sweeper.pruner`` gives each of its jobs the
study (``search_trial.storage``, ``search_trial.study_name``) and the job's trial
(``search_trial.number``). After every validation, rank 0 reports the run's
``optimized_metric`` with step = the epoch (0-based, as in ``metrics.csv``) and asks
the study's pruner whether to go on; the answer is broadcast, so every rank of a DDP
job stops at the same validation, raising ``TrialPruned`` once Lightning has logged it.
Only rank 0 talks to the study.

The pruner is the sweeper's: it records the pruner's name and options in the study
(``PRUNER_ATTR``), and the job rebuilds the same one from them (``build_pruner``).
"""

from __future__ import annotations

import math
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import lightning as L
import optuna
from omegaconf import DictConfig, OmegaConf
from sqlalchemy.engine import make_url

from segscale.errors import ConfigError, RunStopped

PRUNERS: dict[str, type[optuna.pruners.BasePruner]] = {
    "none": optuna.pruners.NopPruner,
    "median": optuna.pruners.MedianPruner,
    "percentile": optuna.pruners.PercentilePruner,
    "hyperband": optuna.pruners.HyperbandPruner,
    "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
    "threshold": optuna.pruners.ThresholdPruner,
}
"""``hydra.sweeper.pruner`` names and the Optuna pruners they build."""

PRUNER_ATTR = "segscale_pruner"
"""The study's user attribute that holds the pruner's ``{"name", "options"}``."""

SQLITE_TIMEOUT_S = 60
"""How long a job or the sweeper waits for another one's write to an SQLite study."""

SQLITE_HELD_S = 5
"""How long opening an SQLite study waits for its write lock before calling it held.

A job's or the sweeper's write takes milliseconds; a lock held for seconds is another
process's long transaction (another search, a browser of the study), not a brief write.
"""


class TrialPruned(RunStopped):
    """The study's pruner stopped this trial after a validation; not a failure."""

    status = "pruned"
    exit_code = 0


def build_pruner(
    name: str | None, options: dict[str, Any] | None = None
) -> optuna.pruners.BasePruner:
    """The Optuna pruner ``hydra.sweeper.pruner=name`` with ``pruner_options`` as arguments."""
    key = "none" if name is None else str(name)
    if key not in PRUNERS:
        raise ConfigError(
            f"hydra.sweeper.pruner={name!r} is unknown: expected one of {list(PRUNERS)}"
        )
    try:
        return PRUNERS[key](**dict(options or {}))
    except (TypeError, ValueError) as error:  # what the pruner says of its arguments
        raise ConfigError(
            f"hydra.sweeper.pruner_options={dict(options or {})!r} do not fit "
            f"hydra.sweeper.pruner={key}: {error}"
        ) from error


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The study storage at ``url``; an SQLite file waits for others' writes, not fails.

    An SQLite file whose write lock another process holds for seconds is refused
    (``ConfigError`` naming the file), rather than waiting ``SQLITE_TIMEOUT_S`` for it.
    """
    if not url.startswith("sqlite"):
        return optuna.storages.get_storage(url)
    database = make_url(url).database
    if database and database != ":memory:":
        _check_not_held(Path(database).resolve())
    # Every running job writes to the file besides the sweeper: wait for the lock.
    return optuna.storages.RDBStorage(
        url, engine_kwargs={"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    )


def held_database_error(database: Path) -> ConfigError:
    """The error for the SQLite study ``database`` whose lock another process holds."""
    return ConfigError(
        f"the Optuna database {database} is locked: another search (or process) holds "
        "it; wait for it to end, or give this search a file of its own "
        "(hydra.sweeper.storage=sqlite:///<file>)"
    )


def _check_not_held(database: Path) -> None:
    """Take and give back ``database``'s write lock, waiting ``SQLITE_HELD_S`` at most."""
    if not database.is_file():
        return  # a new study: nobody can hold it yet
    try:
        with closing(sqlite3.connect(database, timeout=SQLITE_HELD_S)) as connection:
            connection.execute("BEGIN IMMEDIATE")
            connection.rollback()
    except sqlite3.OperationalError as error:
        if "locked" not in str(error):
            raise
        raise held_database_error(database) from error
    except sqlite3.DatabaseError as error:  # "file is not a database"
        raise ConfigError(
            f"the Optuna database {database} is not an SQLite database ({error})"
        ) from error


class TrialPruning(L.Callback):
    """Reports ``monitor`` after each validation to trial ``number``; stops when pruned.

    Rank 0 loads the study when fitting starts (a study or trial that is not there
    stops the run before training); the other ranks only follow its decisions.
    """

    def __init__(self, storage: str, study_name: str, number: int, monitor: str) -> None:
        self.storage = storage
        self.study_name = study_name
        self.number = number
        self.monitor = monitor
        self._trial: optuna.Trial | None = None
        self._pruned: TrialPruned | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Load the study and this job's trial (rank 0)."""
        if trainer.is_global_zero:
            self._trial = self._load_trial()

    def _load_trial(self) -> optuna.Trial:
        where = f"search_trial.study_name={self.study_name!r} in {self.storage}"
        storage = open_storage(self.storage)
        try:
            study_id = storage.get_study_id_from_name(self.study_name)
        except KeyError as error:
            raise ConfigError(f"{where}: no such study") from error
        spec = storage.get_study_user_attrs(study_id).get(PRUNER_ATTR)
        if spec is None:
            raise ConfigError(
                f"{where}: the study records no pruner; search_trial.* are set by "
                "hparams_search=optuna for its jobs, not by hand"
            )
        try:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, self.number)
        except KeyError as error:
            raise ConfigError(
                f"search_trial.number={self.number}: not a trial of {where}"
            ) from error
        state = storage.get_trial(trial_id).state
        if state != optuna.trial.TrialState.RUNNING:
            raise ConfigError(
                f"search_trial.number={self.number}: trial {self.number} of {where} is "
                f"{state.name}, not RUNNING"
            )
        study = optuna.load_study(
            study_name=self.study_name,
            storage=storage,
            # The job never samples: the sweeper asked for its parameters.
            sampler=optuna.samplers.RandomSampler(),
            pruner=build_pruner(spec["name"], spec.get("options")),
        )
        return optuna.Trial(study, trial_id)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Report the score, ask the pruner (rank 0); every rank stops if it said so."""
        if trainer.sanity_checking:
            return
        epoch = trainer.current_epoch
        verdict = self._verdict(trainer, epoch) if trainer.is_global_zero else None
        # Every rank gets rank 0's verdict, so all of them stop at this validation.
        decision = trainer.strategy.broadcast(verdict, src=0)
        assert decision is not None, "rank 0 always decides"
        pruned, value, missing = decision
        if missing:
            raise ConfigError(
                f"optimized_metric={self.monitor!r} is not a logged metric: expected one of "
                f"{missing}"
            )
        if pruned:
            self._pruned = TrialPruned(
                f"trial {self.number} pruned after epoch {epoch}: {self.monitor} = {value:.6g}",
                trial=self.number,
                epoch=epoch,
                step=trainer.global_step,
                value=value,
                metric=self.monitor,
            )

    # The stop is raised at the next hook, once Lightning has logged the validation.
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Stop after an epoch-end validation that pruned the trial."""
        self._raise_if_pruned()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Stop after a mid-epoch validation that pruned the trial."""
        self._raise_if_pruned()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Stop after the last validation, if it pruned the trial."""
        self._raise_if_pruned()

    def _raise_if_pruned(self) -> None:
        if self._pruned is not None:
            raise self._pruned

    def _verdict(self, trainer: L.Trainer, epoch: int) -> tuple[bool, float, list[str] | None]:
        """``(pruned, value, None)``, or ``(False, nan, logged metrics)`` if ``monitor`` is not."""
        assert self._trial is not None, "on_fit_start loads the trial on rank 0"
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            return False, math.nan, sorted(metrics)
        value = float(metrics[self.monitor])
        self._trial.report(value, step=epoch)
        return self._trial.should_prune(), value, None


def trial_pruning(search_trial: DictConfig | None, optimized_metric: str) -> TrialPruning | None:
    """The pruning callback of a search's job (``search_trial``); ``None`` outside a search."""
    if search_trial is None or search_trial.get("storage") is None:
        return None
    node = OmegaConf.to_container(search_trial, resolve=True)
    assert isinstance(node, dict)  # a DictConfig's container
    for key in ("study_name", "number"):
        if node.get(key) is None:
            raise ConfigError(
                f"search_trial.{key}=None: expected it with search_trial.storage (set by "
                "hparams_search=optuna with a pruner)"
            )
    return TrialPruning(
        str(node["storage"]), str(node["study_name"]), int(node["number"]), optimized_metric
    )
