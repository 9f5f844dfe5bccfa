from types import SimpleNamespace

import pytest
from hydra.utils import instantiate
from lightning.pytorch.accelerators import CPUAccelerator

from segscale.data.samplers import EpochShardSampler


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

    trainer = SimpleNamespace(
        global_step=0,
        current_epoch=0,
        num_training_batches=8,
        accumulate_grad_batches=1,
        global_rank=0,
        world_size=1,
        num_devices=1,
        accelerator=CPUAccelerator(),
    )
    datamodule.trainer = trainer
    loader = datamodule.train_dataloader()
    # Lightning makes the loader's iterator before it restores the checkpoint (when it
    # counts the schedule's steps) and trains the resumed epoch from that iterator.
    batches = iter(loader)
    trainer.global_step, trainer.current_epoch = 11, 1  # restored: epoch 1, after batch 3
    assert [batch["key"].tolist() for batch in batches] == epoch_keys(1)[3:]
    # The next epoch starts from its first batch (a persistent worker's too).
    trainer.global_step, trainer.current_epoch = 16, 2
    assert [batch["key"].tolist() for batch in loader] == epoch_keys(2)
