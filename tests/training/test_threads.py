import os

import pytest
import torch

from segscale.errors import ConfigError
from segscale.training.threads import describe_threads, process_threads, resolve_threads


@pytest.fixture
def no_omp(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_auto_is_the_ranks_share_of_the_cores_less_its_workers(no_omp):
    assert resolve_threads("auto", 1, 1, cpus=2) == 1  # the 2-core machine of the issue
    assert resolve_threads("auto", 1, 3, cpus=16) == 13
    assert resolve_threads("auto", 2, 3, cpus=16) == 5
    assert resolve_threads("auto", 4, 8, cpus=16) == 1  # never below one


def test_auto_reads_the_cores_of_this_processs_affinity_mask(no_omp, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the machine's, not this job's
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)))
    assert resolve_threads("auto", 2, 1) == 2


def test_auto_takes_omp_num_threads_where_it_is_set(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert resolve_threads("auto", 1, 1, cpus=16) == 3
    assert "OMP_NUM_THREADS=3 in the environment" in describe_threads("auto", 3, 1, 1)
    monkeypatch.setenv("OMP_NUM_THREADS", "many")  # not a number: as if unset
    assert resolve_threads("auto", 1, 1, cpus=16) == 15


def test_a_number_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert resolve_threads(5, 1, 1, cpus=2) == 5
    assert describe_threads(5, 5, 1, 1) == "threads: 5 per training process (training.threads=5)"


@pytest.mark.parametrize("setting", [0, -1, 1.5, "two", True, None])
def test_other_settings_are_refused_naming_the_key(setting):
    with pytest.raises(ConfigError, match=r"training\.threads=.*expected 'auto' or a positive"):
        resolve_threads(setting, 1, 1)


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
