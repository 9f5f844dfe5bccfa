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
    batch. The last step splits what is left in the same proportions; a rank
    that would get none of it gets one fresh padding index (``dataset_len``,
    ``dataset_len + 1``, ...), since DDP needs the same number of steps on every rank.
    So the ranks' shards are disjoint and never repeat. Call ``set_epoch`` before each
    epoch (Lightning does). ``batches_done``, asked when an epoch's iteration starts,
    says how many of its batches were trained already; the iteration leaves them out,
    so a resumed run continues the interrupted epoch where it stopped. (Asked then, not
    when the sampler is made: Lightning makes the training loader before it restores a
    checkpoint, to count the steps a schedule needs, and keeps it.)
    """

    def __init__(
        self,
        dataset_len: int,
        batch_sizes: Sequence[int] = (1,),
        rank: int = 0,
        shuffle: str = "every-epoch",
        seed: int = 0,
        batches_done: Callable[[], int] | None = None,
    ) -> None:
        if not 0 <= rank < len(batch_sizes):
            raise ValueError(f"rank must be in [0, {len(batch_sizes)}), got {rank}")
        if min(batch_sizes) < 1:
            raise ValueError(f"every rank needs a batch of at least 1, got {list(batch_sizes)}")
        if shuffle not in SHUFFLE_MODES:
            raise ConfigError(
                f"datamodule.shuffle={shuffle!r} is unknown: expected one of {list(SHUFFLE_MODES)}"
            )
        self.dataset_len, self.batch_sizes, self.rank = dataset_len, list(batch_sizes), rank
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.batches_done = batches_done

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose keys the next iteration yields."""
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(self.dataset_len / sum(self.batch_sizes))

    def steps(self) -> Iterator[tuple[int, int]]:
        """``(start, size)`` of this rank's slice of the order, for each step of an epoch."""
        global_batch, position = sum(self.batch_sizes), 0
        for step in range(len(self)):
            if step < len(self) - 1:
                sizes = self.batch_sizes
            else:  # what is left, and one padding patch for a rank that would get none
                left = split_in_proportion(self.dataset_len - position, self.batch_sizes)
                sizes = [max(1, size) for size in left]
            yield position + sum(sizes[: self.rank]), sizes[self.rank]
            position += global_batch

    def __iter__(self) -> Iterator[list[Key]]:
        patch_epoch = self.epoch if self.shuffle == "every-epoch" else 0
        if self.shuffle == "never":
            order = np.arange(self.dataset_len)
        else:
            order = np.random.default_rng([self.seed, patch_epoch]).permutation(self.dataset_len)
        skip = min(self.batches_done(), len(self)) if self.batches_done else 0
        for step, (start, size) in enumerate(self.steps()):
            if step < skip:
                continue
            # Positions past the end of the order are the fresh padding indices.
            yield [
                (patch_epoch, int(order[p]) if p < self.dataset_len else p)
                for p in range(start, start + size)
            ]


def batches_done_in_epoch(
    global_step: int, epoch: int, batches_per_epoch: int, accumulate: int
) -> int:
    """Batches of epoch ``epoch`` already trained when a run restarts at ``global_step``."""
    return max(0, global_step * accumulate - epoch * batches_per_epoch)
