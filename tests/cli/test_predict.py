from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from segscale.checks import ConfigError
from segscale.cli.predict import predict
from tests.conftest import compose_config, oracle_checkpoint, oracle_image


def _config(*overrides: str):
    return compose_config("predict", "accelerator=cpu", *overrides)


def _images(folder: Path) -> dict[str, np.ndarray]:
    """Two images whose sizes are not multiples of the tile; returns their true labels."""
    folder.mkdir()
    truths = {}
    for name, shape in (("wide", (37, 90)), ("tall", (70, 41))):
        mask = np.random.default_rng(len(name)).integers(0, 3, shape).astype(np.uint8)
        Image.fromarray(oracle_image(mask)).save(folder / f"{name}.png")
        truths[name] = mask
    return truths


def test_predict_writes_palette_masks_and_overlays(tmp_path: Path):
    truths = _images(tmp_path / "in")
    colours = [[255, 0, 0], [0, 255, 0], [0, 0, 255]]
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt", colours=colours)
    cfg = _config(
        f"ckpt={ckpt}",
        f"input={tmp_path / 'in'}",
        f"output_dir={tmp_path / 'out'}",
        "inference.tile_size=32",
    )
    written = predict(cfg)
    assert sorted(p.name for p in written) == ["tall.png", "wide.png"]
    for name, truth in truths.items():
        mask = Image.open(tmp_path / "out" / f"{name}.png")
        assert mask.mode == "P" and mask.getpalette()[:9] == [255, 0, 0, 0, 255, 0, 0, 0, 255]
        np.testing.assert_array_equal(np.asarray(mask), truth)
        overlay = np.asarray(Image.open(tmp_path / "out" / f"{name}_overlay.png"))
        assert overlay.shape == (*truth.shape, 3)
    assert not list((tmp_path / "out").glob(".*partial"))


def test_predict_splits_images_across_two_processes_and_writes_tiff(tmp_path: Path):
    truths = _images(tmp_path / "in")
    (tmp_path / "list.txt").write_text("in/wide.png\n# a comment\nin/tall.png\n")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    cfg = _config(
        f"ckpt={ckpt}",
        f"input={tmp_path / 'list.txt'}",
        "devices=2",
        "format=tif",
        "overlay=false",
        f"output_dir={tmp_path / 'out'}",
        "inference.tile_size=32",
    )
    predict(cfg)
    for name, truth in truths.items():
        np.testing.assert_array_equal(tifffile.imread(tmp_path / "out" / f"{name}.tif"), truth)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["tall.tif", "wide.tif"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("input={tmp}/nothing.png", "input=.*is not an image, a folder or a .txt list"),
        ("ckpt={tmp}/missing.ckpt", r"ckpt=.*does not exist; expected a .ckpt"),
        ("ckpt={tmp}/in/wide.png", "ckpt=.*is not a readable checkpoint"),
        ("format=jpg", "format='jpg' is not allowed"),
    ],
)
def test_bad_input_names_the_key(tmp_path: Path, override: str, message: str):
    _images(tmp_path / "in")
    ckpt = oracle_checkpoint(tmp_path / "oracle.ckpt")
    cfg = _config(
        f"ckpt={ckpt}",
        f"input={tmp_path / 'in'}",
        f"output_dir={tmp_path / 'out'}",
        override.format(tmp=tmp_path),
    )
    with pytest.raises(ConfigError, match=message):
        predict(cfg)
