"""A relaunch restores its run's overrides, and refuses those the run cannot take mid-run."""

import logging
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from segscale.data.datasets.synthetic import SyntheticTiles
from segscale.errors import ConfigError
from segscale.training.run_folder import relaunch
from segscale.training.run_folder.relaunch import check_relaunch, restore_overrides


@pytest.fixture(autouse=True)
def nothing_restored_yet(monkeypatch):
    """What restore_overrides noted for the log stays in the test that restored it."""
    monkeypatch.setattr(relaunch, "_restored", None)


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


def generated_tiles(root: Path, **settings) -> Path:
    """A complete synthetic tile set on disk in ``root`` (its ``meta.json``), as a run left it."""
    folder = SyntheticTiles(root=str(root), **settings).folder
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text("{}")
    return folder


def test_the_command_line_wins_key_by_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    generated_tiles(tmp_path / "my tiles")  # the run's: the resume reads them, writes nothing
    recorded = [f"datamodule.source.root={tmp_path / 'my tiles'}", "seed=3", "model=unet"]
    fake_run(tmp_path / "outputs" / "train" / "run1", recorded)
    argv = ["train.py", "ckpt_path=last", "seed=7", "~callbacks.early_stopping"]
    assert (
        restore_overrides(argv)
        == [
            "train.py",
            f"datamodule.source.root='{tmp_path / 'my tiles'}'",  # as segscale writes it: quoted
            "model=unet",
            "trainer.max_epochs=1",
            *argv[1:],
        ]
    )


def test_windows_paths_come_back_unchanged_on_a_resume(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root, weights, init = r"C:\Users\me\data", r"\\server\share\x", r"\\srv\d$\a b,c=d\\"
    # A record may point a synthetic dataset only at a tile set that is complete on disk: on
    # this (POSIX) machine the Windows path is one relative name in the working directory.
    generated_tiles(Path(root))
    # Recorded as typed (unquoted, quoted) and as Hydra's sweeps escape them.
    recorded = [
        rf"datamodule.source.root={root}",
        rf"model.encoder_weights='{weights}'",
        r"model.init_from=\\\\srv\\d$\\a\ b\,c\=d\\\\",
        r"ckpt_path='D:\tiles'",  # the command line's own: not restored
    ]
    fake_run(tmp_path / "outputs" / "train" / "run1", recorded)
    restored = restore_overrides(["train.py", "ckpt_path=last"])
    parsed = OverridesParser.create().parse_overrides(restored[1:])
    values = {o.key_or_group: o.value() for o in parsed}
    assert values["datamodule.source.root"] == root
    assert values["model.encoder_weights"] == weights
    assert values["model.init_from"] == init
    assert values["ckpt_path"] == "last"


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("datamodule.nothere=1", "which this config does not have"),
        ("datamodule.source.splits=1", "which this config does not have"),  # synthetic's
        ("callbacks.model_checkpoint.dirpath=/tmp/elsewhere", "outside its run folder"),
        ("callbacks.model_checkpoint.dirpath=outputs/train", "outside its run folder"),
        ("callbacks.model_checkpoint.dirpath=outputs/train/run1/../x", "outside its run folder"),
        ("callbacks.model_checkpoint.dirpath=outputs/train/run1/out", "outside its run folder"),
        ("callbacks.validation_report.folder=/tmp/x", "outside its run folder"),
        ("trainer.default_root_dir=/tmp/x", "outside its run folder"),
        ("logger.csv.save_dir=/tmp/x", "outside its run folder"),
        ("output_dir=/tmp/x", "outside its run folder"),
        ("callbacks.model_checkpoint.dirpath=null", "outside its run folder"),
        ("callbacks.model_checkpoint.filename=../../../../x", "expected a name"),
        ("callbacks.model_checkpoint.filename=/tmp/x", "expected a name"),
        ("logger.csv.name=..", "expected a name"),
        ("logger.csv.version=../x", "expected a name"),
        ("search_trial.storage=sqlite:////tmp/x.db", "moves a store that runs share"),
        ("datamodule.decode_cache.folder=/tmp/x", "moves a store that runs share"),
        ("trainer.model_registry=mine", "moves a store that runs share"),
        # Lightning expands a leading ~ (the home folder); Path reads it as a name.
        ("callbacks.model_checkpoint.dirpath='~/x'", "outside its run folder"),
    ],
)
def test_a_restored_value_must_exist_and_keep_writes_in_the_run_folder(
    tmp_path, monkeypatch, line, reason
):
    monkeypatch.chdir(tmp_path)
    run = fake_run(tmp_path / "outputs" / "train" / "run1", ["seed=3", line])
    (run / "out").symlink_to(tmp_path)  # a link inside the run that leads out of it
    with pytest.raises(ConfigError, match=rf"overrides\.yaml:2: .*{reason}"):
        restore_overrides(["train.py", "ckpt_path=last"])


@pytest.mark.parametrize(
    "line",
    [
        "logger.wandb.offline=false",
        "logger.wandb.log_model=true",
        # Other spellings of the same wish: any value but the config's own is refused.
        "logger.wandb.offline=False",
        "logger.wandb.offline=0",
        "logger.wandb.offline='true'",
        "logger.wandb.offline=null",
        "logger.wandb.log_model=all",
    ],
)
def test_a_record_may_not_send_a_run_online(tmp_path, monkeypatch, line):
    # segscale's wandb logger is offline: a record that turns it online (or uploads the
    # checkpoints) would send the run's data to a server the command line never named.
    monkeypatch.chdir(tmp_path)
    fake_run(tmp_path / "outputs" / "train" / "run1", ["logger=wandb", line])
    with pytest.raises(ConfigError, match=r"overrides\.yaml:2: .*moves a store that runs share"):
        restore_overrides(["train.py", "ckpt_path=last"])
    fake_run(tmp_path / "outputs" / "train" / "run2", ["logger=wandb"])  # the group: restored
    restored = restore_overrides(["train.py", "ckpt_path=outputs/train/run2/checkpoints/last.ckpt"])
    assert "logger=wandb" in restored


def test_a_leading_tilde_is_read_as_lightning_reads_it_the_home_folder(tmp_path, monkeypatch):
    # A run folder named ~/run below here: ~/run/mine is inside it as a name, but
    # Lightning's checkpoint folder expands ~ to the home folder, elsewhere.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    fake_run(tmp_path / "~" / "run", ["callbacks.model_checkpoint.dirpath='~/run/mine'"])
    with pytest.raises(ConfigError, match=r"overrides\.yaml:1: .*outside its run folder"):
        restore_overrides(["train.py", "ckpt_path='~/run/checkpoints/last.ckpt'"])


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        (["datamodule.source.root={tmp}/elsewhere"], "generate a tile set in"),
        (["datamodule.source.root=data/../elsewhere"], "generate a tile set in"),
        (["datamodule.source.root='~/elsewhere'"], "generate a tile set in"),
        (["datamodule=synthetic", "datamodule.source.root={tmp}/elsewhere"], "generate a tile"),
        # Appended to a run that restores its own tiles (on disk): the appended line named.
        (["datamodule.source.root={tmp}/mine", "datamodule.source.num_train=100000"], "n100000"),
        (["datamodule.source.root={tmp}/mine", "datamodule.source.root={tmp}/elsewhere"], "else"),
        # The config's root, with another size: a new set of the record's size.
        (["datamodule.source.num_train=100000"], "generate a tile set in data/synthetic/"),
        (["datamodule.source.image_size=100000"], "generate a tile set in data/synthetic/"),
        # Spelled so as to slip past the check; the allow-list refuses them first.
        (["+datamodule.source.root={tmp}/elsewhere"], "adds a key"),
        (["++datamodule.source.root={tmp}/elsewhere"], "adds a key"),
        (["datamodule.source.Root={tmp}/elsewhere"], "which this config does not have"),
        (["datamodule.source={{root: {tmp}/elsewhere}}"], "has a dict value"),
        (["datamodule.source.root=${{oc.env:HOME}}/elsewhere"], "an interpolation"),
        (["datamodule.source.root='${{hydra:runtime.cwd}}/../elsewhere'"], "an interpolation"),
    ],
)
def test_a_record_cannot_make_the_synthetic_dataset_write_elsewhere_or_more(
    tmp_path, monkeypatch, lines, reason
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SEGSCALE_DATA_DIR", raising=False)  # the config's root: data/synthetic
    generated_tiles(tmp_path / "mine")
    recorded = [line.format(tmp=tmp_path) for line in lines]
    run = fake_run(tmp_path / "outputs" / "train" / "run1", ["seed=3", *recorded])
    record = run.relative_to(tmp_path) / ".hydra" / "overrides.yaml"
    with pytest.raises(ConfigError, match=rf"^{record}:{len(lines) + 1}: .*{reason}"):
        restore_overrides(["train.py", "ckpt_path=last"])
    for target in (tmp_path / "elsewhere", tmp_path / "home", tmp_path / "data"):
        assert not target.exists()


def test_a_run_s_own_root_edited_in_its_record_is_the_line_named(tmp_path, monkeypatch):
    # The run restores its root and sizes; the root's line is edited, not appended.
    monkeypatch.chdir(tmp_path)
    generated_tiles(tmp_path / "mine", num_train=2)
    lines = [f"datamodule.source.root={tmp_path}/elsewhere", "datamodule.source.num_train=2"]
    fake_run(tmp_path / "outputs" / "train" / "run1", lines)
    with pytest.raises(ConfigError, match=r"overrides\.yaml:1: .*elsewhere/v1_n2\+2"):
        restore_overrides(["train.py", "ckpt_path=last"])


@pytest.mark.parametrize(
    ("lines", "tiles"),
    [
        (["datamodule.source.root=./data/../data/synthetic"], None),  # the config's own
        (["datamodule.source.root={tmp}/mine"], {"root": "{tmp}/mine"}),  # on disk: read
        (["datamodule.source.num_train=3"], {"root": "data/synthetic", "num_train": 3}),
        (["datamodule=folder", "datamodule.source.root={tmp}/nowhere"], None),  # read only
    ],
)
def test_the_synthetic_settings_of_tiles_the_config_or_the_disk_has_are_restored(
    tmp_path, monkeypatch, lines, tiles
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SEGSCALE_DATA_DIR", raising=False)
    if tiles is not None:
        generated_tiles(Path(tiles.pop("root").format(tmp=tmp_path)), **tiles)
    recorded = [line.format(tmp=tmp_path) for line in lines]
    fake_run(tmp_path / "outputs" / "train" / "run1", recorded)
    restored = restore_overrides(["train.py", "ckpt_path=last"])
    assert len(restored) == len(lines) + 3  # the lines, the max_epochs line, train.py, ckpt_path


def test_the_synthetic_root_of_the_environment_is_the_configs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEGSCALE_DATA_DIR", str(tmp_path / "shared"))
    fake_run(
        tmp_path / "outputs" / "train" / "run1",
        [f"datamodule.source.root={tmp_path}/shared/synthetic"],
    )
    assert len(restore_overrides(["train.py", "ckpt_path=last"])) == 4
    fake_run(tmp_path / "outputs" / "train" / "run2", ["datamodule.source.root=data/synthetic"])
    ckpt = tmp_path / "outputs" / "train" / "run2" / "checkpoints" / "last.ckpt"
    with pytest.raises(ConfigError, match=r"overrides\.yaml:1: .*\(the config's: .*shared"):
        restore_overrides(["train.py", f"ckpt_path={ckpt}"])


def test_writes_inside_the_run_folder_and_plain_names_are_restored(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "outputs" / "train" / "run1"
    lines = [
        f"callbacks.model_checkpoint.dirpath={run / 'mine'}",
        "callbacks.model_checkpoint.filename=best-mIoU",
        "callbacks.model_checkpoint.monitor=val/loss",  # a metric's name, not a path
        "logger.mlflow.tracking_uri=sqlite:///outputs/mlflow.db",  # the config's own
        "logger=mlflow",
    ]
    fake_run(run, lines)
    restored = restore_overrides(["train.py", "ckpt_path=last"])
    assert restored[1:6] == [
        f"callbacks.model_checkpoint.dirpath='{run / 'mine'}'",
        "callbacks.model_checkpoint.filename='best-mIoU'",
        "callbacks.model_checkpoint.monitor='val/loss'",
        "logger.mlflow.tracking_uri='sqlite:///outputs/mlflow.db'",
        "logger=mlflow",
    ]


@pytest.mark.parametrize(
    "line", ["task_name=elsewhere", "experiment=matlab_deeplabv3plus", "debug=fast"]
)
def test_a_record_that_would_move_the_run_to_another_folder_is_refused(tmp_path, monkeypatch, line):
    monkeypatch.chdir(tmp_path)
    fake_run(tmp_path / "outputs" / "train" / "run1", [line])
    fake_run(tmp_path / "outputs" / "elsewhere" / "run2", [])
    fake_run(tmp_path / "outputs" / "matlab_deeplabv3plus" / "run3", [])
    fake_run(tmp_path / "outputs" / "debug" / "run4", [])
    with pytest.raises(ConfigError, match=r"would continue the run in outputs/\w+/run\d"):
        restore_overrides(["train.py", "ckpt_path=last"])
    # Through a checkpoint's path the folder is the checkpoint's, whatever the task.
    ckpt = f"ckpt_path={tmp_path / 'outputs' / 'train' / 'run1' / 'checkpoints' / 'last.ckpt'}"
    assert restore_overrides(["train.py", ckpt])[1] in (line, "task_name='elsewhere'")


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


def test_a_wandb_run_resumes_with_its_keys_and_keeps_its_files_in_the_run_folder(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "outputs" / "train" / "run1"
    lines = ["logger=wandb", f"logger.wandb.run_folder={run}", "logger.wandb.project=mine"]
    fake_run(run, lines)  # offline=false is given again, never restored (test above)
    restored = restore_overrides(["train.py", "ckpt_path=last", "logger.wandb.offline=false"])
    assert restored[1:6] == [
        "logger=wandb",
        f"logger.wandb.run_folder='{run}'",
        "logger.wandb.project='mine'",
        "trainer.max_epochs=1",
        "ckpt_path=last",
    ]
    assert restored[-1] == "logger.wandb.offline=false"
    elsewhere = tmp_path / "outputs" / "train" / "run2"
    fake_run(elsewhere, ["logger=wandb", "logger.wandb.run_folder=/tmp/x"])
    with pytest.raises(ConfigError, match=r"overrides\.yaml:2: .*outside its run folder"):
        restore_overrides(["train.py", f"ckpt_path={elsewhere / 'checkpoints' / 'last.ckpt'}"])
