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
from segscale.models.checkpoint_io import load_checkpoint_file, save_checkpoint_file
from tests.conftest import compose_config, oracle_checkpoint, oracle_image, write_pair

LABEL_IDS = [10, 20, 30]
"""Grey levels of the classes of ``_labelled``'s masks (99: void)."""


def _config(root: Path, ckpt: Path, out: Path, *overrides: str):
    """No classes given: evaluate.py takes the checkpoint's."""
    return compose_config(
        "evaluate",
        "datamodule=folder",
        f"datamodule.source.root={root}",
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


def _labelled(root: Path) -> Path:
    """``test.txt`` listing images whose masks hold ``LABEL_IDS`` and the void value 99."""
    rng = np.random.default_rng(1)
    for name in ("a", "b"):
        classes = rng.integers(0, 3, (40, 50)).astype(np.uint8)
        mask = np.asarray(LABEL_IDS, np.uint8)[classes]
        mask[:4, :6] = 99
        write_pair(root, "all", name, oracle_image(classes), mask)
    (root / "test.txt").write_text("a\nb\n")
    return root


def _with_label_ids(ckpt: Path, path: Path) -> Path:
    """``ckpt`` as train.py writes it for masks of grey levels ``LABEL_IDS``, void 99."""
    content = load_checkpoint_file(ckpt, "ckpt")
    content["segscale"] |= {"label_ids": LABEL_IDS, "ignore_ids": [99]}
    save_checkpoint_file(content, path)
    return path


def test_a_model_that_predicts_the_truth_scores_iou_one(tmp_path: Path, caplog):
    root = _dataset(tmp_path / "data")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")  # no label IDs: an older checkpoint
    metrics = evaluate(_config(root, ckpt, tmp_path / "out", "split=test"))
    assert "carries no label IDs" in caplog.text and "class indices 0-2" in caplog.text
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


def test_the_checkpoint_s_label_ids_need_no_override_and_an_equal_one_changes_nothing(
    tmp_path: Path,
):
    root = _labelled(tmp_path / "data")
    old_style = oracle_checkpoint(tmp_path / "old.ckpt")
    ckpt = _with_label_ids(old_style, tmp_path / "oracle.ckpt")

    def metrics(checkpoint: Path, *overrides: str) -> dict:
        where = ("datamodule.source.images=all/images", "datamodule.source.masks=all/masks")
        return evaluate(
            _config(root, checkpoint, tmp_path / "out", "split=test", *where, *overrides)
        )

    own = metrics(ckpt)
    assert own["MeanIoU"] == 1.0 and own["GlobalAccuracy"] == 1.0
    repeated = metrics(
        ckpt,
        "datamodule.class_names=[class0,class1,class2]",
        "datamodule.num_classes=3",
        "datamodule.class_colors=null",
        "datamodule.ignore_index=255",
        "datamodule.label_ids=[[10],20,30]",  # another form of the same values
        "datamodule.ignore_ids=[99,255]",  # 255 is ignored in grey masks anyway
    )
    assert repeated == own
    # an older checkpoint (no label IDs) takes them from the config
    assert (
        metrics(old_style, "datamodule.label_ids=[10,20,30]", "datamodule.ignore_ids=[99]") == own
    )


@pytest.mark.parametrize(
    ("override", "given", "stored"),
    [
        ("datamodule.class_names=[x,y,z]", "['x', 'y', 'z']", "['class0', 'class1', 'class2']"),
        ("datamodule/classes=binary", "['background', 'foreground']", "['class0',"),
        ("datamodule.label_ids=[0,1,2]", "[0, 1, 2]", "[10, 20, 30]"),
    ],
)
def test_a_class_key_that_differs_from_the_checkpoint_s_is_refused_naming_both(
    tmp_path: Path, override: str, given: str, stored: str
):
    ckpt = _with_label_ids(oracle_checkpoint(tmp_path / "old.ckpt"), tmp_path / "new.ckpt")
    with pytest.raises(ConfigError) as refused:
        evaluate(_config(tmp_path, ckpt, tmp_path / "out", override))
    message = str(refused.value)
    key = "label_ids" if "label_ids" in override else "class_names"
    assert f"datamodule.{key}={given} differs" in message and stored in message
    assert str(ckpt) in message


def test_a_split_that_is_not_there_names_what_was_looked_for(tmp_path: Path):
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    with pytest.raises(ConfigError, match=r"splits.test='test': neither the folder .*/test "):
        evaluate(_config(tmp_path, ckpt, tmp_path / "out", "split=test"))
    synthetic = compose_config(
        "evaluate", f"ckpt={ckpt}", f"output_dir={tmp_path}", "split=test", "accelerator=cpu"
    )
    with pytest.raises(ConfigError, match=r"split='test'.*SyntheticTiles\) has no such split"):
        evaluate(synthetic)


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
