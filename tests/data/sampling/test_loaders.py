import pytest
from hydra.utils import instantiate

from segscale.data.sampling.samplers import EpochShardSampler
from tests.data.fake_trainer import fake_trainer, restore


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
