"""A relaunch restores its run's overrides, and refuses those the run cannot take mid-run."""

import logging
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from segscale.errors import ConfigError
from segscale.training.run_folder import relaunch
from segscale.training.run_folder.relaunch import (
    check_relaunch,
    merge_overrides,
    restore_overrides,
)


@pytest.fixture(autouse=True)
def nothing_restored_yet(monkeypatch):
    """What restore_overrides noted for the log stays in the test that restored it."""
    monkeypatch.setattr(relaunch, "_restored", None)


STARTED = ["model=unet", "datamodule.batch_size=2", "trainer.max_epochs=1", "ckpt_path=null"]


def test_the_command_line_wins_key_by_key():
    recorded = [*STARTED, "datamodule.source.root='/data/my tiles'", "+extra=1", "~gone"]
    merged = merge_overrides(recorded, ["ckpt_path=last", "trainer.max_epochs=3", "gone=2"])
    assert merged == [
        "model=unet",
        "datamodule.batch_size=2",
        "datamodule.source.root='/data/my tiles'",  # quoted as it was typed
        "+extra=1",
        "ckpt_path=last",
        "trainer.max_epochs=3",
        "gone=2",
    ]


def test_groups_packages_and_additions_are_keys_too():
    recorded = ["model=unet", "model@aux=fpn", "+extra=1", "++forced=1", "+dropped=1"]
    merged = merge_overrides(recorded, ["model=fpn", "extra=2", "forced=2", "~dropped"])
    # model@aux is another key than model; a recorded addition keeps its prefix, and
    # deleting what only the record added leaves neither.
    assert merged == ["model@aux=fpn", "model=fpn", "+extra=2", "++forced=2"]


def test_the_recorded_checkpoint_is_never_restored():
    merged = merge_overrides(["ckpt_path=/old/last.ckpt", "seed=1"], ["ckpt_path=last"])
    assert merged == ["seed=1", "ckpt_path=last"]


def fake_run(root: Path, overrides: list[str], launches: int = 1) -> Path:
    """A run folder with a checkpoint and ``launches`` launch records."""
    (root / "checkpoints").mkdir(parents=True)
    (root / "checkpoints" / "last.ckpt").write_bytes(b"")
    for number in range(1, launches + 1):
        record = root / ".hydra" / ("" if number == 1 else f"launch-{number}")
        record.mkdir(parents=True, exist_ok=True)
        (record / "config.yaml").write_text("seed: 42\n")
        listed = [*overrides, f"trainer.max_epochs={number}"]
        (record / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(listed)))
    return root


def test_ckpt_path_last_restores_the_latest_launch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_run(tmp_path / "outputs" / "train" / "run1", ["datamodule.batch_size=2"], launches=3)
    argv = ["train.py", "--cfg", "job", "ckpt_path=last", "seed=7"]
    assert restore_overrides(argv) == [
        "train.py",
        "--cfg",
        "job",
        "datamodule.batch_size=2",
        "trainer.max_epochs=3",  # launch-3's, not the first launch's
        "ckpt_path=last",
        "seed=7",
    ]


def test_a_checkpoint_path_restores_its_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = fake_run(tmp_path / "elsewhere" / "run", ["seed=3"])
    ckpt = f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"
    assert restore_overrides(["train.py", ckpt]) == [
        "train.py",
        "seed=3",
        "trainer.max_epochs=1",
        ckpt,
    ]


def test_the_task_root_follows_the_experiment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_run(tmp_path / "outputs" / "matlab_deeplabv3plus" / "run", ["seed=3"])
    argv = ["train.py", "experiment=matlab_deeplabv3plus", "ckpt_path=last"]
    assert restore_overrides(argv)[1:3] == ["seed=3", "trainer.max_epochs=1"]
    assert restore_overrides(["train.py", "ckpt_path=last"]) == ["train.py", "ckpt_path=last"]


@pytest.mark.parametrize(
    "argv",
    [
        ["train.py", "ckpt_path=auto"],  # a requeued job has its whole command line
        ["train.py"],
        ["train.py", "-m", "ckpt_path=last", "seed=1,2"],
        ["train.py", "ckpt_path=/nowhere/model.ckpt"],  # not in a run folder
    ],
)
def test_nothing_is_restored_otherwise(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_run(tmp_path / "outputs" / "train" / "run1", ["seed=3"])
    assert restore_overrides(argv) == argv


def record(cfg_started, folder: Path) -> None:
    (folder / ".hydra").mkdir(parents=True, exist_ok=True)
    (folder / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg_started))


def test_frozen_keys_are_refused_with_both_values(make_config, tmp_path):
    record(make_config("datamodule.batch_size=2"), tmp_path / "run")
    relaunched = make_config("datamodule.batch_size=8", "model=unet", "ckpt_path=last")
    with pytest.raises(ConfigError) as error:
        check_relaunch(relaunched)
    message = str(error.value)
    assert "datamodule.batch_size: the run was started with 2, this launch has 8" in message
    assert "model.arch: the run was started with 'DeepLabV3Plus', this launch has 'Unet'" in message
    assert "cannot change mid-run" in message and "start a new run" in message


def test_what_may_change_passes(make_config, tmp_path):
    started = make_config("trainer.devices=2")
    record(started, tmp_path / "run")
    check_relaunch(
        make_config(
            "ckpt_path=last",
            "trainer.devices=[0,1]",  # the same number of processes
            "trainer.max_epochs=5",
            "datamodule.num_workers=1",
            "datamodule.source.root=/moved",
            "model.encoder_weights=imagenet",
            "callbacks=none",
            "logger=none",
        )
    )


def test_fresh_runs_and_folders_without_a_record_are_not_checked(make_config, tmp_path):
    record(make_config("datamodule.batch_size=2"), tmp_path / "run")
    check_relaunch(make_config("datamodule.batch_size=8"))  # ckpt_path=null: a fresh run
    other = make_config("datamodule.batch_size=8", "ckpt_path=last", f"output_dir={tmp_path}")
    check_relaunch(other)


def test_the_restored_overrides_are_logged(make_config, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    fake_run(tmp_path / "outputs" / "train" / "run1", ["seed=3"])
    restore_overrides(["train.py", "ckpt_path=last"])
    with caplog.at_level(logging.INFO, logger=relaunch.__name__):
        check_relaunch(make_config("ckpt_path=last"))
    assert "restored the run's overrides from" in caplog.text
    assert "seed=3 trainer.max_epochs=1" in caplog.text
