"""How many CPU threads a training process computes with (``training.threads``).

PyTorch's default is one thread per physical core, whatever else runs on them. Threads
that outnumber the cores free to them wait for each other at every parallel region: on
a 2-core machine beside a process that keeps one core busy, 2 threads trained 1.9×
slower than 1. Threads that leave cores idle lose too: alone on the same machine, 1
thread trained 1.6× slower than 2.

So ``auto`` gives each rank its share of the cores this process may use: those of its
affinity mask that other processes are not keeping busy when the run starts, within its
cgroup's CPU quota (``segscale.platforms.cores.cpus_available``: a container limited to 4 CPUs
on a 64-core host has all 64 in its mask), and never below 1. The busy cores are
measured (the kernel's per-core counters over a fraction of a second, less this
process's own time: ``segscale.platforms.cores``), not assumed. The rank's own
DataLoader workers are not counted against it: they are idle for most of a step
whenever training computes on the CPU (cutting and augmenting a batch of patches takes
milliseconds; training on it, a CPU's hundreds of milliseconds), and on a GPU the
training process's threads are the idle ones.

Only the cores that one launcher gives all its ranks alike are divided among them
(``segscale.devices.core_share``): segscale's own rank 0, ``ddp_spawn`` and torchrun
start their ranks with one mask; SLURM starts each rank as a task with cores of its own
(``--cpus-per-task``), which are not divided again. The ranks of a node agree: the
process that starts the others decides, measuring once before they start, and they
inherit its number through ``OMP_NUM_THREADS``; ranks that torchrun or SLURM started
measure nothing (each would see the others' start-up as busy cores) and so, from the
same mask, quota and grant, reach the same number.

``OMP_NUM_THREADS`` in the environment, where someone set it (the user, torchrun, the
parallel launcher dividing a machine between jobs, rank 0 for the ranks it starts), is
what ``auto`` takes instead: the one who set it knows what else runs there. A number in
``training.threads`` wins over both.

A machine's load changes while a run trains: under ``auto`` the number measured at the
start (``Threads.machine`` says what it was made from) is looked at again during
training (``segscale.training.callbacks.threads_follow_machine``), from the cores' times
between two looks (``CoreTimes``, ``busy_between``) rather than a pause. The ranks
segscale's rank 0 starts follow the machine too: ``AUTO_VARIABLE`` tells them that their
``OMP_NUM_THREADS`` is rank 0's measured share, not a number someone set. A number in
``training.threads``, or ``OMP_NUM_THREADS`` set by anyone else, is never changed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from segscale.devices import CoreShare, core_share
from segscale.platforms import cores as platform_cores
from segscale.training.ranks.launch import started_by_launcher

KEY = "training.threads"

SAMPLE_S = 0.2
"""How long the busy cores are sampled for: 20 clock ticks a core at Linux's 100 Hz."""

AUTO_VARIABLE = "SEGSCALE_THREADS_AUTO"
"""Set beside ``OMP_NUM_THREADS`` (to the same number) when that number is ``auto``'s
measured share: the ranks that inherit it follow the machine as the process that measured
it does."""


@dataclass(frozen=True)
class MachineShare:
    """What ``auto`` divides: this rank's share of its mask's cores, within the quota."""

    mask: int
    """Cores in the affinity mask."""
    quota: float | None
    """The cgroup's CPU quota in cores; ``None``: none."""
    share: CoreShare
    workers_per_rank: int
    """DataLoader workers of each rank (named in the reason only)."""

    def count(self, busy: float | None) -> int:
        """The threads of this rank when other processes keep ``busy`` cores busy."""
        return self.share.of(platform_cores.within_quota(self._free(busy), self.quota))

    def _free(self, busy: float | None) -> int:
        """The mask's cores that ``busy`` other processes leave (``None``: all of them)."""
        # A core counts as taken once another process keeps it busy half the time or more.
        return self.mask - (0 if busy is None else min(self.mask - 1, int(busy + 0.5)))

    def threads(self, busy: float | None) -> Threads:
        """``count(busy)``, and where it came from (``busy`` ``None``: not measured)."""
        free = self._free(busy)
        cores = platform_cores.within_quota(free, self.quota)
        parts = [
            f"{self.mask} core(s) in its affinity mask",
            "busy cores not measured (torchrun or SLURM started this rank: every rank "
            "decides alike)"
            if busy is None
            else f"{busy:.1f} busy with other processes",
        ]
        if self.quota is not None:
            parts.append(
                f"limited to {cores} by its cgroup's CPU quota ({self.quota:g} core(s))"
                if cores < free
                else f"its cgroup's CPU quota ({self.quota:g} core(s)) does not limit them"
            )
        parts.append(self.share.describe())
        return Threads(
            self.count(busy),
            f"{KEY}=auto: {', '.join(parts)}; their {self.workers_per_rank} DataLoader "
            "worker(s) each are not counted (idle most of a step)",
            self,
        )


@dataclass(frozen=True)
class Threads:
    """The threads of each training process, and what the number was made from."""

    count: int
    reason: str
    machine: MachineShare | None = None
    """What ``auto`` made the number from, to decide again as the machine's load changes;
    ``None`` for a number that is kept (``training.threads=N``, someone's ``OMP_NUM_THREADS``)."""

    def describe(self) -> str:
        """One log line: the threads of each process and where the number came from."""
        return f"threads: {self.count} per training process ({self.reason})"


def resolve_threads(
    setting: Any,
    ranks_per_node: int,
    workers_per_rank: int,
    cpus: int | None = None,
    busy: float | None = None,
) -> Threads:
    """The threads of each training process that ``training.threads`` asks for.

    ``setting`` is ``auto`` or a positive count (checked by the schema). Under ``auto``
    (without ``OMP_NUM_THREADS``) this rank takes its share (``core_share(ranks_per_node)``)
    of the ``cpus`` of its affinity mask (default: read) that are not ``busy`` with other
    processes, within its cgroup's CPU quota. ``busy`` defaults to ``busy_cores()``
    measured now, by a process that no launcher started as a rank; a rank that torchrun
    or SLURM started measures nothing. ``workers_per_rank`` (DataLoader workers) only
    appear in the reason.
    """
    if setting != "auto":
        return Threads(int(setting), f"{KEY}={setting}")
    from_environment = _environment_threads()
    mask = cpus or len(platform_cores.affinity())
    if from_environment is not None:
        variable = os.environ["OMP_NUM_THREADS"]
        if os.environ.get(AUTO_VARIABLE) != variable.strip():
            return Threads(
                from_environment, f"{KEY}=auto: OMP_NUM_THREADS={variable} in the environment"
            )
        # Rank 0's measured share, inherited: kept at the start, followed as rank 0 does.
        machine = MachineShare(
            mask, platform_cores.cpu_quota(), core_share(ranks_per_node), workers_per_rank
        )
        return Threads(
            from_environment,
            f"{KEY}=auto: OMP_NUM_THREADS={variable}, the share rank 0 measured",
            machine,
        )
    if busy is None and not started_by_launcher():
        busy = busy_cores()
    quota = platform_cores.cpu_quota()
    return MachineShare(mask, quota, core_share(ranks_per_node), workers_per_rank).threads(busy)


def busy_cores(seconds: float = SAMPLE_S) -> float:
    """How many of this process's cores other processes keep busy, measured for ``seconds``.

    Read from the kernel's per-core time counters (``platform_cores.core_seconds``: psutil's),
    over the cores of the affinity mask only, less this process's own CPU time in the
    same interval; processes at a lower priority (``nice``) are not counted, as they
    yield to the run. 0 where the counters cannot be read: then ``auto`` takes the whole
    share.
    """
    cores = platform_cores.affinity()
    before, own_before = platform_cores.core_seconds(cores), _own_seconds()
    if before is None:
        return 0.0
    time.sleep(seconds)
    after, own_after = platform_cores.core_seconds(cores), _own_seconds()
    if after is None:
        return 0.0
    busy, total = after[0] - before[0], after[1] - before[1]
    if total <= 0:
        return 0.0
    cores_busy = len(cores) * busy / total - (own_after - own_before) / seconds
    return max(0.0, cores_busy)


def _own_seconds() -> float:
    """CPU seconds this process has used (every thread)."""
    times = os.times()
    return times.user + times.system


@dataclass(frozen=True)
class CoreTimes:
    """One reading of the cores' counters and of the run's own CPU time, in seconds."""

    busy: float
    """Busy seconds since boot, summed over the mask's cores."""
    total: float
    """All seconds since boot, summed over the mask's cores."""
    own: float
    """CPU seconds of this rank and its DataLoader workers."""


def core_times(cores: set[int], workers: list[int]) -> CoreTimes | None:
    """The counters of ``cores`` now, with this rank's own time; ``None`` if unreadable.

    The own time is this process's, its ``workers``' (the pids of its live DataLoader
    workers) and that of its children that have ended (workers of an epoch gone: their
    time moves from the live ones to the ended ones, so the sum keeps counting).
    Two file reads (psutil's), no pause.
    """
    counted = platform_cores.core_seconds(cores)
    if counted is None:
        return None
    own = _own_seconds() + platform_cores.ended_children_seconds()
    own += platform_cores.processes_seconds(workers)
    return CoreTimes(counted[0], counted[1], own)


def busy_between(before: CoreTimes, after: CoreTimes, cores: int, ranks: int) -> float:
    """Cores that other processes kept busy between two readings of ``cores`` cores.

    The run's own time is taken off as ``ranks`` times this rank's: the ranks of a node
    that share its cores compute alike (they wait for each other at every step), so
    their time needs no other rank's reading. ``0`` over an empty interval.
    """
    total = after.total - before.total
    if total <= 0:
        return 0.0
    seconds = total / cores  # each core's counters advance with the clock
    busy = cores * (after.busy - before.busy) / total
    return max(0.0, busy - ranks * (after.own - before.own) / seconds)


@contextmanager
def process_threads(threads: int, follows: bool = False) -> Iterator[None]:
    """Compute with ``threads`` threads inside the block; as before after it.

    ``OMP_NUM_THREADS`` is set too, so that the ranks this process starts (and
    ``ddp_spawn``'s fresh interpreters) start with the same number; the next job of a
    sequential sweep starts from what this process had. ``follows``: the number is
    ``auto``'s measured share, which those ranks follow too (``AUTO_VARIABLE``).
    """
    saved_threads = torch.get_num_threads()
    saved = {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", AUTO_VARIABLE)}
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if follows:
        os.environ[AUTO_VARIABLE] = str(threads)
    else:
        os.environ.pop(AUTO_VARIABLE, None)
    try:
        yield
    finally:
        torch.set_num_threads(saved_threads)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _environment_threads() -> int | None:
    """``OMP_NUM_THREADS`` when it holds a positive number, else ``None``."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None
