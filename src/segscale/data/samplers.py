"""Samplers that hand each rank its own shard of an index-addressed epoch."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler

from segscale.checks import ConfigError

SHUFFLE_MODES = ("every-epoch", "once", "never")


class EpochShardSampler(Sampler[tuple[int, int]]):
    """Yields ``(epoch, index)`` keys: this rank's share of one epoch's patches.

    ``shuffle`` is MATLAB's ``Shuffle``: with ``every-epoch`` each epoch draws fresh
    patches (keys carry the epoch) in a permutation drawn from ``(seed, epoch)``; with
    ``once`` and ``never`` every epoch repeats epoch 0's patches, in one fixed
    permutation or in index order. The order is the same on every rank. It is padded
    with the fresh indices ``dataset_len, dataset_len + 1, ...`` to a multiple of
    ``num_replicas``, and rank ``r`` takes positions ``r, r + N, r + 2N, ...``. So the
    ranks' shards are disjoint, never repeat, and have equal length (DDP needs the same
    number of steps on every rank), and the ``k``-th global batch of ``N`` ranks × ``b``
    holds the same patches as the ``k``-th batch of size ``N·b`` on one process. Call
    ``set_epoch`` before each epoch (Lightning does). ``skip(n)`` makes the next
    iteration leave out the first ``n`` keys of the shard: a resumed run continues the
    interrupted epoch where it stopped.
    """

    def __init__(
        self,
        dataset_len: int,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: str = "every-epoch",
        seed: int = 0,
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}), got {rank}")
        if shuffle not in SHUFFLE_MODES:
            raise ConfigError(
                f"datamodule.shuffle={shuffle!r} is unknown: expected one of {list(SHUFFLE_MODES)}"
            )
        self.dataset_len, self.num_replicas, self.rank = dataset_len, num_replicas, rank
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self._skip = 0

    def skip(self, count: int) -> None:
        """Leave out the first ``count`` keys of the next iteration only."""
        self._skip = count

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose keys the next iteration yields."""
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(self.dataset_len / self.num_replicas)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        total = len(self) * self.num_replicas
        patch_epoch = self.epoch if self.shuffle == "every-epoch" else 0
        if self.shuffle == "never":
            order = np.arange(self.dataset_len)
        else:
            order = np.random.default_rng([self.seed, patch_epoch]).permutation(self.dataset_len)
        order = np.concatenate([order, np.arange(self.dataset_len, total)])
        start, self._skip = self.rank + self._skip * self.num_replicas, 0
        for position in range(start, total, self.num_replicas):
            yield patch_epoch, int(order[position])
