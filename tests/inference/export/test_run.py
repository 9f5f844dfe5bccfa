from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from segscale.inference.export.formats import (
    ExportSettings,
    load_exported,
    read_metadata,
    resolve_dtype,
)
from segscale.inference.export.run import export_network
from segscale.models.checkpoint.files import save_checkpoint_file
from segscale.models.checkpoint.trained import TrainedModel, load_trained
from segscale.models.networks import build_network
from tests.conftest import full_record, oracle_checkpoint, oracle_image

SUFFIX = {"onnx": ".onnx", "torchscript": ".pt"}


def _raw_images(dtype: str, shapes: list[tuple[int, ...]], max_value: float = 255.0):
    """Random raw pixel values of ``dtype`` for each N×C×H×W shape."""
    rng = np.random.default_rng(0)
    for shape in shapes:
        if dtype == "float32":
            yield (rng.random(shape) * max_value).astype(np.float32)
        else:
            yield rng.integers(0, int(max_value) + 1, shape).astype(dtype)


def _pytorch(trained: TrainedModel, image: np.ndarray) -> np.ndarray:
    """What the checkpoint's module computes (its own forward) on raw pixel values."""
    with torch.no_grad():
        return trained.module(torch.from_numpy(image)).numpy()


def _export(trained: TrainedModel, path: Path, fmt: str, **settings) -> Path:
    """Export without the built-in check: these tests compare independently."""
    written = export_network(trained, path, ExportSettings(fmt, **settings), verify=False)
    assert written.path == path and written.size_bytes == path.stat().st_size
    return path


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_exported_scores_equal_the_module_forward_at_two_sizes(
    tmp_path: Path, fmt: str, dtype: str
):
    trained = load_trained(oracle_checkpoint(tmp_path / "oracle.ckpt"))
    path = _export(trained, tmp_path / f"net{SUFFIX[fmt]}", fmt, dtype=dtype)
    run = load_exported(path, fmt)
    for image in _raw_images(dtype, [(2, 3, 37, 90), (1, 3, 70, 41)]):
        got = run(image)
        assert got.dtype == np.float32 and got.shape == (len(image), 3, *image.shape[2:])
        np.testing.assert_allclose(got, _pytorch(trained, image), atol=1e-4, rtol=0)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_returns_mask_is_the_argmax(tmp_path: Path, fmt: str):
    trained = load_trained(oracle_checkpoint(tmp_path / "oracle.ckpt"))
    path = _export(trained, tmp_path / f"net{SUFFIX[fmt]}", fmt, returns="mask")
    truth = np.random.default_rng(1).integers(0, 3, (2, 45, 33))
    image = np.stack([oracle_image(m).transpose(2, 0, 1) for m in truth])
    mask = load_exported(path, fmt)(image)
    assert mask.dtype == np.int64 and mask.shape == truth.shape
    np.testing.assert_array_equal(mask, _pytorch(trained, image).argmax(1))
    np.testing.assert_array_equal(mask, truth)


def _deeplab_checkpoint(path: Path) -> Path:
    """A small DeepLabV3+ (ResNet-18 encoder, output stride 16), randomly initialised."""
    model = {
        "_target_": "segscale.models.networks.build_network",
        "arch": "DeepLabV3Plus",
        "encoder": "resnet18",
        "num_classes": 4,
        "in_channels": 3,
        "output_stride": 16,
        "decoder_channels": 16,
    }
    torch.manual_seed(0)
    network = build_network(**{k: v for k, v in model.items() if k != "_target_"}).eval()
    meta = {
        "model": model,
        "class_names": [f"class{k}" for k in range(4)],
        "class_colors": None,
        "ignore_index": 255,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "max_value": 255.0,
    }
    state = {f"network.{k}": v for k, v in network.state_dict().items()}
    save_checkpoint_file({"state_dict": state, "segscale": full_record(meta)}, path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_deeplabv3plus_takes_any_batch_and_sides_that_are_multiples_of_16(tmp_path: Path, fmt: str):
    trained = load_trained(_deeplab_checkpoint(tmp_path / "deeplab.ckpt"))
    path = _export(trained, tmp_path / f"net{SUFFIX[fmt]}", fmt)
    run = load_exported(path, fmt)
    for image in _raw_images("uint8", [(2, 3, 64, 64), (1, 3, 48, 112), (3, 3, 96, 32)]):
        np.testing.assert_allclose(run(image), _pytorch(trained, image), atol=1e-4, rtol=0)
    assert read_metadata(path, fmt)["input"]["side_multiple"] == 16


def test_a_16_bit_checkpoint_takes_uint16_images(tmp_path: Path):
    oracle = oracle_checkpoint(tmp_path / "oracle.ckpt")
    checkpoint = torch.load(oracle, weights_only=True)
    checkpoint["segscale"]["max_value"] = 65535.0
    del checkpoint["segscale_sha256"]
    save_checkpoint_file(checkpoint, tmp_path / "16bit.ckpt")
    trained = load_trained(tmp_path / "16bit.ckpt")
    dtype = resolve_dtype("auto", trained.max_value)
    assert dtype == "uint16"
    path = _export(trained, tmp_path / "net.onnx", "onnx", dtype=dtype)
    (image,) = _raw_images("uint16", [(1, 3, 20, 30)], max_value=65535)
    got = load_exported(path, "onnx")(image)
    np.testing.assert_allclose(got, _pytorch(trained, image), atol=1e-4, rtol=0)
