from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

import segscale.inference.export as export_module
from segscale.errors import ConfigError
from segscale.inference.export import (
    ExportMismatchError,
    ExportSettings,
    check_exported,
    check_settings,
    export_network,
    exportable,
    load_exported,
    read_metadata,
    resolve_dtype,
)
from segscale.models.checkpoint.files import save_checkpoint_file
from segscale.models.checkpoint.trained import TrainedModel, load_trained
from segscale.models.networks import build_network
from tests.conftest import oracle_checkpoint, oracle_image

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


def test_onnx_declares_the_input_type_and_dynamic_axes(tmp_path: Path):
    trained = load_trained(oracle_checkpoint(tmp_path / "oracle.ckpt"))
    path = _export(trained, tmp_path / "net.onnx", "onnx", dtype="float32", returns="mask")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (given,), (returned,) = session.get_inputs(), session.get_outputs()
    assert given.name == "image" and given.type == "tensor(float)"
    assert given.shape[1] == 3 and all(isinstance(side, str) for side in given.shape[::2])
    assert returned.name == "mask" and returned.type == "tensor(int64)"
    assert len(returned.shape) == 3


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_the_file_carries_classes_and_input_conventions(tmp_path: Path, fmt: str):
    colours = [[255, 0, 0], [0, 255, 0], [0, 0, 255]]
    trained = load_trained(oracle_checkpoint(tmp_path / "oracle.ckpt", colours=colours))
    path = _export(trained, tmp_path / f"net{SUFFIX[fmt]}", fmt, returns="mask")
    meta = read_metadata(path, fmt)
    assert meta["class_names"] == ["class0", "class1", "class2"]
    assert meta["class_colors"] == colours and meta["returns"] == "mask"
    assert meta["input"] == {
        "layout": "NCHW",
        "dtype": "uint8",
        "channels": 3,
        "max_value": 255.0,
        "side_multiple": 1,
    }


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
    save_checkpoint_file({"state_dict": state, "segscale": meta}, path)
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


def test_an_opset_below_18_uses_the_legacy_exporter(tmp_path: Path):
    import onnx

    trained = load_trained(oracle_checkpoint(tmp_path / "oracle.ckpt"))
    path = _export(trained, tmp_path / "net.onnx", "onnx", opset=13)
    opsets = {o.domain: o.version for o in onnx.load(str(path)).opset_import}
    assert opsets.get("", opsets.get("ai.onnx")) == 13
    for image in _raw_images("uint8", [(2, 3, 37, 90), (1, 3, 70, 41)]):
        got = load_exported(path, "onnx")(image)
        np.testing.assert_allclose(got, _pytorch(trained, image), atol=1e-4, rtol=0)


def test_an_opset_the_exporter_cannot_reach_is_refused_and_nothing_written(tmp_path: Path):
    trained = load_trained(oracle_checkpoint(tmp_path / "oracle.ckpt"))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConfigError, match="opset=99 could not be written"):
        _export(trained, out / "net.onnx", "onnx", opset=99)
    assert not list(out.iterdir())


def test_the_built_in_check_passes_and_reports_the_difference(tmp_path: Path):
    trained = load_trained(oracle_checkpoint(tmp_path / "oracle.ckpt"))
    settings = ExportSettings("onnx", "float32", "mask")
    written = export_network(trained, tmp_path / "net.onnx", settings)
    assert written.max_difference is not None and written.max_difference <= 1e-4


def test_a_file_that_differs_from_pytorch_is_refused_and_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    trained = load_trained(oracle_checkpoint(tmp_path / "oracle.ckpt"))
    path = _export(trained, tmp_path / "net.pt", "torchscript")
    other = exportable(trained, "scores")
    other.mean += 1  # a reference the file cannot match
    image = torch.full((1, 3, 8, 8), 100, dtype=torch.uint8)
    with pytest.raises(ExportMismatchError, match=r"differs from PyTorch by .* on a 1×3×8×8"):
        check_exported(path, ExportSettings("torchscript"), other, [image])

    def refuse(*args, **kwargs):
        raise ExportMismatchError("refused")

    monkeypatch.setattr(export_module, "check_exported", refuse)
    out = tmp_path / "out"
    with pytest.raises(ExportMismatchError):
        export_network(trained, out / "net.pt", ExportSettings("torchscript"))
    assert not list(out.iterdir())  # neither the file nor its temporary


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (("tflite", "auto", "scores", None), "format='tflite' is not allowed"),
        (("onnx", "int8", "scores", None), "dtype='int8' is not allowed"),
        (("onnx", "auto", "probabilities", None), "returns='probabilities' is not allowed"),
        (("onnx", "auto", "scores", 5), "opset=5 is not allowed"),
        (("onnx", "auto", "scores", True), "opset=True is not allowed"),
        (("onnx", "auto", "scores", "18"), "opset='18' is not allowed"),
    ],
)
def test_bad_settings_name_the_key(settings: tuple, message: str):
    with pytest.raises(ConfigError, match=message):
        check_settings(*settings)


def test_dtype_auto_follows_the_checkpoint_and_a_narrow_type_is_refused():
    assert resolve_dtype("auto", 255.0) == "uint8"
    assert resolve_dtype("auto", 65535.0) == "uint16"
    assert resolve_dtype("auto", 1.0) == "float32"
    assert resolve_dtype("uint16", 255.0) == "uint16"
    with pytest.raises(ConfigError, match=r"dtype='uint8' cannot hold .* max_value=65535"):
        resolve_dtype("uint8", 65535.0)
