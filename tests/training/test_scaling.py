import math

import pytest

from segscale.checks import ConfigError
from segscale.cli.train import train
from segscale.training.scaling import ScalingRules


def test_per_device_batches_grow_the_global_batch():
    effective = ScalingRules("per_device", "linear", base_batch_size=8).resolve(8, 0.01, 4)
    assert (effective.per_device_batch_size, effective.global_batch_size) == (8, 32)
    assert effective.learning_rate == pytest.approx(0.04) and effective.warmup_epochs == 1.0


def test_a_global_batch_is_split_across_devices():
    effective = ScalingRules("global", "sqrt", base_batch_size=4).resolve(16, 0.01, 2)
    assert (effective.per_device_batch_size, effective.global_batch_size) == (8, 16)
    assert effective.learning_rate == pytest.approx(0.02)
    with pytest.raises(ConfigError, match=r"datamodule\.batch_size=10 .*3 devices"):
        ScalingRules("global").resolve(10, 0.01, 3)


def test_no_rule_keeps_the_rate_and_adds_no_warmup():
    effective = ScalingRules("per_device", "none").resolve(8, 0.03, 2)
    assert effective.learning_rate == 0.03 and effective.lr_scale == 1.0
    assert effective.warmup_epochs == 0.0
    explicit = ScalingRules("per_device", "linear", 8, warmup_epochs=0).resolve(8, 0.03, 2)
    assert explicit.warmup_epochs == 0 and math.isclose(explicit.learning_rate, 0.06)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"batch": "total"}, "scaling.batch"),
        ({"lr": "cubic"}, "scaling.lr"),
        ({"base_batch_size": 0}, "scaling.base_batch_size"),
        ({"warmup_epochs": -1}, "scaling.warmup"),
    ],
)
def test_bad_rules_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        ScalingRules(**kwargs)


@pytest.mark.parametrize(
    ("devices", "batch", "per_device", "global_batch", "lr"),
    [
        (1, "per_device", 4, 4, 0.03),
        (1, "global", 4, 4, 0.03),
        (2, "per_device", 4, 8, 0.06),
        (2, "global", 2, 4, 0.03),
    ],
)
def test_the_running_objects_get_what_the_rules_say(
    make_config, devices, batch, per_device, global_batch, lr
):
    strategy = "single" if devices == 1 else "ddp_spawn"
    summary = train(
        make_config(
            f"strategy={strategy}",
            f"trainer.devices={devices}",
            f"scaling.batch={batch}",
            "scaling.lr=linear",
            "scaling.base_batch_size=4",
            "trainer.max_epochs=1",
        )
    )
    # Read back from the running DataLoader and optimizer by RunSummary, on rank 0.
    assert summary["world_size"] == devices
    assert summary["per_device_batch_size"] == per_device
    assert summary["global_batch_size"] == global_batch
    assert summary["learning_rate"] == pytest.approx(lr)
    assert summary["scaling"]["warmup_epochs"] == (1.0 if lr > 0.03 else 0.0)
    # One epoch of 16 patches is split into steps of the global batch.
    assert summary["steps"] == 16 // global_batch
