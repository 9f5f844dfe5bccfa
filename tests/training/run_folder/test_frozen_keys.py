"""The keys a relaunch may not change, and the changes found in them."""

import pytest

from segscale.training.run_folder.frozen_keys import FROZEN, WORLD_SIZE, frozen_changes
from tests.conftest import compose_config, tiny_overrides


def test_the_world_size_is_counted_not_compared_as_written(make_config):
    started = make_config("trainer.devices=2")
    assert frozen_changes(started, make_config("trainer.devices=[0,1]")) == {}
    assert frozen_changes(started, make_config("trainer.devices=3")) == {
        WORLD_SIZE: ("2 processes", "3 processes")
    }


def test_an_interpolated_key_is_named_once(make_config):
    started = make_config()
    changed = frozen_changes(started, make_config("datamodule/classes=binary", "seed=1"))
    assert "datamodule.num_classes" in changed and "model.num_classes" not in changed
    assert "seed" in changed and "datamodule.seed" not in changed
    assert frozen_changes(started, make_config("optimizer=adam"))["optimizer.solver"] == (
        "'sgdm'",
        "'adam'",
    )


# For every frozen key, an override that changes it and the key the refusal names. Kept
# apart from FROZEN on purpose: a key dropped from that list fails its case here.
CHANGES = {
    "model": ("model.encoder=resnet34", "model.encoder"),
    "datamodule.num_classes": ("datamodule.num_classes=5", "datamodule.num_classes"),
    "datamodule.class_names": ("datamodule.class_names=[a,b,c,d,e,f]", "datamodule.class_names"),
    "datamodule.ignore_index": ("datamodule.ignore_index=7", "datamodule.ignore_index"),
    "datamodule.label_ids": ("datamodule.label_ids=[0,1,2,3,4,6]", "datamodule.label_ids"),
    "datamodule.ignore_ids": ("datamodule.ignore_ids=[9]", "datamodule.ignore_ids"),
    "datamodule.in_channels": ("datamodule.in_channels=4", "datamodule.in_channels"),
    "datamodule.mean": ("datamodule.mean=[0.5,0.5,0.5]", "datamodule.mean"),
    "datamodule.std": ("datamodule.std=[0.5,0.5,0.5]", "datamodule.std"),
    "datamodule.batch_size": ("datamodule.batch_size=3", "datamodule.batch_size"),
    "datamodule.patch_size": ("datamodule.patch_size=96", "datamodule.patch_size"),
    "datamodule.patches_per_image": (
        "datamodule.patches_per_image=5",
        "datamodule.patches_per_image",
    ),
    "datamodule.shuffle": ("datamodule.shuffle=once", "datamodule.shuffle"),
    "datamodule.sampling": ("datamodule.sampling.mode=class_balanced", "datamodule.sampling.mode"),
    "datamodule.seed": ("datamodule.seed=5", "datamodule.seed"),
    "seed": ("seed=5", "seed"),
    "scaling": ("scaling.lr=linear", "scaling.lr"),
    "optimizer._target_": ("optimizer._target_=torch.optim.SGD", "optimizer._target_"),
    "optimizer.solver": ("optimizer.solver=adam", "optimizer.solver"),
    "trainer.accumulate_grad_batches": (
        "trainer.accumulate_grad_batches=2",
        "trainer.accumulate_grad_batches",
    ),
}


def test_every_frozen_key_has_a_change_below():
    assert set(CHANGES) == set(FROZEN)


@pytest.fixture(scope="module")
def started(tiny_data_root, tmp_path_factory):
    """The tiny config, composed once for the module: the run as it was started."""
    return compose_config("train", *tiny_overrides(tiny_data_root, tmp_path_factory.mktemp("r")))


@pytest.mark.parametrize("frozen", list(CHANGES))
def test_a_change_to_each_frozen_key_is_found_and_named(started, make_config, frozen):
    override, named = CHANGES[frozen]
    changes = frozen_changes(started, make_config(override))
    assert named in changes, changes


def test_what_may_change_inside_a_frozen_subtree_is_not_named(make_config):
    assert frozen_changes(make_config(), make_config("model.encoder_weights=imagenet")) == {}
