import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.segscale_plugins.optuna_sweeper import OptunaSweeper
from segscale.errors import ConfigError
from tests.cli.test_sweeps import job_folders, multirun
from tests.conftest import compose_for_plugins

# The search space on the command line, in place of conf/hparams_search/optuna.yaml's.
SPACE = ["hparams_search=optuna", "hydra.sweeper.params=null", "optimizer.lr=interval(0.005,0.05)"]


def study_of(sweep):
    return optuna.load_study(study_name="train", storage=f"sqlite:///{sweep / 'optuna.db'}")


@pytest.mark.slow
def test_a_stopped_search_resumes_to_n_trials_in_all(tiny_data_root, tmp_path):
    sweep, result = multirun(tmp_path, tiny_data_root, *SPACE, "hydra.sweeper.n_trials=2")
    assert result.returncode == 0, result.stderr[-3000:]
    # Stopped while trial 2 was running: the study holds it as RUNNING.
    interrupted = study_of(sweep).ask()
    interrupted.suggest_float("optimizer.lr", 0.005, 0.05)
    sweep, result = multirun(tmp_path, tiny_data_root, *SPACE, "hydra.sweeper.n_trials=3")
    assert result.returncode == 0, result.stderr[-3000:]
    trials = study_of(sweep).get_trials()
    assert [(t.number, t.state) for t in trials] == [(n, TrialState.COMPLETE) for n in range(3)]
    assert trials[2].params == interrupted.params  # the interrupted trial was run again
    assert job_folders(sweep) == ["0", "1", "2"]
    assert (sweep / "optimization_results.yaml").is_file()
    assert (sweep / "sweep_summary.md").read_text().count("| completed |") == 3


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
