"""What an export writes: the network it traces, the settings, the two formats, read back.

``ExportableNetwork`` is the network with its input normalisation, the one module the
exporters trace; ``ExportSettings`` what to export (the format, the input's pixel type,
what the file returns, the opset).

ONNX goes through ``torch.onnx.export``'s torch.export-based exporter (``dynamo=True``,
the default since PyTorch 2.9), which writes opset 18 or later; an older opset can only
be had from the legacy TorchScript-based exporter (deprecated in PyTorch), used for
opsets 7-17 only. TorchScript is written with ``torch.jit.trace``, which PyTorch 2.14
deprecates (FutureWarning) in favour of ``torch.export``; it still works.

Each file carries ``export_metadata`` (classes, input conventions) under
``METADATA_KEY``: an ONNX metadata property, or a TorchScript extra file.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from segscale.errors import ConfigError
from segscale.models.networks import network_input_multiple

RETURNS = ("scores", "mask")
"""What the exported network returns: class logits, or class indices (their argmax)."""


class ExportableNetwork(nn.Module):
    """A network with its input normalisation: raw pixel values in, scores or mask out.

    The same arithmetic as ``SegmentationModule.forward`` (to float32, minus ``mean``,
    over ``std``, both in raw pixel values), as a plain module that exporters trace.
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(
        self, network: nn.Module, mean: torch.Tensor, std: torch.Tensor, returns: str
    ) -> None:
        super().__init__()
        self.network = network
        self.returns_mask = returns == "mask"
        self.register_buffer("mean", mean.detach().to(torch.float32).clone())
        self.register_buffer("std", std.detach().to(torch.float32).clone())

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """Class logits (N×K×H×W float32) or class indices (N×H×W int64) of raw images."""
        scores = self.network((image.to(torch.float32) - self.mean) / self.std)
        return scores.argmax(1) if self.returns_mask else scores


log = logging.getLogger(__name__)

FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}
"""Export formats and the file suffix each is written with by default."""

DYNAMO_OPSET = 18
"""The lowest opset the torch.export-based ONNX exporter writes (and its default)."""

LEGACY_OPSETS = range(7, DYNAMO_OPSET)
"""Opsets only the legacy (TorchScript-based, deprecated) ONNX exporter writes."""

ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")
"""What format=onnx needs: the ``export`` extra."""

EXPORTER_LOGGERS = ("onnxscript", "onnx_ir", "torch.onnx", "torch.export")
"""Loggers whose lines would drown the run's log: INFO for every optimisation pass, and
a warning with a traceback when an opset cannot be reached, which ``write_onnx`` reports
in one line instead."""

METADATA_KEY = "segscale"
"""The ONNX metadata property (or TorchScript extra file) holding ``export_metadata``."""


def require_onnx_packages() -> None:
    """Raise ``ConfigError`` naming ``format`` if the ONNX packages are not installed."""
    missing = [name for name in ONNX_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"format=onnx needs {', '.join(missing)}, not installed: pip install "
            "'segscale[export]' (or choose format=torchscript)"
        )


def write_onnx(
    network: ExportableNetwork,
    example: torch.Tensor,
    path: Path,
    opset: int | None,
    metadata: dict[str, Any],
) -> None:
    """Write ``network`` as one ONNX file (weights inside) with dynamic N, H and W.

    Height and width are declared multiples of the network's output stride, which is
    what torch.export needs to prove the decoder's feature maps line up at any size.
    """
    import onnx  # the `export` extra: loaded only when exporting to ONNX

    requested = DYNAMO_OPSET if opset is None else opset
    if requested in LEGACY_OPSETS:
        _legacy_onnx(network, example, path, requested)
    else:
        _dynamo_onnx(network, example, path, requested)
    model = onnx.load(str(path))
    written = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if written != requested:
        raise ConfigError(
            f"opset={opset!r} could not be written: PyTorch's exporter could not convert "
            f"the network to it and wrote opset {written}; expected an opset it converts "
            f"to (null: {DYNAMO_OPSET})"
        )
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(metadata)
    onnx.save(model, str(path))


def _dynamo_onnx(network: ExportableNetwork, example: torch.Tensor, path: Path, opset: int) -> None:
    """The torch.export-based exporter (PyTorch's default): opset 18 and later."""
    from torch.export import Dim

    multiple = network_input_multiple(network.network)
    sides = [Dim(name, min=1) for name in ("height", "width")]
    height, width = (side * multiple if multiple > 1 else side for side in sides)
    with warnings.catch_warnings(), _quiet(EXPORTER_LOGGERS):
        # The exporter warns about opsets and shapes it handles; its result is checked.
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            network,
            (example,),
            dynamo=True,
            input_names=["image"],
            output_names=[_output_name(network)],
            opset_version=opset,
            dynamic_shapes={"image": {0: Dim("batch", min=1), 2: height, 3: width}},
            verbose=False,
        )
    assert program is not None  # dynamo=True without a file name returns the program
    program.save(str(path), external_data=False)


def _legacy_onnx(network: ExportableNetwork, example: torch.Tensor, path: Path, opset: int) -> None:
    """The TorchScript-based exporter (deprecated in PyTorch), for opsets below 18."""
    log.warning(
        "opset=%d: using PyTorch's legacy (TorchScript-based, deprecated) ONNX exporter; "
        "the default exporter writes opset %d or later",
        opset,
        DYNAMO_OPSET,
    )
    axes = {0: "batch", 2: "height", 3: "width"}
    out_axes = {0: "batch", 1: "height", 2: "width"} if network.returns_mask else axes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its own DeprecationWarning, said above
        torch.onnx.export(
            network,
            (example,),
            str(path),
            dynamo=False,
            input_names=["image"],
            output_names=[_output_name(network)],
            opset_version=opset,
            dynamic_axes={"image": axes, _output_name(network): out_axes},
        )


def write_torchscript(
    network: ExportableNetwork, example: torch.Tensor, path: Path, metadata: dict[str, Any]
) -> None:
    """Write ``network`` traced with ``torch.jit.trace`` (deprecated in PyTorch 2.14)."""
    with warnings.catch_warnings(), torch.no_grad():
        # torch.jit's FutureWarnings say it is deprecated (the docs say so too); the
        # trace's shape genericity is checked by running the file at another size.
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(network, example, check_trace=False)
        torch.jit.save(traced, str(path), _extra_files={METADATA_KEY: json.dumps(metadata)})


def load_exported(path: str | Path, format: str) -> Callable[[np.ndarray], np.ndarray]:
    """A function that runs the exported file at ``path`` on a numpy image batch (CPU)."""
    if format == "onnx":
        import onnxruntime  # type: ignore[import-untyped]  # the `export` extra

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda image: session.run(None, {"image": image})[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.load's deprecation FutureWarning
        module = torch.jit.load(str(path), map_location="cpu")

    def run(image: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(torch.from_numpy(image)).numpy()

    return run


def read_metadata(path: str | Path, format: str) -> dict[str, Any]:
    """The ``export_metadata`` stored in an exported file."""
    if format == "onnx":
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        entries = {entry.key: entry.value for entry in model.metadata_props}
        return dict(json.loads(entries[METADATA_KEY]))
    files = {METADATA_KEY: ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.load(str(path), map_location="cpu", _extra_files=files)
    return dict(json.loads(files[METADATA_KEY]))


@contextmanager
def _quiet(names: tuple[str, ...]) -> Iterator[None]:
    """Only errors from the loggers ``names`` while inside."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.ERROR))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _output_name(network: ExportableNetwork) -> str:
    """The ONNX output's name: what it holds."""
    return "mask" if network.returns_mask else "scores"


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
