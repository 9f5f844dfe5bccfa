"""``predict.py``'s probability, confidence and entropy files (``probabilities``,
``confidence``) and its output folder; the masks and overlays are tests/cli/test_predict.py's."""

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import rasterio
from omegaconf import OmegaConf
from PIL import Image

import segscale
from segscale.cli.predict import main as predict_main
from segscale.errors import EXIT_BAD_INPUT, ConfigError
from segscale.inference.prediction import probability_maps
from segscale.inference.prediction.run import predict, prediction_folder, unexpected_entries
from segscale.models.checkpoint.files import load_checkpoint_file, save_checkpoint_file
from segscale.runs.folder import RunFolderBusyError, RunFolderLock
from tests.conftest import compose_config, oracle_checkpoint, oracle_image
from tests.helpers.in_process import run_in_process
from tests.inference.prediction.test_georeference import NORTH_UP, UTM, geotiff

CLASS_NAMES = ("water", "building", "asphalt")
"""The checkpoint's classes, not in sorted order: the bands must keep this one."""
TILE = 32
SHAPE = (70, 90)
"""Larger than a tile both ways, and no multiple of the stride: several bands of rows."""


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, np.ndarray]:
    """A checkpoint, a folder with one GeoTIFF (UTM 33N) and its in-memory probabilities."""
    root = tmp_path_factory.mktemp("scene")
    truth = np.random.default_rng(5).integers(0, 3, SHAPE).astype(np.uint8)
    (root / "in").mkdir()
    image = geotiff(root / "in" / "scene.tif", oracle_image(truth), crs=UTM, transform=NORTH_UP)
    ckpt = named_classes(oracle_checkpoint(root / "oracle.ckpt"), CLASS_NAMES)
    expected = segscale.load(ckpt, device="cpu", tile_size=TILE).predict_proba(image)
    return ckpt, root / "in", expected


def named_classes(ckpt: Path, names: tuple[str, ...]) -> Path:
    """``ckpt`` with its classes renamed ``names``, in that order."""
    content = load_checkpoint_file(ckpt, "ckpt")
    content["segscale"]["class_names"] = list(names)
    save_checkpoint_file(content, ckpt)
    return ckpt


def _predict(ckpt: Path, images: Path, out: Path, *overrides: str) -> list[Path]:
    cfg = compose_config(
        "predict",
        "accelerator=cpu",
        f"ckpt={ckpt}",
        f"input={images}",
        f"output_dir={out}",
        f"inference.tile_size={TILE}",
        *overrides,
    )
    return predict(cfg)


def _read(path: Path) -> tuple[np.ndarray, SimpleNamespace]:
    """The bands of ``path`` and what GDAL says of them."""
    with rasterio.open(path) as dataset:
        keys = ("crs", "transform", "descriptions", "scales", "dtypes")
        return dataset.read(), SimpleNamespace(**{key: getattr(dataset, key) for key in keys})


def test_uint8_probabilities_are_the_in_memory_ones_rounded_and_keep_the_georeference(
    scene, tmp_path: Path
):
    ckpt, images, expected = scene
    _predict(ckpt, images, tmp_path, "format=png", "probabilities=uint8")
    # Always a GeoTIFF beside a png mask (and its world file).
    assert sorted(p.name for p in tmp_path.glob("scene*")) == [
        "scene.pgw",
        "scene.png",
        "scene_overlay.pgw",
        "scene_overlay.png",
        "scene_probabilities.tif",
    ]
    stored, dataset = _read(tmp_path / "scene_probabilities.tif")
    assert stored.dtype == np.uint8 and stored.shape == (3, *SHAPE)
    np.testing.assert_array_equal(stored, np.rint(expected * 255))
    # Each pixel's rounded values are within half a step per class of summing to 255.
    assert np.abs(stored.sum(axis=0, dtype=int) - 255).max() <= 1
    assert dataset.crs == UTM and dataset.transform == NORTH_UP
    assert dataset.descriptions == CLASS_NAMES  # band k is class k, the checkpoint's order
    assert dataset.scales == (1 / 255,) * 3
    mask = np.asarray(Image.open(tmp_path / "scene.png"))
    np.testing.assert_array_equal(mask, expected.argmax(axis=0))


def test_float16_probabilities_confidence_and_entropy(scene, tmp_path: Path):
    ckpt, images, expected = scene
    written = _predict(
        ckpt, images, tmp_path, "format=tif", "probabilities=float16", "confidence=float32"
    )
    assert [p.name for p in written] == ["scene.tif"]  # the masks, as before
    stored, dataset = _read(tmp_path / "scene_probabilities.tif")
    assert dataset.dtypes[0] in ("float16", "float32")  # GDAL before 3.11 reads halfs as floats
    np.testing.assert_array_equal(stored, expected.astype(np.float16))
    np.testing.assert_allclose(stored.astype(np.float32).sum(axis=0), 1, atol=2e-3)
    confidence, dataset = _read(tmp_path / "scene_confidence.tif")
    assert dataset.descriptions == ("confidence",) and dataset.transform == NORTH_UP
    np.testing.assert_array_equal(confidence[0], expected.max(axis=0))
    entropy, dataset = _read(tmp_path / "scene_entropy.tif")
    assert dataset.descriptions == ("entropy",) and dataset.crs == UTM
    nats = -(expected * np.log(expected)).sum(axis=0)
    np.testing.assert_allclose(entropy[0], nats / np.log(3), atol=1e-6)
    assert entropy.min() >= 0 and entropy.max() <= 1


def test_uint8_confidence_without_probabilities(scene, tmp_path: Path):
    ckpt, images, expected = scene
    _predict(ckpt, images, tmp_path, "overlay=false", "confidence=uint8")
    assert sorted(p.name for p in tmp_path.glob("*.tif")) == [
        "scene_confidence.tif",
        "scene_entropy.tif",
    ]
    confidence, _ = _read(tmp_path / "scene_confidence.tif")
    assert confidence.dtype == np.uint8
    np.testing.assert_array_equal(confidence[0], np.rint(expected.max(axis=0) * 255))


def test_files_are_written_by_bands_of_rows_never_the_whole_image(
    scene, tmp_path: Path, monkeypatch
):
    ckpt, images, _ = scene
    bands: list[tuple[int, int]] = []
    write = probability_maps.RasterFile.write

    def recorded(self, y0: int, values: np.ndarray) -> None:
        bands.append((y0, values.shape[1]))
        write(self, y0, values)

    monkeypatch.setattr(probability_maps.RasterFile, "write", recorded)
    _predict(ckpt, images, tmp_path, "probabilities=uint8", "inference.overlap=0")
    starts = [y0 for y0, _ in bands]
    assert starts == sorted(starts) and len(set(starts)) >= 3
    assert max(rows for _, rows in bands) <= TILE < SHAPE[0]


def test_an_interrupted_image_leaves_none_of_its_files(scene, tmp_path: Path, monkeypatch):
    ckpt, images, _ = scene
    write = probability_maps.RasterFile.write

    def failing(self, y0: int, values: np.ndarray) -> None:
        if y0 > 0:
            raise OSError(28, "No space left on device")
        write(self, y0, values)

    monkeypatch.setattr(probability_maps.RasterFile, "write", failing)
    with pytest.raises(OSError, match="No space"):
        _predict(ckpt, images, tmp_path, "probabilities=float16", "confidence=uint8")
    assert not [p for p in tmp_path.iterdir() if p.name != ".segscale.lock"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("probabilities=float32", "probabilities='float32' is not allowed: expected one of"),
        ("probabilities=true", "probabilities=True is not allowed"),
        ("confidence=true", "confidence=True is not allowed: expected one of none, uint8"),
        ("confidence=float16", "confidence='float16' is not allowed"),
    ],
)
def test_unknown_values_are_refused_before_anything_is_written(
    scene, tmp_path: Path, override: str, message: str
):
    ckpt, images, _ = scene
    with pytest.raises(ConfigError, match=message):
        _predict(ckpt, images, tmp_path / "out", override)
    assert not list((tmp_path / "out").glob("scene*"))


def test_predict_py_exits_2_naming_the_key(scene, tmp_path: Path):
    ckpt, images, _ = scene
    result = run_in_process(
        predict_main,
        f"ckpt={ckpt}",
        f"input={images}",
        "accelerator=cpu",
        "probabilities=float64",
        f"hydra.run.dir={tmp_path / 'out'}",
        program="predict.py",
    )
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_BAD_INPUT and "Traceback" not in output
    assert "probabilities='float64' is not allowed" in output


def test_an_input_named_like_anothers_probabilities_is_refused(scene, tmp_path: Path):
    ckpt, _, _ = scene
    (tmp_path / "in").mkdir()
    for name in ("a.png", "a_probabilities.png"):
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "in" / name)
    with pytest.raises(ConfigError, match="would both write the output 'a_probabilities'"):
        _predict(ckpt, tmp_path / "in", tmp_path / "out", "probabilities=uint8", "format=tif")
    # Without probabilities the two write different names.
    _predict(ckpt, tmp_path / "in", tmp_path / "plain", "format=tif")


def _folder(root: Path, files: tuple[str, ...] = (), folders: tuple[str, ...] = ()) -> Path:
    root.mkdir()
    for name in folders:
        (root / name).mkdir()
    for name in files:
        (root / name).write_text("")
    return root


def test_a_folder_a_prediction_left_before_its_first_mask_is_fresh(tmp_path: Path):
    assert unexpected_entries(_folder(tmp_path / "new")) == []
    left = _folder(tmp_path / "left", files=(".lock", "predict.log"), folders=(".hydra",))
    assert unexpected_entries(left) == []


@pytest.mark.parametrize(
    ("files", "folders", "found"),
    [
        (("a.png", "a_overlay.png", "predict.log"), (".hydra",), ["a.png", "a_overlay.png"]),
        (("a.tif", "a.tfw"), (), ["a.tfw", "a.tif"]),
        (("notes.txt", ".hidden"), (), [".hidden", "notes.txt"]),
        ((".hydra",), (), [".hydra"]),  # the records' name, but a file
        ((), (".lock",), [".lock/"]),  # the lock's name, but a folder
        ((), ("predict.log",), ["predict.log/"]),  # a log's name, but a folder
        ((), ("masks",), ["masks/"]),  # a folder input's outputs, in subfolders
        (("predict.log.png",), (), ["predict.log.png"]),
    ],
)
def test_anything_else_in_the_folder_is_named(tmp_path, files, folders, found):
    assert unexpected_entries(_folder(tmp_path / "out", files, folders)) == found


def test_links_under_the_allowed_names_are_not_taken_for_them(tmp_path: Path):
    elsewhere = _folder(tmp_path / "elsewhere", files=("x",))
    folder = _folder(tmp_path / "out")
    os.symlink(elsewhere, folder / ".hydra")
    os.symlink(elsewhere / "x", folder / "predict.log")
    os.symlink(elsewhere / "x", folder / ".lock")
    assert unexpected_entries(folder) == [".hydra/", ".lock", "predict.log"]


def test_a_folder_with_another_prediction_s_masks_is_refused_before_the_prediction(tmp_path):
    folder = _folder(tmp_path / "out", files=("wide.png",))
    cfg = OmegaConf.create({"output_dir": str(folder)})
    refused = pytest.raises(ConfigError, match=r"out already holds 1 file\(s\) or folder")
    with refused, prediction_folder(cfg):
        pytest.fail("predicted into a folder holding another prediction's masks")
    assert sorted(p.name for p in folder.iterdir()) == ["wide.png"]  # the lock is gone


def test_a_folder_another_prediction_holds_is_refused_naming_it(tmp_path: Path):
    folder = tmp_path / "out"
    cfg = OmegaConf.create({"output_dir": str(folder)})
    busy = pytest.raises(RunFolderBusyError, match=rf"{folder} is in use by another prediction")
    with RunFolderLock(folder, what="prediction"), busy, prediction_folder(cfg):
        pytest.fail("two predictions held one folder")
    with prediction_folder(cfg) as held:  # free again
        assert held == folder and (folder / ".lock").is_file()
    assert list(folder.iterdir()) == []
