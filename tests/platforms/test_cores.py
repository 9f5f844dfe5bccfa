import os
from collections import namedtuple

from segscale.platforms import cores

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
