import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import segscale
from segscale import api
from segscale.errors import ConfigError
from segscale.inference.prediction.run import predict as predict_command
from segscale.models.checkpoint.files import load_checkpoint_file, save_checkpoint_file
from tests.conftest import (
    compose_config,
    float_oracle_checkpoint,
    oracle_checkpoint,
    oracle_image,
    tiny_overrides,
    write_pair,
)

COLOURS = [[255, 0, 0], [0, 255, 0], [0, 0, 255]]


@pytest.fixture
def oracle(tmp_path: Path) -> Path:
    return oracle_checkpoint(tmp_path / "oracle.ckpt", colours=COLOURS)


def _truth(shape: tuple[int, int] = (70, 90)) -> np.ndarray:
    return np.random.default_rng(1).integers(0, 3, shape).astype(np.uint8)


@pytest.mark.slow
def test_import_segscale_loads_neither_torch_nor_lightning():
    code = (
        "import sys, segscale; "
        "print(sorted(m for m in ('torch', 'lightning', 'segscale.api') if m in sys.modules)); "
        "segscale.load; print(sorted(m for m in ('torch', 'segscale.api') if m in sys.modules)); "
        "print(segscale.__version__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    before, after, version = result.stdout.splitlines()
    assert before == "[]"
    assert after == "['segscale.api', 'torch']"
    assert version[0].isdigit()
    assert {"load", "train", "evaluate", "Predictor", "TrainingFailedError"} <= set(dir(segscale))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        segscale.nothing  # noqa: B018


def test_predict_an_array_and_a_file_as_predict_py_does(oracle: Path, tmp_path: Path):
    truth = _truth()
    image = oracle_image(truth)
    Image.fromarray(image).save(tmp_path / "tile.png")
    predictor = segscale.load(oracle, tile_size=32)
    from_array = predictor.predict(image)
    from_file = predictor.predict(tmp_path / "tile.png")
    np.testing.assert_array_equal(from_array, truth)
    np.testing.assert_array_equal(from_file, truth)
    assert from_array.dtype == np.uint8 and from_array.shape == truth.shape
    cfg = compose_config(
        "predict",
        f"ckpt={oracle}",
        f"input={tmp_path / 'tile.png'}",
        f"output_dir={tmp_path / 'out'}",
        "accelerator=cpu",
        "overlay=false",
        "inference.tile_size=32",
    )
    (written,) = predict_command(cfg)
    np.testing.assert_array_equal(np.asarray(Image.open(written)), from_file)


def test_the_window_is_predict_py_s_unless_replaced(oracle: Path):
    shipped = compose_config("predict").inference
    window = segscale.load(oracle).window
    assert (window.tile_size, window.overlap, window.batch_size, window.tta) == (
        shipped.tile_size,
        shipped.overlap,
        shipped.batch_size,
        shipped.tta,
    )
    replaced = segscale.load(
        oracle, tile_size=48, overlap=0.5, batch_size=2, overrides=["inference.tta=flip"]
    ).window
    assert (replaced.tile_size, replaced.overlap, replaced.batch_size, replaced.tta) == (
        48,
        0.5,
        2,
        "flip",
    )
    scaled = segscale.load(oracle, tta="d4", tta_scales=(0.75, 1, 1.25)).window
    assert (scaled.tta, scaled.tta_scales) == ("d4", (0.75, 1.0, 1.25))
    with pytest.raises(ConfigError, match=r"inference\.tta_scales=\[0\] is not allowed"):
        segscale.load(oracle, tta_scales=[0])
    with pytest.raises(ConfigError, match=r"inference\.overlap=1\.5 is not allowed"):
        segscale.load(oracle, overlap=1.5)


def test_classes_colours_and_probabilities(oracle: Path):
    predictor = segscale.load(oracle, device="cpu", tile_size=32)
    assert predictor.class_names == ("class0", "class1", "class2")
    assert predictor.num_classes == 3
    np.testing.assert_array_equal(predictor.colours, np.array(COLOURS, dtype=np.uint8))
    assert predictor.colours.dtype == np.uint8
    truth = _truth((40, 50))
    probabilities = predictor.predict_proba(oracle_image(truth))
    assert probabilities.shape == (3, 40, 50) and probabilities.dtype == np.float32
    np.testing.assert_allclose(probabilities.sum(axis=0), 1, rtol=1e-5)
    np.testing.assert_array_equal(probabilities.argmax(axis=0), truth)
    assert "class0" in repr(predictor)


def test_wrong_images_are_refused_with_what_was_expected(oracle: Path, tmp_path: Path):
    predictor = segscale.load(oracle, tile_size=32)
    with pytest.raises(ValueError, match=r"shape \(20, 20\).*takes 3 channel"):
        predictor.predict(np.zeros((20, 20), np.uint8))
    with pytest.raises(ValueError, match=r"shape \(3, 20, 20\).*H×W×3"):
        predictor.predict(np.zeros((3, 20, 20), np.uint8))
    with pytest.raises(TypeError, match="numpy array or the path"):
        predictor.predict([[1, 2], [3, 4]])  # type: ignore[arg-type]
    (tmp_path / "broken.png").write_bytes(b"not a png")
    with pytest.raises(ConfigError, match=r"broken\.png: cannot be decoded"):
        predictor.predict(str(tmp_path / "broken.png"))
    Image.fromarray(np.zeros((20, 20), np.uint8)).save(tmp_path / "grey.png")
    with pytest.raises(ConfigError, match=r"grey\.png: has 1 channels.*takes 3"):
        predictor.predict(tmp_path / "grey.png")


def test_a_bad_checkpoint_path_names_it(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"ckpt=.*missing\.ckpt.*no such file"):
        segscale.load(tmp_path / "missing.ckpt")
    (tmp_path / "image.ckpt").write_bytes(b"\x89PNG not weights")
    with pytest.raises(ConfigError, match=r"ckpt=.*image\.ckpt"):
        segscale.load(tmp_path / "image.ckpt")


def _fail_if_started(command: list[str]) -> int:
    raise AssertionError(f"a run was started: {command}")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optimizer.lr=-1"], "optimizer.lr=-1 is not allowed"),
        (["trainer.max_epoch=2"], "Could not override 'trainer.max_epoch'"),
        (["model=nope"], "Could not find 'model/nope'"),
        (["-m", "optimizer.lr=0.1,0.2"], r"\['-m'\] are command-line options"),
        # checked by the same preparation as train.py's: the patch side the network takes
        (
            ["datamodule.patch_size=100"],
            r"datamodule\.patch_size=100 is not allowed: DeepLabV3Plus",
        ),
    ],
)
def test_a_bad_override_raises_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, overrides: list[str], message: str
):
    monkeypatch.setattr(api, "_run", _fail_if_started)
    with pytest.raises(ConfigError, match=message):
        segscale.train(overrides)


FAKE_TRAIN = """
import json, sys
from pathlib import Path
values = dict(a.split("=", 1) for a in sys.argv if "=" in a)
folder = Path(values.get("output_dir", values["hydra.run.dir"].strip("'")))
folder.mkdir(parents=True)
(folder / "summary.json").write_text(json.dumps({"status": "finished", "argv": sys.argv[1:]}))
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def fake_train(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Replace train.py by a script that writes its arguments as the summary."""
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)

    def program(status: int = 0) -> None:
        monkeypatch.setattr(
            api, "_train_program", lambda: [sys.executable, str(script), str(status)]
        )

    program()
    return program


def test_train_passes_the_overrides_and_a_resolved_run_folder(
    fake_train, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    myconf = tmp_path / "my conf"
    (myconf / "experiment").mkdir(parents=True)
    (myconf / "experiment" / "mine.yaml").write_text("# @package _global_\nseed: 7\n")
    summary = segscale.train(
        ["experiment=mine", "hydra.run.dir=runs/${now:%Y}", "optimizer.lr=0.05"], config_dir=myconf
    )
    folder = Path(summary["run_dir"])
    assert folder.parent == tmp_path / "runs" and folder.is_dir()
    assert summary["argv"] == [
        "0",
        "--config-name",
        "train",
        "experiment=mine",
        "optimizer.lr=0.05",
        f"hydra.searchpath=['file://{myconf}']",
        f"hydra.run.dir='{folder}'",
    ]
    # output_dir, when given, is the run folder (where summary.json is written)
    summary = segscale.train([f"output_dir={tmp_path / 'elsewhere'}"])
    assert summary["run_dir"] == str(tmp_path / "elsewhere")


def test_a_failed_run_raises_with_its_status_and_folder(fake_train, tmp_path: Path):
    fake_train(status=2)
    with pytest.raises(api.TrainingFailedError, match="exit status 2") as failure:
        segscale.train([f"hydra.run.dir={tmp_path / 'run'}"])
    assert failure.value.returncode == 2
    assert failure.value.run_dir == tmp_path / "run"
    assert isinstance(failure.value, RuntimeError)


def test_a_missing_config_dir_is_named(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"config_dir=.*nowhere.*no such folder"):
        segscale.train([], config_dir=tmp_path / "nowhere")


@pytest.mark.slow
def test_train_returns_the_summary_and_the_run_predicts(
    tiny_data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    overrides = [*tiny_overrides(tiny_data_root, None), "trainer.max_epochs=1"]
    summary = segscale.train([*overrides, "hydra.run.dir=run"])
    folder = tmp_path / "run"
    assert summary["run_dir"] == str(folder)
    assert summary["status"] == "finished"
    assert 0 <= summary["metrics"]["val/mIoU"] <= 1
    assert json.loads((folder / "summary.json").read_text())["steps"] == summary["steps"]
    best = folder / "checkpoints" / "best.ckpt"
    assert summary["best_checkpoint"] == str(best) and best.is_file()
    image = next(tiny_data_root.rglob("val/images/*.png"))
    labels = segscale.load(best).predict(image)
    assert labels.shape == (192, 192)
    assert labels.max() < 6


def test_an_array_is_checked_against_the_checkpoint_as_an_image_file_is(
    oracle: Path, tmp_path: Path
):
    image = oracle_image(_truth((20, 20)))
    predictor = segscale.load(oracle, tile_size=32)
    network = f"the network of ckpt={str(oracle)!r}"
    with pytest.raises(ValueError, match=re.escape(f"are uint16, {network} takes uint8")):
        predictor.predict(image.astype(np.uint16))  # 16-bit pixels into an 8-bit network
    with pytest.raises(ValueError, match=re.escape(f"float32, {network} takes uint8")):
        predictor.predict_proba(image.astype(np.float32))
    with pytest.raises(ValueError, match=re.escape(f"{network} takes 3 channel")):
        predictor.predict(image[:, :, :2])
    content = load_checkpoint_file(oracle, "ckpt")
    content["segscale"]["max_value"] = 1.0  # a network trained on float pixels
    save_checkpoint_file(content, tmp_path / "float.ckpt")
    floats = segscale.load(tmp_path / "float.ckpt", tile_size=32)
    pixels = image.astype(np.float32) / 255
    assert floats.predict(pixels).shape == (20, 20)
    pixels[3, 4, 1] = np.nan
    with pytest.raises(ValueError, match="has NaN or infinite pixels; expected finite values"):
        floats.predict(pixels)
    with pytest.raises(ValueError, match=re.escape("float64, the network of ckpt=")):
        floats.predict(image / 255)  # numpy's default float type: not the training images'


def test_a_one_channel_float_array_with_a_nan_is_refused_as_h_by_w(oracle: Path, tmp_path: Path):
    content = load_checkpoint_file(oracle, "ckpt")
    meta = content["segscale"]
    meta |= {"max_value": 1.0, "mean": [0.0], "std": [1 / 255]}
    meta["model"]["in_channels"] = 1
    weight = content["state_dict"]["network.weight"]
    content["state_dict"]["network.weight"] = weight[:, :1]
    save_checkpoint_file(content, tmp_path / "grey.ckpt")
    predictor = segscale.load(tmp_path / "grey.ckpt", tile_size=32)
    pixels = np.zeros((20, 20), np.float32)
    assert predictor.predict(pixels).shape == (20, 20)
    pixels[5, 5] = np.nan
    with pytest.raises(ValueError, match="image of dtype float32: has NaN or infinite pixels"):
        predictor.predict(pixels)


def test_an_array_far_outside_the_training_values_is_refused(oracle: Path, tmp_path: Path):
    ckpt = float_oracle_checkpoint(tmp_path / "float.ckpt")
    truth = _truth((20, 20))
    pixels = oracle_image(truth).astype(np.float32)
    predictor = segscale.load(ckpt, tile_size=32)
    np.testing.assert_array_equal(predictor.predict(pixels / 255), truth)
    with pytest.raises(ValueError, match="far from the training images' 0 to 1") as refused:
        predictor.predict(pixels)
    assert "check_value_range=false" in str(refused.value)
    unchecked = segscale.load(ckpt, tile_size=32, overrides=["check_value_range=false"])
    assert unchecked.predict(pixels).shape == truth.shape


def test_evaluate_returns_the_metrics_bf_scores_and_each_image_s_row(tmp_path: Path):
    truth = np.zeros((12, 12), np.uint8)
    truth[2:8, 2:8] = 1
    shifted = np.zeros((12, 12), np.uint8)
    shifted[2:8, 4:10] = 1  # the square 2 px to the right (tests/cli/test_evaluate.py)
    root = tmp_path / "data"
    write_pair(root, "test", "a", oracle_image(shifted), truth)
    write_pair(root, "test", "b", oracle_image(truth), truth)
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    where = ["datamodule=folder", f"datamodule.source.root={root}", "split=test", "other_data=true"]
    metrics = segscale.evaluate(
        ckpt, [*where, "accelerator=cpu", "bf_tolerance=0.07"], output_dir=tmp_path / "out"
    )
    assert metrics["classes"]["class1"]["MeanBFScore"] == 0.8  # (0.6 + 1) / 2
    assert metrics["images"] == [
        {"image": "a.png", "GlobalAccuracy": 0.833333, "MeanAccuracy": 0.777778,
         "MeanIoU": 0.65, "WeightedIoU": 0.725, "MeanBFScore": 0.763235},
        {"image": "b.png", "GlobalAccuracy": 1.0, "MeanAccuracy": 1.0, "MeanIoU": 1.0,
         "WeightedIoU": 1.0, "MeanBFScore": 1.0},
    ]  # fmt: skip
    assert metrics["output_dir"] == str(tmp_path / "out")
    assert (tmp_path / "out/image_metrics.csv").is_file()
    with pytest.raises(ConfigError, match="bf_tolerance=2"):
        segscale.evaluate(ckpt, [*where, "bf_tolerance=2"], output_dir=tmp_path / "bad")
