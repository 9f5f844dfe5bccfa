"""The two export formats: a network written as ONNX or TorchScript, and read back.

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
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from segscale.errors import ConfigError
from segscale.inference.exportable_network import ExportableNetwork
from segscale.models.networks import network_input_multiple

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
