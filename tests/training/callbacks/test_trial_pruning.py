import re
import sqlite3
from types import SimpleNamespace

import optuna
import pytest
import torch
from omegaconf import OmegaConf
from optuna.trial import TrialState

from segscale.errors import ConfigError, RunStopped
from segscale.training.callbacks.trial_pruning import (
    PRUNER_ATTR,
    TrialPruned,
    TrialPruning,
    build_pruner,
    open_storage,
    trial_pruning,
)


class FakeStrategy:
    """One rank of a job: what it broadcasts, and what rank 0 would send it."""

    def __init__(self, from_rank0=None):
        self.from_rank0, self.sent = from_rank0, []

    def broadcast(self, obj, src=0):
        self.sent.append(obj)
        return obj if self.from_rank0 is None else self.from_rank0


def fake_trainer(epoch, metrics, rank0=True, from_rank0=None, sanity=False):
    return SimpleNamespace(
        sanity_checking=sanity,
        current_epoch=epoch,
        global_step=4 * (epoch + 1),
        is_global_zero=rank0,
        callback_metrics={k: torch.tensor(v) for k, v in metrics.items()},
        strategy=FakeStrategy(from_rank0),
    )


@pytest.fixture
def running_trial(tmp_path):
    """A study whose pruner stops a trial below 0.5, and its trial 0, running."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    study.set_user_attr(PRUNER_ATTR, {"name": "threshold", "options": {"lower": 0.5}})
    study.ask()
    return study, search_trial(storage)


def search_trial(storage, number=0):
    return OmegaConf.create({"storage": storage, "study_name": "s", "number": number})


def test_rank0_reports_each_validation_and_every_rank_stops_when_pruned(running_trial):
    study, node = running_trial
    callback = trial_pruning(node, "val/mIoU")
    assert isinstance(callback, TrialPruning)
    callback.on_fit_start(fake_trainer(0, {}), None)
    callback.on_validation_end(fake_trainer(0, {"val/mIoU": 0.1}, sanity=True), None)  # skipped
    callback.on_validation_end(fake_trainer(0, {"val/mIoU": 0.7}), None)  # goes on
    trainer = fake_trainer(1, {"val/mIoU": 0.2})
    callback.on_validation_end(trainer, None)
    # Raised at the next hook, once Lightning has logged the validation.
    with pytest.raises(TrialPruned, match="pruned after epoch 1") as stopped:
        callback.on_train_epoch_end(trainer, None)
    assert trainer.strategy.sent == [(True, pytest.approx(0.2), None)]
    assert isinstance(stopped.value, RunStopped) and stopped.value.exit_code == 0
    assert stopped.value.status == "pruned"
    assert stopped.value.details == {
        "trial": 0,
        "epoch": 1,
        "step": 8,
        "value": pytest.approx(0.2),
        "metric": "val/mIoU",
    }
    (trial,) = study.get_trials()
    assert trial.intermediate_values == {0: pytest.approx(0.7), 1: pytest.approx(0.2)}
    # Another rank never opens the study (it does not exist there): it follows rank 0.
    other = trial_pruning(search_trial("sqlite:////no/such/folder/optuna.db"), "val/mIoU")
    assert other is not None
    other.on_fit_start(fake_trainer(0, {}, rank0=False), None)
    follower = fake_trainer(1, {}, rank0=False, from_rank0=(True, 0.2, None))
    other.on_validation_end(follower, None)
    with pytest.raises(TrialPruned):
        other.on_train_batch_start(follower, None, None, 0)
    assert follower.strategy.sent == [None]


def test_outside_a_search_or_with_a_wrong_trial_or_metric_it_says_what_is_wrong(running_trial):
    study, node = running_trial
    assert trial_pruning(OmegaConf.create({"storage": None}), "val/mIoU") is None
    assert trial_pruning(None, "val/mIoU") is None
    with pytest.raises(ConfigError, match=r"search_trial\.number=None"):
        trial_pruning(OmegaConf.create({"storage": "sqlite://", "study_name": "s"}), "x")
    callback = trial_pruning(node, "val/nope")
    assert callback is not None
    callback.on_fit_start(fake_trainer(0, {}), None)
    with pytest.raises(ConfigError, match=r"optimized_metric='val/nope'.*val/mIoU"):
        callback.on_validation_end(fake_trainer(0, {"val/mIoU": 0.7}), None)
    study.tell(0, 0.7)
    finished = trial_pruning(node, "val/mIoU")
    assert finished is not None
    with pytest.raises(ConfigError, match=r"trial 0 of .* is COMPLETE, not RUNNING"):
        finished.on_fit_start(fake_trainer(0, {}), None)
    assert study.get_trials()[0].state == TrialState.COMPLETE
    with pytest.raises(ConfigError, match=r"hydra\.sweeper\.pruner='best'"):
        build_pruner("best")
    with pytest.raises(ConfigError, match=r"pruner_options=\{'warmup': 1\}"):
        build_pruner("median", {"warmup": 1})
    assert isinstance(build_pruner(None), optuna.pruners.NopPruner)


@pytest.mark.slow
def test_a_job_whose_study_another_process_holds_stops_naming_the_file(running_trial, tmp_path):
    _, node = running_trial
    database = tmp_path / "optuna.db"
    holder = sqlite3.connect(database)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(ConfigError, match=re.escape(f"database {database} is locked")):
            trial_pruning(node, "val/mIoU").on_fit_start(fake_trainer(0, {}), None)
    finally:
        holder.close()
    (tmp_path / "not_a_study.db").write_text("a text file\n")
    with pytest.raises(ConfigError, match=r"not_a_study\.db is not an SQLite database"):
        open_storage(f"sqlite:///{tmp_path / 'not_a_study.db'}")
