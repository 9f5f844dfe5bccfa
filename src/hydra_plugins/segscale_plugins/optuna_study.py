"""The Optuna study of a search: opened in its storage (created if new), and its report.

The study lives in a database (by default an SQLite file in the sweep folder), so a
stopped search resumes where it stopped; it records the pruner by name and options, for
the jobs that rebuild it (``segscale.training.callbacks.trial_pruning``).
"""

import logging
from pathlib import Path
from typing import Any, Literal

import optuna
import sqlalchemy.exc
from omegaconf import OmegaConf
from optuna.trial import TrialState
from sqlalchemy.engine import make_url

from segscale.atomic_files import write_text_atomically
from segscale.training.callbacks.trial_pruning import (
    PRUNER_ATTR,
    held_database_error,
    open_storage,
)

log = logging.getLogger(__name__)

Direction = Literal["minimize", "maximize"]
DIRECTIONS = ("minimize", "maximize")


def open_study(
    storage_url: str,
    study_name: str,
    direction: Direction,
    sampler: optuna.samplers.BaseSampler | None,
    pruner: optuna.pruners.BasePruner,
    pruner_name: str,
    pruner_options: dict[str, Any],
) -> optuna.Study:
    """The study in ``storage_url``, created if new, with the pruner the jobs rebuild.

    ``pruner`` is ``build_pruner(pruner_name, pruner_options)``; the name and options are
    what the study records for the jobs.
    """
    try:
        study = optuna.create_study(
            study_name=study_name,
            storage=open_storage(storage_url),
            direction=direction,
            sampler=sampler,
            pruner=pruner,
            load_if_exists=True,
        )
        # The jobs rebuild the pruner from this to ask it whether to go on.
        study.set_user_attr(PRUNER_ATTR, {"name": pruner_name, "options": pruner_options})
    except sqlalchemy.exc.OperationalError as error:
        # Taken by another process between open_storage's check and these writes.
        database = make_url(storage_url).database
        if "database is locked" not in str(error) or not database:
            raise
        raise held_database_error(Path(database).resolve()) from error
    return study


def report(
    study: optuna.Study, metric: str, direction: Direction, sweep_dir: Path
) -> dict[str, Any]:
    """The best trial and the trials' states, written to ``optimization_results.yaml``."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        log.error("no trial of the study completed")
        return {}
    best = study.best_trial
    result = {
        "name": "optuna",
        "metric": metric,
        "direction": direction,
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
