"""A rank's loading: its workers (how many, how each starts), a late-starting loader, its shard.

A rank's DataLoader workers: how many (``num_workers: auto``), and how each one starts.

A DataLoader that asks its sampler for the epoch's batches when the first batch is asked for.

The batch sampler that hands each rank its own share of an index-addressed epoch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from lightning.fabric.utilities.seed import pl_worker_init_function
from torch.utils.data import DataLoader, Sampler

from segscale.devices import core_share
from segscale.errors import ConfigError
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


class DeferredStartLoader(DataLoader):
    """A ``DataLoader`` whose iteration starts at its first batch, not at ``iter()``.

    A loader with workers starts them and asks its batch sampler for the first
    ``prefetch_factor × num_workers`` batches as soon as ``iter()`` is called (a
    persistent one too, at each epoch's ``iter()``). Lightning calls ``iter()`` on the
    training loader when it makes it, which can be before it restores a checkpoint (it
    makes the loader early to count a schedule's steps) and it keeps that iterator for
    the resumed epoch; a sampler that reads the epoch and the batches already trained
    when its iteration starts (``EpochShardSampler``) would read those of step 0. Here
    the DataLoader's own iterator is made at the first batch, as a loader without
    workers asks its sampler then: with or without workers, a resumed run continues the
    epoch where it stopped.
    """

    # A generator, so that DataLoader.__iter__ runs at the first next(): it returns an
    # iterator of DataLoader's private class, which a generator is not.
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        yield from super().__iter__()


SHUFFLE_MODES = ("every-epoch", "once", "never")

Key = tuple[int, int]
"""``(epoch, index)``: the address of one random patch."""


def split_in_proportion(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split into integers proportional to ``weights`` (largest remainder)."""
    scale = sum(weights)
    exact = [total * w / scale for w in weights]
    shares = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda r: (shares[r] - exact[r], r))
    for rank in by_remainder[: total - sum(shares)]:
        shares[rank] += 1
    return shares


class EpochShardSampler(Sampler[list[Key]]):
    """Yields batches of ``(epoch, index)`` keys: this rank's share of each global batch.

    ``shuffle`` is MATLAB's ``Shuffle``: with ``every-epoch`` each epoch draws fresh
    patches (keys carry the epoch) in a permutation drawn from ``(seed, epoch)``; with
    ``once`` and ``never`` every epoch repeats epoch 0's patches, in one fixed
    permutation or in index order. The order is the same on every rank.

    ``batch_sizes`` holds every rank's batch (they may differ: MATLAB's ``WorkerLoad``).
    Step ``k`` takes the next ``sum(batch_sizes)`` positions of the order, and rank
    ``r`` takes its contiguous slice of them, so the ranks' batches of step ``k``
    together hold exactly the patches of batch ``k`` of one process with the global
    batch, and the ranks' shards are disjoint and never repeat. An epoch is the full
    global batches its patches make: the few left over are not trained that epoch, as
    MATLAB's ``trainNetwork`` discards the last partial mini-batch (a batch of one
    patch stops a network with batch norm, and every rank takes the same steps).

    ``position``, asked when an epoch's iteration starts, gives the epoch and how many
    of its batches were trained already; the iteration leaves those out, so a resumed
    run continues the interrupted epoch where it stopped. (Asked then, not when the
    sampler is made: Lightning makes the training loader, and its iterator, before it
    restores a checkpoint, to count the steps a schedule needs, and keeps both; the
    datamodule's loader, ``DeferredStartLoader``, therefore starts an iteration at its
    first batch, with workers as without. Nor through ``set_epoch``: Lightning calls
    it on a loader's sampler, never on its batch sampler.) Where there is no
    ``position`` (or it gives ``None``: no trainer), ``set_epoch`` selects the epoch
    and no batch is skipped.
    """

    def __init__(
        self,
        dataset_len: int,
        batch_sizes: Sequence[int] = (1,),
        rank: int = 0,
        shuffle: str = "every-epoch",
        seed: int = 0,
        position: Callable[[], tuple[int, int] | None] | None = None,
    ) -> None:
        if not 0 <= rank < len(batch_sizes):
            raise ValueError(f"rank must be in [0, {len(batch_sizes)}), got {rank}")
        if min(batch_sizes) < 1:
            raise ValueError(f"every rank needs a batch of at least 1, got {list(batch_sizes)}")
        if shuffle not in SHUFFLE_MODES:
            raise ConfigError(
                f"datamodule.shuffle={shuffle!r} is unknown: expected one of {list(SHUFFLE_MODES)}"
            )
        self.dataset_len = dataset_len
        self.batch_sizes = list(batch_sizes)
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.position = position

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose keys the next iteration yields (without ``position``)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.dataset_len // sum(self.batch_sizes)

    def __iter__(self) -> Iterator[list[Key]]:
        where = self.position() if self.position else None
        epoch, done = where if where is not None else (self.epoch, 0)
        patch_epoch = epoch if self.shuffle == "every-epoch" else 0
        if self.shuffle == "never":
            order = np.arange(self.dataset_len)
        else:
            order = np.random.default_rng([self.seed, patch_epoch]).permutation(self.dataset_len)
        global_batch, size = sum(self.batch_sizes), self.batch_sizes[self.rank]
        start = sum(self.batch_sizes[: self.rank])  # this rank's slice of each global batch
        for step in range(min(done, len(self)), len(self)):
            first = step * global_batch + start
            yield [(patch_epoch, int(order[p])) for p in range(first, first + size)]
