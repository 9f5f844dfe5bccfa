"""What to export: each setting's allowed values, and dtype=auto from the checkpoint."""

from __future__ import annotations

import pytest

from segscale.configs import compose_config
from segscale.errors import ConfigError
from segscale.inference.export_settings import check_settings, resolve_dtype


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
