"""A rank's DataLoader workers: how many (``num_workers: auto``), and how each one starts."""

from __future__ import annotations

import os

from lightning.fabric.utilities.seed import pl_worker_init_function

from segscale.devices import core_share
from segscale.platforms.cores import cpus_available
from segscale.platforms.processes import end_with_parent
from segscale.platforms.signals import ignore_stop_signals

MAX_AUTO_WORKERS = 8
"""``num_workers: auto`` never starts more workers than this per rank: each holds a copy
of the dataset's Python state, and beyond a few the GPU, not the pipeline, is the limit
(``bench.py`` measures where it lies for a config)."""


def auto_num_workers(ranks_per_node: int, cpus: int | None = None) -> int:
    """DataLoader workers per rank for ``num_workers: auto``: the rank's share of the cores.

    The cores are ``cpus`` (default: ``cpus_available``, the affinity mask within the
    CPU quota), shared as ``core_share`` says (a SLURM task's are its own). One core of
    each share is left to the rank's main process (the training step, and receiving the
    workers' batches); at least one worker, at most ``MAX_AUTO_WORKERS``.
    """
    share = core_share(ranks_per_node).of(cpus or cpus_available())
    return max(1, min(MAX_AUTO_WORKERS, share - 1))


def init_worker(worker_id: int, rank: int = 0) -> None:
    """Set up a DataLoader worker: the signals that stop a run are its main process's.

    A cluster that signals every process of a job (SLURM does), or a console's Ctrl-C
    and Ctrl-Break (which reach every process attached to it), would otherwise end the
    workers, and PyTorch then fails the main process at once, before it can save a
    checkpoint (``segscale.training.ranks.preemption``). So a worker ignores every
    signal that can stop a run on its platform (``segscale.platforms.signals``), and
    is made to end with the process that started it (Linux), however that ends:
    killed, or by the late exit of a stuck preemption. Workers are seeded as Lightning
    seeds them (``seed_everything(workers=True)``); patches are index-addressed anyway.
    """
    ignore_stop_signals()
    end_with_parent()
    if os.environ.get("PL_SEED_WORKERS") == "1":  # what Lightning's own worker_init_fn checks
        pl_worker_init_function(worker_id, rank=rank)
