"""A trained network as one self-contained file for other runtimes: ONNX or TorchScript.

The exported network takes images as the user has them (raw pixel values, N×C×H×W, of
the pixel type ``dtype``), normalises them inside, and returns class scores (N×K×H×W
float32 logits) or the mask (N×H×W int64, their argmax). Batch, height and width stay
dynamic; height and width must be multiples of the network's output stride (16 for
the default DeepLabV3+), as in PyTorch.

This module writes the file for a checkpoint from the module traced
(``segscale.inference.export.formats``), the settings
(``segscale.inference.export.formats``) and the formats
(``segscale.inference.export.formats``); a file passes the check against PyTorch
(``segscale.inference.export.check``) before it is moved into place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from segscale.atomic_files import move_into_place, temporary_beside
from segscale.inference.export.check import check_exported, random_image
from segscale.inference.export.formats import (
    ExportableNetwork,
    ExportSettings,
    require_onnx_packages,
    write_onnx,
    write_torchscript,
)
from segscale.models.checkpoint.trained import TrainedModel
from segscale.models.networks import network_input_multiple


@dataclass(frozen=True)
class ExportedNetwork:
    """A file ``export_network`` wrote, and how far it was from PyTorch when checked."""

    path: Path
    size_bytes: int
    max_difference: float | None
    """Largest |exported − PyTorch| of scores (mask: of the winning score), or None."""


def exportable(trained: TrainedModel, returns: str) -> ExportableNetwork:
    """``trained``'s network and normalisation as one module, in eval mode on the CPU."""
    module = trained.module.cpu().eval()
    return ExportableNetwork(module.network, module.mean, module.std, returns).eval()


def export_metadata(trained: TrainedModel, settings: ExportSettings) -> dict[str, Any]:
    """What a user of the file needs to know, stored in it: classes, input, output."""
    return {
        "class_names": list(trained.class_names),
        "class_colors": trained.colours.tolist(),
        "input": {
            "layout": "NCHW",
            "dtype": settings.dtype,
            "channels": trained.in_channels,
            "max_value": trained.max_value,
            "side_multiple": network_input_multiple(trained.module.network),
        },
        "returns": settings.returns,
    }


def export_network(
    trained: TrainedModel, path: str | Path, settings: ExportSettings, verify: bool = True
) -> ExportedNetwork:
    """Write ``trained`` as ``settings.format`` to ``path``, atomically; return what was written.

    With ``verify`` the file is first run on random images of two sizes and compared
    with PyTorch (``ExportMismatchError`` past ``TOLERANCE``; nothing is written then).
    """
    if settings.format == "onnx":
        require_onnx_packages()
    network = exportable(trained, settings.returns)
    traced, other = example_shapes(trained)
    example = random_image(settings.dtype, trained.max_value, traced)
    metadata = export_metadata(trained, settings)
    temporary = temporary_beside(path)
    try:
        if settings.format == "onnx":
            write_onnx(network, example, temporary, settings.opset, metadata)
        else:
            write_torchscript(network, example, temporary, metadata)
        difference = None
        if verify:
            images = [
                random_image(settings.dtype, trained.max_value, shape, seed=seed)
                for seed, shape in enumerate((traced, other), start=1)
            ]
            reference = exportable(trained, "scores")
            difference = check_exported(temporary, settings, reference, images)
        written = move_into_place(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return ExportedNetwork(written, written.stat().st_size, difference)


def example_shapes(trained: TrainedModel) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two N×C×H×W shapes the network takes, with sides near 64, that differ in N, H, W.

    The exporters trace the first (batch 2, square); a file checked at both would show
    a size that the exporter fixed by mistake.
    """
    multiple = network_input_multiple(trained.module.network)
    side = multiple * math.ceil(64 / multiple)
    channels = trained.in_channels
    return (2, channels, side, side), (1, channels, side + multiple, side + 2 * multiple)
