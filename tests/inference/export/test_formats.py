"""The files as written: ONNX's declared input and axes, the metadata, the opsets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from segscale.configs import compose_config
from segscale.errors import ConfigError
from segscale.inference.export.formats import (
    check_settings,
    load_exported,
    read_metadata,
    resolve_dtype,
)
from segscale.models.checkpoint.trained import load_trained
from tests.conftest import oracle_checkpoint
from tests.inference.export.test_run import SUFFIX, _export, _pytorch, _raw_images


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


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("format=tflite", r"format='tflite' is not allowed: expected one of \['onnx'"),
        ("dtype=int8", r"dtype='int8' is not allowed: expected one of \['auto', 'uint8'"),
        ("returns=probabilities", r"returns='probabilities' is not allowed: .*'scores'"),
    ],
)
def test_bad_values_are_refused_as_the_config_is_composed(override: str, message: str):
    with pytest.raises(ConfigError, match=message):
        compose_config("export", [override])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
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
