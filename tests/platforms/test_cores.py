import os
from collections import namedtuple

import pytest

from segscale.platforms import cores
from tests.helpers.fake_cpus import fake_cgroups, fake_mask

LINUX_TIMES = namedtuple(
    "scputimes", "user nice system idle iowait irq softirq steal guest guest_nice"
)
WINDOWS_TIMES = namedtuple("scputimes", "user system idle interrupt dpc")


def test_busy_time_leaves_out_idle_waiting_and_lower_priority_time(monkeypatch):
    # A niced process (a background build, a batch job) yields its core to the run; the
    # cores outside this process's affinity mask are not its own; a guest's time is
    # inside user and nice already.
    times = [
        LINUX_TIMES(10, 20, 30, 40, 50, 6, 7, 8, 5, 5),
        LINUX_TIMES(1, 1000, 1, 1, 1, 1, 1, 1, 0, 0),
        LINUX_TIMES(99, 99, 99, 99, 99, 99, 99, 99, 0, 0),
    ]
    monkeypatch.setattr(cores.psutil, "cpu_times", lambda percpu: times)
    busy, total = cores.core_seconds({0, 1})
    assert total == (10 + 20 + 30 + 40 + 50 + 6 + 7 + 8) + (1000 + 7)
    assert busy == (10 + 30 + 6 + 7 + 8) + (1 + 1 + 1 + 1 + 1)  # user system irq softirq steal


def test_windows_interrupt_times_are_inside_its_system_time(monkeypatch):
    times = [WINDOWS_TIMES(user=10, system=20, idle=70, interrupt=3, dpc=2)]
    monkeypatch.setattr(cores.psutil, "cpu_times", lambda percpu: times)
    assert cores.core_seconds({0}) == (30, 100)


def test_the_affinity_mask_is_psutils_and_all_cores_where_there_is_none(monkeypatch):
    assert cores.affinity() == os.sched_getaffinity(0)  # Linux: the kernel's mask
    monkeypatch.setattr(cores.psutil.Process, "cpu_affinity", lambda self: [1, 3])  # taskset
    assert cores.affinity() == {1, 3}
    monkeypatch.delattr(cores.psutil.Process, "cpu_affinity")  # as on macOS
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert cores.affinity() == set(range(64))


@pytest.fixture
def cgroups(monkeypatch, tmp_path):
    """``fake_cgroups`` with its mount under this test's folder."""
    return lambda membership, files: fake_cgroups(monkeypatch, tmp_path / "cg", membership, files)


def test_a_cgroup_v2_quota_limits_the_cores_of_the_mask(cgroups, monkeypatch):
    # docker --cpus=4 on a 64-core host: the mask holds all 64.
    fake_mask(monkeypatch, 64)
    cgroups("0::/\n", {"cpu.max": "400000 100000\n"})
    assert cores.cpus_available() == 4  # for the parallel launcher, bench, the test workers
    assert cores.cpu_quota() == 4.0
    cgroups("0::/\n", {"cpu.max": "max 100000\n"})  # no quota
    assert cores.cpu_quota() is None
    assert cores.cpus_available() == 64


def test_a_cgroup_v1_quota_counts_and_minus_one_is_none(cgroups, monkeypatch):
    fake_mask(monkeypatch, 16)
    # Docker on cgroup v1 mounts the container's own cgroup at the mount's root, where
    # /docker/<id> of /proc/self/cgroup is not a folder: its quota is found there.
    membership = "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/docker/abc\n"
    cgroups(membership, {"cpu/cpu.cfs_quota_us": "150000", "cpu/cpu.cfs_period_us": "100000"})
    assert cores.cpu_quota() == 1.5
    assert cores.cpus_available() == 2  # rounded up: the half core is time a thread gets
    cgroups(membership, {"cpu/cpu.cfs_quota_us": "-1"})
    assert cores.cpu_quota() is None and cores.cpus_available() == 16


def test_the_smallest_quota_of_the_cgroup_and_its_ancestors_counts(cgroups, monkeypatch):
    fake_mask(monkeypatch, 64)
    files = {
        "kubepods/cpu.max": "max 100000",
        "kubepods/pod1/cpu.max": "300000 100000",  # the pod's limit
        "kubepods/pod1/c1/cpu.max": "max 100000",  # the container sets none of its own
    }
    cgroups("0::/kubepods/pod1/c1\n", files)
    assert cores.cpu_quota() == 3.0
    cgroups("0::/kubepods/pod1/c1\n", files | {"kubepods/pod1/c1/cpu.max": "800000 100000"})
    assert cores.cpu_quota() == 3.0
    cgroups("0::/kubepods/pod1/c1\n", files | {"kubepods/pod1/c1/cpu.max": "150000 100000"})
    assert cores.cpu_quota() == 1.5


def test_a_quota_below_one_core_still_leaves_one(cgroups, monkeypatch):
    fake_mask(monkeypatch, 8)
    cgroups("0::/\n", {"cpu.max": "20000 100000"})
    assert cores.cpu_quota() == pytest.approx(0.2)
    assert cores.cpus_available() == 1


@pytest.mark.parametrize(
    ("membership", "files"),
    [
        ("0::/../outside\n", {"outside/cpu.max": "100000 100000"}),  # not in this namespace
        ("0::/a\n", {"a/cpu.max": "-100000 100000"}),  # not the kernel's form
        ("0::/a\n", {"a/cpu.max": "100000"}),
        ("0::/a\n", {"a/cpu.max": "1e5 100000"}),
        ("0::/a\n", {"a/cpu.max": "0 100000"}),
        ("0::/a\n", {"a/cpu.max": "100000 0"}),
        ("0::a\n", {"a/cpu.max": "100000 100000"}),  # a path not from the root
        ("1:cpuacct:/a\n", {"cpu/a/cpu.cfs_quota_us": "1", "cpu/a/cpu.cfs_period_us": "1"}),
        ("1:name=cpu:/\n", {"cpu/cpu.cfs_quota_us": "1", "cpu/cpu.cfs_period_us": "1"}),
        ("x:cpu:/\n", {"cpu/cpu.cfs_quota_us": "1", "cpu/cpu.cfs_period_us": "1"}),
        ("1::/a\n", {"a/cpu.max": "100000 100000"}),  # v2 is hierarchy 0
        ("0::/a\n", {"a/cpu.max/x": "a folder, not a file"}),
    ],
)
def test_what_is_not_a_quota_of_this_process_limits_nothing(
    cgroups, monkeypatch, membership, files
):
    fake_mask(monkeypatch, 8)
    cgroups(membership, files)
    assert cores.cpu_quota() is None
    assert cores.cpus_available() == 8


def test_without_cgroups_the_mask_is_all(monkeypatch, tmp_path):
    fake_mask(monkeypatch, 6)
    monkeypatch.setattr(cores, "CGROUP_MEMBERSHIP", tmp_path / "absent")  # not Linux
    assert cores.cpu_quota() is None and cores.cpus_available() == 6
