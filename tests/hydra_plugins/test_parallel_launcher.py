import csv
import json
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser

from hydra_plugins.segscale_plugins.parallel_launcher import ParallelLauncher
from segscale.command_line import quoted_override
from segscale.configs import CONFIG_DIR
from segscale.errors import ConfigError
from tests.cli.test_sweeps import jobs_run_train_py, multirun
from tests.conftest import compose_for_plugins
from tests.helpers.fake_cpus import fake_mask


def process_lifetime(job: Path) -> tuple[datetime, datetime]:
    """When a job's process started and when its run finished, from its summary.json."""
    summary = json.loads((job / "summary.json").read_text())
    assert summary["time_measured_from"] == "process start"
    finished = datetime.fromisoformat(summary["finished_at"])
    return finished - timedelta(seconds=summary["wall_time_s"]), finished


@pytest.mark.slow
def test_two_cpu_jobs_run_at_once_and_a_failing_job_does_not_stop_the_others(
    tiny_data_root, tmp_path, monkeypatch
):
    jobs_run_train_py(monkeypatch)
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
    # The jobs' processes overlapped in time: each ran from its start (its summary's
    # wall time is counted from there) to its finish. Not their fits alone: a tiny job's
    # fit takes a few seconds after ~9 s of imports, and on 2 busy cores one job's imports
    # can end as the other's fit does.
    (start0, end0), (start1, end1) = [process_lifetime(sweep / j) for j in "01"]
    assert start1 < end0 and start0 < end1
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
    fake_mask(monkeypatch, 8)  # of a 64-core machine
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
    assert all(env["PYTHONIOENCODING"] == "utf-8" for env in FakeJob.envs)  # console.log's


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
    sweep = tmp_path / r"D:\sweeps\it's a, b"  # one name here; a Windows path there
    config, context = compose_for_plugins(
        "hydra/launcher=parallel", f"hydra.sweep.dir={quoted_override(str(sweep))}", searchpath
    )
    launcher = ParallelLauncher(cpu_jobs=1, poll_s=0)
    launcher.setup(hydra_context=context, task_function=None, config=config)
    launcher.launch([["trainer.devices=1"]], initial_job_idx=0)
    (command,) = RecordingJob.commands
    assert hydra_values(command)["hydra.run.dir"] == str(sweep / "0")
    # the primary config folder and name, and the user's folder once: a preset there
    # (experiment=mine) composes in the job as it did in the sweep
    assert command[command.index("--config-path") + 1] == CONFIG_DIR
    assert command[command.index("--config-name") + 1] == "train"
    assert command.count(searchpath) == 1


def hydra_values(command: list[str]) -> dict[str, object]:
    """The ``hydra.*`` overrides of a job's command line, as Hydra reads them."""
    overrides = [a for a in command if a.startswith("hydra.")]
    return {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(overrides)}


class TimedJob:
    """A job's process that ends after ``seconds[job number]`` with a summary; keeps times.

    A job of ``None`` seconds ends when every other job has ended (or after 10 s).
    """

    seconds: ClassVar[dict[int, float | None]] = {}
    times: ClassVar[dict[int, list[float]]] = {}

    def __init__(self, command: list[str], env: dict[str, str], **kwargs: object) -> None:
        values = hydra_values(command)
        self.folder = Path(values["hydra.run.dir"])
        self.number = int(values["hydra.job.num"])
        self.returncode: int | None = None
        TimedJob.times[self.number] = [time.perf_counter()]

    def _ended(self) -> bool:
        seconds = self.seconds[self.number]
        if seconds is None:
            others = [n for n in self.seconds if n != self.number]
            if all(len(self.times.get(n, [])) == 2 for n in others):
                return True
            seconds = 10.0
        return time.perf_counter() - self.times[self.number][0] >= seconds

    def poll(self) -> int | None:
        if self.returncode is None and self._ended():
            summary = {"status": "finished", "metrics": {"val/mIoU": 0.1 * self.number}}
            (self.folder / "summary.json").write_text(json.dumps(summary))
            TimedJob.times[self.number].append(time.perf_counter())
            self.returncode = 0
        return self.returncode


def timed_jobs(monkeypatch, seconds):
    """Jobs that take ``seconds[number]``, on a machine without GPUs."""
    from hydra_plugins.segscale_plugins import parallel_launcher

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(parallel_launcher.subprocess, "Popen", TimedJob)
    TimedJob.seconds, TimedJob.times = seconds, {}
    return TimedJob.times


def test_started_jobs_come_back_as_they_end_and_a_freed_slot_starts_the_next(monkeypatch, tmp_path):
    times = timed_jobs(monkeypatch, {0: None, 1: 0.05, 2: 0.05})
    config, context = compose_for_plugins("hydra/launcher=parallel", f"hydra.sweep.dir={tmp_path}")
    launcher = ParallelLauncher(cpu_jobs=2, poll_s=0.01)
    launcher.setup(hydra_context=context, task_function=None, config=config)
    for number in range(3):
        launcher.start([f"optimizer.lr=0.0{number + 1}"], number)
    assert sorted(times) == [0, 1] and launcher.jobs_in_flight == 3  # job 2 waits for a slot
    finished = [launcher.next_finished() for _ in range(3)]
    assert [number for number, _ in finished] == [1, 2, 0]
    assert [result.return_value for _, result in finished] == pytest.approx([0.1, 0.2, 0.0])
    assert times[1][1] <= times[2][0] < times[0][1]  # 2 took 1's slot while 0 still ran
    assert launcher.jobs_in_flight == 0
    with pytest.raises(RuntimeError, match="no job was started"):
        launcher.next_finished()
