from pathlib import Path

import pytest

from segscale.bench.ddp_runs import passed_on, scaling_command, sync_batchnorm, without_key


def test_the_users_overrides_are_passed_on_except_what_the_runs_set():
    overrides = [
        "datamodule.batch_size=16",
        "model.encoder=resnet50",
        "trainer.precision=bf16-mixed",
        "trainer.devices=4",
        "strategy=ddp_spawn",
        "training.sync_batchnorm=false",
        "callbacks=default",
        "+callbacks.extra._target_=x.Y",
        "hydra.run.dir=/somewhere",
        "bench.seconds=1",
        "trainer.max_epochs=3",
    ]
    assert passed_on(overrides) == [
        "datamodule.batch_size=16",
        "model.encoder=resnet50",
        "trainer.precision=bf16-mixed",
        "training.sync_batchnorm=false",
    ]


def test_scaling_command_runs_train_py_with_ddp_and_a_step_timer(tmp_path: Path):
    command = scaling_command(["model.encoder=resnet50"], 2, "cpu", 35, tmp_path / "n2")
    # train.py as a module, found wherever segscale is installed
    assert command[1:4] == ["-m", "segscale.cli.train", "model.encoder=resnet50"]
    for expected in (
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        "++trainer.max_steps=35",
        "++trainer.limit_val_batches=0",
        "+callbacks.step_timer._target_=segscale.bench.timing.StepTimer",
        f"+callbacks.step_timer.path={tmp_path / 'n2' / 'steps.json'}",
        f"hydra.run.dir={tmp_path / 'n2'}",
    ):
        assert expected in command


def test_sync_batchnorm_follows_the_users_override_else_the_default():
    assert sync_batchnorm(["model.encoder=resnet50"]) is True  # conf/train.yaml
    assert sync_batchnorm(["training.sync_batchnorm=false"]) is False
    assert without_key(["a=1", "training.sync_batchnorm=false"], "training.sync_batchnorm") == [
        "a=1"
    ]


@pytest.mark.slow
def test_this_machines_allreduce_is_a_curve_through_measured_points():
    from segscale.bench.ddp_runs import ALLREDUCE_SIZES, measure_allreduce

    link = measure_allreduce(2, 2 * 2**20, cuda=False, repeats=2)
    # 4 B, 4 KiB, 64 KiB, 1 MiB and 2 MiB: ring bytes over 2 ranks are the bytes.
    assert [x for x, _ in link.points] == [*ALLREDUCE_SIZES, 2 * 2**20]
    times = [t for _, t in link.points]
    assert times == sorted(times) and times[0] > 0
    assert link.allreduce_time(2 * 2**20, 2) == times[-1]
