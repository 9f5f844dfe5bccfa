import csv
import json
import sqlite3
import time

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.segscale_plugins.optuna_sweeper import OptunaSweeper
from segscale.errors import ConfigError
from tests.cli.test_sweeps import job_folders, jobs_run_train_py, multirun
from tests.conftest import compose_for_plugins
from tests.hydra_plugins.test_parallel_launcher import timed_jobs

# The search space on the command line, in place of conf/hparams_search/optuna.yaml's.
SPACE = ["hparams_search=optuna", "hydra.sweeper.params=null", "optimizer.lr=interval(0.005,0.05)"]


def study_of(sweep, name="train"):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{sweep / 'optuna.db'}")


@pytest.mark.slow
def test_a_stopped_search_resumes_to_n_trials_in_all(tiny_data_root, tmp_path):
    sweep, result = multirun(tmp_path, tiny_data_root, *SPACE, "hydra.sweeper.n_trials=1")
    assert result.returncode == 0, result.stderr[-3000:]
    # Stopped while trial 1 was running: the study holds it as RUNNING.
    interrupted = study_of(sweep).ask()
    interrupted.suggest_float("optimizer.lr", 0.005, 0.05)
    sweep, result = multirun(tmp_path, tiny_data_root, *SPACE, "hydra.sweeper.n_trials=2")
    assert result.returncode == 0, result.stderr[-3000:]
    trials = study_of(sweep).get_trials()
    assert [(t.number, t.state) for t in trials] == [(n, TrialState.COMPLETE) for n in range(2)]
    assert trials[1].params == interrupted.params  # the interrupted trial was run again
    assert job_folders(sweep) == ["0", "1"]
    assert (sweep / "optimization_results.yaml").is_file()
    assert (sweep / "sweep_summary.md").read_text().count("| completed |") == 2


def test_a_failed_trial_is_recorded_and_the_search_goes_on(tiny_data_root, tmp_path):
    sweep, result = multirun(
        tmp_path,
        tiny_data_root,
        "hparams_search=optuna",
        "hydra.sweeper.params=null",
        "datamodule.patch_size=choice(9999,64)",
        "hydra.sweeper.sampler._target_=optuna.samplers.BruteForceSampler",
        "hydra.sweeper.n_trials=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    states = {t.params["datamodule.patch_size"]: t.state for t in study_of(sweep).get_trials()}
    assert states == {9999: TrialState.FAIL, 64: TrialState.COMPLETE}


def test_an_empty_search_space_or_a_missing_key_stops_before_any_trial(tmp_path):
    config, context = compose_for_plugins("hparams_search=optuna", f"hydra.sweep.dir={tmp_path}")
    sweeper = OptunaSweeper(params={})
    sweeper.setup(hydra_context=context, task_function=None, config=config)
    with pytest.raises(ConfigError, match="search space is empty"):
        sweeper.sweep([])
    sweeper = OptunaSweeper(params={"no_such.key": "interval(0, 1)"})
    sweeper.setup(hydra_context=context, task_function=None, config=config)
    with pytest.raises(Exception, match="no_such"):
        sweeper.sweep([])
    assert not (tmp_path / "optuna.db").exists()
    with pytest.raises(ConfigError, match=r"hydra\.sweeper\.direction='up'"):
        OptunaSweeper(direction="up")


def test_with_the_parallel_launcher_a_freed_slot_takes_the_next_trial_at_once(
    monkeypatch, tmp_path
):
    # Trial 0 runs until 1, 2, 3 and 4 have taken turns in the other slot (in batches of
    # two, 2 would wait for 0, and 0 would end only after 10 s).
    times = timed_jobs(monkeypatch, {0: None, 1: 0.05, 2: 0.05, 3: 0.05, 4: 0.05})
    config, context = compose_for_plugins(
        "hparams_search=optuna",
        "hydra/launcher=parallel",
        "hydra.launcher.poll_s=0.01",
        f"hydra.sweep.dir={tmp_path}",
    )
    sweeper = OptunaSweeper(params={"optimizer.lr": "interval(0.01, 0.1)"}, n_trials=5, n_jobs=2)
    sweeper.setup(hydra_context=context, task_function=None, config=config)
    result = sweeper.sweep([])
    assert result["trials"]["complete"] == 5
    assert sorted(times) == [0, 1, 2, 3, 4]
    assert all(times[n][1] < times[0][1] for n in (1, 2, 3, 4))  # all while 0 ran
    assert times[0][1] - times[0][0] < 9  # 0 did not wait for its 10 s
    assert job_folders(tmp_path) == ["0", "1", "2", "3", "4"]
    # Trial n's folder has trial n's value: the sweeper told each result to its own trial.
    values = {t.number: t.value for t in study_of(tmp_path, "search").get_trials()}
    assert values == pytest.approx({n: 0.1 * n for n in range(5)})


@pytest.mark.slow
def test_a_trial_in_a_bad_region_is_pruned_before_its_last_epoch(
    tiny_data_root, tmp_path, monkeypatch
):
    jobs_run_train_py(monkeypatch)
    # The sampler's seed makes trial 0 lr=0.05 and trial 1 the far too small lr=1e-7; the
    # median pruner compares trial 1's first validation with trial 0's.
    sweep, result = multirun(
        tmp_path,
        tiny_data_root,
        "hparams_search=optuna",
        "hydra.sweeper.params=null",
        "optimizer.lr=choice(0.05,1e-7)",
        "hydra.sweeper.sampler.seed=10",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.pruner=median",
        "hydra.sweeper.pruner_options={n_startup_trials:1}",
        "hydra/launcher=parallel",
        "hydra.launcher.poll_s=0.05",
        "trainer.max_epochs=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    trials = study_of(sweep).get_trials()
    assert [(t.params["optimizer.lr"], t.state) for t in trials] == [
        (0.05, TrialState.COMPLETE),
        (1e-7, TrialState.PRUNED),
    ]
    assert list(trials[0].intermediate_values) == [0, 1] and list(
        trials[1].intermediate_values
    ) == [0]
    summary = json.loads((sweep / "1" / "summary.json").read_text())
    assert summary["status"] == "pruned" and summary["epochs"] < 2
    with (sweep / "sweep_summary.csv").open() as file:
        rows = {r["job"]: r for r in csv.DictReader(file)}
    assert [rows[j]["status"] for j in "01"] == ["completed", "pruned"]
    assert "search_trial" not in rows["1"]["overrides"]


@pytest.mark.slow
def test_a_database_another_process_holds_is_refused_in_seconds_naming_it(tiny_data_root, tmp_path):
    database = tmp_path / "shared" / "optuna.db"
    database.parent.mkdir()
    optuna.create_study(study_name="other", storage=f"sqlite:///{database}")
    holder = sqlite3.connect(database)  # another search, in the middle of a long write
    holder.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        sweep, result = multirun(
            tmp_path, tiny_data_root, *SPACE, f"hydra.sweeper.storage=sqlite:///{database}"
        )
        took = time.monotonic() - started
    finally:
        holder.rollback()
        holder.close()
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output
    error = [line for line in output.splitlines() if "is locked" in line]
    assert len(error) == 1 and f"database {database} is locked" in error[0], output[-3000:]
    assert "another search (or process) holds it" in error[0]
    assert took < 20
    assert not (sweep / "0").exists()
