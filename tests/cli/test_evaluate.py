import json
from pathlib import Path

import numpy as np
import pytest
import torch

from segscale.cli.evaluate import evaluate, image_confusion
from segscale.data.labels import LabelMap
from segscale.data.sources import ImageMaskPair
from segscale.data.validation import InvalidDatasetError
from segscale.errors import ConfigError
from segscale.inference.sliding_window import SlidingWindow
from segscale.inference.trained import load_trained
from tests.conftest import compose_config, oracle_checkpoint, oracle_image, write_pair


def _config(root: Path, ckpt: Path, out: Path, *overrides: str):
    return compose_config(
        "evaluate",
        "datamodule=folder",
        f"datamodule.source.root={root}",
        "+datamodule.source.splits.test=test",
        "datamodule.num_classes=3",
        "datamodule.class_names=[class0,class1,class2]",
        "datamodule.class_colors=null",
        f"ckpt={ckpt}",
        f"output_dir={out}",
        "accelerator=cpu",
        "inference.tile_size=32",
        *overrides,
    )


def _dataset(root: Path) -> Path:
    """Test images of classes 0 and 1 only (class 2 absent), with ignored pixels."""
    rng = np.random.default_rng(0)
    for name, shape in (("a", (45, 70)), ("b", (33, 33))):
        mask = rng.integers(0, 2, shape).astype(np.uint8)
        image = oracle_image(mask)
        mask[:3, :5] = 255  # ignored: whatever is predicted there does not count
        write_pair(root, "test", name, image, mask)
    return root


def test_a_model_that_predicts_the_truth_scores_iou_one(tmp_path: Path):
    root = _dataset(tmp_path / "data")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    metrics = evaluate(_config(root, ckpt, tmp_path / "out", "split=test"))
    assert metrics["GlobalAccuracy"] == 1.0 and metrics["MeanIoU"] == 1.0
    classes = metrics["classes"]
    assert classes["class0"]["IoU"] == classes["class1"]["IoU"] == 1.0
    assert classes["class1"]["Dice"] == 1.0 and classes["class2"]["IoU"] is None
    assert json.loads((tmp_path / "out/metrics.json").read_text()) == metrics
    rows = (tmp_path / "out/confusion_matrix.csv").read_text().splitlines()
    labelled = 45 * 70 + 33 * 33 - 2 * 15
    assert sum(int(v) for row in rows[1:] for v in row.split(",")[1:]) == labelled
    assert (tmp_path / "out/confusion_matrix.png").is_file()
    assert (tmp_path / "out/class_metrics.csv").is_file()


def test_classes_must_match_the_checkpoint_and_the_split_must_exist(tmp_path: Path):
    root = _dataset(tmp_path / "data")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    with pytest.raises(ConfigError, match="differ from the classes the checkpoint"):
        evaluate(
            _config(root, ckpt, tmp_path / "out", "split=test", "datamodule.class_names=[x,y,z]")
        )
    with pytest.raises(ConfigError, match=r"splits.train='train'.*does not exist"):
        evaluate(_config(root, ckpt, tmp_path / "out", "split=train"))


def test_two_processes_count_every_image_once(tmp_path: Path):
    root = _dataset(tmp_path / "data")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    one = evaluate(_config(root, ckpt, tmp_path / "one", "split=test"))
    two = evaluate(_config(root, ckpt, tmp_path / "two", "split=test", "devices=2"))
    assert two == one
    assert (tmp_path / "two/confusion_matrix.csv").read_text() == (
        tmp_path / "one/confusion_matrix.csv"
    ).read_text()


def test_the_pixel_limit_reaches_the_validation_pass_and_every_read(tmp_path: Path):
    root = _dataset(tmp_path / "data")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    limited = _config(
        root, ckpt, tmp_path / "out", "split=test", "datamodule.max_image_pixels=2000"
    )
    with pytest.raises(InvalidDatasetError) as refused:
        evaluate(limited)
    message = str(refused.value)
    assert "test/images/a.png: image cannot be read: its header declares 70 x 45 = 3150" in message
    assert "limit of 2000 pixels" in message and "b.png" not in message  # 33 x 33 = 1089
    pair = ImageMaskPair(root / "test/images/a.png", root / "test/masks/a.png")
    trained, window = load_trained(str(ckpt)), SlidingWindow(tile_size=32)
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="limit of 2000 pixels"):
        image_confusion(pair, trained, window, LabelMap(3), cpu, max_image_pixels=2000)
    assert image_confusion(pair, trained, window, LabelMap(3), cpu).sum() == 45 * 70 - 15


def test_a_bad_window_value_names_the_key(tmp_path: Path):
    root = _dataset(tmp_path / "data")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    # the window is built through build(), which lets our ConfigError through
    with pytest.raises(ConfigError, match=r"inference.overlap=1.5 is not allowed"):
        evaluate(_config(root, ckpt, tmp_path / "out", "split=test", "inference.overlap=1.5"))
