import csv
import os
from datetime import datetime
from typing import ClassVar

import pytest
import torch

from hydra_plugins.segscale_plugins.parallel_launcher import ParallelLauncher
from segscale.configs import CONFIG_DIR
from segscale.errors import ConfigError
from tests.cli.test_sweeps import multirun
from tests.conftest import compose_for_plugins


@pytest.mark.slow
def test_two_cpu_jobs_run_at_once_and_a_failing_job_does_not_stop_the_others(
    tiny_data_root, tmp_path
):
    # Job 2 asks for patches larger than the images: it fails, 0 and 1 complete.
    sweep, result = multirun(
        tmp_path,
        tiny_data_root,
        "hydra/launcher=parallel",
        "hydra.launcher.cpu_jobs=2",
        "datamodule.patch_size=64,48,9999",
    )
    assert result.returncode != 0  # the sweep reports the failure
    assert "job 2" in result.stderr + result.stdout
    with (sweep / "sweep_summary.csv").open() as file:
        rows = {r["job"]: r for r in csv.DictReader(file)}
    assert [rows[j]["status"] for j in "012"] == ["completed", "completed", "failed"]
    (start0, end0), (start1, end1) = [
        (
            datetime.fromisoformat(rows[j]["started_at"]),
            datetime.fromisoformat(rows[j]["finished_at"]),
        )
        for j in "01"
    ]
    assert start1 < end0 and start0 < end1  # their training overlapped in time
    assert "datamodule.patch_size=9999" in (sweep / "2" / "console.log").read_text()


def test_a_job_that_needs_more_gpus_than_there_are_stops_the_sweep_first(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    config, context = compose_for_plugins(
        "hydra/launcher=parallel", f"hydra.sweep.dir={tmp_path}", "trainer.accelerator=gpu"
    )
    launcher = ParallelLauncher()
    launcher.setup(hydra_context=context, task_function=None, config=config)
    with pytest.raises(ConfigError, match=r"trainer\.devices=2 GPUs, but .* has 1"):
        launcher.launch([["trainer.devices=1"], ["trainer.devices=2"]], initial_job_idx=0)
    assert not any(tmp_path.iterdir())  # no job started
    with pytest.raises(ConfigError, match=r"hydra\.launcher\.gpus=\[3\]"):
        ParallelLauncher(gpus=[3]).gpu_ids()
    with pytest.raises(ConfigError, match=r"hydra\.launcher\.cpu_jobs=0"):
        ParallelLauncher(cpu_jobs=0)


class FakeJob:
    """Stands in for a job's process: keeps its environment, and has failed already."""

    envs: ClassVar[list[dict[str, str]]] = []
    returncode = 1

    def __init__(self, command: list[str], env: dict[str, str], **kwargs: object) -> None:
        FakeJob.envs.append(env)

    def poll(self) -> int:
        return self.returncode


def test_cpu_jobs_share_the_cores_this_process_may_use(monkeypatch, tmp_path):
    from hydra_plugins.segscale_plugins import parallel_launcher

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the machine's, not this sweep's
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(parallel_launcher.subprocess, "Popen", FakeJob)
    FakeJob.envs = []
    config, context = compose_for_plugins(
        "hydra/launcher=parallel", f"hydra.sweep.dir={tmp_path}", "trainer.accelerator=cpu"
    )
    launcher = ParallelLauncher(cpu_jobs=2, poll_s=0)
    launcher.setup(hydra_context=context, task_function=None, config=config)
    launcher.launch([["trainer.devices=2"], ["trainer.devices=1"]], initial_job_idx=0)
    # 8 cores, 2 jobs at once: 4 threads a job, shared by its processes.
    assert [env["OMP_NUM_THREADS"] for env in FakeJob.envs] == ["2", "4"]


class RecordingJob(FakeJob):
    """A failed job, as FakeJob, that also keeps its command line."""

    commands: ClassVar[list[list[str]]] = []

    def __init__(self, command: list[str], env: dict[str, str], **kwargs: object) -> None:
        super().__init__(command, env, **kwargs)
        RecordingJob.commands.append(command)


def test_jobs_load_the_sweeps_config_folders(monkeypatch, tmp_path):
    from hydra_plugins.segscale_plugins import parallel_launcher

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(parallel_launcher.subprocess, "Popen", RecordingJob)
    RecordingJob.commands = []
    searchpath = f"hydra.searchpath=[file://{tmp_path / 'myconf'}]"
    config, context = compose_for_plugins(
        "hydra/launcher=parallel", f"hydra.sweep.dir={tmp_path}", searchpath
    )
    launcher = ParallelLauncher(cpu_jobs=1, poll_s=0)
    launcher.setup(hydra_context=context, task_function=None, config=config)
    launcher.launch([["trainer.devices=1"]], initial_job_idx=0)
    (command,) = RecordingJob.commands
    # the primary config folder and name, and the user's folder once: a preset there
    # (experiment=mine) composes in the job as it did in the sweep
    assert command[command.index("--config-path") + 1] == CONFIG_DIR
    assert command[command.index("--config-name") + 1] == "train"
    assert command.count(searchpath) == 1
