"""How many CPU threads a training process computes with (``training.threads``).

PyTorch's default is one thread per physical core, whatever else runs on them. The
DataLoader workers of the same rank and the other ranks of a DDP job need cores too,
and threads that outnumber the cores they may run on wait for each other at every
parallel region: on a 2-core machine, 2 threads beside a busy worker made a step 4×
slower than 1 thread. So ``auto`` gives each rank its share of the cores this job may
use (its affinity mask), less one per DataLoader worker of the rank, and never below 1.

``OMP_NUM_THREADS`` in the environment, where someone set it (the user, torchrun, the
parallel launcher dividing a machine between jobs), is what ``auto`` takes instead:
the one who set it knows what else runs there. A number in ``training.threads`` wins
over both.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from segscale.devices import cpus_available
from segscale.errors import ConfigError

log = logging.getLogger(__name__)

KEY = "training.threads"


def resolve_threads(
    setting: Any, ranks_per_node: int, workers_per_rank: int, cpus: int | None = None
) -> int:
    """The threads of each training process that ``training.threads`` asks for.

    ``setting`` is ``auto`` or a positive count. ``ranks_per_node`` and
    ``workers_per_rank`` (DataLoader workers) share the ``cpus`` this process may use
    (default: its affinity mask).
    """
    if setting == "auto":
        from_environment = _environment_threads()
        if from_environment is not None:
            return from_environment
        share = (cpus or cpus_available()) // max(1, ranks_per_node)
        return max(1, share - workers_per_rank)
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ConfigError(
            f"{KEY}={setting!r} is not allowed: expected 'auto' or a positive number of "
            "threads per training process"
        )
    return setting


def describe_threads(setting: Any, threads: int, ranks_per_node: int, workers_per_rank: int) -> str:
    """One log line: the threads of each process and where the number came from."""
    if setting != "auto":
        reason = f"{KEY}={setting}"
    elif _environment_threads() is not None:
        reason = f"{KEY}=auto: OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} in the environment"
    else:
        reason = (
            f"{KEY}=auto: {cpus_available()} core(s) available to {ranks_per_node} rank(s) "
            f"on this node, less {workers_per_rank} DataLoader worker(s) each"
        )
    return f"threads: {threads} per training process ({reason})"


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
