"""What differs in CPU cores: those this process may use, their times, its cgroups' quota.

``cpus_available`` is the one count of the cores this process may use (its mask within
its quota), for the thread and worker counts, the parallel launcher and bench.

- The affinity mask (what SLURM, cpusets, ``taskset`` and Windows' ``start /affinity``
  narrow): psutil's, on Linux and Windows; macOS has none, so every core counts.
- Per-core times (how busy the cores are): psutil's, from ``/proc/stat`` on Linux, the
  kernel's counters on macOS and Windows. psutil lists the online cores in order, so
  core *i* is the *i*-th online one: the mask's numbers where every core is online.
- Processes' CPU times (a run's DataLoader workers, its children that ended): psutil's
  and ``os.times``' (Windows keeps no ended children's times: 0 there).
- The CPU quota of a container or a batch system: cgroups, on Linux only (elsewhere
  there are no files to read, and no quota).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import psutil

CGROUP_MEMBERSHIP = Path("/proc/self/cgroup")
"""This process's cgroup in each hierarchy (``ID:controllers:/path`` lines)."""

CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where the cgroups are mounted: cgroup v2's hierarchy, and v1's ``cpu`` controller in ``cpu/``."""

FREE_TIMES = ("idle", "iowait", "nice")
"""Times a core is free for a run: idle, waiting for the disk, or running a process at a
lower priority (``nice`` > 0: it yields its core to the run's threads)."""
COUNTED_TWICE = ("guest", "guest_nice", "interrupt", "dpc")
"""Times already inside others: Linux's guests in user and nice, Windows' interrupts and
deferred calls in system."""


def affinity() -> set[int]:
    """The cores this process may run on (all the machine's where the system has no mask)."""
    process = psutil.Process()
    if hasattr(process, "cpu_affinity"):  # not on macOS
        return set(process.cpu_affinity() or ())
    return set(range(os.cpu_count() or 1))


def cpus_available() -> int:
    """CPU cores this process may use: its affinity mask within its cgroup's CPU quota.

    The affinity mask is what SLURM, cpusets and ``taskset`` narrow; a CPU quota (docker
    ``--cpus``, Kubernetes CPU limits) leaves the mask whole and caps the CPU time instead
    (``cpu_quota``). A fractional quota counts rounded up (as loky's ``cpu_count`` and the
    JVM count it), and never below one core.
    """
    return within_quota(len(affinity()), cpu_quota())


def within_quota(cores: int, quota: float | None) -> int:
    """The ``cores`` that a CPU ``quota`` (in cores; ``None``: none) leaves, at least 1."""
    # Rounded up: the fraction of a core is time a thread still gets.
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def core_seconds(cores: set[int]) -> tuple[float, float] | None:
    """Busy and total seconds since boot, summed over ``cores``; ``None`` if unreadable."""
    try:
        times = psutil.cpu_times(percpu=True)
    except (OSError, psutil.Error):  # no /proc (a container without it)
        return None
    busy = total = 0.0
    for core, fields in enumerate(times):
        if core not in cores:
            continue
        counted = {
            name: value for name, value in fields._asdict().items() if name not in COUNTED_TWICE
        }
        core_total = sum(counted.values())
        total += core_total
        busy += core_total - sum(counted.get(name, 0.0) for name in FREE_TIMES)
    return busy, total


def processes_seconds(pids: list[int]) -> float:
    """CPU seconds (user and system) that the live processes ``pids`` have used.

    A process that ended meanwhile counts nothing (``ended_children_seconds`` has it once
    its parent has reaped it).
    """
    seconds = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except (OSError, psutil.Error):  # gone, or not ours to read
            continue
        seconds += times.user + times.system
    return seconds


def ended_children_seconds() -> float:
    """CPU seconds of this process's children that ended and were reaped (0 on Windows)."""
    times = os.times()
    return times.children_user + times.children_system


def cpu_quota() -> float | None:
    """The cores' worth of CPU time this process's cgroups allow; ``None`` without a quota.

    cgroup v2's ``cpu.max`` (``QUOTA PERIOD`` or ``max PERIOD``), cgroup v1's
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: none). A quota set on an ancestor
    cgroup limits this one too, so every cgroup from this process's own up to the root
    is read and the smallest quota counts. Read here rather than through joblib's
    ``cpu_count`` (not a dependency), which reads the root of the mount only: it sees a
    container's own quota, but not one on this process's cgroup seen from the host
    (systemd's ``CPUQuota=``, a batch system's) or on a cgroup above it. psutil reads no
    cgroups. Without cgroups (macOS, Windows, no ``/proc``): ``None``.
    """
    quotas = [q for d, v2 in _cgroup_directories() if (q := _quota_in(d, v2)) is not None]
    return min(quotas, default=None)


def _cgroup_directories() -> Iterator[tuple[Path, bool]]:
    """The CPU-controlling cgroup directories of this process and of its ancestors.

    Yields ``(directory, is_v2)``, the process's own first. A cgroup path outside this
    cgroup namespace (``/../x``) names no directory here and is skipped.
    """
    try:
        lines = CGROUP_MEMBERSHIP.read_text(encoding="utf-8").splitlines()
    except OSError:
        return
    for line in lines:
        match = re.fullmatch(r"([0-9]+):([^:]*):(/.*)", line)
        if match is None:
            continue
        hierarchy, controllers, path = match.groups()
        if hierarchy == "0" and controllers == "":
            mount, v2 = CGROUP_ROOT, True
        elif "cpu" in controllers.split(","):
            mount, v2 = CGROUP_ROOT / "cpu", False
        else:
            continue
        parts = PurePosixPath(path).parts[1:]
        if ".." in parts:
            continue
        for depth in range(len(parts), -1, -1):
            yield mount.joinpath(*parts[:depth]), v2


def _quota_in(directory: Path, v2: bool) -> float | None:
    """The CPU quota set on the cgroup ``directory``, in cores; ``None`` if none or unreadable."""
    try:
        if v2:
            text = (directory / "cpu.max").read_text(encoding="utf-8")
            quota, _, period = text.strip().partition(" ")
        else:
            quota = (directory / "cpu.cfs_quota_us").read_text(encoding="utf-8").strip()
            period = (directory / "cpu.cfs_period_us").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    # Only the kernel's forms count: "max" or -1 (no quota), anything else unreadable, is none.
    if not (re.fullmatch("[0-9]+", quota) and re.fullmatch("[0-9]+", period)):
        return None
    return int(quota) / int(period) if int(quota) > 0 and int(period) > 0 else None
