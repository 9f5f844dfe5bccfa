"""A DataLoader that asks its sampler for the epoch's batches when the first batch is asked for."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader


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
