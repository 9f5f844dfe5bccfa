"""``python train.py -m``: grid sweeps, with DDP jobs, with MLflow tracking."""

import csv
import os
import subprocess
import sys

import pytest
import yaml
from mlflow.tracking import MlflowClient

from hydra_plugins.segscale_plugins import parallel_launcher
from segscale import command_line
from segscale.cli.train import main
from segscale.models.nonfinite import EXIT_NONFINITE
from segscale.runs.folder import RunFolderLock
from segscale.training.ranks import launch
from segscale.training.ranks.launch import free_port
from tests.conftest import REPO, tiny_overrides, train_command
from tests.helpers.in_process import run_in_process

ONE_EPOCH = ["trainer.max_epochs=1", "callbacks.validation_report.num_samples=0"]


def multirun(tmp_path, data_root, *args, timeout=300, env=None, own_process=False):
    """``python train.py -m`` in ``tmp_path``: the sweep folder and the process's result.

    In this process (no 9 s of imports) unless ``own_process``: the ranks of a DDP job
    run the program of ``__main__``, which must then be train.py (and rank 0 would be
    this process). For the parallel launcher's jobs, see ``jobs_run_train_py``.
    """
    sweep = tmp_path / "sweep"
    args = ("-m", *tiny_overrides(data_root, None), *ONE_EPOCH, f"hydra.sweep.dir={sweep}", *args)
    if not own_process:
        return sweep, run_in_process(main, *args, cwd=tmp_path, env=env)
    result = subprocess.run(
        train_command(*args),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )
    return sweep, result


def jobs_run_train_py(monkeypatch) -> None:
    """The parallel launcher starts its jobs as train.py, as under ``python train.py -m``.

    It starts each job with the program of ``__main__``: in a sweep run in this process
    (``multirun``), that would be pytest. Replaced where it is defined and in the plugin
    module, which imported it by name: Hydra scans the plugins once a process, running
    their modules again, so the plugin holds the definition's name from before or after
    this test's patch depending on whether an earlier test started Hydra.
    """
    program = [sys.executable, str(REPO / "train.py")]
    monkeypatch.setattr(command_line, "program_command", lambda: program)  # the definition
    monkeypatch.setattr(launch, "program_command", lambda: program)
    monkeypatch.setattr(parallel_launcher, "program_command", lambda: program)


def job_folders(sweep):
    return sorted(p.name for p in sweep.iterdir() if p.is_dir())


@pytest.mark.slow
def test_grid_sweep_writes_one_folder_per_job_a_summary_and_an_mlflow_experiment(
    tiny_data_root, tmp_path
):
    store = tmp_path / "outputs" / "mlflow.db"
    sweep, result = multirun(tmp_path, tiny_data_root, "logger=mlflow", "optimizer.lr=0.01,0.05")
    assert result.returncode == 0, result.stderr[-3000:]
    assert job_folders(sweep) == ["0", "1"]
    with (sweep / "sweep_summary.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [(r["overrides"], r["status"]) for r in rows] == [
        ("optimizer.lr=0.01", "completed"),
        ("optimizer.lr=0.05", "completed"),
    ]
    assert all(float(r["val/mIoU"]) >= 0 and r["best_epoch"] == "0" for r in rows)
    assert (sweep / "sweep_curves.png").is_file()
    # The sweep is one MLflow experiment, each job one run, read back by MLflow itself.
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]
    assert experiment.name == "train-multirun/sweep"
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == ["0", "1"]
    for name, lr in (("0", "0.01"), ("1", "0.05")):
        run = runs[name]
        assert run.info.status == "FINISHED" and run.data.params["optimizer.lr"] == lr
        summary = yaml.safe_load((sweep / name / "summary.json").read_text())
        assert run.data.metrics["val/mIoU"] == summary["metrics"]["val/mIoU"]
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"config", "summary.json", "training_progress.png"} <= artifacts


@pytest.mark.slow
def test_ddp_sweep_trains_each_job_on_two_ranks_with_its_own_value(tiny_data_root, tmp_path):
    sweep, result = multirun(
        tmp_path,
        tiny_data_root,
        "strategy=ddp",
        "trainer.devices=2",
        "optimizer.lr=0.01,0.05",
        timeout=400,
        # A cluster's fixed port: every job's ranks meet on it, one job after another.
        env={"MASTER_PORT": str(free_port())},
        own_process=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # Exactly the two jobs: the ranks did not re-run the sweep into other folders.
    assert job_folders(sweep) == ["0", "1"]
    assert not (tmp_path / "outputs").exists() and not (REPO / "multirun").exists()
    for name, lr in (("0", 0.01), ("1", 0.05)):
        config = yaml.safe_load((sweep / name / ".hydra" / "config.yaml").read_text())
        assert config["optimizer"]["lr"] == lr
        summary = yaml.safe_load((sweep / name / "summary.json").read_text())
        assert summary["world_size"] == 2 and summary["learning_rate"] == lr
        log = (sweep / name / "train.log").read_text()
        assert f"learning_rate={lr}" in log and "world_size=2" in log


def test_a_sweep_over_a_missing_key_stops_before_any_job(tiny_data_root, tmp_path):
    sweep, result = multirun(tmp_path, tiny_data_root, "optimizer.lr=0.01,0.05", "no_such.key=1,2")
    assert result.returncode != 0
    assert "no_such" in result.stderr
    assert not sweep.exists() or job_folders(sweep) == []


def test_a_second_sweep_into_a_live_sweeps_folder_is_refused(tiny_data_root, tmp_path):
    sweep = tmp_path / "sweep"
    # The live sweep, here this process (the lock is exclusive within it too).
    with RunFolderLock(sweep, what="sweep", key="hydra.sweep.dir"):
        _, result = multirun(tmp_path, tiny_data_root, "optimizer.lr=0.01,0.05")
        assert job_folders(sweep) == []  # no job of the second sweep started
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert f"{sweep} is in use by another sweep (pid {os.getpid()}" in output
    assert "hydra.sweep.dir" in output and "Traceback" not in output


def test_an_optuna_search_into_a_live_sweeps_folder_is_refused(tiny_data_root, tmp_path):
    sweep = tmp_path / "sweep"
    space = [
        "hparams_search=optuna",
        "hydra.sweeper.params=null",
        "optimizer.lr=interval(0.005,0.05)",
    ]
    with RunFolderLock(sweep, what="sweep", key="hydra.sweep.dir"):
        _, result = multirun(tmp_path, tiny_data_root, *space, "hydra.sweeper.n_trials=1")
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "is in use by another sweep" in output and not (sweep / "optuna.db").exists()


@pytest.mark.slow
def test_a_job_stopped_by_a_non_finite_loss_fails_the_sweep_in_a_few_lines(
    tiny_data_root, tmp_path
):
    sweep, result = multirun(tmp_path, tiny_data_root, "optimizer.lr=1e6,0.03")
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_NONFINITE, output[-3000:]
    assert "Traceback" not in output and "Error executing job" not in output
    # The other job ran, and the summary says which failed.
    with (sweep / "sweep_summary.csv").open() as file:
        assert [row["status"] for row in csv.DictReader(file)] == ["failed", "completed"]
    # The last lines name the failed job, what set it apart, its folder and why.
    last = output.strip().splitlines()[-2:]
    assert last[0].endswith("1 of 2 job(s) of the sweep failed:")
    assert last[1].startswith(f"  #0 (optimizer.lr=1000000.0, {sweep / '0'}): training stop")
    assert "the loss is not finite" in (sweep / "0" / "train.log").read_text()
