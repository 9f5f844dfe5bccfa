"""A rank's loading: a loader whose workers start late, each rank's share of an epoch."""

import pytest
from hydra.utils import instantiate

from segscale.data.sampling.loaders import EpochShardSampler, split_in_proportion
from segscale.errors import ConfigError
from tests.helpers.fake_trainer import fake_trainer, restore


@pytest.mark.parametrize("persistent", [False, True])
def test_a_loader_with_workers_iterated_before_the_restore_continues_the_epoch(
    make_config, persistent
):
    cfg = make_config(
        "datamodule.patches_per_image=16",
        "datamodule.num_workers=1",
        f"datamodule.persistent_workers={persistent}",
    )
    datamodule = instantiate(cfg.datamodule, _convert_="all")
    datamodule.check()
    datamodule.setup("fit")
    train_set = datamodule.train_set

    def epoch_keys(epoch: int) -> list[list[list[int]]]:
        """The keys of each batch of an uninterrupted epoch (8 batches of 4)."""
        sampler = EpochShardSampler(len(train_set), [4], seed=datamodule.seed)
        sampler.set_epoch(epoch)
        return [[list(key) for key in batch] for batch in sampler]

    trainer = fake_trainer()
    datamodule.trainer = trainer
    loader = datamodule.train_dataloader()
    # Lightning makes the loader's iterator before it restores the checkpoint (when it
    # counts the schedule's steps) and trains the resumed epoch from that iterator.
    batches = iter(loader)
    restore(trainer, epoch=1, batches_done=3)  # restored: epoch 1, 3 batches done
    assert [batch["key"].tolist() for batch in batches] == epoch_keys(1)[3:]
    # The next epoch starts from its first batch (a persistent worker's too).
    restore(trainer, epoch=2, batches_done=0)
    assert [batch["key"].tolist() for batch in loader] == epoch_keys(2)


def keys(sampler):
    return [key for batch in sampler for key in batch]


@pytest.mark.parametrize("length", [12, 13, 17])
@pytest.mark.parametrize("batch_sizes", [[4], [2, 2], [2, 2, 2], [3, 1], [2, 1, 1]])
def test_ranks_draw_disjoint_shards_of_full_global_batches(length, batch_sizes):
    shards = []
    for rank in range(len(batch_sizes)):
        sampler = EpochShardSampler(length, batch_sizes, rank, shuffle="every-epoch", seed=1)
        sampler.set_epoch(4)
        batches = list(sampler)
        assert len(batches) == len(sampler) == length // sum(batch_sizes)
        # Every step is a full global batch: a last, partial one is left out.
        assert [len(b) for b in batches] == [batch_sizes[rank]] * len(sampler)
        assert all(epoch == 4 for epoch, _ in keys(sampler))
        shards.append([index for _, index in keys(sampler)])
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat)) == len(sampler) * sum(batch_sizes)
    assert set(flat) <= set(range(length))


def test_the_patches_left_over_differ_each_epoch():
    sampler = EpochShardSampler(10, [3], shuffle="every-epoch", seed=2)
    left_over = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        left_over.append(set(range(10)) - {i for _, i in keys(sampler)})
    assert all(len(s) == 1 for s in left_over) and len({min(s) for s in left_over}) > 1
    assert len(EpochShardSampler(3, [2, 2])) == 0


@pytest.mark.parametrize("batch_sizes", [[2, 2], [3, 1], [1, 2, 1]])
def test_global_batches_match_one_process(batch_sizes):
    total = sum(batch_sizes)
    one = list(EpochShardSampler(18, [total], 0, shuffle="every-epoch", seed=7))
    ranks = [
        list(EpochShardSampler(18, batch_sizes, r, shuffle="every-epoch", seed=7))
        for r in range(len(batch_sizes))
    ]
    assert all(len(r) == len(one) for r in ranks)
    for step, single in enumerate(one):
        assert sorted(single) == sorted(k for r in ranks for k in r[step])
        assert [len(r[step]) for r in ranks] == batch_sizes


def test_the_epoch_and_batches_done_are_asked_when_an_epoch_starts():
    where = [(0, 0)]
    sampler = EpochShardSampler(20, [2, 2], 1, seed=3, position=lambda: where[0])
    first = list(sampler)
    sampler.set_epoch(5)  # the position's epoch counts, not set_epoch's
    assert list(sampler) == first
    where[0] = (1, 2)  # asked at the start of the iteration, not when the sampler was made
    sampler.set_epoch(1)
    resumed = list(sampler)
    where[0] = (1, 0)
    second = list(sampler)
    assert resumed == second[2:] and {e for e, _ in keys(sampler)} == {1}
    assert second != first


def test_split_in_proportion_keeps_the_total():
    assert split_in_proportion(10, [2, 1]) == [7, 3]
    assert split_in_proportion(5, [1, 1, 0.5]) == [2, 2, 1]
    assert split_in_proportion(4, [1, 1, 1]) == [2, 1, 1]


def test_epochs_differ_and_seed_reproduces():
    sampler = EpochShardSampler(20, shuffle="every-epoch", seed=3)
    first = keys(sampler)
    sampler.set_epoch(1)
    assert [i for _, i in keys(sampler)] != [i for _, i in first]
    assert keys(EpochShardSampler(20, shuffle="every-epoch", seed=3)) == first
    assert [i for _, i in keys(EpochShardSampler(5, shuffle="never"))] == [0, 1, 2, 3, 4]


def test_once_and_never_repeat_the_same_patches_every_epoch():
    for mode, ordered in (("once", False), ("never", True)):
        sampler = EpochShardSampler(12, shuffle=mode, seed=3)
        first = keys(sampler)
        sampler.set_epoch(5)
        assert keys(sampler) == first  # same keys, so the same patches, in the same order
        assert {epoch for epoch, _ in first} == {0}
        assert ([i for _, i in first] == list(range(12))) == ordered


def test_unknown_shuffle_mode_names_the_key():
    with pytest.raises(ConfigError, match=r"datamodule\.shuffle='sometimes'"):
        EpochShardSampler(4, shuffle="sometimes")
