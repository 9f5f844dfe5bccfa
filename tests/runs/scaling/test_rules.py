import math
from pathlib import Path

import pytest

from segscale.configs import compose_config
from segscale.errors import ConfigError
from segscale.runs.scaling.rules import ScalingRules
from segscale.training.run.training_run import train


def test_per_device_batches_grow_the_global_batch():
    effective = ScalingRules("per_device", "linear", base_batch_size=8).resolve(8, 0.01, 4)
    assert (effective.per_device_batch_sizes, effective.global_batch_size) == ((8,) * 4, 32)
    assert effective.learning_rate == pytest.approx(0.04) and effective.warmup_epochs == 1.0


def test_a_global_batch_is_split_across_devices():
    effective = ScalingRules("global", "sqrt", base_batch_size=4).resolve(16, 0.01, 2)
    assert (effective.per_device_batch_sizes, effective.global_batch_size) == ((8, 8), 16)
    assert effective.learning_rate == pytest.approx(0.02)
    with pytest.raises(ConfigError, match=r"datamodule\.batch_size=10 .*3 devices"):
        ScalingRules("global").resolve(10, 0.01, 3)


def test_worker_load_shares_the_batch_unevenly_and_zero_leaves_a_device_out():
    per_device = ScalingRules("per_device", "linear", 8, worker_load=[1, 1, 0.5]).resolve(
        8, 0.01, 3
    )
    assert per_device.per_device_batch_sizes == (8, 8, 4) and per_device.global_batch_size == 20
    assert per_device.learning_rate == pytest.approx(0.025)
    split = ScalingRules("global", worker_load=[2, 1]).resolve(10, 0.01, 2)
    assert split.per_device_batch_sizes == (7, 3) and split.global_batch_size == 10
    left_out = ScalingRules("global", worker_load=[1, 0, 1]).resolve(8, 0.01, 3)
    assert left_out.world_size == 2 and left_out.included == (0, 2)
    assert left_out.per_device_batch_sizes == (4, 4)


def test_no_rule_keeps_the_rate_and_adds_no_warmup():
    effective = ScalingRules("per_device", "none").resolve(8, 0.03, 2)
    assert effective.learning_rate == 0.03 and effective.lr_scale == 1.0
    assert effective.warmup_epochs == 0.0
    explicit = ScalingRules("per_device", "linear", 8, warmup_epochs=0).resolve(8, 0.03, 2)
    assert explicit.warmup_epochs == 0 and math.isclose(explicit.learning_rate, 0.06)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("scaling.batch=total", "scaling.batch"),
        ("scaling.lr=cubic", "scaling.lr"),
        ("scaling.base_batch_size=0", "scaling.base_batch_size"),
        ("scaling.warmup_epochs=-1", "scaling.warmup"),
        ("scaling.worker_load=[1,-1]", "scaling.worker_load"),
        ("scaling.worker_load=[0,0]", "scaling.worker_load"),
        ("scaling.worker_load=[fast,1]", "scaling.worker_load"),
    ],
)
def test_bad_rules_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose_config("train", [override])


def test_worker_load_must_match_the_devices_and_give_each_a_patch():
    with pytest.raises(ConfigError, match=r"scaling\.worker_load has 3 weights .* 2 devices"):
        ScalingRules(worker_load=[1, 1, 1]).resolve(8, 0.01, 2)
    with pytest.raises(ConfigError, match=r"scaling\.worker_load=.*batches of \[3, 0\]"):
        ScalingRules("global", worker_load=[1, 0.1]).resolve(3, 0.01, 2)


@pytest.mark.slow
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
    assert summary["per_device_batch_sizes"] == [per_device] * devices
    assert summary["global_batch_size"] == global_batch
    assert summary["learning_rate"] == pytest.approx(lr)
    assert summary["scaling"]["warmup_epochs"] == (1.0 if lr > 0.03 else 0.0)
    # One epoch of 16 patches is split into steps of the global batch: on two ranks,
    # each draws its half of the epoch (tests/cli/test_train.py runs train.py's DDP).
    assert summary["train_patches"] == 16 and summary["steps"] == 16 // global_batch
    assert Path(summary["last_checkpoint"]).is_file()


@pytest.mark.slow
def test_worker_load_reaches_the_dataloaders_and_a_zero_weight_drops_a_rank(make_config):
    summary = train(
        make_config(
            "strategy=ddp_spawn",
            "trainer.devices=3",
            "scaling.worker_load=[2,0,1]",
            "datamodule.batch_size=2",
            "trainer.max_epochs=1",
        )
    )
    assert summary["world_size"] == 2 and summary["per_device_batch_sizes"] == [4, 2]
    # 16 patches an epoch: 2 full global batches of 6; the last, partial one is dropped.
    assert summary["global_batch_size"] == 6 and summary["steps"] == 2


def test_a_zero_weight_on_several_nodes_is_an_error(make_config):
    config = make_config(
        "strategy=ddp", "trainer.num_nodes=2", "scaling.worker_load=[1,0]", "trainer.max_epochs=1"
    )
    with pytest.raises(ConfigError, match=r"scaling\.worker_load .*num_nodes=2"):
        train(config)
