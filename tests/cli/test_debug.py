"""The debug presets (conf/debug/): each trains to a finished run in its run folder."""

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from segscale.configs import CONFIG_DIR
from segscale.training.run.training_run import train
from tests.conftest import compose_config, tiny_overrides

EXPERIMENT = "experiment=deeplabv3plus_inceptionresnetv2-d16_b20-10e_512x512"
PRESETS = sorted(p.stem for p in (Path(CONFIG_DIR) / "debug").glob("*.yaml"))
SLOW = {"overfit", "profile"}
"""Presets whose tiny run takes over ~20 s on two shared CPU cores."""
OVERFIT_EPOCHS = 2
"""debug=overfit trains 50 epochs; the tiny run needs 2 to see its batches repeat."""


def each_preset() -> list:
    """``PRESETS`` as pytest parameters, the slow ones marked."""
    return [pytest.param(p, marks=[pytest.mark.slow] if p in SLOW else []) for p in PRESETS]


class RecordBatches(L.Callback):
    """Writes the patch keys and pixel sums of every training batch, by epoch, to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.batches: list[dict[str, Any]] = []

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Record this batch."""
        self.batches.append(
            {
                "epoch": trainer.current_epoch,
                "keys": batch["key"].tolist(),
                "pixels": batch["image"].to(torch.float64).sum(dim=(1, 2, 3)).tolist(),
            }
        )

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write what was recorded."""
        self.path.write_text(json.dumps(self.batches))


Run = tuple[DictConfig, dict[str, Any], Path]
"""A trained preset: its config, its summary and its run folder."""


@pytest.fixture(scope="module")
def trained(tiny_data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Run]:
    """Train ``debug=<preset>`` on the tiny tiles, once per module; record its batches.

    The tiny overrides' ``trainer.max_epochs`` is left out: the preset sets it.
    """
    runs: dict[str, Run] = {}

    def run(preset: str) -> Run:
        if preset not in runs:
            folder = tmp_path_factory.mktemp(preset)
            tiny = tiny_overrides(tiny_data_root, folder / "run")
            cfg = compose_config(
                "train",
                *[o for o in tiny if not o.startswith("trainer.max_epochs=")],
                f"debug={preset}",
                *([f"trainer.max_epochs={OVERFIT_EPOCHS}"] if preset == "overfit" else []),
                "+callbacks.record._target_=tests.cli.test_debug.RecordBatches",
                f"+callbacks.record.path={folder / 'batches.json'}",
            )
            runs[preset] = (cfg, train(cfg), folder / "run")
        return runs[preset]

    return run


def recorded_batches(run: Path) -> list[dict[str, Any]]:
    """What ``RecordBatches`` wrote for the run in ``run``."""
    return json.loads((run.parent / "batches.json").read_text())


def test_no_preset_by_default():
    cfg = compose_config("train")
    assert cfg.task_name == "train" and cfg.trainer.profiler is None
    assert cfg.trainer.limit_train_batches is None and cfg.trainer.overfit_batches == 0


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_overrides_the_experiment(preset):
    plain = compose_config("train", EXPERIMENT)
    cfg = compose_config("train", EXPERIMENT, f"debug={preset}")
    assert plain.trainer.max_epochs == 10 and cfg.trainer.max_epochs != 10
    assert cfg.task_name == "debug"  # outputs/debug/<time>, not the experiment's folder


@pytest.mark.parametrize("preset", each_preset())
def test_every_preset_trains_to_a_finished_summary(trained, preset):
    _, summary, run = trained(preset)
    assert summary["status"] == "finished" and summary["steps"] >= 1
    assert json.loads((run / "summary.json").read_text()) == summary


def test_fast_trains_one_batch_and_writes_what_a_run_writes(trained):
    cfg, summary, run = trained("fast")
    assert cfg.trainer.fast_dev_run is False  # it would skip the loggers and best.ckpt
    assert summary["steps"] == 1 and summary["epochs"] == 1
    assert summary["train_patches"] == cfg.datamodule.batch_size
    assert len(recorded_batches(run)) == 1
    assert (run / "checkpoints" / "best.ckpt").is_file()
    assert (run / "checkpoints" / "last.ckpt").is_file()
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [r["val/mIoU"] for r in rows if r.get("val/mIoU")]  # the one batch validated


def test_overfit_fixes_the_patches_and_turns_augmentation_off():
    cfg = compose_config("train", "debug=overfit")
    assert cfg.trainer.overfit_batches > 0 and cfg.datamodule.shuffle == "never"
    augmentation = instantiate(cfg.datamodule.augmentation)
    assert augmentation.rotation == augmentation.translate_x == augmentation.translate_y == (0, 0)
    assert augmentation.pipeline is None
    assert cfg.callbacks.early_stopping is None


@pytest.mark.slow
def test_overfit_trains_the_same_patches_every_epoch(trained):
    cfg, summary, run = trained("overfit")
    batches = recorded_batches(run)
    epochs = [
        [(b["keys"], b["pixels"]) for b in batches if b["epoch"] == e]
        for e in range(OVERFIT_EPOCHS)
    ]
    assert len(epochs[0]) == cfg.trainer.overfit_batches
    assert all(epoch == epochs[0] for epoch in epochs[1:])
    assert summary["steps"] == OVERFIT_EPOCHS * cfg.trainer.overfit_batches


@pytest.mark.slow
def test_profile_writes_its_report_into_the_run_folder(trained):
    _, summary, run = trained("profile")
    assert summary["steps"] == 4  # the tiny run's whole epoch: fewer than the preset's limit
    assert "run_training_batch" in (run / "fit-profile.txt").read_text()
