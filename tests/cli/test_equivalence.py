"""DDP over 2 ranks × batch b equals one process × batch 2b (docs/architecture.md).

And with uneven devices (``scaling.worker_load``): 2 ranks with batches 4 and 2 equal
one process with batch 6.
"""

from pathlib import Path

import pytest
import torch

from segscale.training.run.training_run import train

# No rotation or translation: no ignored pixels, so every patch weighs the same in the
# loss on one process and on two ranks. No dropout: per-rank masks cannot match. Float64:
# in float32 this untrained network's gradient on flat synthetic patches is sensitive to
# the order of summation at the 1e-2 level, whatever the batch split; in float64 one
# process and two ranks agree to 1e-9 (measured), so a real difference cannot hide.
SAME_STEPS = [
    "trainer.precision=64-true",
    "datamodule.augmentation.rotation=[0,0]",
    "datamodule.augmentation.translate_x=[0,0]",
    "datamodule.augmentation.translate_y=[0,0]",
    "+model.decoder_aspp_dropout=0.0",
    "datamodule.patches_per_image=8",  # 16 patches an epoch: 2 steps of 8
    "trainer.max_epochs=2",
]
PATCHES = 16
"""Patches an epoch: 2 tiles × 8."""


def final_weights(
    make_config, run: Path, *overrides: str, global_batch: int = 8
) -> dict[str, torch.Tensor]:
    """The floating-point weights after training in the run folder ``run`` (one per run)."""
    summary = train(make_config(*SAME_STEPS, *overrides, f"output_dir={run}"))
    assert summary["global_batch_size"] == global_batch
    assert summary["steps"] == 2 * (PATCHES // global_batch)  # a partial batch is left out
    state = torch.load(summary["last_checkpoint"], map_location="cpu", weights_only=True)
    return {k: v for k, v in state["state_dict"].items() if v.is_floating_point()}


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.slow
def test_ddp_with_synced_batchnorm_takes_the_same_steps_as_one_process(make_config, tmp_path):
    one = final_weights(make_config, tmp_path / "one", "strategy=single", "datamodule.batch_size=8")
    two = final_weights(
        make_config,
        tmp_path / "two",
        "strategy=ddp_spawn",
        "trainer.devices=2",
        "datamodule.batch_size=4",
    )
    assert one.keys() == two.keys()
    assert largest_difference(one, two) < 1e-6
    # The test has power: without synchronized batch norm the runs part ways.
    unsynced = final_weights(
        make_config,
        tmp_path / "unsynced",
        "strategy=ddp_spawn",
        "trainer.devices=2",
        "datamodule.batch_size=4",
        "training.sync_batchnorm=false",
    )
    assert largest_difference(one, unsynced) > 1e-3


CLASS_BALANCED = [
    "datamodule.sampling.mode=class_balanced",
    "datamodule.sampling.p=0.8",
    "datamodule.sampling.class_weights=inverse_frequency",
]


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [[], CLASS_BALANCED], ids=["uniform", "class_balanced"])
def test_uneven_worker_load_takes_the_same_steps_as_one_process(make_config, tmp_path, sampling):
    # Rotation on: patches carry ignored corners, so the ranks' batches differ in
    # labelled pixels as well as in size; the loss must weigh them as one batch does.
    # Class-balanced sampling draws each patch's class and tile from (seed, epoch,
    # index) too, so the ranks' patches are still those of one process.
    uneven = ["datamodule.augmentation.rotation=[-40,40]", "datamodule.batch_size=6", *sampling]
    one = final_weights(make_config, tmp_path / "one", *uneven, "strategy=single", global_batch=6)
    two = final_weights(
        make_config,
        tmp_path / "two",
        *uneven,
        "strategy=ddp_spawn",
        "trainer.devices=2",
        "scaling.batch=global",
        "scaling.worker_load=[2,1]",
        global_batch=6,
    )
    assert largest_difference(one, two) < 1e-6
