import re
import sys

import pytest
from omegaconf import OmegaConf

from segscale.cli.train import main
from segscale.devices import devices_count
from segscale.errors import ConfigError
from segscale.training.run.config_checks import check_config
from tests.helpers.in_process import run_in_process


@pytest.mark.parametrize(
    ("devices", "count"), [(1, 1), (2, 2), ("3", 3), ([0, 2], 2), ("auto", 1), (-1, 1)]
)
def test_devices_count(devices, count):
    assert devices_count(OmegaConf.create({"d": devices}).d) == count


@pytest.mark.parametrize("devices", [0, -2, [], [0, 0], [-1], "two", 1.5, True])
def test_bad_devices_name_the_key(devices):
    with pytest.raises(ConfigError, match=r"trainer\.devices=.*expected a positive count"):
        devices_count(devices)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("datamodule.num_classes=1", "datamodule.num_classes"),
        ("model.num_classes=1", "model.num_classes"),
        ("optimizer.lr=-0.1", "optimizer.lr"),
        ("optimizer.lr=0", "optimizer.lr"),
        ("datamodule.batch_size=0", "datamodule.batch_size"),
        ("datamodule.patch_size=-5", "datamodule.patch_size"),
        ("trainer.devices=0", "trainer.devices"),
        ("datamodule.num_workers=-1", "datamodule.num_workers"),
        ("datamodule.num_workers=many", "datamodule.num_workers"),
        ("datamodule.prefetch_factor=0", "datamodule.prefetch_factor"),
        ("datamodule.worker_start_method=threads", "datamodule.worker_start_method"),
        ("datamodule.persistent_workers=yes_please", "datamodule.persistent_workers"),
        ("datamodule.pin_memory=1", "datamodule.pin_memory"),
        ("training.compile=fast", "training.compile"),
        ("training.keep_freed_memory=sometimes", "training.keep_freed_memory"),
        ("training.keep_freed_memory=1", "training.keep_freed_memory"),  # a number, not true
        ("training.channels_last=null", "training.channels_last"),
        ("training.encoder_lr_factor=-0.1", "training.encoder_lr_factor"),
        ("training.encoder_lr_factor=.nan", "training.encoder_lr_factor"),
        ("training.encoder_lr_factor=fast", "training.encoder_lr_factor"),
        ("training.freeze_encoder_epochs=1.5", "training.freeze_encoder_epochs"),
        ("training.freeze_encoder_epochs=-1", "training.freeze_encoder_epochs"),
        ("training.freeze_encoder_epochs=true", "training.freeze_encoder_epochs"),
    ],
)
def test_check_config_names_the_key(make_config, override, key):
    cfg = make_config(override)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_config(cfg)


def test_default_config_passes(make_config):
    check_config(make_config())


def test_fine_tuning_values_pass(make_config):
    check_config(make_config("training.encoder_lr_factor=0", "training.freeze_encoder_epochs=3"))


def test_freezing_needs_its_callback(make_config):
    # callbacks=none drops the callback that freezes: refused, not trained unfrozen.
    with pytest.raises(ConfigError, match=r"training\.freeze_encoder_epochs=2 needs the callback"):
        check_config(make_config("callbacks=none", "training.freeze_encoder_epochs=2"))
    check_config(make_config("callbacks=none"))
    with pytest.raises(ConfigError, match=r"callbacks\.encoder_freeze\.epochs=2 differs"):
        check_config(make_config("callbacks.encoder_freeze.epochs=2"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["datamodule=folder"],
            "datamodule.source.root is not set: give it on the command line, e.g. "
            "datamodule.source.root=/path/to/data",
        ),
        (
            ["datamodule=folder", "datamodule.source.splits.train={images: a, mask: b}"],
            "datamodule.source.splits.train={'images': 'a', 'mask': 'b'} is not allowed "
            "(unknown key 'mask'): expected one of: datamodule.source.splits.train=train",
        ),
    ],
)
def test_train_py_names_an_unset_or_misshapen_folder_source(tmp_path, overrides, message):
    root = [] if overrides == ["datamodule=folder"] else [f"datamodule.source.root={tmp_path}"]
    done = run_in_process(
        main, *overrides, *root, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output, output[-2000:]
    assert message in output


@pytest.mark.parametrize(
    ("platform", "overrides", "message"),
    [
        (
            "win32",
            ["trainer.accelerator=gpu", "strategy.process_group_backend=nccl"],
            "strategy.process_group_backend='nccl' is not allowed: Windows has no NCCL",
        ),
        (
            "linux",
            ["trainer.accelerator=cpu", "strategy.process_group_backend=nccl"],
            "strategy.process_group_backend='nccl' is not allowed: NCCL moves tensors between "
            "CUDA GPUs only; ranks on cpu devices on Linux have gloo",
        ),
        (
            "linux",
            ["trainer.accelerator=gpu", "strategy.process_group_backend='cpu:gloo,cuda:nccl'"],
            "strategy.process_group_backend='cpu:gloo,cuda:nccl' is not allowed: not a "
            "process-group backend; ranks on cuda devices on Linux have nccl or gloo",
        ),
    ],
)
def test_a_backend_the_platform_lacks_is_refused_by_the_config_check(
    make_config, platform, overrides, message, monkeypatch
):
    cfg = make_config("strategy=ddp", *overrides)
    monkeypatch.setattr(sys, "platform", platform)
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(cfg)


def test_train_py_refuses_a_backend_with_exit_2_before_any_rank_starts(tmp_path):
    done = run_in_process(
        main,
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        "strategy.process_group_backend=NCCL",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output, output[-2000:]
    assert "strategy.process_group_backend='NCCL' is not allowed: not a process-group " in output
    assert "started ranks" not in output and not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_start_method_windows_lacks_is_refused_by_the_config_check(
    make_config, method, monkeypatch
):
    cfg = make_config(f"datamodule.worker_start_method={method}")
    check_config(cfg)  # Linux has it
    monkeypatch.setattr(sys, "platform", "win32")
    message = f"datamodule.worker_start_method='{method}' is not allowed: Windows has no "
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(cfg)
    check_config(make_config("datamodule.worker_start_method=spawn"))


def test_train_py_refuses_an_unknown_start_method_with_exit_2_before_building(tmp_path):
    done = run_in_process(
        main,
        "datamodule.worker_start_method=threads",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output, output[-2000:]
    assert (
        "datamodule.worker_start_method='threads' is not allowed: not a start method Linux "
        "has; expected one of fork, spawn, forkserver, auto"
    ) in output
    assert not (tmp_path / "run" / "checkpoints").exists()
