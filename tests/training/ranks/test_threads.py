import os
import subprocess
import sys
import time

import pytest
import torch

from segscale.configs import compose_config
from segscale.errors import ConfigError
from segscale.platforms import cores
from segscale.training.ranks import threads
from segscale.training.ranks.threads import busy_cores, process_threads, resolve_threads
from tests.helpers.fake_cpus import fake_cgroups, fake_mask, no_launcher, slurm_task


@pytest.fixture(autouse=True)
def alone(monkeypatch, tmp_path):
    """No cgroup quota and no launcher, whatever the machine running the tests has."""
    fake_cgroups(monkeypatch, tmp_path / "cgroup", "0::/\n", {})
    no_launcher(monkeypatch)


@pytest.fixture
def no_omp(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_auto_is_the_ranks_share_of_the_cores_nothing_else_keeps_busy(no_omp):
    # The 2-core machine of issue 30: alone, both cores; beside a spinning process, one.
    assert resolve_threads("auto", 1, 1, cpus=2, busy=0.05).count == 2
    assert resolve_threads("auto", 1, 1, cpus=2, busy=1.02).count == 1
    assert resolve_threads("auto", 1, 1, cpus=2, busy=0.4).count == 2  # under half a core
    assert resolve_threads("auto", 1, 1, cpus=2, busy=0.6).count == 1
    assert resolve_threads("auto", 1, 3, cpus=16, busy=0).count == 16  # workers not counted
    assert resolve_threads("auto", 2, 3, cpus=16, busy=3.9).count == 6  # (16 - 4) // 2
    assert resolve_threads("auto", 4, 8, cpus=16, busy=15).count == 1  # never below one
    assert resolve_threads("auto", 1, 1, cpus=2, busy=7).count == 1


def test_auto_says_what_it_counted(no_omp):
    line = resolve_threads("auto", 1, 1, cpus=2, busy=1.02).describe()
    assert line == (
        "threads: 1 per training process (training.threads=auto: 2 core(s) in its affinity "
        "mask, 1.0 busy with other processes, shared by 1 rank(s) on this node; their 1 "
        "DataLoader worker(s) each are not counted (idle most of a step))"
    )


def test_auto_reads_the_cores_of_this_processs_affinity_mask(no_omp, monkeypatch):
    fake_mask(monkeypatch, 6)  # of a 64-core machine: the job's, not the machine's
    assert resolve_threads("auto", 2, 1, busy=0).count == 3


def test_a_containers_cpu_quota_limits_auto_and_the_log_says_so(no_omp, monkeypatch, tmp_path):
    # A 4-CPU container (docker --cpus=4, a Kubernetes limit) on a 64-core host.
    fake_mask(monkeypatch, 64)
    fake_cgroups(monkeypatch, tmp_path / "v2", "0::/\n", {"cpu.max": "400000 100000\n"})
    chosen = resolve_threads("auto", 1, 2, busy=0)
    assert chosen.count == 4
    assert "64 core(s) in its affinity mask" in chosen.describe()
    assert "limited to 4 by its cgroup's CPU quota (4 core(s))" in chosen.describe()
    assert resolve_threads("auto", 2, 2, busy=0).count == 2  # the ranks share the quota
    assert resolve_threads("auto", 1, 2, busy=62).count == 2  # 2 free cores, quota 4
    fake_cgroups(monkeypatch, tmp_path / "v2", "0::/\n", {"cpu.max": "max 100000\n"})
    assert resolve_threads("auto", 1, 2, busy=0).count == 64


def test_a_cgroup_v1_quota_limits_auto(no_omp, monkeypatch, tmp_path):
    fake_mask(monkeypatch, 16)
    quota = {"cpu/cpu.cfs_quota_us": "250000\n", "cpu/cpu.cfs_period_us": "100000\n"}
    fake_cgroups(monkeypatch, tmp_path / "v1", "3:cpu,cpuacct:/\n", quota)
    assert resolve_threads("auto", 1, 1, busy=0).count == 3  # 2.5 cores, rounded up
    fake_cgroups(monkeypatch, tmp_path / "v1", "3:cpu,cpuacct:/\n", {"cpu/cpu.cfs_quota_us": "-1"})
    assert resolve_threads("auto", 1, 1, busy=0).count == 16


def test_a_quota_below_one_core_gives_one_thread(no_omp, monkeypatch, tmp_path):
    fake_mask(monkeypatch, 8)
    fake_cgroups(monkeypatch, tmp_path / "cg", "0::/job\n", {"job/cpu.max": "50000 100000"})
    assert resolve_threads("auto", 1, 1, busy=0).count == 1
    assert resolve_threads("auto", 4, 1, busy=0).count == 1


def test_a_slurm_rank_computes_on_the_cores_slurm_gave_it(no_omp, monkeypatch):
    # srun --ntasks-per-node=4 --cpus-per-task=8: each task's own 8-core mask.
    slurm_task(monkeypatch, 1, tasks=4, cpus="8")
    fake_mask(monkeypatch, 8)
    chosen = resolve_threads("auto", 4, 7)
    assert chosen.count == 8
    assert "not divided (SLURM started this rank as a task with cores of its own" in (
        chosen.describe()
    )
    # Tasks not bound to their cores each see the whole 32-core allocation.
    fake_mask(monkeypatch, 32)
    assert resolve_threads("auto", 4, 7).count == 8


def test_ranks_that_torchrun_or_slurm_started_agree_without_measuring(no_omp, monkeypatch):
    # Ranks starting side by side each see the others' start-up as busy cores: measured,
    # rank 0 would find 0 busy and rank 1 three. Neither measures, so both take 16 // 2.
    fake_mask(monkeypatch, 16)
    seen = iter([0.0, 3.0])
    monkeypatch.setattr(threads, "busy_cores", lambda: next(seen))
    counts = []
    for rank in (0, 1):
        monkeypatch.setenv("LOCAL_RANK", str(rank))  # torchrun's ranks share its mask
        counts.append(resolve_threads("auto", 2, 1))
    assert [c.count for c in counts] == [8, 8]
    assert "busy cores not measured" in counts[1].describe()
    no_launcher(monkeypatch)
    for rank in (0, 1):
        slurm_task(monkeypatch, rank, tasks=2, cpus="16")
        assert resolve_threads("auto", 2, 1).count == 16


def test_the_ranks_segscale_starts_take_rank_zeros_number(no_omp, monkeypatch):
    # Rank 0 measures once, before any other rank starts, and passes its number down.
    from segscale.training.ranks import launch

    started: list[dict[str, str]] = []

    class Started:
        def __init__(self, commands, envs, cwd):
            started.extend(envs)

        def wait(self):
            pass

    fake_mask(monkeypatch, 8)
    monkeypatch.setattr(threads, "busy_cores", lambda: 2.0)
    monkeypatch.setattr(launch, "RankProcesses", Started)
    monkeypatch.setattr(launch, "rank_command", lambda rank, folder, resolved=None: ["x"])
    decided = resolve_threads("auto", 2, 1)
    assert decided.count == 3  # (8 - 2) // 2
    with process_threads(decided.count), launch.job_ranks("popen", 2, "/runs/a"):
        pass
    (rank_1,) = started
    monkeypatch.setattr(threads, "busy_cores", lambda: 0.0)  # its start-up saw no load
    with monkeypatch.context() as inside:
        for name, value in rank_1.items():
            inside.setenv(name, value)
        assert resolve_threads("auto", 2, 1).count == 3


def test_a_process_spinning_on_a_core_is_measured_busy():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # started and spinning
        assert busy_cores(seconds=0.5) >= 0.7
    finally:
        spinner.kill()
        spinner.wait()


def test_this_processs_own_work_is_not_counted_as_busy(monkeypatch):
    # The counters see all the time as busy, this process's own included; its own time
    # is taken off, so only what remains counts.
    seconds = iter([(0.0, 2.0), (0.4, 2.4)])  # 0.4 s busy of 0.4 s, on the one core
    monkeypatch.setattr(cores, "affinity", lambda: {0})
    monkeypatch.setattr(cores, "core_seconds", lambda cores: next(seconds))
    own = iter([1.0, 1.2])  # 0.2 s of this process's own time in 0.2 s
    monkeypatch.setattr(threads, "_own_seconds", lambda: next(own))
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    assert busy_cores(seconds=0.2) == pytest.approx(0.0)


def test_unreadable_counters_count_nothing_busy(monkeypatch):
    def unreadable(percpu):
        raise FileNotFoundError("/proc/stat")  # a container without /proc

    monkeypatch.setattr(cores.psutil, "cpu_times", unreadable)
    assert busy_cores(seconds=0.01) == 0.0


def test_auto_takes_omp_num_threads_where_it_is_set(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    chosen = resolve_threads("auto", 1, 1, cpus=16, busy=0)
    assert chosen.count == 3
    assert "OMP_NUM_THREADS=3 in the environment" in chosen.describe()
    monkeypatch.setenv("OMP_NUM_THREADS", "many")  # not a number: as if unset
    assert resolve_threads("auto", 1, 1, cpus=16, busy=0).count == 16


def test_a_number_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    chosen = resolve_threads(5, 1, 1, cpus=2)
    assert chosen.count == 5
    assert chosen.describe() == "threads: 5 per training process (training.threads=5)"


@pytest.mark.parametrize("setting", ["0", "-1", "1.5", "two", "true", "null"])
def test_other_settings_are_refused_naming_the_key(setting):
    with pytest.raises(ConfigError, match=r"training\.threads=.*expected 'auto' or a positive"):
        compose_config("train", [f"training.threads={setting}"])


def test_the_threads_are_set_inside_and_restored_after(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    with process_threads(before + 1):
        assert torch.get_num_threads() == before + 1
        assert os.environ["OMP_NUM_THREADS"] == str(before + 1)  # for the ranks it starts
    assert torch.get_num_threads() == before and "OMP_NUM_THREADS" not in os.environ
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    with pytest.raises(RuntimeError), process_threads(1):
        raise RuntimeError("the job failed")
    assert torch.get_num_threads() == before and os.environ["OMP_NUM_THREADS"] == "7"


def test_auto_keeps_what_it_was_made_from_and_a_number_keeps_nothing(no_omp):
    measured = resolve_threads("auto", 2, 1, cpus=8, busy=2.0)
    assert measured.machine is not None and measured.machine.count(0.0) == 4
    assert measured.machine.count(6.0) == 1
    assert resolve_threads(3, 2, 1, cpus=8).machine is None


def test_someone_elses_omp_num_threads_is_kept_and_rank_zeros_share_followed(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's, torchrun's, a launcher's
    assert resolve_threads("auto", 1, 1, cpus=16, busy=0).machine is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    with process_threads(3, follows=True):  # rank 0's measured share, for its ranks
        inherited = resolve_threads("auto", 2, 1, cpus=16)
        assert inherited.count == 3 and inherited.machine is not None
        assert inherited.machine.count(0.0) == 8
        assert "the share rank 0 measured" in inherited.describe()
    assert threads.AUTO_VARIABLE not in os.environ
    with process_threads(3):  # a number: not followed
        assert resolve_threads("auto", 2, 1, cpus=16).machine is None


def test_busy_cores_between_two_readings_leave_the_runs_own_time_out():
    before = threads.CoreTimes(busy=100.0, total=400.0, own=10.0)
    # 10 s on 4 cores: 30 core-seconds busy, 12 of them this rank's own.
    after = threads.CoreTimes(busy=130.0, total=440.0, own=22.0)
    assert threads.busy_between(before, after, 4, ranks=1) == pytest.approx(1.8)
    assert threads.busy_between(before, after, 4, ranks=2) == pytest.approx(0.6)  # 3 - 2 × 1.2
    assert threads.busy_between(after, after, 4, ranks=1) == 0.0


def test_a_reading_counts_the_workers_and_the_children_that_ended(monkeypatch):
    monkeypatch.setattr(cores, "core_seconds", lambda cores: (5.0, 20.0))
    monkeypatch.setattr(threads, "_own_seconds", lambda: 1.0)
    monkeypatch.setattr(cores, "ended_children_seconds", lambda: 2.0)
    worker = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)
        reading = threads.core_times({0}, [worker.pid])
        assert reading is not None and (reading.busy, reading.total) == (5.0, 20.0)
        assert reading.own > 3.2  # this process's 1 s, the ended ones' 2 s, the worker's
    finally:
        worker.kill()
        worker.wait()
    assert threads.core_times({0}, [worker.pid]).own == 3.0  # gone: nothing of its own
