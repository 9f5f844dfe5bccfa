"""The keys a relaunch may not change, and the changes found in them."""

from segscale.training.run_folder.frozen_keys import WORLD_SIZE, frozen_changes


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
