"""datamodule/classes=auto in a run, and classes files in the user's own config folder."""

import contextlib
import io
import logging
import shutil
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, OmegaConf

from segscale.cli import train as train_cli
from segscale.configs import compose_config
from segscale.training.run.training_run import train
from tests.conftest import tiny_overrides

MINE = """\
# @package datamodule
num_classes: 3
class_names: [sky, road, car]
class_colors: [[0, 0, 255], [128, 128, 128], [255, 0, 0]]
ignore_index: 255
label_ids: [10, 20, 30]
ignore_ids: [0]
"""


def with_config_dir(config_dir: Path, *overrides: str) -> DictConfig:
    """The ``datamodule`` that ``train.py --config-dir <config_dir> OVERRIDES`` composes.

    Hydra's own command line, in this process: ``--cfg job`` prints the config only.
    """
    argv = ["train.py", "--config-dir", str(config_dir), *overrides]
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setattr(sys, "argv", [*argv, "--cfg", "job", "--resolve", "--package", "datamodule"])
        train_cli.run()
    cfg = OmegaConf.create(printed.getvalue())
    assert isinstance(cfg, DictConfig)
    return cfg


def test_a_classes_file_in_the_users_config_folder_is_found_both_ways(tmp_path: Path):
    (tmp_path / "myconf/datamodule/classes").mkdir(parents=True)
    (tmp_path / "myconf/datamodule/classes/mine.yaml").write_text(MINE)
    searched = compose_config(
        "train", [f"hydra.searchpath=[file://{tmp_path / 'myconf'}]", "datamodule/classes=mine"]
    )
    assert searched.datamodule.class_names == ["sky", "road", "car"]
    assert searched.model.num_classes == 3 and searched.datamodule.ignore_ids == [0]
    given = with_config_dir(tmp_path / "myconf", "datamodule=folder", "datamodule/classes=mine")
    assert given.label_ids == [10, 20, 30] and OmegaConf.is_missing(given.source, "root")


@pytest.mark.slow
def test_classes_auto_trains_writes_classes_yaml_and_resumes(tiny_data_root, tmp_path, caplog):
    run = tmp_path / "run"
    tiny = [*tiny_overrides(tiny_data_root, run), "debug=fast", "trainer.max_epochs=1"]
    overrides = [*tiny, "datamodule/classes=auto"]
    with caplog.at_level(logging.INFO, logger="segscale.training.run.inferred_classes"):
        assert train(compose_config("train", overrides))["status"] == "finished"
    assert "datamodule/classes=auto: 6 classes found in the training masks" in caplog.text
    names = [f"class_{v}" for v in range(6)]  # the synthetic masks hold class indices 0-5
    written = (run / "classes.yaml").read_text()
    assert written.startswith("# @package datamodule\n")
    assert "<your config dir>/datamodule/classes/<name>.yaml" in written
    record = OmegaConf.load(run / ".hydra/config.yaml")
    assert record.datamodule.label_ids == list(range(6)) and record.model.num_classes == 6
    checkpoint = torch.load(run / "checkpoints/last.ckpt", weights_only=True)
    assert checkpoint["segscale"]["class_names"] == names

    # The file composes back as a classes file of the user's own.
    (tmp_path / "myconf/datamodule/classes").mkdir(parents=True)
    shutil.copy(run / "classes.yaml", tmp_path / "myconf/datamodule/classes/found.yaml")
    copied = with_config_dir(tmp_path / "myconf", "datamodule/classes=found")
    assert copied.class_names == names and copied.label_ids == list(range(6))

    # A resume finds the same classes: the relaunch check and the checkpoint agree (the run
    # had finished: nothing is left to train, the checks before it are the point).
    resumed = compose_config("train", [*overrides, f"ckpt_path={run / 'checkpoints/last.ckpt'}"])
    assert train(resumed)["epochs"] == 1
    assert (run / "classes.yaml").read_text() == written
