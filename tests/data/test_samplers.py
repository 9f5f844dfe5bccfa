import pytest

from segscale.checks import ConfigError
from segscale.data.samplers import EpochShardSampler


@pytest.mark.parametrize("length", [12, 13])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_draw_disjoint_equal_shards(length, world):
    shards = []
    for rank in range(world):
        sampler = EpochShardSampler(length, world, rank, shuffle="every-epoch", seed=1)
        sampler.set_epoch(4)
        shards.append([index for epoch, index in sampler])
        assert all(epoch == 4 for epoch, _ in sampler)
    assert len({len(s) for s in shards}) == 1
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat))
    assert set(range(length)) <= set(flat)


def test_global_batches_match_one_process():
    one = [i for _, i in EpochShardSampler(16, 1, 0, shuffle="every-epoch", seed=7)]
    ranks = [
        [i for _, i in EpochShardSampler(16, 2, r, shuffle="every-epoch", seed=7)] for r in range(2)
    ]
    batch = 2  # per rank; the single process uses 4
    for step in range(4):
        single = set(one[4 * step : 4 * step + 4])
        window = slice(batch * step, batch * step + batch)
        split = set(ranks[0][window]) | set(ranks[1][window])
        assert single == split


def test_epochs_differ_and_seed_reproduces():
    sampler = EpochShardSampler(20, shuffle="every-epoch", seed=3)
    first = list(sampler)
    sampler.set_epoch(1)
    assert [i for _, i in sampler] != [i for _, i in first]
    assert list(EpochShardSampler(20, shuffle="every-epoch", seed=3)) == first
    assert [i for _, i in EpochShardSampler(5, shuffle="never")] == [0, 1, 2, 3, 4]


def test_once_and_never_repeat_the_same_patches_every_epoch():
    for mode, ordered in (("once", False), ("never", True)):
        sampler = EpochShardSampler(12, shuffle=mode, seed=3)
        first = list(sampler)
        sampler.set_epoch(5)
        assert list(sampler) == first  # same keys, so the same patches, in the same order
        assert {epoch for epoch, _ in first} == {0}
        assert ([i for _, i in first] == list(range(12))) == ordered


def test_unknown_shuffle_mode_names_the_key():
    with pytest.raises(ConfigError, match=r"datamodule\.shuffle='sometimes'"):
        EpochShardSampler(4, shuffle="sometimes")
