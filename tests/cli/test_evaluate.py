import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from segscale import progress
from segscale.cli.evaluate import main as evaluate_main
from segscale.cli.train import main as train_main
from segscale.data.checks.dataset_problems import InvalidDatasetError
from segscale.data.classes.labels import LabelMap
from segscale.data.storage.sources import ImageMaskPair
from segscale.errors import EXIT_BAD_INPUT, ConfigError
from segscale.inference.evaluation.run import evaluate, image_confusion
from segscale.inference.sliding_window import SlidingWindow
from segscale.models.checkpoint.files import load_checkpoint_file, save_checkpoint_file
from segscale.models.checkpoint.trained import load_trained
from tests.conftest import (
    compose_config,
    float_oracle_checkpoint,
    oracle_checkpoint,
    oracle_image,
    oracle_process,
    write_pair,
)
from tests.helpers.in_process import run_in_process
from tests.models.checkpoint.test_init_from import trained_checkpoint

LABEL_IDS = [10, 20, 30]
"""Grey levels of the classes of ``_labelled``'s masks (99: void)."""


def _config(root: Path, ckpt: Path, out: Path, *overrides: str):
    """No classes given: evaluate.py takes the checkpoint's; the data are ``root``'s.

    ``other_data=true`` unless ``overrides`` set it: an oracle was trained on none of them.
    """
    other = [] if any(o.startswith("other_data=") for o in overrides) else ["other_data=true"]
    return compose_config(
        "evaluate",
        "datamodule=folder",
        f"datamodule.source.root={root}",
        f"ckpt={ckpt}",
        f"output_dir={out}",
        "accelerator=cpu",
        "inference.tile_size=32",
        *other,
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


def test_a_model_that_predicts_the_truth_scores_iou_one(tmp_path: Path):
    root = _dataset(tmp_path / "data")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")  # masks of class indices
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


def test_the_checkpoint_s_label_ids_need_no_override_and_an_equal_one_changes_nothing(
    tmp_path: Path,
):
    root = _labelled(tmp_path / "data")
    ckpt = _with_label_ids(oracle_checkpoint(tmp_path / "indices.ckpt"), tmp_path / "oracle.ckpt")

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
        "evaluate",
        f"ckpt={ckpt}",
        f"output_dir={tmp_path}",
        "split=test",
        "accelerator=cpu",
        "other_data=true",  # the composed synthetic set, not the oracle's data
    )
    with pytest.raises(ConfigError, match=r"split='test'.*SyntheticTiles\) has no such split"):
        evaluate(synthetic)


@pytest.mark.slow
def test_two_processes_count_every_image_once(tmp_path: Path):
    root = _dataset(tmp_path / "data")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    one = evaluate(_config(root, ckpt, tmp_path / "one", "split=test"))
    two = evaluate(_config(root, ckpt, tmp_path / "two", "split=test", "devices=2"))
    assert two == one
    assert (tmp_path / "two/confusion_matrix.csv").read_text() == (
        tmp_path / "one/confusion_matrix.csv"
    ).read_text()
    # each image's row and BF scores cross back from its process, not sums
    assert "MeanBFScore" in two["classes"]["class0"]
    rows = (tmp_path / "two/image_metrics.csv").read_text()
    assert rows == (tmp_path / "one/image_metrics.csv").read_text()
    assert [row.split(",")[0] for row in rows.splitlines()[1:]] == ["a.png", "b.png"]


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


def _trained_on(ckpt: Path, source: dict, path: Path) -> Path:
    """``ckpt`` as train.py writes it after training on ``source`` (its data_source)."""
    content = load_checkpoint_file(ckpt, "ckpt")
    content["segscale"]["data_source"] = source
    save_checkpoint_file(content, path)
    return path


def _folder_source(root: Path) -> dict:
    """``datamodule=folder datamodule.source.root=root`` as a checkpoint records it."""
    return {
        "_target_": "segscale.data.datasets.folder.FolderTiles",
        "root": str(root),
        "images": "images",
        "masks": "masks",
        "splits": {"train": "train", "val": "val", "test": "test"},
    }


def test_without_data_named_the_checkpoint_s_own_data_are_evaluated(tmp_path: Path, caplog):
    caplog.set_level("INFO")
    root = _dataset(tmp_path / "data")
    oracle = oracle_checkpoint(tmp_path / "oracle.ckpt")
    ckpt = _trained_on(oracle, _folder_source(root), tmp_path / "folder.ckpt")
    # what `python evaluate.py ckpt=... split=test` composes: the synthetic default
    cfg = compose_config(
        "evaluate",
        f"ckpt={ckpt}",
        f"output_dir={tmp_path / 'out'}",
        "split=test",
        "accelerator=cpu",
        "inference.tile_size=32",
    )
    metrics = evaluate(cfg, data_given=False)
    assert metrics["MeanIoU"] == 1.0  # the folder's images, not generated tiles
    assert "evaluating the data ckpt was trained on: FolderTiles(root=" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "given"),
    [
        (("datamodule.source.num_val=1",), "SyntheticTiles("),  # the synthetic set, named
        (("datamodule=folder", "datamodule.source.root={tmp}/other"), "FolderTiles(root='/other'"),
    ],
)
def test_data_named_that_differ_from_the_checkpoint_s_are_refused_naming_both(
    tmp_path: Path, overrides: tuple, given: str
):
    root = _dataset(tmp_path / "data")
    ckpt = _trained_on(
        oracle_checkpoint(tmp_path / "oracle.ckpt"), _folder_source(root), tmp_path / "f.ckpt"
    )
    named = [o.format(tmp=tmp_path) for o in overrides]
    common = (f"ckpt={ckpt}", f"output_dir={tmp_path / 'out'}", "accelerator=cpu")
    with pytest.raises(ConfigError) as refused:
        evaluate(compose_config("evaluate", *common, *named))
    message = str(refused.value)
    assert f"datamodule.source is {given}" in message.replace(str(tmp_path), "")
    assert f"trained on FolderTiles(root={str(root)!r}" in message
    assert "other_data=true" in message


def test_other_data_true_evaluates_the_data_named(tmp_path: Path):
    root = _dataset(tmp_path / "data")
    other = _dataset(tmp_path / "other")
    ckpt = _trained_on(
        oracle_checkpoint(tmp_path / "oracle.ckpt"), _folder_source(root), tmp_path / "f.ckpt"
    )
    cfg = _config(other, ckpt, tmp_path / "out", "split=test", "other_data=true")
    assert evaluate(cfg)["MeanIoU"] == 1.0


def test_a_checkpoint_s_data_of_a_source_not_shipped_are_not_rebuilt(tmp_path: Path):
    source = {"_target_": "builtins.exec", "root": "print('ran')"}
    ckpt = _trained_on(oracle_checkpoint(tmp_path / "o.ckpt"), source, tmp_path / "x.ckpt")
    cfg = compose_config("evaluate", f"ckpt={ckpt}", f"output_dir={tmp_path}", "accelerator=cpu")
    with pytest.raises(ConfigError, match=r"_target_='builtins.exec', which evaluate.py does not"):
        evaluate(cfg, data_given=False)


@pytest.mark.slow
def test_evaluate_py_alone_evaluates_the_folder_a_trained_checkpoint_learnt_on(tmp_path: Path):
    root = _dataset(tmp_path / "data")
    for name in ("a", "b"):  # train/val splits for the training run
        for split in ("train", "val"):
            write_pair(root, split, name, *_pair_of(root, name))
    common = ["datamodule.patch_size=32", "datamodule.patches_per_image=2"]
    run = tmp_path / "run"
    trained = run_in_process(
        train_main,
        "datamodule=folder",
        f"datamodule.source.root={root}",
        *common,
        "datamodule.batch_size=2",
        "datamodule.num_workers=0",
        "model.encoder_weights=null",
        "model.encoder=resnet18",
        "trainer.max_epochs=1",
        "trainer.accelerator=cpu",
        f"output_dir={run}",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    ckpt = run / "checkpoints/last.ckpt"
    out = tmp_path / "evaluated"
    args = (f"ckpt={ckpt}", "accelerator=cpu", "inference.tile_size=32", f"hydra.run.dir={out}")
    result = run_in_process(evaluate_main, *args, "split=test", cwd=tmp_path, program="evaluate.py")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "evaluating the data ckpt was trained on: FolderTiles(" in result.stdout + result.stderr
    assert (out / "metrics.json").is_file()
    refused = run_in_process(
        evaluate_main, *args, "datamodule.source.num_val=1", cwd=tmp_path, program="evaluate.py"
    )
    assert refused.returncode == EXIT_BAD_INPUT, refused.stderr[-3000:]
    output = refused.stdout + refused.stderr
    assert "Traceback" not in output and "datamodule.source is SyntheticTiles(" in output


def _pair_of(root: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The test split's image and mask ``name``, as arrays."""
    image = np.asarray(Image.open(root / "test/images" / f"{name}.png"))
    return image, np.asarray(Image.open(root / "test/masks" / f"{name}.png"))


@pytest.mark.parametrize("dtype", [np.uint16, np.float32])
def test_images_of_another_pixel_type_than_the_checkpoint_s_are_refused(tmp_path: Path, dtype):
    mask = np.random.default_rng(0).integers(0, 2, (40, 40)).astype(np.uint8)
    image = oracle_image(mask).astype(dtype)
    write_pair(tmp_path / "data", "test", "a", image, mask, ".tif", ".png")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")  # trained on uint8 (max_value 255)
    with pytest.raises(ConfigError) as refused:
        evaluate(_config(tmp_path / "data", ckpt, tmp_path / "out", "split=test"))
    name = np.dtype(dtype).name
    assert f"test/images/a.tif: its pixels are {name}, the network of ckpt=" in str(refused.value)
    assert "takes uint8 pixels (full intensity 255)" in str(refused.value)


@pytest.mark.slow
def test_a_folder_dataset_without_its_root_names_the_key(tmp_path: Path):
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    args = (f"ckpt={ckpt}", "datamodule=folder", f"output_dir={tmp_path / 'out'}")
    # ``python evaluate.py`` in a process of its own: its exit status is the process's.
    command = oracle_process("evaluate.py", *args)
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_BAD_INPUT, output[-3000:]
    assert "MissingMandatoryValue" not in output and "Traceback" not in output
    assert "datamodule.source.root is not set: give it on the command line" in output


def test_images_of_other_channels_than_the_checkpoint_s_name_its_network(tmp_path: Path):
    root = _dataset(tmp_path / "data")
    write_pair(root, "test", "grey", np.zeros((40, 40), np.uint8), np.zeros((40, 40), np.uint8))
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")  # a 3-channel network
    args = (f"ckpt={ckpt}", "datamodule=folder", f"datamodule.source.root={root}", "split=test")
    result = run_in_process(
        evaluate_main,
        *args,
        "other_data=true",
        f"output_dir={tmp_path / 'out'}",
        cwd=tmp_path,
        program="evaluate.py",
    )
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_BAD_INPUT, output[-3000:]
    assert f"grey.png: has 1 channels, the network of ckpt={str(ckpt)!r} takes 3" in output
    assert "datamodule.in_channels" not in output and "Traceback" not in output


def test_images_far_outside_the_checkpoint_s_value_range_are_refused(tmp_path: Path):
    mask = np.random.default_rng(0).integers(0, 3, (40, 40)).astype(np.uint8)
    pixels = oracle_image(mask).astype(np.float32)  # 0-255, for a network of 0-1
    write_pair(tmp_path / "data", "test", "a", pixels, mask, ".tif", ".png")
    ckpt = float_oracle_checkpoint(tmp_path / "float.ckpt")
    with pytest.raises(ConfigError) as refused:
        evaluate(_config(tmp_path / "data", ckpt, tmp_path / "out", "split=test"))
    message = str(refused.value)
    assert f"{tmp_path / 'data/test/images/a.tif'}: " in message
    assert "far from the training images' 0 to 1" in message
    unchecked = _config(
        tmp_path / "data", ckpt, tmp_path / "out", "split=test", "check_value_range=false"
    )
    assert evaluate(unchecked)["GlobalAccuracy"] < 1.0  # scored, and wrong: 255x too bright
    write_pair(tmp_path / "data", "test", "a", pixels / 255, mask, ".tif", ".png")
    assert (
        evaluate(_config(tmp_path / "data", ckpt, tmp_path / "out", "split=test"))["GlobalAccuracy"]
        == 1.0
    )


def _with_class_indices(ckpt: Path, path: Path, ignore_ids: list | None = None) -> Path:
    """``ckpt`` as train.py writes it for masks of class indices (``ignore_ids`` besides)."""
    content = load_checkpoint_file(ckpt, "ckpt")
    content["segscale"] |= {"label_ids": None, "ignore_ids": ignore_ids or []}
    save_checkpoint_file(content, path)
    return path


def _with_extra_values(root: Path) -> Path:
    """``_dataset``'s test split, its masks holding 7 (no class of the oracle) in a corner."""
    _dataset(root)
    for name in ("a", "b"):
        path = root / "test/masks" / f"{name}.png"
        mask = np.asarray(Image.open(path)).copy()
        mask[-2:, -3:] = 7
        Image.fromarray(mask).save(path)
    return root


def test_other_data_with_a_value_no_class_has_are_told_the_way_forward_and_take_it(
    tmp_path: Path,
):
    root = _dataset(tmp_path / "data")
    other = _with_extra_values(tmp_path / "other")
    oracle = _trained_on(
        oracle_checkpoint(tmp_path / "o.ckpt"), _folder_source(root), tmp_path / "t.ckpt"
    )
    ckpt = _with_class_indices(oracle, tmp_path / "oracle.ckpt")
    common = ("split=test", "other_data=true")
    with pytest.raises(InvalidDatasetError) as refused:
        evaluate(_config(other, ckpt, tmp_path / "out", *common))
    message = str(refused.value)
    assert "set datamodule.ignore_ids=[7]" in message and "evaluate.py" in message
    assert "datamodule/classes=auto takes" not in message  # training's advice
    assert "classes file of your own" not in message
    for extra in ((), ("datamodule/classes=auto",)):
        metrics = evaluate(
            _config(other, ckpt, tmp_path / "out", *common, *extra, "datamodule.ignore_ids=[7]")
        )
        assert metrics["MeanIoU"] == 1.0
    rows = (tmp_path / "out/confusion_matrix.csv").read_text().splitlines()
    labelled = 45 * 70 + 33 * 33 - 2 * 15 - 2 * 6  # the 255s and the 7s left out
    assert sum(int(v) for row in rows[1:] for v in row.split(",")[1:]) == labelled


def test_ignore_ids_given_add_to_the_checkpoint_s_and_may_not_take_a_class_s_value(
    tmp_path: Path,
):
    other = _with_extra_values(tmp_path / "other")
    ckpt = _with_class_indices(oracle_checkpoint(tmp_path / "o.ckpt"), tmp_path / "c.ckpt", [9])
    cfg = _config(other, ckpt, tmp_path / "out", "split=test", "datamodule.ignore_ids=[7]")
    evaluate(cfg)
    assert list(cfg.datamodule.ignore_ids) == [9, 7]  # the checkpoint's stay ignored
    for value, refused in (
        ("[1]", "mask value 1 is class 'class1'"),
        ("7", "expected a list"),
        ("[x]", "'x' is not a mask value"),
        ("[[0,0,9]]", "mix grey levels and RGB triplets"),
    ):
        cfg = _config(other, ckpt, tmp_path / "out", f"datamodule.ignore_ids={value}")
        with pytest.raises(ConfigError, match=f"^datamodule.ignore_ids.*{re.escape(refused)}"):
            evaluate(cfg)


def test_a_tiled_tiff_is_evaluated_band_by_band_never_decoded_whole(tmp_path, monkeypatch):
    import tifffile

    from segscale.data.storage.rasters import WindowedRaster

    mask = np.random.default_rng(3).integers(0, 3, (300, 200)).astype(np.uint8)
    tiled = {"tile": (64, 64), "compression": "zlib"}
    tifffile.imwrite(tmp_path / "big.tif", oracle_image(mask), **tiled)
    tifffile.imwrite(tmp_path / "big_mask.tif", mask, **tiled)
    reads = []
    window_read = WindowedRaster._read_window

    def counted(self, y0, y1, x0, x1):
        reads.append((y1 - y0) * (x1 - x0))
        return window_read(self, y0, y1, x0, x1)

    def whole(*args, **kwargs):
        raise AssertionError("the whole raster was decoded")

    monkeypatch.setattr(WindowedRaster, "_read_window", counted)
    monkeypatch.setattr(WindowedRaster, "__array__", whole)
    pair = ImageMaskPair(tmp_path / "big.tif", tmp_path / "big_mask.tif")
    trained = load_trained(str(oracle_checkpoint(tmp_path / "oracle.ckpt")))
    confusion = image_confusion(
        pair, trained, SlidingWindow(tile_size=32), LabelMap(3), torch.device("cpu")
    )
    assert int(confusion.trace()) == confusion.sum() == 300 * 200  # the oracle is right
    assert max(reads) <= 32 * 200  # a band of tiles at a time, not the image


def test_a_palette_mask_is_scored_by_its_palette_s_colours(tmp_path):
    from tests.helpers.palette_files import write_palette_mask

    mask = np.random.default_rng(5).integers(0, 3, (40, 30)).astype(np.uint8)
    colours = [(60, 16, 152), (132, 41, 246), (110, 193, 228)]
    Image.fromarray(oracle_image(mask)).save(tmp_path / "a.png")
    write_palette_mask(tmp_path / "a_mask.png", mask, colours, order=[2, 0, 1])
    pair = ImageMaskPair(tmp_path / "a.png", tmp_path / "a_mask.png")
    trained = load_trained(str(oracle_checkpoint(tmp_path / "oracle.ckpt")))
    labels = LabelMap(3, 255, colours)  # a checkpoint of colour classes
    confusion = image_confusion(
        pair, trained, SlidingWindow(tile_size=32), labels, torch.device("cpu")
    )
    assert int(confusion.trace()) == confusion.sum() == 40 * 30  # the oracle is right


def _shifted_squares(root: Path) -> Path:
    """Two 12×12 test images, a 6×6 square of class 1 at rows 2-7, cols 2-7 in each mask.

    The oracle predicts, in ``a``, the square shifted 2 px right (cols 4-9); in ``b``, the
    truth. (``tests/models/test_boundary_f1.py`` computes ``a``'s BF scores by hand.)
    """
    truth = np.zeros((12, 12), np.uint8)
    truth[2:8, 2:8] = 1
    shifted = np.zeros((12, 12), np.uint8)
    shifted[2:8, 4:10] = 1
    write_pair(root, "test", "a", oracle_image(shifted), truth)
    write_pair(root, "test", "b", oracle_image(truth), truth)
    return root


def test_bf_scores_and_each_image_s_metrics_are_matlab_s_as_computed_by_hand(
    tmp_path: Path, caplog, monkeypatch
):
    caplog.set_level("INFO")
    monkeypatch.setattr(progress, "QUIET_S", 0.0)  # a tiny run is over in a moment
    root = _shifted_squares(tmp_path / "data")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    out = tmp_path / "out"
    # θ = 0.07 · 12√2 = 1.19 px
    metrics = evaluate(_config(root, ckpt, out, "split=test", "bf_tolerance=0.07"))
    # a: class 1 has 36 true pixels, 36 predicted, 24 shared (cols 4-7); class 0 has 108
    # true, 108 predicted, 96 shared. Global 120/144; mean accuracy (96/108 + 24/36) / 2;
    # IoU 96/120 = 0.8 and 24/48 = 0.5: mean 0.65, weighted 108/144·0.8 + 36/144·0.5 =
    # 0.725; BF 63/68 and 0.6 (class 2 in neither map: left out), mean 0.763235.
    # b: all ones.
    rows = (out / "image_metrics.csv").read_text().splitlines()
    assert rows[0] == "image,GlobalAccuracy,MeanAccuracy,MeanIoU,WeightedIoU,MeanBFScore"
    assert rows[1] == "a.png,0.833333,0.777778,0.65,0.725,0.763235"
    assert rows[2] == "b.png,1.0,1.0,1.0,1.0,1.0"
    classes = metrics["classes"]
    # per class: the mean over the images that have the class
    assert classes["class0"]["MeanBFScore"] == round((63 / 68 + 1) / 2, 6)
    assert classes["class1"]["MeanBFScore"] == 0.8 and classes["class2"]["MeanBFScore"] is None
    assert metrics["MeanBFScore"] == round((0.763235 + 1) / 2, 6)
    assert metrics["bf_tolerance"] == 0.07
    assert json.loads((out / "metrics.json").read_text()) == metrics
    # class 1 of both images: 72 true, 72 predicted, 60 shared: recall 60/72, IoU 60/84,
    # Dice 120/144; BF (0.6 + 1) / 2
    class1 = "class1,0.833333,0.714286,0.833333,0.8"
    assert (out / "class_metrics.csv").read_text().splitlines()[2] == class1
    assert "MeanBFScore" in caplog.text  # the log's per-class table
    # redirected (caplog is no terminal): progress lines with counts, not a bar
    assert "images evaluated: 1/2 (50%), image 1/2 (a.png): row 1/1 of tiles, " in caplog.text
    assert "images evaluated: 2/2 (100%), image 2/2 (b.png): row 1/1 of tiles, " in caplog.text
    assert re.search(
        r"image 1/2 \(a\.png\): row 1/1 of tiles, [0-9.]+ tiles/s, .* left", caplog.text
    )


@pytest.mark.parametrize("off", ["null", "0"])
def test_without_a_bf_tolerance_no_bf_score_is_computed(tmp_path: Path, off: str):
    root = _shifted_squares(tmp_path / "data")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    out = tmp_path / "out"
    metrics = evaluate(_config(root, ckpt, out, "split=test", f"bf_tolerance={off}"))
    assert "MeanBFScore" not in metrics and "MeanBFScore" not in metrics["classes"]["class0"]
    assert (out / "image_metrics.csv").read_text().splitlines()[
        1
    ] == "a.png,0.833333,0.777778,0.65,0.725,"


@pytest.mark.parametrize("value", ["1.5", "-0.1", "true", "'0.01'", "[0.01]"])
def test_a_bf_tolerance_other_than_a_fraction_is_refused_naming_the_key(tmp_path: Path, value: str):
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    root = _shifted_squares(tmp_path / "data")
    with pytest.raises(ConfigError, match=r"bf_tolerance=.* expected a fraction"):
        evaluate(_config(root, ckpt, tmp_path / "out", "split=test", f"bf_tolerance={value}"))


def test_a_mask_on_another_grid_is_refused_or_warped_onto_its_image(tmp_path: Path):
    from segscale.data.storage.grids import WarpedLabels, read_grid
    from tests.data.storage.test_grids import UTM, class_map, in_wgs84, write_geotiff

    classes = class_map()
    root = tmp_path / "data"
    write_geotiff(
        root / "test/images/g.tif", np.moveaxis(oracle_image(classes), 2, 0), "EPSG:32632", UTM
    )
    mask, transform = in_wgs84(classes)
    write_geotiff(root / "test/masks/g.tif", mask, "EPSG:4326", transform)
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    with pytest.raises(
        InvalidDatasetError, match=r"mask lies on another grid than its image g\.tif"
    ):
        evaluate(_config(root, ckpt, tmp_path / "refused", "split=test"))
    warped = _config(root, ckpt, tmp_path / "out", "split=test", "datamodule.mask_alignment=warp")
    metrics = evaluate(warped)
    # The oracle predicts the image's classes: the truth, read on the image's grid, agrees
    # but for nearest-neighbour seams along the blocks' edges.
    assert metrics["GlobalAccuracy"] > 0.95
    truth = WarpedLabels(
        root / "test/masks/g.tif", read_grid(root / "test/images/g.tif"), LabelMap(3)
    )
    rows = (tmp_path / "out/confusion_matrix.csv").read_text(encoding="utf-8").splitlines()
    counted = sum(int(v) for row in rows[1:] for v in row.split(",")[1:])
    assert counted == (np.asarray(truth) < 3).sum() > 0.95 * classes.size


@pytest.mark.parametrize("given", [False, True])
def test_a_tile_side_the_network_cannot_take_is_named_where_it_came_from(tmp_path, given):
    # An edited checkpoint records a validation patch side of 63 for an FPN (multiples of
    # 32): the user gave no tile size, so the refusal names the checkpoint's field.
    ckpt, _ = trained_checkpoint(tmp_path / "fpn.ckpt", ["a", "b", "c"])
    content = load_checkpoint_file(ckpt, "ckpt")
    content["segscale"]["validation_inference"] = {"tile_size": 63, "overlap": 0.0, "blend": "none"}
    save_checkpoint_file(content, ckpt)
    tile = ["inference.tile_size=63"] if given else []  # else inference=validation's "checkpoint"
    cfg = compose_config("evaluate", f"ckpt={ckpt}", f"output_dir={tmp_path / 'out'}", *tile)
    with pytest.raises(ConfigError) as refused:
        evaluate(cfg)
    message = str(refused.value)
    rule = "63 is not allowed: FPN (output stride 32) takes sides that are multiples of 32"
    if given:
        assert message.startswith(f"inference.tile_size={rule}")
    else:
        prefix = f"ckpt={str(ckpt)!r}: its segscale.validation_inference.tile_size={rule}"
        assert message.startswith(prefix) and " inference.tile_size=63" not in message
        assert "give inference.tile_size=<side>" in message
