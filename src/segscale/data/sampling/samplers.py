"""The batch sampler that hands each rank its own share of an index-addressed epoch."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

from segscale.errors import ConfigError

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
