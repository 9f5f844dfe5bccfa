"""What to export: the format, the input's pixel type, what the file returns, the opset.

Each value is checked before any file is read (``check_settings``); ``dtype=auto`` is
resolved from the checkpoint's pixel range (``resolve_dtype``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from segscale.errors import ConfigError
from segscale.inference.export_formats import DYNAMO_OPSET, LEGACY_OPSETS

DTYPES: dict[str, tuple[torch.dtype, float]] = {
    "uint8": (torch.uint8, 255.0),
    "uint16": (torch.uint16, 65535.0),
    "float32": (torch.float32, math.inf),
}
"""Input pixel types, with the largest pixel value each holds."""


@dataclass(frozen=True)
class ExportSettings:
    """What to export: ``format`` (onnx, torchscript), input ``dtype``, ``returns``."""

    format: str = "onnx"
    dtype: str = "uint8"
    """The input's pixel type, resolved (``resolve_dtype``): uint8, uint16 or float32."""
    returns: str = "scores"
    opset: int | None = None
    """ONNX opset; None: ``DYNAMO_OPSET``. Ignored by TorchScript."""


def check_settings(format: str, dtype: str, returns: str, opset: Any) -> None:
    """Raise ``ConfigError`` naming the key of a value refused before any file is read."""
    # format, dtype and returns: the schema's (segscale.config_schema).
    if opset is not None and (
        isinstance(opset, bool) or not isinstance(opset, int) or opset < LEGACY_OPSETS.start
    ):
        raise ConfigError(
            f"opset={opset!r} is not allowed: expected null (the default, {DYNAMO_OPSET}) "
            f"or an ONNX opset number from {LEGACY_OPSETS.start}"
        )


def resolve_dtype(name: str, max_value: float) -> str:
    """The input pixel type ``dtype=name`` asks for; ``auto`` picks it from ``max_value``.

    ``auto``: uint8 for 8-bit checkpoints (``max_value`` 255), uint16 for 16-bit ones,
    float32 otherwise. A type that cannot hold ``max_value`` is refused.
    """
    if name == "auto":
        return next((key for key, (_, top) in DTYPES.items() if top == max_value), "float32")
    if DTYPES[name][1] < max_value:
        raise ConfigError(
            f"dtype={name!r} cannot hold the pixel values of this checkpoint's images (up "
            f"to max_value={max_value:g}): expected a wider type, such as float32"
        )
    return name
