"""How many CPU threads a training process computes with (``training.threads``).

PyTorch's default is one thread per physical core, whatever else runs on them. Threads
that outnumber the cores free to them wait for each other at every parallel region: on
a 2-core machine beside a process that keeps one core busy, 2 threads trained 1.9×
slower than 1. Threads that leave cores idle lose too: alone on the same machine, 1
thread trained 1.6× slower than 2.

So ``auto`` gives each rank its share of the cores this process may use: those of its
affinity mask that other processes are not keeping busy when the run starts, within its
cgroup's CPU quota (``segscale.devices.cpus_available``: a container limited to 4 CPUs
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
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from segscale.devices import CoreShare, affinity_cores, core_share, within_quota
from segscale.errors import ConfigError
from segscale.platforms import cores as platform_cores
from segscale.training.ranks.launch import started_by_launcher

KEY = "training.threads"

SAMPLE_S = 0.2
"""How long the busy cores are sampled for: 20 clock ticks a core at Linux's 100 Hz."""


@dataclass(frozen=True)
class Threads:
    """The threads of each training process, and what the number was made from."""

    count: int
    reason: str

    def describe(self) -> str:
        """One log line: the threads of each process and where the number came from."""
        return f"threads: {self.count} per training process ({self.reason})"


def check_threads_setting(setting: Any) -> None:
    """Raise ``ConfigError`` unless ``setting`` is ``auto`` or a positive count."""
    if setting == "auto":
        return
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ConfigError(
            f"{KEY}={setting!r} is not allowed: expected 'auto' or a positive number of "
            "threads per training process"
        )


def resolve_threads(
    setting: Any,
    ranks_per_node: int,
    workers_per_rank: int,
    cpus: int | None = None,
    busy: float | None = None,
) -> Threads:
    """The threads of each training process that ``training.threads`` asks for.

    ``setting`` is ``auto`` or a positive count. Under ``auto`` (without
    ``OMP_NUM_THREADS``) this rank takes its share (``core_share(ranks_per_node)``) of the
    ``cpus`` of its affinity mask (default: read) that are not ``busy`` with other
    processes, within its cgroup's CPU quota. ``busy`` defaults to ``busy_cores()``
    measured now, by a process that no launcher started as a rank; a rank that torchrun
    or SLURM started measures nothing. ``workers_per_rank`` (DataLoader workers) only
    appear in the reason.
    """
    check_threads_setting(setting)
    if setting != "auto":
        return Threads(int(setting), f"{KEY}={setting}")
    from_environment = _environment_threads()
    if from_environment is not None:
        return Threads(
            from_environment,
            f"{KEY}=auto: OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} in the environment",
        )
    mask = cpus or affinity_cores()
    if busy is None and not started_by_launcher():
        busy = busy_cores()
    quota = platform_cores.cpu_quota()
    return _auto_threads(mask, busy, quota, core_share(ranks_per_node), workers_per_rank)


def _auto_threads(
    mask: int, busy: float | None, quota: float | None, share: CoreShare, workers_per_rank: int
) -> Threads:
    """The threads of ``auto``, and where they came from.

    This rank's ``share`` of the ``mask``'s cores less the ``busy`` ones (``None``: not
    measured), within the CPU ``quota``.
    """
    # A core counts as taken once another process keeps it busy half the time or more.
    free = mask - (0 if busy is None else min(mask - 1, int(busy + 0.5)))
    cores = within_quota(free, quota)
    parts = [
        f"{mask} core(s) in its affinity mask",
        "busy cores not measured (torchrun or SLURM started this rank: every rank decides alike)"
        if busy is None
        else f"{busy:.1f} busy with other processes",
    ]
    if quota is not None:
        parts.append(
            f"limited to {cores} by its cgroup's CPU quota ({quota:g} core(s))"
            if cores < free
            else f"its cgroup's CPU quota ({quota:g} core(s)) does not limit them"
        )
    parts.append(share.describe())
    return Threads(
        share.of(cores),
        f"{KEY}=auto: {', '.join(parts)}; their {workers_per_rank} DataLoader worker(s) "
        "each are not counted (idle most of a step)",
    )


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


@contextmanager
def process_threads(threads: int) -> Iterator[None]:
    """Compute with ``threads`` threads inside the block; as before after it.

    ``OMP_NUM_THREADS`` is set too, so that the ranks this process starts (and
    ``ddp_spawn``'s fresh interpreters) start with the same number; the next job of a
    sequential sweep starts from what this process had.
    """
    saved_threads, saved_variable = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved_threads)
        if saved_variable is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved_variable


def _environment_threads() -> int | None:
    """``OMP_NUM_THREADS`` when it holds a positive number, else ``None``."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None
