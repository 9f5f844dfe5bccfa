"""A logger folder that cannot be written stops the run before training, naming its key.

The tests run as root, where a read-only mode stops nobody: a folder is made impossible
by a regular file where it, or one of its parents, would be.
"""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from segscale.cli.train import main
from segscale.configs import CONFIG_DIR
from segscale.errors import ConfigError
from segscale.training.reporting.logger_folders import check_logger_folders, logger_folders
from tests.conftest import compose_config, tiny_overrides
from tests.helpers.in_process import run_in_process

LOGGERS = sorted(path.stem for path in (Path(CONFIG_DIR) / "logger").glob("*.yaml"))


def folders(run: Path, option: str) -> dict[str, Path]:
    """Key → folder of every logger of ``logger=<option>``, for the run folder ``run``."""
    cfg = compose_config("train", f"output_dir={run}", f"logger={option}")
    return {place.key: place.folder for place in logger_folders(cfg.logger)}


@pytest.mark.parametrize("option", LOGGERS)
def test_every_shipped_logger_says_where_it_writes(tmp_path, option, monkeypatch):
    monkeypatch.chdir(tmp_path)  # mlflow's default store is relative to the current folder
    run = tmp_path / "run"
    found = folders(run, option)
    expected = {
        "csv": {},
        "tensorboard": {"logger.tensorboard.save_dir": run / "tensorboard"},
        "wandb": {"logger.wandb.run_folder": run / "wandb"},
        "mlflow": {
            "logger.mlflow.tracking_uri": tmp_path / "outputs",
            "logger.mlflow.artifact_location": Path("outputs/mlartifacts"),
        },
        "none": {},
    }[option]
    assert found == (expected | {"logger.csv.save_dir": run} if option != "none" else {})
    check_logger_folders(compose_config("train", f"output_dir={run}", f"logger={option}").logger)


def logger_group(**nodes: dict) -> OmegaConf:
    return OmegaConf.create(nodes)


LIGHTNING = "lightning.pytorch.loggers."
OURS = "segscale.training.reporting.loggers."


@pytest.mark.parametrize(
    ("node", "key", "blocked"),
    [
        ({"_target_": OURS + "CSVLogger", "save_dir": "{f}/run", "name": "", "version": ""},
         "logger.x.save_dir", "{f}"),
        # The folder itself a file, under a folder that can be written.
        ({"_target_": LIGHTNING + "TensorBoardLogger", "save_dir": "{d}", "name": "tensorboard",
          "version": ""}, "logger.x.save_dir", "{d}/tensorboard"),
        ({"_target_": OURS + "WandbLogger", "run_folder": "{d}"}, "logger.x.run_folder",
         "{d}/wandb"),
        ({"_target_": LIGHTNING + "WandbLogger", "save_dir": "{f}/w"}, "logger.x.save_dir", "{f}"),
        ({"_target_": LIGHTNING + "WandbLogger", "dir": "{f}/w"}, "logger.x.dir", "{f}"),
        ({"_target_": OURS + "MLFlowLogger", "run_folder": "{d}", "task_name": "t",
          "tracking_uri": "sqlite:///{f}/x/mlflow.db"}, "logger.x.tracking_uri", "{f}"),
        ({"_target_": OURS + "MLFlowLogger", "run_folder": "{d}", "task_name": "t",
          "tracking_uri": "file://{f}/store"}, "logger.x.tracking_uri", "{f}"),
        ({"_target_": OURS + "MLFlowLogger", "run_folder": "{d}", "task_name": "t",
          "tracking_uri": "http://tracking:5000", "artifact_location": "{f}/a"},
         "logger.x.artifact_location", "{f}"),
        ({"_target_": LIGHTNING + "MLFlowLogger", "tracking_uri": None, "save_dir": "{f}/runs"},
         "logger.x.save_dir", "{f}"),
    ],
    ids=["csv", "tensorboard", "wandb", "lightning-wandb-save_dir", "lightning-wandb-dir",
         "mlflow-sqlite", "mlflow-file-store", "mlflow-artifacts", "lightning-mlflow-save_dir"],
)  # fmt: skip
def test_a_logger_folder_that_cannot_be_made_is_refused_naming_its_key(
    tmp_path, node, key, blocked
):
    folder, file = tmp_path / "d", tmp_path / "f"
    folder.mkdir()
    file.touch()
    (folder / "wandb").touch()  # where the W&B run would go
    (folder / "tensorboard").touch()
    filled = {k: v.format(d=folder, f=file) if isinstance(v, str) else v for k, v in node.items()}
    with pytest.raises(ConfigError) as refused:
        check_logger_folders(logger_group(x=filled))
    message = str(refused.value)
    assert message.startswith(f"{key}=")
    assert f"{blocked.format(d=folder, f=file)} is a file" in message
    assert f"set {key}=..., or leave that logger out: ~logger.x" in message


def test_remote_stores_and_other_loggers_are_left_to_themselves(tmp_path):
    group = logger_group(
        remote={
            "_target_": OURS + "MLFlowLogger",
            "run_folder": str(tmp_path),
            "task_name": "t",
            "tracking_uri": "databricks",
            "artifact_location": "s3://bucket/artifacts",
        },
        other={"_target_": "lightning.pytorch.loggers.CometLogger", "save_dir": "/dev/null/x"},
        off=None,
    )
    assert logger_folders(group) == []
    check_logger_folders(group)


def test_train_py_stops_before_training_when_the_wandb_folder_cannot_be_written(
    tiny_data_root, tmp_path
):
    run = tmp_path / "run"
    run.mkdir()
    (run / "wandb").write_text("not a folder")  # where W&B would write its offline run
    done = run_in_process(
        main,
        *tiny_overrides(tiny_data_root, None),
        f"hydra.run.dir={run}",
        "logger=wandb",
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-3000:]
    assert f"logger.wandb.run_folder='{run}' is not allowed: the wandb logger writes into" in (
        output
    )
    assert f"{run / 'wandb'} is a file" in output and "Traceback" not in output
    # Refused before training, as any bad value: the config and the log, nothing else.
    assert not (run / "summary.json").exists() and not (run / "checkpoints").exists()
    assert "logger.wandb.run_folder" in (run / "train.log").read_text()
    assert sorted(p.name for p in run.iterdir()) == [".hydra", "train.log", "wandb"]
