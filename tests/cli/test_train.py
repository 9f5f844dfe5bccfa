import csv
import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from PIL import Image

from segscale.cli.train import main
from segscale.configs import CONFIG_DIR
from segscale.data.datasets.synthetic import draw_tile
from segscale.data.storage.sources import read_mask
from segscale.errors import ConfigError
from segscale.inference.prediction.run import predict
from segscale.runs.builders import instantiate_each
from segscale.training.run.training_run import train
from tests.conftest import compose_config, tiny_overrides, train_command, write_pair
from tests.helpers.in_process import run_in_process
from tests.helpers.palette_files import write_palette_mask
from tests.helpers.record_threads import recorded_threads

GROUPS = [
    "model",
    "datamodule",
    "strategy",
    "optimizer",
    "scheduler",
    "trainer",
    "callbacks",
    "logger",
    "loss",
]
# datamodule=folder needs a folder dataset: test_folder_datasets_train below composes it.
OPTIONS = [
    (g, p.stem)
    for g in GROUPS
    for p in sorted((Path(CONFIG_DIR) / g).glob("*.yaml"))
    if (g, p.stem) != ("datamodule", "folder")
]


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_instantiates(make_config, group, option, tmp_path):
    # The MLflow logger reads the job's overrides from Hydra, which compose() does not set.
    mlflow = ["logger.mlflow.overrides=[]", f"logger.mlflow.tracking_uri=sqlite:///{tmp_path}/m.db"]
    cfg = make_config(f"{group}={option}", *(mlflow if option == "mlflow" else []))
    built = {
        "model": lambda: instantiate(cfg.model),
        "datamodule": lambda: instantiate(cfg.datamodule, _convert_="all"),
        "strategy": lambda: instantiate(cfg.strategy),
        "optimizer": lambda: instantiate(cfg.optimizer)(torch.nn.Linear(1, 1)),
        "scheduler": lambda: instantiate(cfg.scheduler),
        "trainer": lambda: instantiate(cfg.trainer, strategy="auto"),
        "callbacks": lambda: instantiate_each(cfg.callbacks),
        "logger": lambda: instantiate_each(cfg.logger),
        "experiment": lambda: instantiate(cfg.model),
        "loss": lambda: instantiate(
            cfg.loss, num_classes=6, ignore_index=255, class_frequencies=[0.5, 0.3, 0.1, 0.1, 0, 0]
        ),
    }[group]()
    assert built is not None
    if group == "datamodule":
        built.check()
    if group == "model":
        assert built.eval()(torch.zeros(1, 3, 64, 64)).shape == (
            1,
            cfg.datamodule.num_classes,
            64,
            64,
        )


def test_single_device_run_writes_the_run_folder(make_config, tmp_path):
    threads_before = torch.get_num_threads()
    # At optimizer.lr=0.1 the two validations score far apart (0.09 and 0.23 mIoU here;
    # at the default 0.03 they tie): which one best.ckpt holds is then a real choice.
    overrides = ["training.threads=3", "optimizer.lr=0.1", *record_threads(tmp_path / "threads")]
    summary = train(make_config(*overrides))
    # training.threads reached the training process, and the next job starts as before.
    assert recorded_threads(tmp_path / "threads") == {"rank0": 3}
    assert torch.get_num_threads() == threads_before
    run = tmp_path / "run"
    assert (run / "checkpoints" / "best.ckpt").is_file()
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert not list((run / "checkpoints").glob("*.tmp"))
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/loss", "val/loss", "val/mIoU", "val/acc", "val/IoU_building"} <= set(header)
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk == summary
    assert summary["world_size"] == 1 and summary["per_device_batch_sizes"] == [4]
    assert summary["global_batch_size"] == 4 and summary["learning_rate"] == 0.1
    assert summary["train_patches"] == 2 * 16 and summary["steps"] == 2 * 4
    assert summary["throughput_patches_per_s"] > 0 and summary["wall_time_s"] > 0
    assert 0 <= summary["metrics"]["val/mIoU"] <= 1
    assert summary["best_checkpoint"].endswith("best.ckpt")
    # best.ckpt is the best of the two validations by the optimized metric (val/mIoU,
    # the higher the better), not the worse one (model_checkpoint.mode=min, say).
    scores = validation_scores(run / "metrics.csv", "val/mIoU")
    assert len(scores) == 2 and len(set(scores.values())) == 2, scores
    best = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)
    assert (best["epoch"], best["global_step"]) == max(scores, key=scores.__getitem__)
    assert summary["best_score"] == pytest.approx(max(scores.values()))


def validation_scores(metrics_csv: Path, metric: str) -> dict[tuple[int, int], float]:
    """``metric`` of each validation in ``metrics_csv``, by the checkpoint's (epoch, step).

    Lightning logs a validation at the step of the last optimizer step before it, the
    ``global_step`` its checkpoint records less one.
    """
    with metrics_csv.open() as file:
        rows = [row for row in csv.DictReader(file) if row[metric]]
    return {(int(row["epoch"]), int(row["step"]) + 1): float(row[metric]) for row in rows}


def record_threads(folder: Path) -> list[str]:
    """Overrides that add ``RecordThreads`` to a run's callbacks."""
    target = "tests.helpers.record_threads.RecordThreads"
    return [f"+callbacks.threads._target_={target}", f"+callbacks.threads.folder={folder}"]


def cli_overrides(data_root: Path) -> list[str]:
    return [o for o in tiny_overrides(data_root, Path()) if not o.startswith("output_dir=")]


@pytest.mark.slow
def test_ddp_from_the_command_line(tiny_data_root, tmp_path):
    run = tmp_path / "run"
    result = subprocess.run(
        train_command(
            "strategy=ddp",
            "trainer.devices=2",
            f"hydra.run.dir={run}",
            *cli_overrides(tiny_data_root),
            "training.threads=3",
            *record_threads(tmp_path / "threads"),
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "threads"]  # one run folder
    # Every rank trains with training.threads threads; rank 0 logs the number.
    assert recorded_threads(tmp_path / "threads") == {"rank0": 3, "rank1": 3}
    assert "threads: 3 per training process (training.threads=3)" in result.stdout + result.stderr
    assert "💡 Tip" not in result.stdout + result.stderr and "LeafSpec" not in result.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["devices"] == ["cpu", "cpu"]
    assert summary["global_batch_size"] == 8
    # Each rank drew half of every epoch: 16 patches an epoch in all, 2 steps per rank.
    # (ddp_spawn in this process: tests/runs/scaling/test_rules.py.)
    assert summary["train_patches"] == 2 * 16 and summary["steps"] == 2 * 2
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert "val/mIoU" in (run / "metrics.csv").read_text()
    assert (run / ".hydra" / "config.yaml").is_file()
    # Only rank 0 writes files: one log, one config folder, no per-rank leftovers.
    assert sorted(p.name for p in run.iterdir()) == [
        ".hydra",
        "checkpoints",
        "class_frequencies.csv",
        "class_frequencies.json",
        "evaluation",
        "metrics.csv",
        "summary.json",
        "train.log",
        "training_progress.png",
    ]


BAD_INPUT = [
    (["trainer.devices=0"], "trainer.devices=0"),
    (["datamodule.num_classes=1"], "datamodule.num_classes=1"),
    (["datamodule.patch_size=4096"], "datamodule.patch_size=4096"),
    (["optimizer.lr=-0.1"], "optimizer.lr=-0.1"),
    (["strategy=single", "trainer.devices=2"], "use strategy=ddp"),
    (["model=unet", "model.output_stride=8"], "model.output_stride=8"),
    (["trainer.max_epochs=abc"], "trainer.max_epochs='abc' is not allowed: expected a number"),
    (
        ["model.encoder=resnet18", "datamodule.patch_size=100"],  # the default network
        "datamodule.patch_size=100 is not allowed: DeepLabV3Plus (resnet18, output stride 16) "
        "takes sides that are multiples of 16, such as 96 or 112",
    ),
    (
        ["training.preemption_signals=[SIGTERM,SIGBREAK]"],  # Windows' Ctrl-Break, not Linux's
        "training.preemption_signals: 'SIGBREAK' does not exist on Linux; it has SIGTERM, SIGINT",
    ),
    (["trainer.no_such_key=1"], "trainer.no_such_key"),  # refused by Hydra itself
]


@pytest.mark.parametrize(("overrides", "expected"), BAD_INPUT)
def test_bad_input_stops_before_training(tiny_data_root, tmp_path, overrides, expected):
    # train.py's entry point in this process (python train.py would spend ~9 s importing);
    # the test below runs one case as a process of its own.
    run = tmp_path / "run"
    args = [*cli_overrides(tiny_data_root), f"hydra.run.dir={run}", *overrides]
    result = run_in_process(main, *args, cwd=tmp_path)
    _assert_stopped_before_training(result, run, expected)


@pytest.mark.slow
def test_bad_input_stops_a_train_py_process_with_exit_status_2(tiny_data_root, tmp_path):
    """One case of the above from ``python train.py`` itself: its exit status end to end."""
    overrides, expected = BAD_INPUT[0]
    run = tmp_path / "run"
    result = subprocess.run(
        train_command(*cli_overrides(tiny_data_root), f"hydra.run.dir={run}", *overrides),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    _assert_stopped_before_training(result, run, expected)


def _assert_stopped_before_training(
    result: subprocess.CompletedProcess[str], run: Path, expected: str
) -> None:
    output = result.stdout + result.stderr
    assert expected in output
    if "no_such_key" in expected:
        assert result.returncode != 0
    else:  # our own checks: a clean message, no traceback
        assert result.returncode == 2 and "Traceback" not in output
        assert expected in (run / "train.log").read_text()
    written = sorted(p.name for p in run.iterdir()) if run.exists() else []
    assert set(written) <= {".hydra", "train.log"}


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["optimizer.solver=lbfgs"], "optimizer.solver='lbfgs'"),
        (["scheduler=piecewise", "scheduler.drop_period=0"], "scheduler.drop_period=0"),
        (["scheduler=piecewise", "scheduler.drop_factor=1.5"], "scheduler.drop_factor=1.5"),
        (["scheduler.name=step"], "scheduler.name='step'"),
        (["datamodule.shuffle=sometimes"], "datamodule.shuffle='sometimes'"),
        (["training.output_network=best"], "training.output_network='best'"),
        (["training.gradient_threshold_method=l1"], "training.gradient_threshold_method='l1'"),
        (
            ["callbacks.model_checkpoint.dirpath=/proc/no/such"],
            "callbacks.model_checkpoint.dirpath",
        ),
        (["ckpt_path=/no/such.ckpt"], "ckpt_path='/no/such.ckpt'"),
    ],
)
def test_more_bad_input_is_refused_before_training(make_config, tmp_path, overrides, expected):
    with pytest.raises(ConfigError) as error:
        train(make_config(*overrides))
    assert expected in str(error.value)
    # The launch record (written first, as Hydra would) and nothing else.
    written = (
        {p.name for p in (tmp_path / "run").iterdir()} if (tmp_path / "run").exists() else set()
    )
    assert written <= {".hydra"}


@pytest.fixture(scope="module")
def learning_data(tmp_path_factory):
    return tmp_path_factory.mktemp("learning")


@pytest.mark.slow
def test_default_run_learns(learning_data, tmp_path):
    """The default recipe, shortened, beats predicting the majority class by far."""
    cfg = compose_config(
        "train",
        f"output_dir={tmp_path}",
        f"datamodule.source.root={learning_data}",
        "datamodule.source.image_size=512",
        "datamodule.source.num_train=3",
        "datamodule.source.num_val=1",
        "datamodule.patches_per_image=64",
        "trainer.max_epochs=2",
        "trainer.accelerator=cpu",
        "callbacks=none",
    )
    summary = train(cfg)
    masks = [read_mask(p.mask).values for p in instantiate(cfg.datamodule.source).pairs("val")]
    counts = np.bincount(np.concatenate([m.ravel() for m in masks]), minlength=6)
    majority_miou = counts.max() / counts.sum() / np.count_nonzero(counts)
    # Measured here: mIoU 0.55 against a majority-class mIoU of 0.04.
    assert summary["metrics"]["val/mIoU"] > max(0.3, 3 * majority_miou)


def test_the_trainer_follows_the_schedule(make_config, tmp_path):
    train(
        make_config("scheduler=piecewise", "scheduler.drop_period=1", "scheduler.drop_factor=0.5")
    )
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    lr_column, step_column = header.index("lr-SGD"), header.index("step")
    lr_at = {}
    for row in rows[1:]:
        cells = row.split(",")
        if cells[lr_column]:
            lr_at[int(cells[step_column])] = float(cells[lr_column])
    # 4 steps an epoch: 0.03 for steps 0-3, 0.015 for steps 4-7.
    assert lr_at[0] == lr_at[3] == pytest.approx(0.03)
    assert lr_at[4] == lr_at[7] == pytest.approx(0.015)


def test_the_matlab_preset_has_the_users_settings(make_config):
    preset = "experiment=deeplabv3plus_inceptionresnetv2-d16_b20-10e_512x512"
    cfg = compose_config("train", preset, "output_dir=/tmp/x")
    assert cfg.model.encoder == "inceptionresnetv2" and cfg.model.output_stride == 16
    assert cfg.datamodule.num_classes == 6 and cfg.datamodule.patch_size == 512
    assert cfg.datamodule.patches_per_image == 1500 and cfg.datamodule.batch_size == 20
    assert cfg.optimizer.solver == "sgdm" and cfg.optimizer.momentum == 0.9
    assert cfg.optimizer.lr == 0.03 and cfg.optimizer.weight_decay == 0.001
    assert cfg.scheduler.name == "piecewise"
    assert (cfg.scheduler.drop_period, cfg.scheduler.drop_factor) == (3, 0.2)
    assert cfg.trainer.max_epochs == 10 and cfg.callbacks.early_stopping.patience == 4
    assert list(cfg.datamodule.augmentation.rotation) == [-20, 20]
    assert cfg.datamodule.shuffle == "every-epoch"
    assert cfg.callbacks.periodic_checkpoint.frequency == 1
    assert cfg.model.encoder_weights == "imagenet"  # pretrained, as MATLAB's network is
    # And it trains, shrunk to tiny patches (command-line overrides win over the preset),
    # from random weights: tests run offline.
    summary = train(
        make_config(
            preset,
            "model.encoder_weights=null",
            "trainer.max_epochs=1",
            "datamodule.batch_size=4",
            "datamodule.patches_per_image=4",
        )
    )
    assert summary["steps"] == 2 and summary["learning_rate"] == 0.03


def _folder_overrides(root: Path, output_dir: Path) -> list[str]:
    return [
        "datamodule=folder",
        f"datamodule.source.root={root}",
        "datamodule.patch_size=32",
        "datamodule.patches_per_image=4",
        "datamodule.batch_size=4",
        "datamodule.val_batch_size=8",
        "datamodule.num_workers=0",
        "model.encoder=resnet18",
        "trainer.max_epochs=1",
        "trainer.accelerator=cpu",
        f"output_dir={output_dir}",
    ]


def test_rgb_palette_masks_train_and_the_checkpoint_predicts(tmp_path):
    colours = np.array(compose_classes("potsdam").class_colors, np.uint8)
    masks = {}
    for split, count in (("train", 2), ("val", 1)):
        for i in range(count):
            image, mask = draw_tile(64, seed=0, index=i + 10 * (split == "val"))
            write_pair(tmp_path / "data", split, f"t{i}", image, colours[mask])
            masks[split, i] = mask
            if (split, i) != ("train", 0):  # palette PNGs, each its palette in its own order
                order = [5, 2, 0, 4, 1, 3] if split == "train" else [1, 3, 5, 0, 2, 4]
                path = tmp_path / "data" / split / "masks" / f"t{i}.png"
                write_palette_mask(path, mask, colours.tolist(), order)
    cfg = compose_config(
        "train",
        *_folder_overrides(tmp_path / "data", tmp_path / "run"),
        "datamodule/classes=potsdam_rgb",
    )
    summary = train(cfg)
    assert summary["epochs"] == 1
    frequencies = (tmp_path / "run/class_frequencies.csv").read_text().splitlines()
    assert frequencies[0].startswith("class,train_pixels") and len(frequencies) == 8
    train_pixels = np.bincount(np.concatenate([masks["train", 0], masks["train", 1]]).ravel())
    counted = [int(row.split(",")[1]) for row in frequencies[1:7]]
    assert counted == np.pad(train_pixels, (0, 6 - len(train_pixels))).tolist()
    confusion = (tmp_path / "run/evaluation/confusion_matrix.csv").read_text().splitlines()
    scored = sum(int(float(v)) for row in confusion[1:] for v in row.split(",")[1:])
    assert scored == 64 * 64  # the val palette mask's every pixel has its class
    predict_cfg = compose_config(
        "predict",
        f"ckpt={tmp_path / 'run/checkpoints/last.ckpt'}",
        f"input={tmp_path / 'data/val/images'}",
        f"output_dir={tmp_path / 'predicted'}",
        "accelerator=cpu",
        "inference.tile_size=32",
    )
    (written,) = predict(predict_cfg)
    assert np.asarray(Image.open(written)).shape == (64, 64)
    assert Image.open(written).getpalette()[:6] == [255, 255, 255, 0, 0, 255]


def test_the_log_confirms_ignored_values_with_their_share(tmp_path, caplog):
    for split, count in (("train", 2), ("val", 1)):
        for i in range(count):
            image, mask = draw_tile(64, seed=0, index=i + 10 * (split == "val"))
            mask[:16] = 9  # a void value: a quarter of each mask
            write_pair(tmp_path / "data", split, f"t{i}", image, mask)
    cfg = compose_config(
        "train",
        *_folder_overrides(tmp_path / "data", tmp_path / "run"),
        "datamodule/classes=potsdam",
        "datamodule.ignore_ids=[9]",
    )
    with caplog.at_level(logging.INFO, logger="segscale.training.run.training_run"):
        train(cfg)
    assert "ignore_ids [9]: 2,048 px, 25.0% of training pixels, ignored" in caplog.text
    stored = json.loads((tmp_path / "run/class_frequencies.json").read_text())
    assert stored["ignored"]["train"] == {"pixels": 2048, "share": 0.25}


def test_16_bit_multichannel_tiffs_train_with_measured_normalization(tmp_path):
    rng = np.random.default_rng(0)
    for split, count in (("train", 2), ("val", 1)):
        for i in range(count):
            _, mask = draw_tile(64, seed=0, index=i + 10 * (split == "val"))
            image = rng.integers(0, 4000, (64, 64, 4)).astype(np.uint16)
            image[..., 3] += mask.astype(np.uint16) * 9000  # the fourth band tells the class
            write_pair(tmp_path / "data", split, f"t{i}", image, mask, ".tif", ".tif")
    cfg = compose_config(
        "train",
        *_folder_overrides(tmp_path / "data", tmp_path / "run"),
        "loss=ce_dice",
        "loss.class_weights=median",
    )
    summary = train(cfg)
    assert summary["epochs"] == 1
    checkpoint = torch.load(tmp_path / "run/checkpoints/last.ckpt", weights_only=True)
    meta = checkpoint["segscale"]
    assert meta["model"]["in_channels"] == 4 and meta["max_value"] == 65535
    assert 0.02 < meta["mean"][0] < 0.04  # uniform 0-4000 of 65535: about 0.031


def test_a_broken_folder_dataset_stops_the_run_listing_every_file(tmp_path):
    for split in ("train", "val"):
        image, mask = draw_tile(64, seed=0, index=0)
        write_pair(tmp_path / "data", split, "ok", image, mask)
    (tmp_path / "data/train/masks/ok.png").rename(tmp_path / "data/train/masks/orphan.png")
    write_pair(tmp_path / "data", "val", "bad", image, np.full((64, 64), 9, np.uint8))
    cfg = compose_config("train", *_folder_overrides(tmp_path / "data", tmp_path / "run"))
    with pytest.raises(ConfigError) as error:
        train(cfg)
    message = str(error.value)
    assert "train/images/ok.png: no mask" in message and "orphan.png: no image" in message
    assert "1 mask(s) hold a value that datamodule/classes does not know" in message
    assert f"(in {tmp_path / 'data/val/masks'})" in message and "ignore_ids=[9]" in message
    assert not (tmp_path / "run/checkpoints").exists()


def compose_classes(name: str):
    """The datamodule keys that ``conf/datamodule/classes/<name>.yaml`` sets."""
    cfg = compose_config("train", f"datamodule/classes={name}")
    return cfg.datamodule


# What a spawned process (a DataLoader worker, a ddp_spawn rank) does when it imports
# the commands' modules again: nothing that a run's start would do.
IMPORT_EVERY_COMMAND = """
import sys
from omegaconf import OmegaConf
from segscale.training.reporting import run_times
for command in ("bench", "data", "evaluate", "export", "predict", "summarize", "train"):
    __import__(f"segscale.cli.{command}")
print(OmegaConf.has_resolver("segscale.run_dir"), run_times._imports_done)
"""


@pytest.mark.slow
@pytest.mark.spawn
def test_importing_a_command_does_no_work(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERY_COMMAND],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "None"]


def test_importing_train_py_leaves_the_run_modules_to_main(tmp_path):
    # A spawned DataLoader worker imports train.py's module again: torch, Lightning and
    # the run's modules are not its to import (they come with what its work unpickles).
    code = (
        "import sys, segscale.cli.train; "
        "print(sorted(m for m in ('torch', 'lightning', 'segscale.training') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
